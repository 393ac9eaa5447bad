// troupe's one JSON library: a small strict JSON (RFC 8259) reader into a read-only tree,
// and a buffer-based writer. Every layer reads JSON from arbitrary files (config.json,
// safetensors headers, tokenizer.json, JSONL data), so the parser is bounded (depth limit,
// checked sizes) and reports NAME:LINE:COLUMN for every error and every value.
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
// Nesting limit of data files (JSONL records, tokenizer.json) and of the writer.
#define TR_JSON_DATA_DEPTH 2048

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
void tr_json_free(tr_json_doc *doc);

// Rules beyond the defaults above (tr_json_opts.flags).
enum {
    TR_JSON_DUP_LAST = 1 << 0,    // a repeated key is no error: its last value replaces the
                                  // first one, which keeps its place in the member order
    TR_JSON_NO_NUL = 1 << 1,      // \u0000 is an error in any string
    TR_JSON_NO_NUL_KEY = 1 << 2,  // \u0000 is an error in object keys
    TR_JSON_INT64 = 1 << 3,       // an integer literal outside int64 is an error (by default
                                  // it reads as a double only)
    TR_JSON_DEPTH_ALL = 1 << 4,   // max_depth counts scalars as a level too, not only
                                  // arrays and objects
};
// The rules JSON data files (JSONL records, tokenizer.json, run files) are read with, with
// max_depth TR_JSON_DATA_DEPTH; add TR_JSON_DUP_LAST where repeated keys are tolerated.
#define TR_JSON_DATA (TR_JSON_NO_NUL_KEY | TR_JSON_INT64 | TR_JSON_DEPTH_ALL)

typedef struct tr_json_opts {
    const char *name;    // prefixes error messages (NULL: "<json>")
    int64_t line;        // line number of the text's first line in its file (0: 1)
    int max_depth;       // 0: TR_JSON_MAX_DEPTH
    unsigned flags;      // TR_JSON_* rules above
    const char *what;    // put before syntax error messages, e.g. "invalid JSON: " (NULL: none)
} tr_json_opts;

int tr_json_parse_opts(tr_json_doc *doc, const char *text, size_t len, const tr_json_opts *opts,
                       tr_err *err);

// The file at path read whole and parsed (json_file.c): by opts, or with opts NULL by
// tr_json_parse's rules with the path as the name.
int tr_json_parse_file(tr_json_doc *doc, const char *path, const tr_json_opts *opts,
                       tr_err *err);

// Member of an object by key (NULL when absent or when obj is not an object).
const tr_json *tr_json_get(const tr_json *obj, const char *key);
// Element i of an array (NULL when out of range or not an array); O(i): loops over all
// elements follow child and next instead.
const tr_json *tr_json_at(const tr_json *arr, int32_t i);
const char *tr_json_type_name(enum tr_json_type type);

// Length of the valid UTF-8 sequence at s[0..n) (n > 0), or 0 when invalid (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t tr_json_utf8_len(const unsigned char *s, size_t n);

// Type tests that accept NULL (an absent member).
static inline bool tr_json_is(const tr_json *v, enum tr_json_type t) { return v && v->type == t; }
static inline bool tr_json_is_int(const tr_json *v) {
    return v && v->type == TR_JSON_NUMBER && v->is_int;
}
// Absent or null.
static inline bool tr_json_is_none(const tr_json *v) { return !v || v->type == TR_JSON_NULL; }

// Writer: appends to a growing buffer; commas, quoting, escaping and indentation are
// handled here. Errors (allocation, non-finite numbers, unbalanced nesting, invalid UTF-8
// under TR_JSON_W_UTF8) are sticky and reported once by tr_json_writer_finish.
// Output style (tr_json_writer.flags, set after init; 0 is the engine's style):
enum {
    TR_JSON_W_SPACED = 1 << 0,  // ", " and ": " on one line, as Python's json.dumps (indent 0)
    TR_JSON_W_ASCII = 1 << 1,   // non-ASCII characters as \uXXXX (surrogate pairs above
                                // U+FFFF); implies TR_JSON_W_UTF8
    TR_JSON_W_UPPER = 1 << 2,   // \u escapes in upper-case hex (\u001B)
    TR_JSON_W_G17 = 1 << 3,     // doubles as %.17g (0.10000000000000001, 1e20, 1.5e-5), not
                                // the shortest text; always with a '.' or an exponent
    TR_JSON_W_UTF8 = 1 << 4,    // strings must be valid UTF-8, else the document fails
};
// The style of data-layer output (JSONL lines, prompt metadata).
#define TR_JSON_W_DATA (TR_JSON_W_UPPER | TR_JSON_W_G17 | TR_JSON_W_UTF8)

typedef struct tr_json_writer {
    char *buf;
    size_t len, cap;
    int32_t indent;         // spaces per level; 0 writes one line
    unsigned flags;         // TR_JSON_W_* style
    int32_t depth;
    bool first[TR_JSON_DATA_DEPTH + 1];   // nothing written yet at this level
    bool is_obj[TR_JSON_DATA_DEPTH + 1];  // this level is an object (values need a key)
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
void tr_json_key_n(tr_json_writer *w, const char *key, size_t n);
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
// Writes a parsed value (and everything in it): integers as integers, other numbers as
// doubles.
void tr_json_value(tr_json_writer *w, const tr_json *v);
// Appends raw bytes (e.g. padding after the document).
void tr_json_raw(tr_json_writer *w, const char *s, size_t n);
// Checks the document is complete; on success *out/*len hold the NUL-terminated text, which
// stays owned by the writer.
int tr_json_writer_finish(tr_json_writer *w, const char **out, size_t *len, tr_err *err);
// Empties the writer for the next document, keeping its buffer and style.
void tr_json_writer_reset(tr_json_writer *w);
