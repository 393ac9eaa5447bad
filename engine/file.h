// Whole-file reads and crash-safe writes: data goes to PATH.tmp.<pid>, is fsync'd, then
// renamed over PATH, and the directory is fsync'd, so a failure never leaves a half file.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/err.h"

// Reads the whole file into a malloc'd buffer with a trailing NUL (not counted in *len).
int tr_file_read(const char *path, char **data, size_t *len, tr_err *err);

// An in-progress atomic write. Open, write (any number of times), then commit or abort.
// A path that exists and is neither a regular file nor a symlink to one (a device such as
// /dev/stdout, a FIFO) is written in place instead, as rename would replace the device; a
// symlink to a file has its target replaced; a directory is an error at open. tmp is empty
// for an in-place write.
typedef struct tr_file_writer {
    FILE *f;
    char path[4096];
    char tmp[4200];
} tr_file_writer;

int tr_file_writer_open(tr_file_writer *w, const char *path, tr_err *err);
int tr_file_writer_write(tr_file_writer *w, const void *data, size_t len, tr_err *err);
// Flushes and fsyncs without renaming, so the writes of several files can all succeed
// before any of them replaces its target (commit then only renames).
int tr_file_writer_sync(tr_file_writer *w, tr_err *err);
int tr_file_writer_commit(tr_file_writer *w, tr_err *err);
void tr_file_writer_abort(tr_file_writer *w);

// One-shot atomic write of a buffer.
int tr_file_write_atomic(const char *path, const void *data, size_t len, tr_err *err);
// mkdir -p; existing directories are fine.
int tr_mkdirs(const char *path, tr_err *err);
int tr_file_exists(const char *path);
