// Buffer ops of the CPU backend against host loops written here: fill, gather_rows and
// scatter_rows for row sizes of every alignment (bytes around each written range untouched),
// kv_copy_blocks against a copy of the layout's arithmetic, copy_2d's blocks of rows,
// decode_rows against its definition, and convert: every bf16 pattern through fp32 and back,
// ties to even, random fp32 patterns against a rounding reference that measures distances in
// double, every fp16 pattern to fp32 and bf16, and same-dtype copies.
// All buffers are backend memory, so the test also runs under TROUPE_CPU_GUARD=1.
#include "tests/backend_test.h"
#include "tests/kernels/kernels_test.h"

static tr_backend be;


static uint8_t *rand_bytes(size_t n) {
    uint8_t *b = kt_malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((kt_uniform() + 1.0) * 128.0);
    return b;
}

// fill of x[off, off + n) inside a larger buffer: exactly those floats become value.
static void check_fill(size_t total, size_t off, size_t n, float value) {
    float *h = kt_rand(total, 1.0), *got = kt_floats(total);
    float *d = et_dev(&be, h, total * sizeof(float));
    be.ops->fill(&be, d + off, value, n);
    et_get(&be, got, d, total * sizeof(float));
    int ok = 1;
    for (size_t i = 0; i < total; i++) {
        float want = i >= off && i < off + n ? value : h[i];
        ok &= memcmp(&got[i], &want, sizeof want) == 0;
    }
    CHECKF(ok, "fill of %zu floats at %zu (value %g)", n, off, (double)value);
    be.ops->free(&be, d);
    free(h);
    free(got);
}

// gather of n rows out of n_src (idx with repeats), then scatter of the gathered rows back
// to distinct rows of a second buffer; rows untouched by the scatter keep their bytes.
static void check_rows(int32_t n_src, int32_t n, size_t row_bytes) {
    size_t src_bytes = (size_t)n_src * row_bytes, out_bytes = (size_t)n * row_bytes;
    uint8_t *src = rand_bytes(src_bytes), *dst0 = rand_bytes(src_bytes);
    uint8_t *got = kt_malloc(src_bytes + out_bytes);
    int32_t *gidx = kt_malloc((size_t)n * sizeof(int32_t));
    int32_t *sidx = kt_malloc((size_t)n_src * sizeof(int32_t));
    for (int32_t r = 0; r < n; r++) gidx[r] = (int32_t)((kt_uniform() + 1.0) * 0.5 * n_src) % n_src;
    gidx[0] = n_src - 1;   // the last row: its end is the buffer's end
    for (int32_t i = 0; i < n_src; i++) sidx[i] = i;
    for (int32_t i = n_src - 1; i > 0; i--) {   // distinct targets: a shuffled prefix
        int32_t r = (int32_t)((kt_uniform() + 1.0) * 0.5 * (i + 1)) % (i + 1), t = sidx[i];
        sidx[i] = sidx[r];
        sidx[r] = t;
    }
    int32_t ns = n < n_src ? n : n_src;
    uint8_t *d_src = et_dev(&be, src, src_bytes), *d_out = et_dev(&be, NULL, out_bytes);
    uint8_t *d_dst = et_dev(&be, dst0, src_bytes);
    int32_t *d_gidx = et_dev(&be, gidx, (size_t)n * sizeof(int32_t));
    int32_t *d_sidx = et_dev(&be, sidx, (size_t)ns * sizeof(int32_t));
    be.ops->gather_rows(&be, d_out, d_src, d_gidx, n, row_bytes);
    be.ops->scatter_rows(&be, d_dst, d_out, d_sidx, ns, row_bytes);
    et_get(&be, got, d_out, out_bytes);
    int ok = 1;
    for (int32_t r = 0; r < n; r++)
        ok &= memcmp(got + (size_t)r * row_bytes, src + (size_t)gidx[r] * row_bytes, row_bytes) == 0;
    CHECKF(ok, "gather_rows: %d of %d rows of %zu bytes", n, n_src, row_bytes);
    et_get(&be, got, d_dst, src_bytes);
    uint8_t *want = kt_malloc(src_bytes);
    memcpy(want, dst0, src_bytes);
    for (int32_t r = 0; r < ns; r++)
        memcpy(want + (size_t)sidx[r] * row_bytes, src + (size_t)gidx[r] * row_bytes, row_bytes);
    CHECKF(memcmp(got, want, src_bytes) == 0, "scatter_rows: %d rows of %zu bytes", ns,
           row_bytes);
    be.ops->free(&be, d_src);
    be.ops->free(&be, d_out);
    be.ops->free(&be, d_dst);
    be.ops->free(&be, d_gidx);
    be.ops->free(&be, d_sidx);
    free(src); free(dst0); free(got); free(gidx); free(sidx); free(want);
}

