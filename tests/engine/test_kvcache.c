// The KV block pool by hand: sizing, free-list order and exhaustion, reference counts of
// shared blocks, copy on write of a shared partial block (only the written prefix is copied,
// in every layer, and the original stays intact), table limits, slot addressing as
// attention_decode reads it, and a pool in a caller's buffer (placement, reset, rebinding).
#include <stdio.h>

#include "engine/kvcache.h"
#include "tests/backend_test.h"
#include "tests/test.h"

static tr_backend be;

static tr_model_config small_cfg(void) {
    tr_model_config c;
    memset(&c, 0, sizeof c);
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    return c;
}

// Value stored for (layer, position, channel) of sequence `tag`; K and V differ in sign.
static float val(int32_t tag, int32_t layer, int32_t pos, int32_t ch) {
    return (float)(tag * 10000 + layer * 1000 + pos * 10 + ch);
}

// Rows to write and their slot, in backend memory as the generator has them.
static float *dev_k, *dev_v;
static int32_t *dev_slot;

static void write_pos(tr_kvcache *c, const tr_kv_seq *s, int32_t tag, int32_t pos) {
    float k[8], v[8];
    for (int32_t l = 0; l < c->n_layers; l++) {
        for (int32_t ch = 0; ch < 8; ch++) {
            k[ch] = val(tag, l, pos, ch);
            v[ch] = -val(tag, l, pos, ch);
        }
        int32_t slot = tr_kv_seq_slot(s, pos, c->block_size);
        et_put(&be, dev_k, k, sizeof k);
        et_put(&be, dev_v, v, sizeof v);
        et_put(&be, dev_slot, &slot, sizeof slot);
        tr_kv_pages p = tr_kvcache_layer(c, l);
        be.ops->kv_write(&be, &p, dev_slot, dev_k, dev_v, 8, 1);
    }
}

// Whether positions [0, n) of s read back as sequence tag's values through the layer pages.
static bool reads_back(const tr_kvcache *c, const tr_kv_seq *s, int32_t tag, int32_t from,
                       int32_t n) {
    bool ok = true;
    for (int32_t l = 0; l < c->n_layers; l++) {
        tr_kv_pages p = tr_kvcache_layer(c, l);
        float *k = et_floats(&be, p.k_pool, c->layer_bytes / sizeof(float));
        float *v = et_floats(&be, p.v_pool, c->layer_bytes / sizeof(float));
        for (int32_t pos = from; pos < n; pos++) {
            size_t off = (size_t)tr_kv_seq_slot(s, pos, p.block_size) * p.n_kv_heads * p.head_dim;
            for (int32_t ch = 0; ch < 8; ch++)
                if (k[off + ch] != val(tag, l, pos, ch) || v[off + ch] != -val(tag, l, pos, ch))
                    ok = false;
        }
        free(k);
        free(v);
    }
    return ok;
}

