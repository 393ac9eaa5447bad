// Word -> ids cache for BPE, shared by all threads encoding with one tokenizer: words of up to
// 16 bytes that merge to at most 8 ids sit in a direct-mapped table of 64-byte slots guarded
// by per-slot sequence counters (a seqlock: readers retry nothing, they just miss on a torn
// read; a writer that finds the slot busy skips it). No locks, no allocation while encoding.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

// Slot words: 0 sequence (odd while written), 1 key length | id count << 8 | hash << 16,
// 2-3 key bytes, 4-7 ids (two per word).
enum { W_SEQ, W_META, W_KEY, W_IDS = 4, W_N = 8 };

int tr_tok_cache_init(tr_tok_cache *c, tr_err *err) {
    c->slots = calloc(TR_TOK_CACHE_SLOTS * W_N, sizeof *c->slots);
    if (!c->slots) return tr_errf(err, TR_ENOMEM, "out of memory for the word cache");
    return 0;
}

void tr_tok_cache_free(tr_tok_cache *c) {
    free((void *)c->slots);
    c->slots = NULL;
}

static void key_words(const uint8_t *w, size_t len, uint64_t k[2]) {
    uint8_t b[16] = {0};
    memcpy(b, w, len);
    memcpy(k, b, 16);
}

static uint64_t key_hash(const uint64_t k[2], size_t len) {
    uint64_t h = (k[0] ^ (k[1] * 0x9e3779b97f4a7c15ull) ^ len) * 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

bool tr_tok_cache_get(const tr_tok_cache *c, const uint8_t *w, size_t len, int32_t *ids, size_t *n) {
    if (!c->slots || len > TR_TOK_CACHE_KEY) return false;
    uint64_t k[2];
    key_words(w, len, k);
    uint64_t h = key_hash(k, len);
    _Atomic uint64_t *s = c->slots + (h & (TR_TOK_CACHE_SLOTS - 1)) * W_N;
    uint64_t seq = atomic_load_explicit(&s[W_SEQ], memory_order_acquire);
    if (seq & 1) return false;
    uint64_t v[W_N];
    for (int i = 1; i < W_N; i++) v[i] = atomic_load_explicit(&s[i], memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&s[W_SEQ], memory_order_relaxed) != seq) return false;
    uint64_t meta = (uint64_t)len | (h << 16);
    if ((v[W_META] & ~(uint64_t)0xff00) != meta || v[W_KEY] != k[0] || v[W_KEY + 1] != k[1])
        return false;
    size_t m = (v[W_META] >> 8) & 0xff;
    if (m == 0 || m > TR_TOK_CACHE_IDS) return false;
    for (size_t i = 0; i < m; i++) ids[i] = (int32_t)(uint32_t)(v[W_IDS + i / 2] >> (32 * (i % 2)));
    *n = m;
    return true;
}

void tr_tok_cache_put(const tr_tok_cache *c, const uint8_t *w, size_t len, const int32_t *ids, size_t n) {
    if (!c->slots || len > TR_TOK_CACHE_KEY || n == 0 || n > TR_TOK_CACHE_IDS) return;
    uint64_t k[2];
    key_words(w, len, k);
    uint64_t h = key_hash(k, len);
    _Atomic uint64_t *s = c->slots + (h & (TR_TOK_CACHE_SLOTS - 1)) * W_N;
    uint64_t seq = atomic_load_explicit(&s[W_SEQ], memory_order_relaxed);
    if ((seq & 1) || !atomic_compare_exchange_strong_explicit(&s[W_SEQ], &seq, seq + 1,
                                                              memory_order_acq_rel,
                                                              memory_order_relaxed))
        return;  // another thread is writing this slot
    atomic_thread_fence(memory_order_release);
    uint64_t v[W_N] = {0};
    v[W_META] = (uint64_t)len | (uint64_t)n << 8 | (h << 16);
    v[W_KEY] = k[0];
    v[W_KEY + 1] = k[1];
    for (size_t i = 0; i < n; i++) v[W_IDS + i / 2] |= (uint64_t)(uint32_t)ids[i] << (32 * (i % 2));
    for (int i = 1; i < W_N; i++) atomic_store_explicit(&s[i], v[i], memory_order_relaxed);
    atomic_store_explicit(&s[W_SEQ], seq + 2, memory_order_release);
}
