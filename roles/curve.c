// CURVE key files. One format serves key pairs, public keys and authorized-keys lists, so
// that `cat worker*.pub > authorized` builds the list a controller accepts.
#include "roles/curve.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zmq.h>

#include "engine/file.h"

static const char z85_chars[] =
    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";

bool tr_curve_key_valid(const char *key) {
    if (!key || strlen(key) != TR_CURVE_KEY_LEN) return false;
    for (int i = 0; i < TR_CURVE_KEY_LEN; i++)
        if (!strchr(z85_chars, key[i])) return false;
    // z85 of 32 bytes decodes only when each 5-character group stays below 2^32.
    unsigned char raw[32];
    return zmq_z85_decode(raw, key) != NULL;
}

int tr_curve_keypair_generate(tr_curve_keypair *kp, tr_err *err) {
    memset(kp, 0, sizeof *kp);
    if (zmq_curve_keypair(kp->public_key, kp->secret_key) != 0)
        return tr_errf(err, TR_EUNSUPPORTED, "CURVE key generation failed: %s (libzmq without CURVE?)",
                       zmq_strerror(zmq_errno()));
    return 0;
}

// Parses `NAME = "KEY"` (spaces optional); returns 1 and copies KEY on a match of name.
static int parse_key_line(const char *line, const char *name, char *out, const char *path, int lineno,
                          tr_err *err) {
    size_t n = strlen(name);
    if (strncmp(line, name, n) != 0) return 0;
    const char *p = line + n;
    while (*p == ' ' || *p == '\t') p++;
    if (*p++ != '=') return tr_errf(err, TR_EFORMAT, "%s:%d: expected '=' after %s", path, lineno, name);
    while (*p == ' ' || *p == '\t') p++;
    if (*p++ != '"') return tr_errf(err, TR_EFORMAT, "%s:%d: expected a quoted key after %s =", path, lineno, name);
    const char *q = strchr(p, '"');
    if (!q || q - p != TR_CURVE_KEY_LEN)
        return tr_errf(err, TR_EFORMAT, "%s:%d: %s must be %d z85 characters in quotes", path, lineno, name,
                       TR_CURVE_KEY_LEN);
    for (const char *r = q + 1; *r; r++)
        if (*r != ' ' && *r != '\t' && *r != '\r')
            return tr_errf(err, TR_EFORMAT, "%s:%d: text after the key", path, lineno);
    memcpy(out, p, TR_CURVE_KEY_LEN);
    out[TR_CURVE_KEY_LEN] = '\0';
    if (!tr_curve_key_valid(out)) return tr_errf(err, TR_EFORMAT, "%s:%d: %s is not valid z85", path, lineno, name);
    return 1;
}

// Calls fn for every non-comment line; the buffer is modified in place.
static int for_lines(char *text, const char *path, int (*fn)(void *, const char *, int, const char *, tr_err *),
                     void *ctx, tr_err *err) {
    int lineno = 0;
    char *save = NULL;
    for (char *line = text; line; line = save) {
        lineno++;
        save = strchr(line, '\n');
        if (save) *save++ = '\0';
        while (*line == ' ' || *line == '\t') line++;
        size_t len = strlen(line);
        while (len && (line[len - 1] == '\r' || line[len - 1] == ' ' || line[len - 1] == '\t')) line[--len] = '\0';
        if (len == 0 || line[0] == '#') continue;
        if (fn(ctx, line, lineno, path, err)) return -1;
    }
    return 0;
}

static int keypair_line(void *ctx, const char *line, int lineno, const char *path, tr_err *err) {
    tr_curve_keypair *kp = ctx;
    int r = parse_key_line(line, "public-key", kp->public_key, path, lineno, err);
    if (r == 0) r = parse_key_line(line, "secret-key", kp->secret_key, path, lineno, err);
    if (r == 0) return tr_errf(err, TR_EFORMAT, "%s:%d: expected public-key or secret-key", path, lineno);
    return r < 0 ? -1 : 0;
}

int tr_curve_key_read(const char *path, tr_curve_keypair *kp, tr_err *err) {
    memset(kp, 0, sizeof *kp);
    char *text;
    size_t len;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = for_lines(text, path, keypair_line, kp, err);
    free(text);
    if (rc) return -1;
    if (!kp->public_key[0]) return tr_errf(err, TR_EFORMAT, "%s: no public-key line", path);
    if (kp->secret_key[0]) {
        char derived[TR_CURVE_KEY_LEN + 1];
        if (zmq_curve_public(derived, kp->secret_key) != 0)
            return tr_errf(err, TR_EFORMAT, "%s: cannot derive the public key: %s", path, zmq_strerror(zmq_errno()));
        if (strcmp(derived, kp->public_key) != 0)
            return tr_errf(err, TR_EFORMAT, "%s: secret-key does not belong to public-key", path);
    }
    return 0;
}