int main(void) {
    tr_model_config cfg = small_cfg();
    tr_err err = {0};
    et_backend(&be, 1);
    dev_k = et_dev(&be, NULL, 8 * sizeof(float));
    dev_v = et_dev(&be, NULL, 8 * sizeof(float));
    dev_slot = et_dev(&be, NULL, sizeof(int32_t));
    tr_kvcache c;
    // 10 tokens in blocks of 4: 3 blocks; 2 layers x (K, V) x 3 x 4 x 2 x 4 floats.
    CHECK(tr_kvcache_init(&c, &be, &cfg, 4, 10, &err) == 0);
    CHECK(c.n_blocks == 3 && c.n_free == 3);
    CHECK(tr_kvcache_bytes(&cfg, 4, 3, TR_F32) == 2u * 2 * 3 * 4 * 2 * 4 * sizeof(float));
    CHECK(tr_kvcache_bytes(&cfg, 4, 3, TR_BF16) == 2u * 2 * 3 * 4 * 2 * 4 * 2);
    tr_kvcache bad;
    CHECK(tr_kvcache_init(&bad, &be, &cfg, 0, 10, &err) != 0 && strstr(err.msg, "block size"));

    // Free list: a fresh pool hands out 0, 1, 2; then it is empty; a freed block comes back.
    CHECK(tr_kvcache_alloc(&c) == 0 && tr_kvcache_alloc(&c) == 1 && tr_kvcache_alloc(&c) == 2);
    CHECK(tr_kvcache_alloc(&c) == -1 && c.n_free == 0);
    tr_kvcache_release(&c, 1);
    CHECK(c.n_free == 1 && c.refs[1] == 0 && tr_kvcache_alloc(&c) == 1);
    tr_kvcache_retain(&c, 2);
    tr_kvcache_release(&c, 2);
    CHECK(c.refs[2] == 1 && c.n_free == 0);   // still held once
    for (int32_t b = 0; b < 3; b++) tr_kvcache_release(&c, b);
    CHECK(c.n_free == 3);

    // A sequence grows one block per 4 positions.
    int32_t ta[3], tb[3], tc[1];
    tr_kv_seq a, b, s1;
    tr_kv_seq_init(&a, ta, 3);
    int32_t took = 0;
    for (int32_t pos = 0; pos < 6; pos++) {
        CHECK(tr_kv_seq_blocks_needed(&c, &a, pos) == (pos % 4 == 0));
        int32_t t = tr_kv_seq_prepare(&c, &a, pos, &err);
        CHECK(t == (pos % 4 == 0));
        took += t;
        a.len = pos + 1;
        write_pos(&c, &a, 1, pos);
    }
    CHECK(took == 2 && a.n_blocks == 2 && c.n_free == 1);
    CHECK(reads_back(&c, &a, 1, 0, 6));
    // Positions past the end are refused.
    CHECK(tr_kv_seq_prepare(&c, &a, 9, &err) == -1 && strstr(err.msg, "past the end"));

    // Fork: b shares both blocks; writing position 6 (inside the shared, partly filled
    // block 1) copies slots 4 and 5 of every layer into a private block.
    tr_kv_seq_init(&b, tb, 3);
    CHECK(tr_kv_seq_fork(&c, &b, &a, &err) == 0);
    CHECK(b.len == 6 && b.n_blocks == 2 && c.refs[ta[0]] == 2 && c.refs[ta[1]] == 2);
    int32_t shared_block = ta[1];
    CHECK(tr_kv_seq_blocks_needed(&c, &b, 6) == 1);
    CHECK(tr_kv_seq_prepare(&c, &b, 6, &err) == 1);
    tr_kvcache_flush(&c);
    CHECK(b.blocks[0] == a.blocks[0] && b.blocks[1] != shared_block);
    CHECK(c.refs[shared_block] == 1 && c.refs[b.blocks[1]] == 1 && c.refs[ta[0]] == 2);
    CHECK(reads_back(&c, &b, 1, 0, 6));   // the prefix came along
    b.len = 7;
    write_pos(&c, &b, 2, 6);
    CHECK(reads_back(&c, &b, 2, 6, 7));
    // a's block is untouched by b's write, and a, now the only holder, writes in place.
    CHECK(reads_back(&c, &a, 1, 0, 6));
    CHECK(tr_kv_seq_prepare(&c, &a, 6, &err) == 0 && a.blocks[1] == shared_block);
    CHECK(c.n_free == 0);

    // Pool empty: growth fails with a message, nothing changes.
    CHECK(tr_kv_seq_prepare(&c, &b, 8, &err) == -1 && strstr(err.msg, "in use"));
    CHECK(b.n_blocks == 2);
    // A table too small for a fork or for growth.
    tr_kv_seq_init(&s1, tc, 1);
    CHECK(tr_kv_seq_fork(&c, &s1, &a, &err) == -1);
    tr_kv_seq_release(&c, &b);
    CHECK(c.n_free == 1 && c.refs[ta[0]] == 1);
    tr_kv_seq_init(&s1, tc, 1);
    CHECK(tr_kv_seq_prepare(&c, &s1, 0, &err) == 1);
    CHECK(tr_kv_seq_prepare(&c, &s1, 4, &err) == -1 && strstr(err.msg, "table"));
    tr_kv_seq_release(&c, &s1);
    tr_kv_seq_release(&c, &a);
    CHECK(c.n_free == 3 && a.n_blocks == 0 && a.len == 0);
    for (int32_t i = 0; i < 3; i++) CHECK(c.refs[i] == 0);

    // Layer pages: layer 1's pool starts one layer's floats after layer 0's.
    tr_kv_pages p0 = tr_kvcache_layer(&c, 0), p1 = tr_kvcache_layer(&c, 1);
    CHECK((char *)p1.k_pool - (char *)p0.k_pool == 3 * 4 * 2 * 4 * sizeof(float) &&
          p0.n_blocks == 3 && p0.block_size == 4);
    CHECK(p0.n_kv_heads == 2 && p0.head_dim == 4);
    tr_kvcache_free(&c);

    // The pool in a caller's buffer: 2 layers x 3 blocks x 4 x 8 = 192 floats of K, V from
    // the next 64-byte boundary (192 floats already is one); the cache never frees the buffer.
    CHECK(tr_kvcache_pool_bytes(&cfg, 4, 10, TR_F32) == 2 * 192 * sizeof(float));
    CHECK(tr_kvcache_pool_bytes(&cfg, 4, 9, TR_F32) == 2 * 192 * sizeof(float));
    CHECK(tr_kvcache_pool_bytes(&cfg, 4, 10, TR_BF16) == 2 * 192 * 2);
    // One layer, one kv head of 2: 2 blocks of 3 tokens are 12 floats of K, V at 16.
    tr_model_config tiny = cfg;
    tiny.n_layers = 1;
    tiny.n_kv_heads = 1;
    tiny.head_dim = 2;
    CHECK(tr_kvcache_pool_bytes(&tiny, 3, 5, TR_F32) == 2 * 16 * sizeof(float) &&
          tr_kvcache_pool_bytes(&tiny, 3, 0, TR_F32) == 0);
    float *buf[2] = {et_dev(&be, NULL, (2 * 192 + 16) * sizeof(float)),
                     et_dev(&be, NULL, (2 * 192 + 16) * sizeof(float))};
    const size_t pool = 2 * 192 * sizeof(float);
    CHECK(tr_kvcache_init_in(&c, &be, &cfg, 4, 10, buf[0], pool, &err) == 0);
    CHECK(c.k == buf[0] && c.v == (void *)(buf[0] + 192) && c.n_blocks == 3 && !c.owns_pool);
    CHECK(tr_kvcache_init_in(&bad, &be, &cfg, 4, 10, buf[0], pool - 1, &err) != 0 &&
          strstr(err.msg, "1536"));
    CHECK(tr_kvcache_init_in(&bad, &be, &cfg, 4, 10, buf[0] + 1, pool, &err) != 0 &&
          strstr(err.msg, "misaligned"));
    // Used out of order, then reset: every block free and handed out 0, 1, 2 again.
    tr_kv_seq_init(&a, ta, 3);
    for (int32_t pos = 0; pos < 10; pos++) {
        CHECK(tr_kv_seq_prepare(&c, &a, pos, &err) >= 0);
        a.len = pos + 1;
        write_pos(&c, &a, 3, pos);
    }
    CHECK(reads_back(&c, &a, 3, 0, 10));
    tr_kvcache_release(&c, ta[0]);
    tr_kvcache_reset(&c);
    CHECK(c.n_free == 3 && c.refs[0] == 0 && c.refs[1] == 0 && c.refs[2] == 0);
    CHECK(tr_kvcache_alloc(&c) == 0 && tr_kvcache_alloc(&c) == 1 && tr_kvcache_alloc(&c) == 2);
    // Rebinding moves the pool (nothing carried over) and empties it.
    tr_kvcache_rebind(&c, buf[1]);
    CHECK(c.k == buf[1] && c.v == (void *)(buf[1] + 192) && c.n_free == 3);
    tr_kv_pages pb = tr_kvcache_layer(&c, 1);
    CHECK(pb.k_pool == (void *)(buf[1] + 96) && pb.v_pool == (void *)(buf[1] + 192 + 96));
    tr_kvcache_free(&c);
    be.ops->free(&be, buf[0]);
    be.ops->free(&be, buf[1]);
    be.ops->free(&be, dev_k);
    be.ops->free(&be, dev_v);
    be.ops->free(&be, dev_slot);
    tr_backend_free(&be);
    return tr_test_summary("test_kvcache");
}