// n = 0 touches nothing.
static void check_rows_empty(void) {
    uint8_t h[64], got[64];
    for (int i = 0; i < 64; i++) h[i] = (uint8_t)i;
    uint8_t *d = et_dev(&be, h, 64);
    int32_t *idx = et_dev(&be, NULL, sizeof(int32_t));
    be.ops->gather_rows(&be, d, d + 32, idx, 0, 16);
    be.ops->scatter_rows(&be, d, d + 32, idx, 0, 16);
    et_get(&be, got, d, 64);
    CHECK(memcmp(got, h, 64) == 0);
    be.ops->free(&be, d);
    be.ops->free(&be, idx);
}

// decode_rows over n rows of tables w blocks wide (block size bs), from random last-step
// state; every third row patched (some as padding), the rest continuing: each output against
// the op's definition written out here. With emb (tensor parallelism) the ids as rows of a
// vocabulary slice [v0, v0 + V) that holds some of them.
static void check_decode_rows(int32_t n, int32_t w, int32_t bs, bool emb) {
    size_t ni = (size_t)n * sizeof(int32_t);
    int32_t *pos = kt_malloc(ni), *drawn = kt_malloc(ni), *tables = kt_malloc(ni * w);
    int32_t *patch = kt_malloc(ni * 3 + sizeof(int32_t)), *got = kt_malloc(ni + sizeof(int32_t));
    int32_t *ids = kt_malloc(ni), *want_pos = kt_malloc(ni);
    for (int32_t r = 0; r < n; r++) {
        pos[r] = (int32_t)((kt_uniform() + 1.0) * 0.5 * (w * bs - 1)) % (w * bs - 1);
        drawn[r] = 1000 + r;
        for (int32_t j = 0; j < w; j++) tables[r * w + j] = 7 * r + 3 * j + 1;
    }
    patch[0] = 0;
    for (int32_t r = 0; r < n; r += 3) {
        int32_t *e = patch + 1 + 3 * patch[0]++;
        e[0] = r;
        e[1] = 50 + r;
        e[2] = r % 2 ? -1 : (r * 5) % (w * bs);
    }
    int32_t *d_ids = et_dev(&be, NULL, ni), *d_pos = et_dev(&be, pos, ni);
    int32_t *d_slot = et_dev(&be, NULL, ni), *d_len = et_dev(&be, NULL, ni);
    int32_t *d_doc = et_dev(&be, NULL, ni + sizeof(int32_t)), *d_drawn = et_dev(&be, drawn, ni);
    int32_t *d_patch = et_dev(&be, patch, (1 + 3 * (size_t)patch[0]) * sizeof(int32_t));
    int32_t *d_tables = et_dev(&be, tables, ni * w), *d_emb = emb ? et_dev(&be, NULL, ni) : NULL;
    const int32_t v0 = 1000 + n / 2, V = n / 4 + 1;
    be.ops->decode_rows(&be, &(tr_decode_rows_args){.ids = d_ids, .pos = d_pos, .slot = d_slot,
                                                    .len = d_len, .doc_start = d_doc,
                                                    .emb_ids = d_emb, .drawn = d_drawn,
                                                    .patch = d_patch, .tables = d_tables, .w = w,
                                                    .bs = bs, .n = n, .v0 = v0, .V = V});
    int ok_ids = 1, ok_pos = 1, ok_len = 1, ok_slot = 1, ok_doc = 1, ok_emb = 1;
    int32_t *emb_ids = kt_malloc(ni);
    if (emb) et_get(&be, emb_ids, d_emb, ni);
    et_get(&be, ids, d_ids, ni);
    et_get(&be, got, d_pos, ni);
    for (int32_t r = 0; r < n; r++) {
        int32_t id = drawn[r], p = pos[r] + 1;
        if (r % 3 == 0) {   // patched, odd rows as padding
            id = r % 2 ? 0 : 50 + r;
            p = r % 2 ? 0 : (r * 5) % (w * bs);
        }
        want_pos[r] = p;
        ok_ids &= ids[r] == id;
        if (emb) ok_emb &= emb_ids[r] == (id >= v0 && id < v0 + V ? id - v0 : -1);
        ok_pos &= got[r] == p;
    }
    et_get(&be, got, d_len, ni);
    for (int32_t r = 0; r < n; r++) ok_len &= got[r] == want_pos[r] + 1;
    et_get(&be, got, d_slot, ni);
    for (int32_t r = 0; r < n; r++) {
        int32_t p = want_pos[r];
        const bool pad = r % 3 == 0 && r % 2;
        ok_slot &= got[r] == (pad ? -1 : tables[r * w + p / bs] * bs + p % bs);
    }
    et_get(&be, got, d_doc, ni + sizeof(int32_t));
    for (int32_t r = 0; r <= n; r++) ok_doc &= got[r] == r;
    CHECKF(ok_ids && ok_pos && ok_len && ok_slot && ok_doc && ok_emb,
           "decode_rows, %d rows: ids %d positions %d lengths %d slots %d documents %d "
           "embedding rows %d", n, ok_ids, ok_pos, ok_len, ok_slot, ok_doc, ok_emb);
    int32_t *bufs[] = {d_ids, d_pos, d_slot, d_len, d_doc, d_drawn, d_patch, d_tables, d_emb};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be.ops->free(&be, bufs[i]);
    free(pos); free(drawn); free(tables); free(patch); free(got); free(ids); free(want_pos);
    free(emb_ids);
}

