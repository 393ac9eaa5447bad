// JSON Lines reader on top of getdelim (no line-length limit) and jansson (one object per
// line). Line numbers count every physical line, blank ones included, so FILE:LINE in an
// error is what an editor shows.
#include "data/jsonl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int tr_jsonl_open(tr_jsonl *r, const char *path, tr_err *err) {
    memset(r, 0, sizeof *r);
    if (strlen(path) >= sizeof r->path) return tr_errf(err, TR_EINVAL, "path too long: %s", path);
    strcpy(r->path, path);
    if (strcmp(path, "-") == 0) {
        r->f = stdin;
        return 0;
    }
    r->f = fopen(path, "rb");
    if (!r->f) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    r->owned = true;
    struct stat st;
    if (fstat(fileno(r->f), &st) == 0 && S_ISREG(st.st_mode)) r->size = (uint64_t)st.st_size;
    return 0;
}

int tr_jsonl_open_stream(tr_jsonl *r, FILE *f, const char *name, tr_err *err) {
    memset(r, 0, sizeof *r);
    if (strlen(name) >= sizeof r->path) return tr_errf(err, TR_EINVAL, "name too long: %s", name);
    strcpy(r->path, name);
    r->f = f;
    return 0;
}

void tr_jsonl_close(tr_jsonl *r) {
    if (r->f && r->owned) fclose(r->f);
    r->f = NULL;
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\f' && s[i] != '\v') return false;
    return true;
}

int tr_jsonl_next_line(tr_jsonl *r, const char **text, size_t *len, tr_err *err) {
    for (;;) {
        errno = 0;
        ssize_t n = getdelim(&r->buf, &r->cap, '\n', r->f);
        if (n < 0) {
            if (ferror(r->f))
                return tr_errf(err, TR_EIO, "%s:%lld: read failed: %s", r->path,
                               (long long)r->line + 1, strerror(errno ? errno : EIO));
            if (errno == ENOMEM)
                return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory for a line", r->path,
                               (long long)r->line + 1);
            return 0;
        }
        r->line++;
        r->bytes_read += (uint64_t)n;
        size_t m = (size_t)n;
        if (m && r->buf[m - 1] == '\n') m--;
        if (m && r->buf[m - 1] == '\r') m--;
        r->buf[m] = '\0';
        char *s = r->buf;
        // A UTF-8 byte order mark on the first line is an editor's artefact, not JSON.
        if (r->line == 1 && m >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
            s += 3;
            m -= 3;
        }
        if (is_blank(s, m)) continue;
        *text = s;
        *len = m;
        return 1;
    }
}

const char *tr_jsonl_type_name(const json_t *v) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER:
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

int tr_jsonl_parse(const char *path, int64_t line, const char *text, size_t len, json_t **obj,
                   tr_err *err) {
    *obj = NULL;
    json_error_t je;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!v)
        return tr_errf(err, TR_EFORMAT, "%s:%lld:%d: invalid JSON: %s", path, (long long)line,
                       je.column, je.text);
    if (!json_is_object(v)) {
        const char *t = tr_jsonl_type_name(v);
        json_decref(v);
        return tr_errf(err, TR_EFORMAT, "%s:%lld: expected a JSON object, got %s", path,
                       (long long)line, t);
    }
    *obj = v;
    return 0;
}

int tr_jsonl_next(tr_jsonl *r, json_t **obj, tr_err *err) {
    *obj = NULL;
    const char *text;
    size_t len;
    int rc = tr_jsonl_next_line(r, &text, &len, err);
    if (rc <= 0) return rc;
    if (tr_jsonl_parse(r->path, r->line, text, len, obj, err)) return -1;
    return 1;
}

int tr_jsonl_get_string(const char *path, int64_t line, const json_t *obj, const char *key,
                        bool required, const char **s, size_t *len, tr_err *err) {
    *s = NULL;
    if (len) *len = 0;
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (!required) return 0;
        return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field '%s'", path, (long long)line, key);
    }
    if (!json_is_string(v))
        return tr_errf(err, TR_EFORMAT, "%s:%lld: field '%s' must be a string, got %s", path,
                       (long long)line, key, tr_jsonl_type_name(v));
    *s = json_string_value(v);
    if (len) *len = json_string_length(v);
    return 0;
}

int tr_jsonl_get_array(const char *path, int64_t line, const json_t *obj, const char *key,
                       bool required, json_t **arr, tr_err *err) {
    *arr = NULL;
    json_t *v = json_object_get(obj, key);
    if (!v) {
        if (!required) return 0;
        return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field '%s'", path, (long long)line, key);
    }
    if (!json_is_array(v))
        return tr_errf(err, TR_EFORMAT, "%s:%lld: field '%s' must be an array, got %s", path,
                       (long long)line, key, tr_jsonl_type_name(v));
    *arr = v;
    return 0;
}
