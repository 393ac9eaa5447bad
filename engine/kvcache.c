// The KV block pool: a LIFO free list (a just-freed block is reused first, while it is still
// in cache), reference counts for blocks shared between the samples of one prompt, and copy
// on write for a shared partially filled block.
#include "engine/kvcache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"

static size_t block_bytes(const tr_model_config *cfg, int32_t block_size, tr_dt dt) {
    return (size_t)block_size * (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim * tr_dt_size(dt);
}

size_t tr_kvcache_bytes(const tr_model_config *cfg, int32_t block_size, int32_t n_blocks,
                        tr_dt dt) {
    return 2 * (size_t)cfg->n_layers * (size_t)n_blocks * block_bytes(cfg, block_size, dt);
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

size_t tr_kvcache_pool_bytes(const tr_model_config *cfg, int32_t block_size, int64_t max_tokens,
                             tr_dt dt) {
    if (block_size < 1 || max_tokens < 1) return 0;
    size_t n_blocks = (size_t)((max_tokens + block_size - 1) / block_size);
    size_t layers = (size_t)(cfg->n_layers > 0 ? cfg->n_layers : 1);
    return 2 * round64(layers * n_blocks * block_bytes(cfg, block_size, dt));
}

// The checks and bookkeeping shared by both inits; the pool memory is the caller's.
static int init_meta(tr_kvcache *c, const tr_model_config *cfg, int32_t block_size,
                     int64_t max_tokens, tr_dt dt, tr_err *err) {
    memset(c, 0, sizeof *c);
    if (block_size < 1 || block_size > 4096)
        return tr_errf(err, TR_EINVAL, "kv cache: block size must be in 1..4096, got %d",
                       block_size);
    if (max_tokens < 1)
        return tr_errf(err, TR_EINVAL, "kv cache: token budget must be >= 1, got %lld",
                       (long long)max_tokens);
    int64_t n_blocks = (max_tokens + block_size - 1) / block_size;
    if (n_blocks > INT32_MAX / 2)
        return tr_errf(err, TR_ERANGE, "kv cache: %lld blocks is too many", (long long)n_blocks);
    c->n_layers = cfg->n_layers;
    c->n_kv_heads = cfg->n_kv_heads;
    c->head_dim = cfg->head_dim;
    c->block_size = block_size;
    c->n_blocks = (int32_t)n_blocks;
    c->dt = dt;
    c->layer_bytes = (size_t)n_blocks * block_bytes(cfg, block_size, dt);
    c->refs = calloc((size_t)n_blocks, sizeof(int32_t));
    c->free_ids = malloc((size_t)n_blocks * sizeof(int32_t));
    c->cow_src = malloc((size_t)n_blocks * 3 * sizeof(int32_t));
    if (!c->refs || !c->free_ids || !c->cow_src) {
        tr_kvcache_free(c);
        return tr_errf(err, TR_ENOMEM, "kv cache: cannot allocate the tables of %lld blocks",
                       (long long)n_blocks);
    }
    c->cow_dst = c->cow_src + n_blocks;
    c->cow_slots = c->cow_dst + n_blocks;
    tr_kvcache_reset(c);
    return 0;
}

// The backend side of the copy-on-write queue (the pool memory is the caller's).
static int init_cow(tr_kvcache *c, tr_backend *be, tr_err *err) {
    c->be = be;
    c->d_cow = tr_dev_alloc(be, (size_t)c->n_blocks * 3 * sizeof(int32_t), "kv cache tables",
                            err);
    if (c->d_cow) return 0;
    tr_kvcache_free(c);
    return -1;
}

// K at buf, V from the next 64-byte boundary (what tr_kvcache_pool_bytes counts).
static void place_pool(tr_kvcache *c, void *buf) {
    size_t layers = (size_t)(c->n_layers > 0 ? c->n_layers : 1);
    c->k = buf;
    c->v = (char *)buf + round64(layers * c->layer_bytes);
}

int tr_kvcache_init(tr_kvcache *c, tr_backend *be, const tr_model_config *cfg,
                    int32_t block_size, int64_t max_tokens, tr_err *err) {
    if (init_meta(c, cfg, block_size, max_tokens, be->act, err) != 0 || init_cow(c, be, err) != 0)
        return -1;
    size_t bytes = tr_kvcache_pool_bytes(cfg, block_size, max_tokens, be->act);
    void *buf = tr_dev_alloc(be, bytes, "kv cache", err);
    if (!buf) {
        tr_kvcache_free(c);
        return -1;
    }
    place_pool(c, buf);
    c->owns_pool = true;
    return 0;
}

int tr_kvcache_init_in(tr_kvcache *c, tr_backend *be, const tr_model_config *cfg,
                       int32_t block_size, int64_t max_tokens, void *buf, size_t buf_bytes,
                       tr_err *err) {
    if (init_meta(c, cfg, block_size, max_tokens, be->act, err) != 0 || init_cow(c, be, err) != 0)
        return -1;
    size_t need = tr_kvcache_pool_bytes(cfg, block_size, max_tokens, be->act);
    if (!buf || buf_bytes < need || ((uintptr_t)buf % 64) != 0) {
        int32_t n_blocks = c->n_blocks;
        tr_kvcache_free(c);
        return tr_errf(err, TR_EINVAL, "kv cache: %d blocks of %d tokens need %zu bytes at a "
                       "64-byte boundary; the buffer given has %zu%s", n_blocks, block_size, need,
                       buf_bytes, buf && ((uintptr_t)buf % 64) != 0 ? " (misaligned)" : "");
    }
    place_pool(c, buf);
    return 0;
}

void tr_kvcache_free(tr_kvcache *c) {
    if (c->be) {
        if (c->owns_pool) tr_dev_free(c->be, c->k);
        tr_dev_free(c->be, c->d_cow);
    }
    free(c->refs);
    free(c->free_ids);
    free(c->cow_src);
    memset(c, 0, sizeof *c);
}

void tr_kvcache_reset(tr_kvcache *c) {
    // Free stack with block 0 on top, so a fresh pool hands out blocks in order.
    for (int32_t i = 0; i < c->n_blocks; i++) {
        c->refs[i] = 0;
        c->free_ids[i] = c->n_blocks - 1 - i;
    }
    c->n_free = c->n_blocks;
    c->n_cow = 0;
}

void tr_kvcache_rebind(tr_kvcache *c, void *buf) {
    if (!c->owns_pool) place_pool(c, buf);
    tr_kvcache_reset(c);
}

tr_kv_pages tr_kvcache_layer(const tr_kvcache *c, int32_t layer) {
    tr_kv_pages p = {.k_pool = (char *)c->k + (size_t)layer * c->layer_bytes,
                     .v_pool = (char *)c->v + (size_t)layer * c->layer_bytes,
                     .block_size = c->block_size, .n_blocks = c->n_blocks,
                     .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim};
    return p;
}

int32_t tr_kvcache_alloc(tr_kvcache *c) {
    if (c->n_free == 0) return -1;
    int32_t b = c->free_ids[--c->n_free];
    c->refs[b] = 1;
    return b;
}

void tr_kvcache_retain(tr_kvcache *c, int32_t block) { c->refs[block]++; }

void tr_kvcache_release(tr_kvcache *c, int32_t block) {
    if (--c->refs[block] == 0) c->free_ids[c->n_free++] = block;
}

void tr_kv_seq_init(tr_kv_seq *s, int32_t *table, int32_t cap) {
    s->blocks = table;
    s->cap = cap;
    s->n_blocks = 0;
    s->len = 0;
}

int32_t tr_kv_seq_blocks_needed(const tr_kvcache *c, const tr_kv_seq *s, int32_t pos) {
    int32_t bi = pos / c->block_size;
    if (bi >= s->n_blocks) return 1;
    return c->refs[s->blocks[bi]] > 1 ? 1 : 0;
}

int tr_kv_seq_prepare(tr_kvcache *c, tr_kv_seq *s, int32_t pos, tr_err *err) {
    int32_t bs = c->block_size, bi = pos / bs;
    if (bi > s->n_blocks || (bi == s->n_blocks && pos % bs != 0))
        return tr_errf(err, TR_EINVAL, "kv cache: position %d is past the end of a %d-block "
                       "sequence", pos, s->n_blocks);
    if (bi < s->n_blocks && c->refs[s->blocks[bi]] == 1) return 0;
    if (bi == s->n_blocks && bi >= s->cap)
        return tr_errf(err, TR_ERANGE, "kv cache: position %d needs block %d, the sequence's "
                       "table holds %d", pos, bi + 1, s->cap);
    int32_t nb = tr_kvcache_alloc(c);
    if (nb < 0)
        return tr_errf(err, TR_ENOMEM, "kv cache: all %d blocks are in use", c->n_blocks);
    if (bi == s->n_blocks) {
        s->blocks[s->n_blocks++] = nb;
        return 1;
    }
    // Shared block: copy the slots before pos (the others are about to be written or unused).
    // The old block keeps another holder, so it is not handed out again before the flush.
    int32_t old = s->blocks[bi];
    c->cow_src[c->n_cow] = old;
    c->cow_dst[c->n_cow] = nb;
    c->cow_slots[c->n_cow] = pos % bs;
    c->n_cow++;
    tr_kvcache_release(c, old);
    s->blocks[bi] = nb;
    return 1;
}

void tr_kvcache_flush(tr_kvcache *c) {
    if (c->n_cow == 0) return;
    const tr_ops *op = c->be->ops;
    size_t n = (size_t)c->n_cow * sizeof(int32_t), slot = (size_t)c->n_kv_heads * c->head_dim;
    int32_t *d = c->d_cow;
    op->upload(c->be, d, c->cow_src, n);
    op->upload(c->be, d + c->n_blocks, c->cow_dst, n);
    op->upload(c->be, d + 2 * (size_t)c->n_blocks, c->cow_slots, n);
    tr_kv_pool pool = {.k = c->k, .v = c->v, .layer_bytes = c->layer_bytes,
                       .n_layers = c->n_layers, .block_size = c->block_size,
                       .slot_bytes = slot * tr_dt_size(c->dt)};
    op->kv_copy_blocks(c->be, &pool, d, d + c->n_blocks, d + 2 * (size_t)c->n_blocks, c->n_cow);
    c->n_cow = 0;
}

int tr_kv_seq_fork(tr_kvcache *c, tr_kv_seq *dst, const tr_kv_seq *src, tr_err *err) {
    if (src->n_blocks > dst->cap)
        return tr_errf(err, TR_ERANGE, "kv cache: a %d-block sequence does not fit a %d-entry "
                       "table", src->n_blocks, dst->cap);
    for (int32_t i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        tr_kvcache_retain(c, src->blocks[i]);
    }
    dst->n_blocks = src->n_blocks;
    dst->len = src->len;
    return 0;
}

void tr_kv_seq_release(tr_kvcache *c, tr_kv_seq *s) {
    for (int32_t i = 0; i < s->n_blocks; i++) tr_kvcache_release(c, s->blocks[i]);
    s->n_blocks = 0;
    s->len = 0;
}