// copy_2d of a rows x width block at (r0, c0) of a rows_src x ld_src byte matrix into
// (r1, c1) of a rows_dst x ld_dst one: exactly the block changes.
static void check_copy_2d(size_t ld_src, size_t ld_dst, size_t r0, size_t c0, size_t r1, size_t c1,
                          size_t width, size_t rows) {
    size_t src_bytes = (r0 + rows + 1) * ld_src, dst_bytes = (r1 + rows + 2) * ld_dst;
    uint8_t *src = rand_bytes(src_bytes), *dst = rand_bytes(dst_bytes), *got = kt_malloc(dst_bytes);
    uint8_t *d_src = et_dev(&be, src, src_bytes), *d_dst = et_dev(&be, dst, dst_bytes);
    be.ops->copy_2d(&be, d_dst + r1 * ld_dst + c1, ld_dst, d_src + r0 * ld_src + c0, ld_src, width, rows);
    et_get(&be, got, d_dst, dst_bytes);
    for (size_t r = 0; r < rows; r++) memcpy(dst + (r1 + r) * ld_dst + c1, src + (r0 + r) * ld_src + c0, width);
    CHECKF(memcmp(got, dst, dst_bytes) == 0, "copy_2d of %zu rows x %zu bytes (pitches %zu, %zu)", rows, width,
           ld_src, ld_dst);
    be.ops->free(&be, d_src);
    be.ops->free(&be, d_dst);
    free(src);
    free(dst);
    free(got);
}

