// Short accessors over engine/json trees for test code: a missing or mistyped value reads as
// NULL, 0, NAN or false, so a check fails instead of the test crashing.
#pragma once
#include <math.h>

#include <stdlib.h>

#include "engine/file.h"
#include "engine/json.h"

static inline const char *tj_str(const tr_json *v) { return tr_json_is(v, TR_JSON_STRING) ? v->str : NULL; }
static inline size_t tj_len(const tr_json *v) { return tr_json_is(v, TR_JSON_STRING) ? v->len : 0; }
static inline long long tj_int(const tr_json *v) { return tr_json_is_int(v) ? v->inum : 0; }
static inline double tj_num(const tr_json *v) { return tr_json_is(v, TR_JSON_NUMBER) ? v->num : NAN; }
static inline bool tj_true(const tr_json *v) { return tr_json_is(v, TR_JSON_BOOL) && v->boolean; }
// Elements of an array or members of an object (0 for anything else).
static inline size_t tj_size(const tr_json *v) {
    return tr_json_is(v, TR_JSON_ARRAY) || tr_json_is(v, TR_JSON_OBJECT) ? (size_t)v->count : 0;
}
static inline const tr_json *tj_at(const tr_json *arr, size_t i) {
    return i > INT32_MAX ? NULL : tr_json_at(arr, (int32_t)i);
}

// Parses text (or the file at path) as data files are read: TR_JSON_DATA rules.
static inline int tj_parse(tr_json_doc *doc, const char *text, size_t len, const char *name,
                           tr_err *err) {
    tr_json_opts o = {.name = name, .max_depth = TR_JSON_DATA_DEPTH, .flags = TR_JSON_DATA};
    return tr_json_parse_opts(doc, text, len, &o, err);
}
static inline int tj_load(tr_json_doc *doc, const char *path, tr_err *err) {
    char *text;
    size_t len;
    doc->root = NULL;
    doc->blocks = NULL;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = tj_parse(doc, text, len, path, err);
    free(text);
    return rc;
}
