// Paged KV cache for generation: one pool of fixed-size blocks sized once at start-up, shared
// by all layers (block b is the same token slots in every layer's K and V pool), a free list,
// reference counts so sequences can share blocks, and per-sequence block tables. Nothing here
// allocates after tr_kvcache_init; sequences only take blocks from and return them to the pool.
// Keys and values are in the backend's activation dtype; the pool may live in a caller's
// buffer (a worker arena, engine/arena.h).
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"
#include "kernels/ops.h"

typedef struct tr_kvcache {
    tr_backend *be;         // whose memory the pool is (not owned)
    int32_t n_layers, n_kv_heads, head_dim;
    int32_t block_size;     // token slots per block
    int32_t n_blocks;
    tr_dt dt;            // the backend's activation dtype
    size_t layer_bytes;     // bytes of one layer's K (or V) pool: n_blocks*block_size*KVH*D values
    void *k, *v;            // [n_layers][n_blocks][block_size][n_kv_heads][head_dim], backend
                            // memory; the tables below are the host's bookkeeping
    bool owns_pool;         // k and v were allocated here (false: the caller's buffer)
    int32_t *refs;          // [n_blocks] holders of each block; 0 = on the free list
    int32_t *free_ids;      // [n_blocks] stack of free blocks, top at n_free - 1
    int32_t n_free;
    // Copies on write queued by tr_kv_seq_prepare until tr_kvcache_flush runs them in one op:
    // host lists [n_blocks] each and their backend copy (3 x n_blocks).
    int32_t *cow_src, *cow_dst, *cow_slots;
    int32_t n_cow;
    int32_t *d_cow;
} tr_kvcache;

// A sequence's view of the cache: its block table (storage owned by the caller, cap entries)
// and how many token slots, from position 0, hold keys and values.
typedef struct tr_kv_seq {
    int32_t *blocks;
    int32_t cap;
    int32_t n_blocks;
    int32_t len;
} tr_kv_seq;

// Blocks covering positions [0, n_tokens).
static inline int32_t tr_kv_blocks_for(int64_t n_tokens, int32_t block_size) {
    return (int32_t)((n_tokens + block_size - 1) / block_size);
}

// Bytes of the keys and values of n_blocks blocks of block_size tokens in dtype dt (without
// the padding tr_kvcache_pool_bytes adds between K and V).
size_t tr_kvcache_bytes(const tr_model_config *cfg, int32_t block_size, int32_t n_blocks,
                        tr_dt dt);

// Bytes of the K and V pools of ceil(max_tokens / block_size) blocks as one buffer holds
// them: K first, V from the next 64-byte boundary. 0 when the arguments are out of range.
size_t tr_kvcache_pool_bytes(const tr_model_config *cfg, int32_t block_size, int64_t max_tokens,
                             tr_dt dt);

// Pool of ceil(max_tokens / block_size) blocks for cfg's layers and kv heads, in be's memory.
int tr_kvcache_init(tr_kvcache *c, tr_backend *be, const tr_model_config *cfg,
                    int32_t block_size, int64_t max_tokens, tr_err *err);
// The same pool with its K and V in buf (be's memory, 64-byte aligned, buf_bytes >=
// tr_kvcache_pool_bytes), which the cache never frees; only the bookkeeping is allocated.
int tr_kvcache_init_in(tr_kvcache *c, tr_backend *be, const tr_model_config *cfg,
                       int32_t block_size, int64_t max_tokens, void *buf, size_t buf_bytes,
                       tr_err *err);
void tr_kvcache_free(tr_kvcache *c);
// Every block back on the free list, handed out in order again as by a fresh pool. Keys and
// values already written are garbage from here on.
void tr_kvcache_reset(tr_kvcache *c);
// Moves a caller-buffer pool to buf (same size) and resets it; what the old buffer held is
// not carried over. For a region that other phases overwrite between generations.
void tr_kvcache_rebind(tr_kvcache *c, void *buf);

// The pages of one layer as attention_decode reads them.
tr_kv_pages tr_kvcache_layer(const tr_kvcache *c, int32_t layer);

// Takes a free block (reference count 1); -1 when the pool is empty.
int32_t tr_kvcache_alloc(tr_kvcache *c);
void tr_kvcache_retain(tr_kvcache *c, int32_t block);
// Drops one reference; the block returns to the free list when none are left.
void tr_kvcache_release(tr_kvcache *c, int32_t block);

void tr_kv_seq_init(tr_kv_seq *s, int32_t *table, int32_t cap);
// Makes position pos (== s->len or inside the last block) writable: takes a new block when
// pos opens one, or replaces a shared last block by a private copy of its first pos % bs
// slots in every layer (copy on write, queued: tr_kvcache_flush must run before the cache is
// read or written again). Returns the number of blocks taken (0 or 1), or -1 with err set
// when the pool is empty or the table is full.
int tr_kv_seq_prepare(tr_kvcache *c, tr_kv_seq *s, int32_t pos, tr_err *err);
// Runs the queued copies on write, all of them in one backend op.
void tr_kvcache_flush(tr_kvcache *c);
// Blocks tr_kv_seq_prepare would take for pos: 0 or 1 (no side effects).
int32_t tr_kv_seq_blocks_needed(const tr_kvcache *c, const tr_kv_seq *s, int32_t pos);
// dst (empty) shares every block of src: one more reference each, same length.
int tr_kv_seq_fork(tr_kvcache *c, tr_kv_seq *dst, const tr_kv_seq *src, tr_err *err);
// Drops the sequence's references and empties it.
void tr_kv_seq_release(tr_kvcache *c, tr_kv_seq *s);
// Slot index (block * block_size + offset) of position pos; the block must be in the table.
static inline int32_t tr_kv_seq_slot(const tr_kv_seq *s, int32_t pos, int32_t block_size) {
    return s->blocks[pos / block_size] * block_size + pos % block_size;
}