// A pool of L layers x NB blocks x BS slots of `slot` bytes in K and V; pairs copy the first
// n_slots of a block over another one. The reference addresses bytes as
// ((layer * NB + block) * BS + slot) * slot_bytes, the layout kvcache.h describes.
static void check_kv_copy(int32_t L, int32_t NB, int32_t BS, size_t slot, int32_t n,
                          const int32_t *src, const int32_t *dst, const int32_t *n_slots) {
    size_t layer = (size_t)NB * BS * slot, bytes = (size_t)L * layer;
    uint8_t *k = rand_bytes(bytes), *v = rand_bytes(bytes);
    uint8_t *wk = kt_malloc(bytes), *wv = kt_malloc(bytes), *gk = kt_malloc(bytes);
    uint8_t *gv = kt_malloc(bytes);
    memcpy(wk, k, bytes);
    memcpy(wv, v, bytes);
    for (int32_t i = 0; i < n; i++)
        for (int32_t l = 0; l < L; l++)
            for (int32_t s = 0; s < n_slots[i]; s++) {
                size_t from = (((size_t)l * NB + src[i]) * BS + s) * slot;
                size_t to = (((size_t)l * NB + dst[i]) * BS + s) * slot;
                memcpy(wk + to, k + from, slot);
                memcpy(wv + to, v + from, slot);
            }
    size_t ni = (size_t)(n > 0 ? n : 1) * sizeof(int32_t);
    tr_kv_pool pool = {.k = et_dev(&be, k, bytes), .v = et_dev(&be, v, bytes), .layer_bytes = layer,
                       .n_layers = L, .block_size = BS, .slot_bytes = slot};
    int32_t *d_src = et_dev(&be, NULL, ni), *d_dst = et_dev(&be, NULL, ni), *d_n = et_dev(&be, NULL, ni);
    if (n > 0) {
        be.ops->upload(&be, d_src, src, (size_t)n * sizeof(int32_t));
        be.ops->upload(&be, d_dst, dst, (size_t)n * sizeof(int32_t));
        be.ops->upload(&be, d_n, n_slots, (size_t)n * sizeof(int32_t));
    }
    be.ops->kv_copy_blocks(&be, &pool, d_src, d_dst, d_n, n);
    et_get(&be, gk, pool.k, bytes);
    et_get(&be, gv, pool.v, bytes);
    CHECKF(memcmp(gk, wk, bytes) == 0 && memcmp(gv, wv, bytes) == 0,
           "kv_copy_blocks: %d layers, %d pairs, %zu-byte slots", L, n, slot);
    be.ops->free(&be, pool.k);
    be.ops->free(&be, pool.v);
    be.ops->free(&be, d_src);
    be.ops->free(&be, d_dst);
    be.ops->free(&be, d_n);
    free(k); free(v); free(wk); free(wv); free(gk); free(gv);
}

static void check_casts(void) {
    // every bf16 pattern: to fp32 is the pattern shifted up; back to bf16 is the pattern
    const size_t NB = 65536;
    uint16_t *all = kt_malloc(NB * sizeof(uint16_t)), *back = kt_malloc(NB * sizeof(uint16_t));
    float *wide = kt_floats(NB);
    for (size_t i = 0; i < NB; i++) all[i] = (uint16_t)i;
    uint16_t *d_all = et_dev(&be, all, NB * sizeof(uint16_t)), *d_back = et_dev(&be, NULL, NB * sizeof(uint16_t));
    float *d_wide = et_dev(&be, NULL, NB * sizeof(float));
    be.ops->convert(&be, d_wide, TR_F32, d_all, TR_BF16, NB);
    be.ops->convert(&be, d_back, TR_BF16, d_wide, TR_F32, NB);
    et_get(&be, wide, d_wide, NB * sizeof(float));
    et_get(&be, back, d_back, NB * sizeof(uint16_t));
    int ok_wide = 1, ok_back = 1;
    for (size_t i = 0; i < NB; i++) {
        ok_wide &= kt_bits_of_f32(wide[i]) == (uint32_t)i << 16;
        ok_back &= back[i] == all[i];
    }
    CHECKF(ok_wide, "bf16 -> fp32 is not the pattern shifted up for every bf16");
    CHECKF(ok_back, "bf16 -> fp32 -> bf16 is not the identity for every bf16");
    be.ops->free(&be, d_all);
    be.ops->free(&be, d_back);
    be.ops->free(&be, d_wide);

    // fp32 inputs: for each finite bf16 h, the tie above it, just below and just above the
    // tie; then specials and random patterns
    const size_t NR = 1u << 20;
    size_t n = 3 * NB + NR + 16;
    uint32_t *in = kt_malloc(n * sizeof(uint32_t));
    size_t m = 0;
    for (size_t h = 0; h < NB; h++) {
        if ((h & 0x7f80u) == 0x7f80u) continue;   // inf and NaN: no tie above them
        uint32_t b = (uint32_t)h << 16;
        in[m++] = b | 0x8000u;
        in[m++] = b | 0x7fffu;
        in[m++] = b | 0x8001u;
    }
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                       0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
                                       0x00000001u, 0x80008000u, 0x00018000u, 0x7f800001u,
                                       0xff800001u, 0x7fc00000u, 0x7f810000u, 0xffffffffu};
    for (size_t i = 0; i < 16; i++) in[m++] = special[i];
    for (size_t i = 0; i < NR; i++) {
        uint32_t a = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        uint32_t b = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        in[m++] = a << 16 | b;
    }
    uint16_t *out = kt_malloc(m * sizeof(uint16_t));
    float *d_in = et_dev(&be, in, m * sizeof(float));
    uint16_t *d_out = et_dev(&be, NULL, m * sizeof(uint16_t));
    be.ops->convert(&be, d_out, TR_BF16, d_in, TR_F32, m);
    et_get(&be, out, d_out, m * sizeof(uint16_t));
    size_t bad = 0;
    for (size_t i = 0; i < m; i++) {
        float x = kt_f32_of_bits(in[i]);
        int ok;
        if (x != x) {   // NaN in, NaN of the same sign out
            uint16_t h = out[i];
            ok = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0 && (h >> 15) == (in[i] >> 31);
        } else {
            ok = out[i] == kt_bf16(x);
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "convert fp32 0x%08x to bf16 = 0x%04x, want 0x%04x\n", in[i], out[i],
                    kt_bf16(x));
    }
    CHECKF(bad == 0, "convert fp32 to bf16: %zu of %zu wrong", bad, m);
    // named cases: ties go to the even pattern, overflow past the last tie goes to inf
    CHECK(out[0] == 0x0000 && out[1] == 0x0000 && out[2] == 0x0001);   // 0 + tie, below, above
    size_t s0 = m - NR - 16;
    CHECK(out[s0 + 1] == 0x8000 && out[s0 + 6] == 0x7f80 && out[s0 + 7] == 0x7f7f);
    CHECK(out[s0 + 9] == 0x8000 && out[s0 + 10] == 0x0002);   // -0 tie stays -0; odd tie up
    CHECK(out[s0 + 11] == 0x7fc0 && out[s0 + 12] == 0xffc0 && out[s0 + 14] == 0x7f81);   // NaNs
    be.ops->free(&be, d_in);
    be.ops->free(&be, d_out);
    free(all); free(back); free(wide); free(in); free(out);
}

