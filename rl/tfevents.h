// TensorBoard event files written by hand: TFRecord framing (length, masked CRC-32C of the
// length, data, masked CRC-32C of the data) around Event protobufs whose Summary holds
// simple_value scalars. Small enough that troupe needs no protobuf or TensorFlow library.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/err.h"

typedef struct tr_tfevents {
    FILE *f;
    char path[4096];
} tr_tfevents;

// CRC-32C (Castagnoli), and the masked form TFRecord stores.
uint32_t tr_crc32c(const void *data, size_t n);
uint32_t tr_crc32c_masked(const void *data, size_t n);

// Creates dir and the file dir/events.out.tfevents.<secs>.<host>.<pid>, whose first record
// is the file_version event TensorBoard expects.
int tr_tfevents_open(tr_tfevents *w, const char *dir, double wall_time, tr_err *err);
// One event at step holding n scalars tags[i] = values[i] (non-finite values are skipped).
int tr_tfevents_scalars(tr_tfevents *w, double wall_time, int64_t step, const char *const *tags,
                        const double *values, int n, tr_err *err);
// A SessionLog START at step: TensorBoard drops what earlier files logged at steps >= step,
// so a resumed run does not show the abandoned tail twice.
int tr_tfevents_session_start(tr_tfevents *w, double wall_time, int64_t step, tr_err *err);
// Flushes and fsyncs.
int tr_tfevents_flush(tr_tfevents *w, tr_err *err);
void tr_tfevents_close(tr_tfevents *w);

// The encodings on their own, into buf (cap bytes); return the length, or -1 when cap is
// too small. Event records with explicit path: for the writer and the byte-level tests.
int64_t tr_tfevents_encode_version(uint8_t *buf, size_t cap, double wall_time);
int64_t tr_tfevents_encode_scalars(uint8_t *buf, size_t cap, double wall_time, int64_t step,
                                   const char *const *tags, const double *values, int n);
int64_t tr_tfevents_encode_session_start(uint8_t *buf, size_t cap, double wall_time,
                                         int64_t step);
// TFRecord framing of data (n bytes) into buf: n + 16 bytes.
int64_t tr_tfevents_frame(uint8_t *buf, size_t cap, const uint8_t *data, size_t n);
