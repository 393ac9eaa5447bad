// The RL workflows' prompt source: a JSONL prompt set encoded once (chat format applied,
// prompts longer than max_prompt_len tokens skipped and counted), drawn in epochs each
// shuffled by (seed, epoch), so draw k is a pure function of k and a resumed run continues
// the same stream from its cursor.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "data/chat.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "engine/err.h"
#include "roles/client.h"

typedef struct tr_prompt_loader {
    tr_prompt_set set;
    int64_t n;            // usable prompts
    int64_t n_skipped;    // longer than max_prompt_len
    int64_t *item;        // [n] index into set.items
    int64_t *off;         // [n + 1] into ids
    int32_t *ids;
    int32_t max_len;      // longest usable prompt, tokens
    bool shuffle;
    uint64_t seed;
    int64_t *perm;        // [n] the order of perm_epoch
    int64_t perm_epoch;
} tr_prompt_loader;

// A drawn batch laid out as policy.generate takes it (texts and meta point into the loader).
typedef struct tr_prompt_draw {
    tr_prompt_batch batch;
    int32_t *ids;
    int64_t *offset;
    int32_t *group;
    char **text, **meta;
    int64_t cap_ids;
    int32_t cap;
} tr_prompt_draw;

// Loads path and encodes every prompt (chat may be NULL: plain text). No usable prompt
// is an error naming the file.
int tr_prompt_loader_init(tr_prompt_loader *l, const char *path, const tr_chat_format *chat,
                          const tr_tokenizer *tok, int32_t max_prompt_len, bool shuffle,
                          uint64_t seed, tr_err *err);
void tr_prompt_loader_free(tr_prompt_loader *l);
// The usable prompt served by draw k (k >= 0).
int64_t tr_prompt_loader_index(tr_prompt_loader *l, int64_t k);
// Fills d with draws k .. k + count - 1, groups numbered 0 .. count - 1.
int tr_prompt_loader_draw(tr_prompt_loader *l, int64_t k, int32_t count, tr_prompt_draw *d,
                          tr_err *err);
void tr_prompt_draw_free(tr_prompt_draw *d);