// The value of an IEEE half, from its fields: exact in double, so in fp32 too.
static float f16_ref(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double mag;
    if (e == 0x1f) {
        if (m == 0) mag = INFINITY;
        else return kt_f32_of_bits((uint32_t)(h & 0x8000) << 16 | 0x7f800000u | (uint32_t)m << 13);
    } else {
        mag = e == 0 ? ldexp((double)m, -24) : ldexp(1024.0 + m, e - 25);
    }
    return (float)((h & 0x8000) ? -mag : mag);
}

// Every fp16 pattern to fp32 (exact: subnormals, infinities, signed zeros, NaN payloads) and
// to bf16 (through fp32, rounded once); and the same dtype on both sides copies bytes as they
// are, NaN payloads included.
static void check_convert_f16(void) {
    const size_t NB = 65536;
    uint16_t *all = kt_malloc(NB * sizeof(uint16_t)), *b16 = kt_malloc(NB * sizeof(uint16_t));
    float *f32 = kt_floats(NB);
    for (size_t i = 0; i < NB; i++) all[i] = (uint16_t)i;
    uint16_t *d_all = et_dev(&be, all, NB * 2), *d_b16 = et_dev(&be, NULL, NB * 2);
    float *d_f32 = et_dev(&be, NULL, NB * 4);
    be.ops->convert(&be, d_f32, TR_F32, d_all, TR_F16, NB);
    be.ops->convert(&be, d_b16, TR_BF16, d_all, TR_F16, NB);
    et_get(&be, f32, d_f32, NB * 4);
    et_get(&be, b16, d_b16, NB * 2);
    size_t bad32 = 0, bad16 = 0;
    for (size_t i = 0; i < NB; i++) {
        float want = f16_ref((uint16_t)i);
        if (kt_bits_of_f32(f32[i]) != kt_bits_of_f32(want) && bad32++ < 3)
            fprintf(stderr, "fp16 0x%04zx to fp32: 0x%08x, want 0x%08x\n", i,
                    kt_bits_of_f32(f32[i]), kt_bits_of_f32(want));
        if (b16[i] != kt_bf16(want) && bad16++ < 3)
            fprintf(stderr, "fp16 0x%04zx to bf16: 0x%04x, want 0x%04x\n", i, b16[i],
                    kt_bf16(want));
    }
    CHECKF(bad32 == 0, "convert fp16 to fp32: %zu of %zu wrong", bad32, NB);
    CHECKF(bad16 == 0, "convert fp16 to bf16: %zu of %zu wrong", bad16, NB);
    // named cases: the smallest subnormal, the largest normal, -0, inf, a NaN's payload
    CHECK(f32[0x0001] == ldexpf(1.0f, -24) && f32[0x7bff] == 65504.0f);
    CHECK(kt_bits_of_f32(f32[0x8000]) == 0x80000000u && f32[0x7c00] == INFINITY);
    CHECK(kt_bits_of_f32(f32[0x7e01]) == 0x7fc02000u);

    // copies: odd sizes of random bytes (NaN patterns among them)
    size_t n = 200003;
    uint8_t *bytes = rand_bytes(4 * n), *got = kt_malloc(4 * n);
    uint8_t *d_src = et_dev(&be, bytes, 4 * n), *d_dst = et_dev(&be, NULL, 4 * n);
    be.ops->convert(&be, d_dst, TR_F32, d_src, TR_F32, n);
    et_get(&be, got, d_dst, 4 * n);
    CHECKF(memcmp(got, bytes, 4 * n) == 0, "convert fp32 to fp32 is not a copy");
    memset(got, 0, 4 * n);
    et_put(&be, d_dst, got, 4 * n);
    be.ops->convert(&be, d_dst, TR_BF16, d_src, TR_BF16, n);
    et_get(&be, got, d_dst, 4 * n);
    int copied = memcmp(got, bytes, 2 * n) == 0;
    for (size_t i = 2 * n; i < 4 * n; i++) copied &= got[i] == 0;   // nothing past 2n bytes
    CHECKF(copied, "convert bf16 to bf16 is not a copy of n elements");
    be.ops->free(&be, d_all);
    be.ops->free(&be, d_b16);
    be.ops->free(&be, d_f32);
    be.ops->free(&be, d_src);
    be.ops->free(&be, d_dst);
    free(all); free(b16); free(f32); free(bytes); free(got);
}

