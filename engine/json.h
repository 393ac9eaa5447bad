// A small strict JSON (RFC 8259) reader into a read-only tree, and a buffer-based writer.
// The engine may not link jansson, yet it reads config.json and safetensors headers from
// arbitrary files, so the parser is bounded (depth limit, checked sizes) and reports
// NAME:LINE:COLUMN for every error and every value.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

enum tr_json_type {
    TR_JSON_NULL,
    TR_JSON_BOOL,
    TR_JSON_NUMBER,
    TR_JSON_STRING,
    TR_JSON_ARRAY,
    TR_JSON_OBJECT,
};

#define TR_JSON_MAX_DEPTH 64

typedef struct tr_json tr_json;
struct tr_json {
    enum tr_json_type type;
    int32_t line, col;      // 1-based position of the value's first byte (col counts bytes)
    const char *key;        // member name when the value sits in an object, else NULL
    size_t key_len;
    // Numbers keep both readings: num always, inum exactly when is_int (a literal without
    // fraction or exponent that fits in int64).
    bool is_int;
    bool boolean;
    int64_t inum;
    double num;
    const char *str;        // unescaped UTF-8, NUL-terminated; len excludes the NUL
    size_t len;
    tr_json *child;         // first element or member, in document order
    tr_json *next;          // next sibling
    int32_t count;          // elements or members
};

typedef struct tr_json_block tr_json_block;

// A parsed document: every node and string lives in the document's blocks.
typedef struct tr_json_doc {
    const tr_json *root;
    tr_json_block *blocks;
} tr_json_doc;

// Parses len bytes of text (need not be NUL-terminated). `name` prefixes error messages
// ("config.json:3:14: ..."). Rejects comments, trailing commas, leading zeros, NaN,
// control characters and invalid UTF-8 in strings, lone surrogates, duplicate keys,
// nesting deeper than TR_JSON_MAX_DEPTH, and anything after the top-level value.
int tr_json_parse(tr_json_doc *doc, const char *text, size_t len, const char *name,
                  tr_err *err);
int tr_json_parse_depth(tr_json_doc *doc, const char *text, size_t len, const char *name,
                        int max_depth, tr_err *err);
void tr_json_free(tr_json_doc *doc);

// Member of an object by key (NULL when absent or when obj is not an object).
const tr_json *tr_json_get(const tr_json *obj, const char *key);
// Element i of an array (NULL when out of range or not an array); O(i).
const tr_json *tr_json_at(const tr_json *arr, int32_t i);
const char *tr_json_type_name(enum tr_json_type type);

// Writer: appends to a growing buffer; commas, quoting, escaping and indentation are
// handled here. Errors (allocation, non-finite numbers, unbalanced nesting) are sticky and
// reported once by tr_json_writer_finish.
typedef struct tr_json_writer {
    char *buf;
    size_t len, cap;
    int32_t indent;         // spaces per level; 0 writes compact JSON
    int32_t depth;
    bool first[TR_JSON_MAX_DEPTH + 1];   // nothing written yet at this level
    bool is_obj[TR_JSON_MAX_DEPTH + 1];  // this level is an object (values need a key)
    bool after_key;
    bool done;              // the top-level value is complete
    int failed;             // a tr_err_code, TR_OK while fine
} tr_json_writer;

void tr_json_writer_init(tr_json_writer *w, int32_t indent);
void tr_json_writer_free(tr_json_writer *w);
void tr_json_begin_object(tr_json_writer *w);
void tr_json_end_object(tr_json_writer *w);
void tr_json_begin_array(tr_json_writer *w);
void tr_json_end_array(tr_json_writer *w);
void tr_json_key(tr_json_writer *w, const char *key);
void tr_json_string(tr_json_writer *w, const char *s);
void tr_json_string_n(tr_json_writer *w, const char *s, size_t n);
void tr_json_int(tr_json_writer *w, int64_t v);
void tr_json_uint(tr_json_writer *w, uint64_t v);
// Shortest text that reads back as the same double; always has a '.' or exponent so
// Python reads it as a float.
void tr_json_double(tr_json_writer *w, double v);
// Shortest text that reads back as the same float (1e-06 rather than 9.99999997e-07).
void tr_json_float(tr_json_writer *w, float v);
void tr_json_bool(tr_json_writer *w, bool v);
void tr_json_null(tr_json_writer *w);
// Appends raw bytes (e.g. padding after the document).
void tr_json_raw(tr_json_writer *w, const char *s, size_t n);
// Checks the document is complete; on success *out/*len hold the NUL-terminated text, which
// stays owned by the writer.
int tr_json_writer_finish(tr_json_writer *w, const char **out, size_t *len, tr_err *err);
