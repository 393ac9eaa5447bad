// ZeroMQ CURVE keys for non-loopback endpoints: key pair generation and the key file
// formats of docs/protocol.md ("public-key"/"secret-key" lines with 40-character z85 keys,
// and authorized-keys files with one z85 public key per line).
#pragma once
#include <stdbool.h>

#include "engine/err.h"

#define TR_CURVE_KEY_LEN 40  // z85 text of a 32-byte key

typedef struct tr_curve_keypair {
    char public_key[TR_CURVE_KEY_LEN + 1];
    char secret_key[TR_CURVE_KEY_LEN + 1];  // empty when read from a public-key file
} tr_curve_keypair;

int tr_curve_keypair_generate(tr_curve_keypair *kp, tr_err *err);
// Reads a key file: public-key is required, secret-key optional; the secret must match the public key.
int tr_curve_key_read(const char *path, tr_curve_keypair *kp, tr_err *err);
// Writes PATH (both keys, mode 0600) atomically; with public_only only the public key (mode 0644).
int tr_curve_key_write(const char *path, const tr_curve_keypair *kp, bool public_only, tr_err *err);
// The `keygen` helper: a fresh pair into BASE.key (secret, 0600) and BASE.pub (public).
int tr_curve_keygen_files(const char *base, tr_curve_keypair *kp, tr_err *err);

// An authorized-keys file: one z85 public key per line; blank lines and '#' comments skipped.
typedef struct tr_curve_authorized {
    char (*keys)[TR_CURVE_KEY_LEN + 1];
    int n;
} tr_curve_authorized;

int tr_curve_authorized_read(const char *path, tr_curve_authorized *a, tr_err *err);
// Adds one key (checked to be valid z85 of 32 bytes).
int tr_curve_authorized_add(tr_curve_authorized *a, const char *z85_key, tr_err *err);
bool tr_curve_authorized_has(const tr_curve_authorized *a, const unsigned char key[32]);
void tr_curve_authorized_free(tr_curve_authorized *a);

// True when key is 40 characters of z85 text.
bool tr_curve_key_valid(const char *key);