int main(void) {
    kt_seed(21);
    kt_backend_dev(&be, 2, TR_F32);
    check_fill(1000, 0, 1000, 1.5f);
    check_fill(300000, 17, 200001, -0.0f);   // several tasks, both ends inside the buffer
    check_fill(64, 3, 0, 7.0f);
    check_fill(64, 5, 50, NAN);
    static const size_t row_sizes[] = {1, 3, 4, 6, 16, 20, 100, 4100, 70000};
    for (size_t i = 0; i < sizeof row_sizes / sizeof row_sizes[0]; i++) {
        check_rows(37, 50, row_sizes[i]);
        check_rows(5, 3, row_sizes[i]);
    }
    check_rows(1000, 5000, 64);   // many rows: several tasks
    check_rows_empty();
    // 3 layers of 8 blocks of 4 slots; pairs with no, some and all slots, two from one block
    // (two forks of a shared block); float and odd slot sizes
    static const int32_t src[] = {0, 5, 2, 0}, dst[] = {3, 4, 6, 7}, ns[] = {4, 1, 0, 3};
    check_kv_copy(3, 8, 4, 2 * 8 * sizeof(float), 4, src, dst, ns);
    check_kv_copy(3, 8, 4, 6, 4, src, dst, ns);
    check_kv_copy(1, 2, 16, 128 * sizeof(float), 1, (const int32_t[]){1},
                  (const int32_t[]){0}, (const int32_t[]){9});
    check_kv_copy(2, 3, 4, 32, 0, NULL, NULL, NULL);
    check_copy_2d(40, 24, 2, 8, 1, 4, 16, 7);     // a column block into a narrower matrix
    check_copy_2d(24, 40, 0, 0, 3, 22, 18, 5);    // into a wider one, ending at a row's end
    check_copy_2d(12, 12, 1, 0, 0, 0, 12, 9);     // whole rows: one contiguous range
    check_copy_2d(8, 8, 0, 2, 0, 2, 0, 3);        // nothing
    check_decode_rows(1, 1, 16, false);
    check_decode_rows(37, 3, 16, true);
    check_decode_rows(256, 5, 7, true);
    check_casts();
    check_convert_f16();
    tr_backend_cpu_free(&be);
    return tr_test_summary("test_movement");
}
