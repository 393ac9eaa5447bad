// JSON Lines reading: one JSON object per line, read line by line so files of any size and
// lines of any length stream through. Blank lines are skipped, CRLF and a final line without
// a newline are accepted, and every error names FILE:LINE (and the column for bad JSON).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/err.h"
#include "engine/json.h"

typedef struct tr_jsonl {
    FILE *f;
    char path[4096];
    char *buf;            // the current line (getdelim buffer), NUL-terminated, without EOL
    size_t cap;
    int64_t line;         // 1-based number of the line last returned
    uint64_t bytes_read;  // bytes consumed so far, for progress
    uint64_t size;        // file size in bytes, 0 when unknown (a pipe)
    bool owned;           // f was opened here and is closed by tr_jsonl_close
} tr_jsonl;

// Opens PATH ("-" reads standard input).
int tr_jsonl_open(tr_jsonl *r, const char *path, tr_err *err);
// Reads an already open stream (not closed by tr_jsonl_close); name stands for the file.
int tr_jsonl_open_stream(tr_jsonl *r, FILE *f, const char *name, tr_err *err);
void tr_jsonl_close(tr_jsonl *r);

// Next non-blank line, without its line ending: returns 1 with *text/*len set (valid until
// the next call), 0 at end of file, -1 on a read error.
int tr_jsonl_next_line(tr_jsonl *r, const char **text, size_t *len, tr_err *err);
// Next record parsed as a JSON object (doc->root; the caller tr_json_free's doc): 1, 0 at
// end (doc empty), -1 on error (doc empty).
int tr_jsonl_next(tr_jsonl *r, tr_json_doc *doc, tr_err *err);

// Parses one line as a JSON object; errors read "PATH:LINE:COL: invalid JSON: ...".
// Thread-safe, so workers can parse lines read by another thread. Records are read with
// TR_JSON_DATA rules, and a repeated key keeps its last value.
int tr_jsonl_parse(const char *path, int64_t line, const char *text, size_t len,
                   tr_json_doc *doc, tr_err *err);

// Field access with located errors ("PATH:LINE: field 'KEY' must be a string, got number").
// A missing optional field gives NULL and returns 0; a missing required one is an error.
int tr_jsonl_get_string(const char *path, int64_t line, const tr_json *obj, const char *key,
                        bool required, const char **s, size_t *len, tr_err *err);
int tr_jsonl_get_array(const char *path, int64_t line, const tr_json *obj, const char *key,
                       bool required, const tr_json **arr, tr_err *err);
// Name of a JSON value's type for messages ("string", "number", "object", ...; "nothing"
// for NULL).
const char *tr_jsonl_type_name(const tr_json *v);
