// safetensors files: an 8-byte little-endian header length, a JSON header mapping tensor
// names to {dtype, shape, data_offsets} (plus an optional "__metadata__" string map), then
// the raw little-endian data. Reading maps the file and validates every entry before any
// tensor is touched; writing produces F32 or BF16 files atomically.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/json.h"

enum tr_st_dtype {
    TR_ST_BOOL,
    TR_ST_U8,
    TR_ST_I8,
    TR_ST_I16,
    TR_ST_U16,
    TR_ST_F16,
    TR_ST_BF16,
    TR_ST_I32,
    TR_ST_U32,
    TR_ST_F32,
    TR_ST_I64,
    TR_ST_U64,
    TR_ST_F64,
    TR_ST_F8_E4M3,
    TR_ST_F8_E5M2,
};

#define TR_ST_MAX_DIMS 8
// The reference implementation refuses larger headers; so do we (bounds hostile input).
#define TR_ST_MAX_HEADER ((uint64_t)100000000)

typedef struct tr_st_tensor {
    const char *name;              // points into the parsed header
    enum tr_st_dtype dtype;
    int32_t ndim;
    int64_t shape[TR_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end;           // data_offsets, relative to the data section
    const unsigned char *data;     // begin's address in the mapped file
} tr_st_tensor;

typedef struct tr_st_file {
    char path[4096];               // file name used in error messages
    void *map;                     // mmap'd file (NULL when parsed from a caller's buffer)
    size_t map_len;
    const unsigned char *data;     // data section
    uint64_t data_len;
    tr_json_doc header;
    const tr_json *metadata;       // the "__metadata__" object, or NULL
    tr_st_tensor *tensors;         // in header order
    int32_t n_tensors;
    int32_t *by_name;              // indices of tensors sorted by name, for lookup
} tr_st_file;

// Maps and validates PATH. Errors name the file and, where one is at fault, the tensor.
int tr_st_open(tr_st_file *f, const char *path, tr_err *err);
// Validates a safetensors image already in memory (kept by the caller until tr_st_close).
int tr_st_parse(tr_st_file *f, const void *buf, size_t len, const char *name, tr_err *err);
void tr_st_close(tr_st_file *f);

const tr_st_tensor *tr_st_find(const tr_st_file *f, const char *name);
// A "__metadata__" value (always a string per the format), or NULL.
const char *tr_st_metadata(const tr_st_file *f, const char *key);

const char *tr_st_dtype_name(enum tr_st_dtype dtype);
// Parses "F32", "BF16", ...; returns -1 for an unknown name.
int tr_st_dtype_parse(const char *name, enum tr_st_dtype *dtype);
size_t tr_st_dtype_size(enum tr_st_dtype dtype);

// Converts a tensor of F32, BF16, F16 or F64 to fp32 (numel floats into out). F64 rounds to
// nearest; the others are exact.
int tr_st_read_f32(const tr_st_file *f, const tr_st_tensor *t, float *out, tr_err *err);
// Converts a tensor of I8/I16/I32/I64/U8/U16/U32/BOOL to int64 (U64 too when it fits).
int tr_st_read_i64(const tr_st_file *f, const tr_st_tensor *t, int64_t *out, tr_err *err);

// fp32 -> bf16 with round-to-nearest-even (NaN stays NaN), as torch converts.
uint16_t tr_f32_to_bf16(float x);
float tr_bf16_to_f32(uint16_t h);
float tr_f16_to_f32(uint16_t h);

// One tensor to write: fp32 data converted to the file's dtype on the way out.
typedef struct tr_st_entry {
    const char *name;
    int32_t ndim;
    int64_t shape[TR_ST_MAX_DIMS];
    const float *data;
} tr_st_entry;

// Writes the entries (in this order) as F32 or BF16 into PATH atomically; metadata is
// n_meta key/value string pairs for "__metadata__" (transformers wants {"format": "pt"}).
int tr_st_save(const char *path, const tr_st_entry *entries, int32_t n, enum tr_st_dtype dtype,
               const char *const *meta_kv, int32_t n_meta, tr_err *err);
// Bytes tr_st_save writes for one tensor's data.
uint64_t tr_st_entry_bytes(const tr_st_entry *e, enum tr_st_dtype dtype);