int tr_curve_key_write(const char *path, const tr_curve_keypair *kp, bool public_only, tr_err *err) {
    if (!tr_curve_key_valid(kp->public_key)) return tr_errf(err, TR_EINVAL, "%s: invalid public key", path);
    if (!public_only && !tr_curve_key_valid(kp->secret_key))
        return tr_errf(err, TR_EINVAL, "%s: invalid secret key", path);
    char text[256];
    int n = snprintf(text, sizeof text, "# troupe CURVE %s (docs/protocol.md)\npublic-key = \"%s\"\n",
                     public_only ? "public key" : "key pair: keep this file secret", kp->public_key);
    if (!public_only) n += snprintf(text + n, sizeof text - (size_t)n, "secret-key = \"%s\"\n", kp->secret_key);
    tr_file_writer w;
    if (tr_file_writer_open(&w, path, err)) return -1;
    // Restrict the mode before any secret byte reaches the disk.
    if (fchmod(fileno(w.f), public_only ? 0644 : 0600) != 0) {
        int e = errno;
        tr_file_writer_abort(&w);
        return tr_errf(err, TR_EIO, "%s: cannot set the file mode: %s", path, strerror(e));
    }
    if (tr_file_writer_write(&w, text, (size_t)n, err)) return -1;
    return tr_file_writer_commit(&w, err);
}

int tr_curve_keygen_files(const char *base, tr_curve_keypair *kp, tr_err *err) {
    char path[4096];
    if (strlen(base) + 5 >= sizeof path) return tr_errf(err, TR_EINVAL, "key path too long: %s", base);
    if (tr_curve_keypair_generate(kp, err)) return -1;
    snprintf(path, sizeof path, "%s.key", base);
    if (tr_curve_key_write(path, kp, false, err)) return -1;
    snprintf(path, sizeof path, "%s.pub", base);
    return tr_curve_key_write(path, kp, true, err);
}

int tr_curve_authorized_add(tr_curve_authorized *a, const char *z85_key, tr_err *err) {
    if (!tr_curve_key_valid(z85_key)) return tr_errf(err, TR_EINVAL, "authorized key is not 40 characters of z85");
    char(*keys)[TR_CURVE_KEY_LEN + 1] = realloc(a->keys, (size_t)(a->n + 1) * sizeof *keys);
    if (!keys) return tr_errf(err, TR_ENOMEM, "out of memory for authorized keys");
    a->keys = keys;
    memcpy(a->keys[a->n], z85_key, TR_CURVE_KEY_LEN + 1);
    a->n++;
    return 0;
}

static int authorized_line(void *ctx, const char *line, int lineno, const char *path, tr_err *err) {
    char key[TR_CURVE_KEY_LEN + 1];
    int r = parse_key_line(line, "public-key", key, path, lineno, err);
    if (r < 0) return -1;
    if (r == 0) {
        if (strncmp(line, "secret-key", 10) == 0)
            return tr_errf(err, TR_EFORMAT, "%s:%d: a secret key in an authorized-keys file", path, lineno);
        return tr_errf(err, TR_EFORMAT, "%s:%d: expected public-key = \"...\"", path, lineno);
    }
    return tr_curve_authorized_add(ctx, key, err);
}

int tr_curve_authorized_read(const char *path, tr_curve_authorized *a, tr_err *err) {
    memset(a, 0, sizeof *a);
    char *text;
    size_t len;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = for_lines(text, path, authorized_line, a, err);
    free(text);
    if (rc) {
        tr_curve_authorized_free(a);
        return -1;
    }
    if (a->n == 0) return tr_errf(err, TR_EFORMAT, "%s: no public-key lines", path);
    return 0;
}

bool tr_curve_authorized_has(const tr_curve_authorized *a, const unsigned char key[32]) {
    char z85[TR_CURVE_KEY_LEN + 1];
    if (!zmq_z85_encode(z85, key, 32)) return false;
    for (int i = 0; i < a->n; i++)
        if (memcmp(a->keys[i], z85, TR_CURVE_KEY_LEN) == 0) return true;
    return false;
}

void tr_curve_authorized_free(tr_curve_authorized *a) {
    free(a->keys);
    a->keys = NULL;
    a->n = 0;
}
