// Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx, "MMIDIDX" version 1): a reader that
// mmaps both files and checks every size and pointer against the file lengths, and a builder
// that appends sequences, ends documents, merges other datasets and commits atomically.
//
// .idx layout (little-endian): "MMIDIDX\0\0" | u64 version = 1 | u8 dtype code |
// u64 sequence count S | u64 document count D (= documents + 1) | i32 lengths[S] |
// i64 byte pointers[S] into .bin | i64 document indices[D] (sequence index where each
// document starts; first 0, last S). .bin holds the sequences' tokens back to back.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"
#include "engine/file.h"

enum tr_indexed_dtype {
    TR_IDX_UINT8 = 1,
    TR_IDX_INT8 = 2,
    TR_IDX_INT16 = 3,
    TR_IDX_INT32 = 4,
    TR_IDX_INT64 = 5,
    TR_IDX_FLOAT64 = 6,
    TR_IDX_FLOAT32 = 7,
    TR_IDX_UINT16 = 8,
};

#define TR_IDX_HEADER_SIZE 34

// Bytes per element of a dtype code, 0 for an unknown code.
size_t tr_indexed_dtype_size(int dtype);
const char *tr_indexed_dtype_name(int dtype);
// The token dtype Megatron's preprocessing picks: uint16 below 65500 ids, else int32.
int tr_indexed_dtype_for_vocab(int64_t vocab_size);

typedef struct tr_indexed {
    char prefix[4096];
    int dtype;
    size_t elem;            // bytes per token
    int64_t n_seqs;
    int64_t n_docs;         // documents (the .idx document count minus one)
    const uint8_t *idx;     // mmap'd .idx; arrays are unaligned, read through the accessors
    size_t idx_size;
    const uint8_t *bin;     // mmap'd .bin (NULL when empty)
    size_t bin_size;
    int64_t n_tokens;       // sum of sequence lengths
    bool mapped;            // idx/bin are mmaps owned by this struct
} tr_indexed;

// Opens PREFIX.idx and PREFIX.bin; errors name the file and the byte offset that is wrong.
int tr_indexed_open(tr_indexed *d, const char *prefix, tr_err *err);
void tr_indexed_close(tr_indexed *d);
// Validates and wraps index and data bytes already in memory (kept by the caller); name
// stands for the prefix in messages. The same checks as tr_indexed_open.
int tr_indexed_open_mem(tr_indexed *d, const char *name, const void *idx, size_t idx_size,
                        const void *bin, size_t bin_size, tr_err *err);

int32_t tr_indexed_seq_len(const tr_indexed *d, int64_t seq);
int64_t tr_indexed_seq_ptr(const tr_indexed *d, int64_t seq);
// Sequence index where document doc starts (doc in [0, n_docs]; n_docs gives n_seqs).
int64_t tr_indexed_doc_index(const tr_indexed *d, int64_t doc);
// Tokens of a document: the sum of its sequences' lengths.
int64_t tr_indexed_doc_tokens(const tr_indexed *d, int64_t doc);
// Copies count tokens of sequence seq starting at token offset into out, as int32.
// Integer dtypes only; a value outside int32 is an error naming the .bin offset.
int tr_indexed_read(const tr_indexed *d, int64_t seq, int64_t offset, int64_t count,
                    int32_t *out, tr_err *err);

typedef struct tr_indexed_builder {
    tr_file_writer bin;
    char idx_path[4200];
    int dtype;
    size_t elem;
    int32_t *seq_len;
    int64_t n_seqs, cap_seqs;
    int64_t *doc_idx;       // starts as {0}
    int64_t n_doc_idx, cap_doc_idx;
    int64_t bin_bytes;
    uint8_t *conv;          // scratch for dtype conversion
    size_t conv_cap;
    bool open;
} tr_indexed_builder;

// Starts PREFIX.bin (written to a temporary name until finish). dtype: an integer code.
int tr_indexed_builder_init(tr_indexed_builder *b, const char *prefix, int dtype, tr_err *err);
// Appends one sequence; every id must fit the dtype.
int tr_indexed_builder_add(tr_indexed_builder *b, const int32_t *ids, int64_t n, tr_err *err);
// Closes the current document (the sequences added since the last call).
int tr_indexed_builder_end_document(tr_indexed_builder *b, tr_err *err);
// Appends every sequence and document of the dataset at prefix (same dtype required).
int tr_indexed_builder_append(tr_indexed_builder *b, const char *prefix, tr_err *err);
// Writes PREFIX.idx, then renames both files into place once both are on disk. Frees
// nothing: call _free after (which removes the temporaries of a failed finish).
int tr_indexed_builder_finish(tr_indexed_builder *b, tr_err *err);
// Releases memory; an unfinished builder's temporary .bin is removed.
void tr_indexed_builder_free(tr_indexed_builder *b);

// Concatenates the datasets at prefixes[0..n) into out_prefix.
int tr_indexed_merge(const char *out_prefix, const char *const *prefixes, int n, tr_err *err);
