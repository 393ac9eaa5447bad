// JSON Lines reader on top of getdelim (no line-length limit) and engine/json (one object per
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

const char *tr_jsonl_type_name(const tr_json *v) {
    return v ? tr_json_type_name(v->type) : "nothing";
}

int tr_jsonl_parse(const char *path, int64_t line, const char *text, size_t len,
                   tr_json_doc *doc, tr_err *err) {
    tr_json_opts o = {.name = path, .line = line, .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_DUP_LAST, .what = "invalid JSON: "};
    if (tr_json_parse_opts(doc, text, len, &o, err)) return -1;
    if (doc->root->type != TR_JSON_OBJECT) {
        const char *t = tr_jsonl_type_name(doc->root);
        tr_json_free(doc);
        return tr_errf(err, TR_EFORMAT, "%s:%lld: expected a JSON object, got %s", path,
                       (long long)line, t);
    }
    return 0;
}

int tr_jsonl_next(tr_jsonl *r, tr_json_doc *doc, tr_err *err) {
    doc->root = NULL;
    doc->blocks = NULL;
    const char *text;
    size_t len;
    int rc = tr_jsonl_next_line(r, &text, &len, err);
    if (rc <= 0) return rc;
    if (tr_jsonl_parse(r->path, r->line, text, len, doc, err)) return -1;
    return 1;
}

// The member key of obj, or a located error when a required one is missing.
static int get_field(const char *path, int64_t line, const tr_json *obj, const char *key,
                     bool required, const tr_json **v, tr_err *err) {
    *v = tr_json_get(obj, key);
    if (*v || !required) return 0;
    return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field '%s'", path, (long long)line, key);
}

int tr_jsonl_get_string(const char *path, int64_t line, const tr_json *obj, const char *key,
                        bool required, const char **s, size_t *len, tr_err *err) {
    *s = NULL;
    if (len) *len = 0;
    const tr_json *v;
    if (get_field(path, line, obj, key, required, &v, err)) return -1;
    if (!v) return 0;
    if (v->type != TR_JSON_STRING)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: field '%s' must be a string, got %s", path,
                       (long long)line, key, tr_jsonl_type_name(v));
    *s = v->str;
    if (len) *len = v->len;
    return 0;
}

int tr_jsonl_get_array(const char *path, int64_t line, const tr_json *obj, const char *key,
                       bool required, const tr_json **arr, tr_err *err) {
    *arr = NULL;
    const tr_json *v;
    if (get_field(path, line, obj, key, required, &v, err)) return -1;
    if (!v) return 0;
    if (v->type != TR_JSON_ARRAY)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: field '%s' must be an array, got %s", path,
                       (long long)line, key, tr_jsonl_type_name(v));
    *arr = v;
    return 0;
}
