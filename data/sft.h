// SFT datasets: JSONL conversations (`messages` [{role, content}] or ShareGPT `conversations`
// [{from: human|gpt|system, value}]) rendered through a chat format to ids + loss mask, then
// packed into fixed-length rows with document boundaries for tr_doc_layout.
//
// Length policy per sample (max_len tokens): TR_SFT_DROP skips longer samples;
// TR_SFT_TRUNCATE keeps their first max_len tokens (the tail, usually the end of the last
// answer, is lost). Either way a sample with no trained token left is skipped and counted.
//
// A packed row of R tokens holds whole samples back to back, each its own document
// (positions restart at 0, attention never crosses), then padding as one more document of
// pad ids that is never trained. targets[t] is the id the model should predict after token t
// (the next token of the same document when that token is trained, else -1).
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/chat.h"
#include "engine/err.h"
#include "engine/json.h"

enum tr_sft_policy { TR_SFT_DROP = 0, TR_SFT_TRUNCATE = 1 };

typedef struct tr_sft_dataset {
    int64_t n;            // samples kept
    int64_t *off;         // [n + 1] token offsets into ids/mask
    int32_t *ids;
    uint8_t *mask;        // 1 on tokens the loss trains on
    int64_t *line;        // [n] source line of each sample
    int64_t n_dropped;    // longer than max_len under TR_SFT_DROP
    int64_t n_truncated;  // cut to max_len under TR_SFT_TRUNCATE
    int64_t n_untrained;  // skipped: no trained token
    int64_t cap_samples, cap_tokens;
} tr_sft_dataset;

// Reads path; every error names path:line.
int tr_sft_load(tr_sft_dataset *d, const char *path, const tr_chat_format *chat, int32_t max_len,
                int policy, tr_err *err);
// Adds one conversation (already parsed) as a sample; line is for messages only.
int tr_sft_add(tr_sft_dataset *d, const tr_chat_format *chat, const tr_chat_msg *msgs, size_t n,
               int32_t max_len, int policy, int64_t line, tr_err *err);
void tr_sft_free(tr_sft_dataset *d);

// Messages of one JSONL record (`messages` or `conversations`); *msgs is malloc'd, its roles
// are static strings and its contents point into obj's strings (valid while obj lives).
int tr_sft_parse_messages(const char *path, int64_t line, const tr_json *obj, tr_chat_msg **msgs,
                          size_t *n, tr_err *err);

typedef struct tr_sft_packing {
    int32_t row_len;
    int64_t n_rows;
    int64_t *row_off;     // [n_rows + 1] offsets into items
    int64_t *items;       // sample indices, row by row
} tr_sft_packing;

// Shuffles the samples by seed and packs them first-fit into rows of row_len tokens (pack =
// false: one sample per row). Samples must fit a row (row_len >= the dataset's max_len).
int tr_sft_pack(tr_sft_packing *p, const tr_sft_dataset *d, int32_t row_len, bool pack,
                uint64_t seed, tr_err *err);
void tr_sft_packing_free(tr_sft_packing *p);

typedef struct tr_sft_row {
    int32_t *ids;         // [row_len]
    int32_t *targets;     // [row_len], -1 = no loss
    int32_t *pos;         // [row_len]
    int32_t *doc_start;   // [row_len + 2], n_docs + 1 used
    int32_t n_docs;
    int32_t n_real;       // tokens before the padding
} tr_sft_row;

int tr_sft_row_init(tr_sft_row *r, int32_t row_len, tr_err *err);
void tr_sft_row_free(tr_sft_row *r);
// Fills r with row `row` of the packing.
int tr_sft_row_fill(const tr_sft_dataset *d, const tr_sft_packing *p, int64_t row, int32_t pad_id,
                    tr_sft_row *r, tr_err *err);
