// Open-addressing hash maps for the tokenizer: byte strings -> ids (vocabularies) and id
// pairs -> (rank, merged id) (BPE merges). Built once at load, read-only afterwards, so any
// number of threads may look things up at once.
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer_impl.h"

static uint64_t hash_bytes(const void *key, size_t len) {
    // FNV-1a with a final mix; keys are short token strings.
    const uint8_t *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

int tr_tok_strmap_init(tr_tok_strmap *m, uint32_t expected, tr_err *err) {
    memset(m, 0, sizeof *m);
    uint32_t cap = 16;
    while (cap < 2u * expected + 16 && cap < (1u << 30)) cap <<= 1;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return tr_errf(err, TR_ENOMEM, "out of memory for a vocabulary of %u", expected);
    m->mask = cap - 1;
    return 0;
}

void tr_tok_strmap_free(tr_tok_strmap *m) {
    free(m->slots);
    free(m->entries);
    free(m->pool);
    memset(m, 0, sizeof *m);
}

static int strmap_grow(tr_tok_strmap *m, tr_err *err) {
    uint32_t cap = (m->mask + 1) * 2;
    uint32_t *slots = calloc(cap, sizeof *slots);
    if (!slots) return tr_errf(err, TR_ENOMEM, "out of memory growing a vocabulary map");
    for (uint32_t i = 0; i < m->n; i++) {
        const tr_tok_strmap_entry *e = &m->entries[i];
        uint64_t h = hash_bytes(m->pool + e->off, e->len);
        uint32_t s = (uint32_t)h & (cap - 1);
        while (slots[s]) s = (s + 1) & (cap - 1);
        slots[s] = i + 1;
    }
    free(m->slots);
    m->slots = slots;
    m->mask = cap - 1;
    return 0;
}

int tr_tok_strmap_put(tr_tok_strmap *m, const void *key, size_t len, int32_t val, tr_err *err) {
    if (len > UINT32_MAX) return tr_errf(err, TR_ERANGE, "token of %zu bytes is too long", len);
    if ((uint64_t)(m->n + 1) * 2 > (uint64_t)m->mask + 1 && strmap_grow(m, err)) return -1;
    uint64_t h = hash_bytes(key, len);
    uint32_t s = (uint32_t)h & m->mask;
    while (m->slots[s]) {
        tr_tok_strmap_entry *e = &m->entries[m->slots[s] - 1];
        if (e->len == len && memcmp(m->pool + e->off, key, len) == 0) {
            e->val = val;
            return 0;
        }
        s = (s + 1) & m->mask;
    }
    if (m->n == m->n_cap) {
        uint32_t nc = m->n_cap ? m->n_cap * 2 : 64;
        tr_tok_strmap_entry *ne = realloc(m->entries, (size_t)nc * sizeof *ne);
        if (!ne) return tr_errf(err, TR_ENOMEM, "out of memory growing a vocabulary map");
        m->entries = ne;
        m->n_cap = nc;
    }
    if (m->pool_len + len + 1 > m->pool_cap) {
        size_t nc = m->pool_cap ? m->pool_cap : 4096;
        while (nc < m->pool_len + len + 1) nc *= 2;
        char *np = realloc(m->pool, nc);
        if (!np) return tr_errf(err, TR_ENOMEM, "out of memory growing a vocabulary map");
        m->pool = np;
        m->pool_cap = nc;
    }
    if (len) memcpy(m->pool + m->pool_len, key, len);
    m->pool[m->pool_len + len] = '\0';
    m->entries[m->n] = (tr_tok_strmap_entry){.off = m->pool_len, .len = (uint32_t)len, .val = val};
    m->pool_len += len + 1;
    m->slots[s] = ++m->n;
    return 0;
}

int32_t tr_tok_strmap_get(const tr_tok_strmap *m, const void *key, size_t len) {
    if (!m->slots) return -1;
    uint32_t s = (uint32_t)hash_bytes(key, len) & m->mask;
    while (m->slots[s]) {
        const tr_tok_strmap_entry *e = &m->entries[m->slots[s] - 1];
        if (e->len == len && memcmp(m->pool + e->off, key, len) == 0) return e->val;
        s = (s + 1) & m->mask;
    }
    return -1;
}

static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static uint64_t hash_pair(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    k ^= k >> 29;
    return k;
}

int tr_tok_pairmap_init(tr_tok_pairmap *m, size_t expected, tr_err *err) {
    memset(m, 0, sizeof *m);
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)expected + 16) cap <<= 1;
    m->slots = malloc(cap * sizeof *m->slots);
    if (!m->slots) return tr_errf(err, TR_ENOMEM, "out of memory for %zu merges", expected);
    for (uint64_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
    return 0;
}

void tr_tok_pairmap_free(tr_tok_pairmap *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

void tr_tok_pairmap_put(tr_tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    // Sized by init for the number of merges in the file, so it is never more than half full.
    uint64_t k = pair_key(a, b);
    uint64_t s = hash_pair(k) & m->mask;
    while (m->slots[s].key != UINT64_MAX && m->slots[s].key != k) s = (s + 1) & m->mask;
    if (m->slots[s].key == UINT64_MAX) m->n++;
    m->slots[s] = (tr_tok_pair_slot){.key = k, .rank = rank, .id = id};
}

const tr_tok_pair_slot *tr_tok_pairmap_get(const tr_tok_pairmap *m, int32_t a, int32_t b) {
    uint64_t k = pair_key(a, b);
    uint64_t s = hash_pair(k) & m->mask;
    for (;;) {
        const tr_tok_pair_slot *p = &m->slots[s];
        if (p->key == k) return p;
        if (p->key == UINT64_MAX) return NULL;
        s = (s + 1) & m->mask;
    }
}
