// The CUDA backend against the CPU backend (itself checked against float64 references and
// finite differences by the other kernel tests), in two passes: fp32 (both backends fp32)
// and bf16 (CUDA's default against the CPU's emulated mode, which rounds at the same
// points). Every op runs on the same inputs on both; outputs agree within the tolerances
// below (each derived from the arithmetic where it is stated), exact ops (embedding, kv_write,
// fill, row moves, KV block copies, convert, decode rows) bit for bit; every CUDA op run twice
// gives the same bits; written outputs start as NaN, so an op that adds into one fails, and the
// gaps of strided rows must still be NaN after it; the paged decode step reproduces the CUDA
// training forward's rows bit for bit, and so does a layout with shared prefixes those of its
// unshared equivalent; the sampler draws the CPU's ids except in draws it counts as
// near. Measured errors are printed. Exits 77 (skip) without a CUDA device.
// `test_cuda_ops [SECTION [fp32|bf16]]` runs one section (as named in run_pass) in one or
// both passes, e.g. under compute-sanitizer, whose slowdown the whole test would not fit.
#include <stdint.h>

#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/device.h"
#include "tests/kernels/kernels_test.h"

// fp32 outputs, both passes: max |cuda - cpu| / max |cpu| of an output array. Both backends
// compute in fp32 from the same (exactly representable) inputs and differ only in summation
// order: a k-term sum differs by about sqrt(k) 2^-24 of the summands' scale, at most k 2^-24,
// and tensor-core accumulation (bf16 GEMMs) adds one rounding per 16-product group, so for
// the k <= 1024 sums here the errors stay near 1e-6 with a worst case under 1e-4.
#define TOL 1e-4
// bf16 (A dtype) outputs in the bf16 pass: each backend rounds its fp32 result once, to
// nearest even. Two fp32 results within TOL * scale of each other can round to neighbouring
// bf16 values, one ulp apart; a bf16 ulp is at most 2^-7 of the value (8 significant bits),
// and the rounding moves each result at most half an ulp. So elementwise
//   |cuda - cpu| <= BF16_REL * max(|cuda|, |cpu|) + TOL * scale,
// BF16_REL = 2^-7 (1 + 2^-7) (the max of the rounded values can be half an ulp below the
// unrounded one's). Elements near zero relative to the array's scale fall under the second
// term: their fp32 values may differ by a larger part of themselves (cancellation).
#define BF16_REL (0x1p-7 * (1.0 + 0x1p-7))
#define MAX_BUFS 64

static tr_backend cpu_be, gpu_be;
static tr_dt prec;   // this pass: both backends' act and wt

// ---- bf16 on the host (convert's rule: round to nearest even, NaN payload kept) ----

static uint16_t h_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        uint16_t h = (uint16_t)(u >> 16);
        return (h & 0x7f) ? h : (uint16_t)(h | 0x40);
    }
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float h_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// fp16 bits to fp32, exactly (the reference for convert from fp16).
static float h_f16(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1fu) u = sign | 0x7f800000u | (m << 13);
    else if (e) u = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m) u = sign;
    else {
        float f = (float)m * 0x1p-24f;   // exact: m < 2^10
        return (h & 0x8000u) ? -f : f;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Random values exactly representable in this pass's A/W dtype, so host copies equal what
// the devices hold and both backends read identical inputs.
static float *rand_act(size_t n, double scale) {
    float *x = kt_rand(n, scale);
    if (prec == TR_BF16)
        for (size_t i = 0; i < n; i++) x[i] = h_f32(h_bf16(x[i]));
    return x;
}

static float nan_f(void) { return NAN; }

// ---- buffers of one op run ----
// Device memory for the GPU backend, host copies for the CPU one (so the CPU op never writes
// into the caller's inputs either). Freed together by bufs_free.
static void *bufs[MAX_BUFS];
static int n_bufs;

static void die(const char *what, const char *msg) {
    fprintf(stderr, "test_cuda_ops: %s: %s\n", what, msg);
    exit(1);
}

static tr_backend *be_of(int gpu) { return gpu ? &gpu_be : &cpu_be; }

static void *put(int gpu, const void *host, size_t bytes) {
    char msg[256];
    void *p;
    if (n_bufs == MAX_BUFS) die("put", "too many buffers");
    if (gpu) {
        if (tr_cuda_alloc(&p, bytes, msg, sizeof msg) != 0) die("alloc", msg);
        if (host && tr_cuda_copy_h2d(p, host, bytes, msg, sizeof msg) != 0) die("h2d", msg);
        if (!host && tr_cuda_zero(p, bytes, msg, sizeof msg) != 0) die("zero", msg);
    } else {
        p = kt_malloc(bytes);
        if (host) memcpy(p, host, bytes);
        else memset(p, 0, bytes);
    }
    bufs[n_bufs++] = p;
    return p;
}

static float *putf(int gpu, const float *host, size_t n) {
    return put(gpu, host, n * sizeof(float));
}
static int32_t *puti(int gpu, const int32_t *host, size_t n) {
    return put(gpu, host, n * sizeof(int32_t));
}

// n values of dtype t from host floats (rounded to bf16 for TR_BF16); NULL host: NaNs, the
// poison of written outputs.
static void *putt(int gpu, const float *host, size_t n, tr_dt t) {
    if (t == TR_F32) {
        if (host) return putf(gpu, host, n);
        float *x = kt_fill(n, nan_f());
        void *p = putf(gpu, x, n);
        free(x);
        return p;
    }
    uint16_t *h = kt_malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) h[i] = h_bf16(host ? host[i] : nan_f());
    void *p = put(gpu, h, n * sizeof(uint16_t));
    free(h);
    return p;
}
static void *put_act(int gpu, const float *host, size_t n) {
    return putt(gpu, host, n, be_of(gpu)->act);
}
static void *put_wt(int gpu, const float *host, size_t n) {
    return putt(gpu, host, n, be_of(gpu)->wt);
}

// The element i of a buffer of dtype t.
static void *elem(void *p, size_t i, tr_dt t) { return (char *)p + i * tr_dt_size(t); }

static void get(int gpu, void *host, const void *p, size_t bytes) {
    char msg[256];
    if (!gpu) {
        memcpy(host, p, bytes);
        return;
    }
    if (tr_backend_cuda_status(&gpu_be, msg, sizeof msg) != 0) die("cuda backend", msg);
    if (tr_cuda_copy_d2h(host, p, bytes, msg, sizeof msg) != 0) die("d2h", msg);
}
static void getf(int gpu, float *host, const float *p, size_t n) {
    get(gpu, host, p, n * sizeof(float));
}
// n values of dtype t as floats (exact)
static void gett(int gpu, float *host, const void *p, size_t n, tr_dt t) {
    if (t == TR_F32) {
        getf(gpu, host, p, n);
        return;
    }
    uint16_t *h = kt_malloc(n * sizeof(uint16_t));
    get(gpu, h, p, n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) host[i] = h_f32(h[i]);
    free(h);
}
static void get_act(int gpu, float *host, const void *p, size_t n) {
    gett(gpu, host, p, n, be_of(gpu)->act);
}

// Frees the buffers put after the first keep.
static void bufs_pop(int gpu, int keep) {
    for (int i = keep; i < n_bufs; i++) {
        if (gpu) tr_cuda_free(bufs[i]);
        else free(bufs[i]);
    }
    n_bufs = keep;
}
static void bufs_free(int gpu) { bufs_pop(gpu, 0); }

// ---- strided rows ----

// Columns [off, off + width) of T rows of stride ld, packed into dst. With `poisoned`, the
// other columns must still be NaN (an op must not write outside its view), and the view
// must hold no NaN (it wrote every element).
static void unpack_rows(const char *name, float *dst, const float *full, int32_t T, int32_t ld,
                        int32_t off, int32_t width, int poisoned) {
    size_t outside = 0, holes = 0;
    for (int32_t t = 0; t < T; t++)
        for (int32_t c = 0; c < ld; c++) {
            float x = full[(size_t)t * ld + c];
            if (c >= off && c < off + width) {
                dst[(size_t)t * width + c - off] = x;
                holes += isnan(x) != 0;
            } else {
                outside += poisoned && !isnan(x);
            }
        }
    if (poisoned) {
        CHECKF(outside == 0, "%s: %zu elements written outside the strided view", name, outside);
        CHECKF(holes == 0, "%s: %zu elements of the view not written", name, holes);
    }
}

// ---- comparing backends ----

// Elementwise check of bf16 outputs (see BF16_REL). Returns the violations; reports the
// share of elements that differ at all and the largest difference in bf16 ulps.
static size_t bf16_check(const float *g, const float *c, size_t n, double scale,
                         double *differ, int32_t *max_ulp) {
    size_t bad = 0, nd = 0;
    *max_ulp = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - (double)c[i]);
        double m = fabs(g[i]) > fabs(c[i]) ? fabs(g[i]) : fabs(c[i]);
        if (!(d <= BF16_REL * m + TOL * scale)) bad++;
        if (g[i] == c[i]) continue;
        nd++;
        int32_t a = h_bf16(g[i]), b = h_bf16(c[i]);
        a = a & 0x8000 ? -(a & 0x7fff) : a;
        b = b & 0x8000 ? -(b & 0x7fff) : b;
        if (abs(a - b) > *max_ulp) *max_ulp = abs(a - b);
    }
    *differ = n ? (double)nd / (double)n : 0.0;
    return bad;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        if (fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

// Runs op(gpu, outputs) on the CPU and twice on the GPU; the n_out = strlen(kinds) outputs
// (host floats, len[i] each) are compared by kind: 'A' an A-dtype output (BF16_REL rule in
// the bf16 pass, TOL in the fp32 one), 'F' an fp32 output (TOL), 'X' an exact op's output
// (bitwise equal to the CPU's). GPU against GPU: bitwise, always.
typedef void (*op_fn)(int gpu, float **out, void *arg);

static void compare(const char *name, op_fn op, void *arg, const char *kinds,
                    const size_t *len) {
    int n_out = (int)strlen(kinds);
    float *ref[8], *a[8], *b[8];
    for (int i = 0; i < n_out; i++) {
        ref[i] = kt_floats(len[i]);
        a[i] = kt_floats(len[i]);
        b[i] = kt_floats(len[i]);
    }
    op(0, ref, arg);
    op(1, a, arg);
    op(1, b, arg);
    for (int i = 0; i < n_out; i++) {
        double e = tr_test_rel_err(a[i], ref[i], len[i]);
        char k = kinds[i];
        CHECKF(kt_same_bits(a[i], b[i], len[i]), "%s output %d: two cuda runs differ", name, i);
        printf("  %-5s %-26s out %d (%c): max err / scale %.2e", tr_dt_name(prec), name, i,
               k, e);
        if (k == 'X') {
            int same = kt_same_bits(a[i], ref[i], len[i]);
            CHECKF(same, "%s output %d: cuda differs from cpu (exact op)", name, i);
            printf(same ? ", bitwise\n" : ", NOT bitwise\n");
        } else if (k == 'A' && prec == TR_BF16) {
            double differ;
            int32_t ulps;
            size_t bad = bf16_check(a[i], ref[i], len[i], max_abs(ref[i], len[i]), &differ, &ulps);
            CHECKF(bad == 0, "%s output %d: %zu of %zu elements past 1 bf16 ulp + %.0e of scale",
                   name, i, bad, len[i], TOL);
            printf(", %.2f%% differ, max %d ulp%s\n", 100.0 * differ, ulps,
                   bad ? " (PAST TOLERANCE)" : "");
        } else {
            CHECKF(e <= TOL, "%s output %d: cuda vs cpu rel err %.3g", name, i, e);
            printf("%s\n", kt_same_bits(a[i], ref[i], len[i]) ? ", bitwise" : "");
        }
        free(ref[i]);
        free(a[i]);
        free(b[i]);
    }
}

// --- matmul ---------------------------------------------------------------------------------

typedef struct mm_arg {
    int32_t T, IC, OC, flags;
    int add;   // matmul_forward_add onto out0 (the residual stream) instead of matmul_forward
    float *in, *w, *bias, *dout, *out0, *dw0, *db0;
} mm_arg;

static tr_dt mm_out_type(const tr_backend *be, int32_t flags) {
    return (flags & TR_MM_OUT_F32) ? TR_F32 : be->act;
}

static void mm_forward(int gpu, float **out, void *arg) {
    mm_arg *m = arg;
    tr_backend *be = be_of(gpu);
    size_t no = (size_t)m->T * m->OC;
    tr_dt ot = mm_out_type(be, m->flags);
    void *in = put_act(gpu, m->in, (size_t)m->T * m->IC);
    void *w = put_wt(gpu, m->w, (size_t)m->OC * m->IC);
    void *bias = m->bias ? put_wt(gpu, m->bias, m->OC) : NULL;
    if (m->add) {
        // added into the residual stream x: into a buffer of NaNs (out[0]) and in place
        // (out[1]), which agree bit for bit
        float *x = putf(gpu, m->out0, no), *to = putt(gpu, NULL, no, TR_F32);
        be->ops->matmul_forward_add(be, to, x, in, w, bias, m->T, m->IC, m->OC);
        be->ops->matmul_forward_add(be, x, x, in, w, bias, m->T, m->IC, m->OC);
        getf(gpu, out[0], to, no);
        getf(gpu, out[1], x, no);
        CHECKF(kt_same_bits(out[0], out[1], no),
               "matmul_forward_add %dx%dx%d on %s: into another buffer differs from in place",
               m->T, m->IC, m->OC, gpu ? "cuda" : "cpu");
    } else {
        void *o = putt(gpu, NULL, no, ot);
        be->ops->matmul_forward(be, o, in, w, bias, m->T, m->IC, m->OC, m->flags);
        gett(gpu, out[0], o, no, ot);
    }
    bufs_free(gpu);
}

static void mm_backward(int gpu, float **out, void *arg) {
    mm_arg *m = arg;
    tr_backend *be = be_of(gpu);
    size_t nin = (size_t)m->T * m->IC, nw = (size_t)m->OC * m->IC;
    void *in = put_act(gpu, m->in, nin), *w = put_wt(gpu, m->w, nw);
    void *dout = put_act(gpu, m->dout, (size_t)m->T * m->OC);
    void *din = put_act(gpu, NULL, nin);   // written: starts as NaN
    float *dw = putf(gpu, m->dw0, nw), *db = putf(gpu, m->db0, m->OC);
    be->ops->matmul_backward(be, din, dw, db, dout, in, w, m->T, m->IC, m->OC);
    get_act(gpu, out[0], din, nin);
    getf(gpu, out[1], dw, nw);
    getf(gpu, out[2], db, m->OC);
    bufs_free(gpu);
}

static void test_matmul(int32_t T, int32_t IC, int32_t OC) {
    mm_arg m = {.T = T, .IC = IC, .OC = OC};
    m.in = rand_act((size_t)T * IC, 1.0);
    m.w = rand_act((size_t)OC * IC, 0.1);
    m.bias = rand_act(OC, 1.0);
    m.dout = rand_act((size_t)T * OC, 1.0);
    m.out0 = kt_rand((size_t)T * OC, 1.0);
    m.dw0 = kt_rand((size_t)OC * IC, 1.0);
    m.db0 = kt_rand(OC, 1.0);
    size_t lf[1] = {(size_t)T * OC}, lb[3] = {(size_t)T * IC, (size_t)OC * IC, (size_t)OC};
    char name[64];
    snprintf(name, sizeof name, "matmul_fwd %dx%dx%d", T, IC, OC);
    compare(name, mm_forward, &m, "A", lf);   // A out with bias: the epilogue's one rounding
    float *bias = m.bias;
    m.bias = NULL;
    m.flags = TR_MM_OUT_F32;
    snprintf(name, sizeof name, "matmul_fwd %dx%dx%d F", T, IC, OC);
    compare(name, mm_forward, &m, "F", lf);
    m.add = 1;
    size_t la[2] = {(size_t)T * OC, (size_t)T * OC};
    snprintf(name, sizeof name, "matmul_fwd %dx%dx%d x+", T, IC, OC);
    compare(name, mm_forward, &m, "FF", la);
    m.bias = bias;
    snprintf(name, sizeof name, "matmul_fwd %dx%dx%d x+,b", T, IC, OC);
    compare(name, mm_forward, &m, "FF", la);
    m.add = 0;
    snprintf(name, sizeof name, "matmul_bwd %dx%dx%d", T, IC, OC);
    compare(name, mm_backward, &m, "AFF", lb);
    free(m.in); free(m.w); free(m.bias); free(m.dout); free(m.out0); free(m.dw0); free(m.db0);
}

// ops.h: "The reduction over IC of each output element runs in an order that depends on
// neither T nor the row". Rows computed in calls of 1, 2, 17 and 64 tokens (fresh buffers, so
// alignments match) must equal the same rows of one 300-token call bit for bit. bf16 runs
// cuBLASLt with split-K excluded, so this is checked; fp32 runs cuBLAS sgemm, whose kernel
// choice the backend does not control, so it is only reported.
static void mm_rows_gpu(float *out, const float *in, const float *w, const float *bias,
                        int32_t T, int32_t IC, int32_t OC) {
    void *din = put_act(1, in, (size_t)T * IC), *dw = put_wt(1, w, (size_t)OC * IC);
    void *db = put_wt(1, bias, OC), *o = put_act(1, NULL, (size_t)T * OC);
    gpu_be.ops->matmul_forward(&gpu_be, o, din, dw, db, T, IC, OC, 0);
    get_act(1, out, o, (size_t)T * OC);
    bufs_free(1);
}

static void test_matmul_batch_invariance(int32_t IC, int32_t OC) {
    const int32_t T = 300, sizes[] = {1, 2, 17, 64}, starts[] = {0, 299, 150, 200};
    float *in = rand_act((size_t)T * IC, 1.0), *w = rand_act((size_t)OC * IC, 0.1);
    float *bias = rand_act(OC, 1.0);
    float *full = kt_floats((size_t)T * OC), *part = kt_floats((size_t)64 * OC);
    mm_rows_gpu(full, in, w, bias, T, IC, OC);
    int same = 1;
    for (int i = 0; i < 4; i++) {
        int32_t n = sizes[i], r0 = starts[i] + n <= T ? starts[i] : T - n;
        mm_rows_gpu(part, in + (size_t)r0 * IC, w, bias, n, IC, OC);
        int s = kt_same_bits(part, full + (size_t)r0 * OC, (size_t)n * OC);
        printf("  %-5s matmul %dx%d rows %d..%d alone vs in 300: %s\n", tr_dt_name(prec), IC,
               OC, r0, r0 + n - 1, s ? "bitwise" : "DIFFER");
        same &= s;
    }
    if (prec == TR_BF16)
        CHECKF(same, "matmul %dx%d: a row's bits depend on the batch around it", IC, OC);
    free(in); free(w); free(bias); free(full); free(part);
}

// With batch invariance off, forward products of few rows may split their reduction
// (cuBLASLt adds the parts in a fixed order): against the CPU, and two runs bitwise.
static void test_matmul_split(void) {
    tr_backend keep = gpu_be;
    char msg[512];
    if (tr_backend_cuda_init(&gpu_be, 0, TR_BF16, 0) != 0) {
        tr_backend_cuda_status(&gpu_be, msg, sizeof msg);
        CHECKF(0, "a backend without batch invariance: %s", msg);
        tr_backend_cuda_free(&gpu_be);
        gpu_be = keep;
        return;
    }
    printf("  batch invariance off:\n");
    test_matmul(64, 4864, 896);    // a decode step's down projection: a long reduction
    test_matmul(16, 896, 1152);
    test_matmul(256, 1024, 200);
    CHECKF(tr_backend_cuda_status(&gpu_be, msg, sizeof msg) == 0, "cuda backend: %s", msg);
    tr_backend_cuda_free(&gpu_be);
    gpu_be = keep;
}

// --- the sequential-k kernel (kernels/cuda/gemm_seqk.cu) ---------------------------------
// Every configuration (and the default) on forward products as matmul.cu issues them, bf16
// out with and without the bias, fp32 out with and without accumulation: each output within
// the bound below of the float64 result, and every output's bits those of the batch-invariant
// cuBLASLt plan (both asserted: on an H200 with cuBLAS 13 the kernel's chains are cuBLASLt's,
// 0 differing outputs at every shape here; plan_settle still runs it only where they are on
// the product's own data, so another library's chains would only leave it unused, and this
// check would say so). The cuBLASLt plan's own error against the bound is printed beside, as
// a check of the bound.
//
// The bound: bf16 products are exact in fp32, and each k16 block adds its 16 to the fp32
// accumulator with an error of a few fp32 units of the block's magnitude (the tensor core
// aligns the terms and rounds once or truncates), so after IC/16 blocks an output is within
// (IC/16 + 1) 2^-21 sum_k |x_k w_k|; the bias or the start adds one fp32 rounding (2^-24 of
// the result), a bf16 output half an ulp (BF16_REL of it). A wrong fragment, tile or stage
// would be off by whole terms, far past it.

typedef struct sqk_case {
    const char *name;
    int out_f32, acc, bias;
} sqk_case;

static void test_matmul_seqk(int32_t T, int32_t IC, int32_t OC) {
    static const sqk_case cases[] = {
        {"bf16", 0, 0, 0}, {"bf16+b", 0, 0, 1}, {"f32", 1, 0, 0}, {"f32+=", 1, 1, 0}};
    const size_t nx = (size_t)T * IC, nw = (size_t)OC * IC, no = (size_t)T * OC;
    float *x = rand_act(nx, 1.0), *w = rand_act(nw, 0.1), *bias = rand_act(OC, 1.0);
    float *start = kt_rand(no, 1.0);
    double *sum = kt_malloc(no * sizeof(double)), *mag = kt_malloc(no * sizeof(double));
    for (int32_t t = 0; t < T; t++)
        for (int32_t o = 0; o < OC; o++) {
            const float *xr = x + (size_t)t * IC, *wr = w + (size_t)o * IC;
            double s_ = 0.0, m_ = 0.0;
            for (int32_t k = 0; k < IC; k++) {
                double p = (double)xr[k] * (double)wr[k];
                s_ += p;
                m_ += fabs(p);
            }
            sum[(size_t)t * OC + o] = s_;
            mag[(size_t)t * OC + o] = m_;
        }
    float *got = kt_floats(no), *ref = kt_floats(no);
    void *dx = put_act(1, x, nx), *dw = put_wt(1, w, nw);
    void *db = put_wt(1, bias, OC);   // bf16: the bias of a bf16 output
    const int keep = n_bufs, nc = tr_backend_cuda_seqk_configs();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const sqk_case *q = &cases[c];
        const tr_dt ot = q->out_f32 ? TR_F32 : TR_BF16;
        double worst = 0.0, worst_ref = 0.0;
        char differ[256] = "";
        size_t used = 0;
        for (int cfg = -1; cfg < nc; cfg++) {
            void *dout = putt(1, q->acc ? start : NULL, no, ot);   // NULL: NaN, all written
            void *dref = putt(1, q->acc ? start : NULL, no, ot);
            int r = tr_backend_cuda_seqk_check(&gpu_be, dout, dref, dx, dw, q->bias ? db : NULL,
                                               T, IC, OC, q->out_f32, q->acc, cfg);
            char msg[512];
            if (r < 0) {
                tr_backend_cuda_status(&gpu_be, msg, sizeof msg);
                CHECKF(0, "seqk %dx%dx%d %s config %d: %s", T, IC, OC, q->name, cfg, msg);
                bufs_pop(1, keep);
                break;
            }
            if (r > 0) {   // a tile wider than the tokens: refused
                CHECKF(cfg >= 0, "seqk %dx%dx%d %s: the default configuration refused", T, IC,
                       OC, q->name);
                if (used < sizeof differ)
                    used += (size_t)snprintf(differ + used, sizeof differ - used, " -");
                bufs_pop(1, keep);
                continue;
            }
            gett(1, got, dout, no, ot);
            gett(1, ref, dref, no, ot);
            bufs_pop(1, keep);
            size_t bad = 0, nd = 0;
            for (size_t i = 0; i < no; i++) {
                const int32_t o = (int32_t)(i % (size_t)OC);
                const double e =
                    sum[i] + (q->bias ? (double)bias[o] : q->acc ? (double)start[i] : 0.0);
                const double chain = (IC / 16 + 1) * 0x1p-21 * mag[i];
                const double tol = chain + 0x1p-23 * fabs(e) +
                                   (q->out_f32 ? 0.0 : BF16_REL * (fabs(e) + chain)) + 1e-30;
                const double d = fabs((double)got[i] - e), dr = fabs((double)ref[i] - e);
                if (!(d <= tol)) bad++;   // NaN (an output not written) included
                worst = fmax(worst, isnan(d) ? INFINITY : d / tol);
                worst_ref = fmax(worst_ref, isnan(dr) ? INFINITY : dr / tol);
                nd += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
            }
            CHECKF(bad == 0, "seqk %dx%dx%d %s config %d (%s): %zu of %zu outputs past the bound",
                   T, IC, OC, q->name, cfg, tr_backend_cuda_seqk_name(cfg), bad, no);
            CHECKF(nd == 0, "seqk %dx%dx%d %s config %d (%s): %zu of %zu outputs are not the "
                   "batch-invariant plan's bits", T, IC, OC, q->name, cfg,
                   tr_backend_cuda_seqk_name(cfg), nd, no);
            if (used < sizeof differ)
                used += (size_t)snprintf(differ + used, sizeof differ - used, " %zu", nd);
        }
        printf("  %-5s seqk %dx%dx%d %-6s err / bound %.3f (cuBLASLt %.3f); outputs of %zu "
               "differing from the batch-invariant plan, default then configs 0..%d:%s\n",
               tr_dt_name(prec), T, IC, OC, q->name, worst, worst_ref, no, nc - 1, differ);
    }
    bufs_free(1);
    free(x); free(w); free(bias); free(start); free(sum); free(mag); free(got); free(ref);
}

// The decode products of Qwen2.5-0.5B (qkv, down, gate/up) and an odd shape (a k-tile and
// output tiles cut short) at 1, 7, 64 and 200 tokens.
static void test_matmul_seqk_all(void) {
    const int32_t Ts[] = {1, 7, 64, 200};
    const int32_t shapes[][2] = {{896, 1152}, {4864, 896}, {896, 9728}, {96, 208}};
    for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_matmul_seqk(Ts[t], shapes[s][0], shapes[s][1]);
}

// The gate/up product fused with SwiGLU (matmul_swiglu_forward, batch-invariant bf16): the
// bits of matmul_forward then swiglu_forward, at up to 64 rows by the fused kernel (asserted:
// its run counter moves; the plan settles on the product's first run, which takes the two
// ops) and past them by the two ops.
static void test_matmul_swiglu(int32_t T, int32_t C, int32_t I) {
    tr_backend *be = &gpu_be;
    const size_t nx = (size_t)T * C, nw = (size_t)2 * I * C, na = (size_t)T * I;
    float *x = rand_act(nx, 1.0), *w = rand_act(nw, 0.1);
    float *ref = kt_floats(na), *got = kt_floats(na);
    void *dx = put_act(1, x, nx), *dw = put_wt(1, w, nw);
    void *gu = put_act(1, NULL, (size_t)T * 2 * I), *act = put_act(1, NULL, na);
    be->ops->matmul_forward(be, gu, dx, dw, NULL, T, C, 2 * I, 0);   // settles the plan
    be->ops->swiglu_forward(be, act, gu, T, I);
    get_act(1, ref, act, na);
    tr_backend_cuda_fused_swiglu(be, 1);
    const long runs = tr_backend_cuda_fused_swiglu_runs(be);
    void *act2 = put_act(1, NULL, na), *gu2 = put_act(1, NULL, (size_t)T * 2 * I);
    be->ops->matmul_swiglu_forward(be, act2, gu2, dx, dw, T, C, I);
    get_act(1, got, act2, na);
    const long fused = tr_backend_cuda_fused_swiglu_runs(be) - runs;
    tr_backend_cuda_fused_swiglu(be, 0);
    char msg[512];
    CHECKF(tr_backend_cuda_status(be, msg, sizeof msg) == 0, "matmul_swiglu %dx%dx%d: %s", T, C,
           I, msg);
    CHECKF(fused == (T <= 64 ? 1 : 0), "matmul_swiglu %dx%dx%d: %ld fused runs", T, C, I, fused);
    const int same = kt_same_bits(got, ref, na);
    CHECKF(same, "matmul_swiglu %dx%dx%d: not the bits of matmul_forward then swiglu_forward", T,
           C, I);
    printf("  %-5s matmul_swiglu %dx%dx%d (%s) = matmul_forward, swiglu_forward: %s\n",
           tr_dt_name(prec), T, C, I, fused ? "fused" : "two ops", same ? "bitwise" : "NO");
    bufs_free(1);
    free(x); free(w); free(ref); free(got);
}

// --- embedding ------------------------------------------------------------------------------

typedef struct emb_arg {
    int32_t T, C, V;
    int32_t *ids;
    float *table, *dout, *dtable0;
} emb_arg;

static void emb_forward(int gpu, float **out, void *arg) {
    emb_arg *e = arg;
    float *o = putf(gpu, NULL, (size_t)e->T * e->C);
    void *table = put_wt(gpu, e->table, (size_t)e->V * e->C);
    int32_t *ids = puti(gpu, e->ids, e->T);
    be_of(gpu)->ops->embedding_forward(be_of(gpu), o, ids, table, e->T, e->C);
    getf(gpu, out[0], o, (size_t)e->T * e->C);
    bufs_free(gpu);
}

static void emb_backward(int gpu, float **out, void *arg) {
    emb_arg *e = arg;
    float *dt = putf(gpu, e->dtable0, (size_t)e->V * e->C);
    float *dout = putf(gpu, e->dout, (size_t)e->T * e->C);
    int32_t *ids = puti(gpu, e->ids, e->T);
    void *scratch = put(gpu, NULL, be_of(gpu)->ops->embedding_scratch_bytes(be_of(gpu), e->T));
    be_of(gpu)->ops->embedding_backward(be_of(gpu), dt, dout, ids, e->T, e->C, scratch);
    getf(gpu, out[0], dt, (size_t)e->V * e->C);
    bufs_free(gpu);
}

// ids: V ids drawn at random, then every `hot`-th token set to id 0 (a long run of one id);
// both backends must give the same bits (rows add their tokens in token order). The forward
// widens W rows to fp32, exactly, in both passes; the backward is fp32 only (fp32 pass).
static void test_embedding(int32_t T, int32_t C, int32_t V, int32_t hot) {
    emb_arg e = {.T = T, .C = C, .V = V};
    e.ids = kt_malloc((size_t)e.T * sizeof(int32_t));
    for (int32_t t = 0; t < e.T; t++) e.ids[t] = (int32_t)((kt_uniform() + 1.0) * 0.5 * e.V) % e.V;
    for (int32_t t = 0; hot > 0 && t < e.T; t += hot) e.ids[t] = 0;
    e.ids[e.T - 1] = e.ids[0];   // the same id at the first and the last token
    e.table = rand_act((size_t)e.V * e.C, 1.0);
    e.dout = kt_rand((size_t)e.T * e.C, 1.0);
    e.dtable0 = kt_rand((size_t)e.V * e.C, 1.0);
    size_t lf[1] = {(size_t)e.T * e.C}, lb[1] = {(size_t)e.V * e.C};
    compare("embedding_forward", emb_forward, &e, "X", lf);
    if (prec == TR_F32) compare("embedding_backward", emb_backward, &e, "X", lb);
    free(e.ids); free(e.table); free(e.dout); free(e.dtable0);
}

// Scratch sized for T tokens must serve every smaller T (the model sizes it once).
static void test_embedding_scratch(void) {
    size_t prev = 0;
    int mono = 1;
    for (int32_t T = 1; T <= (1 << 20); T += T < 5000 ? 1 : T / 64) {
        size_t b = gpu_be.ops->embedding_scratch_bytes(&gpu_be, T);
        mono &= b >= prev && b >= 3 * (size_t)T * sizeof(int32_t);
        prev = b;
    }
    CHECKF(mono, "embedding_scratch_bytes is not monotone in T");
}

// --- rmsnorm --------------------------------------------------------------------------------

typedef struct rms_arg {
    int32_t T, C;
    float *in, *w, *dout, *din0, *dw0, *rstd;   // rstd: the CPU forward's, for the backward
} rms_arg;

static void rms_forward(int gpu, float **out, void *arg) {
    rms_arg *r = arg;
    size_t n = (size_t)r->T * r->C;
    void *o = put_act(gpu, NULL, n);
    float *rstd = putt(gpu, NULL, r->T, TR_F32);
    float *in = putf(gpu, r->in, n);
    void *w = put_wt(gpu, r->w, r->C);
    be_of(gpu)->ops->rmsnorm_forward(be_of(gpu), o, rstd, in, w, 1e-5f, r->T, r->C);
    get_act(gpu, out[0], o, n);
    getf(gpu, out[1], rstd, r->T);
    bufs_free(gpu);
}

// Both backends get the same saved rstd, so the backward alone is compared.
static void rms_backward(int gpu, float **out, void *arg) {
    rms_arg *r = arg;
    size_t n = (size_t)r->T * r->C;
    float *rstd = putf(gpu, r->rstd, r->T);
    float *in = putf(gpu, r->in, n);
    void *w = put_wt(gpu, r->w, r->C), *dout = put_act(gpu, r->dout, n);
    float *din = putf(gpu, r->din0, n), *dw = putf(gpu, r->dw0, r->C);
    void *dact = put_act(gpu, NULL, n);
    be_of(gpu)->ops->rmsnorm_backward(be_of(gpu), din, dact, dw, dout, in, w, rstd, r->T, r->C);
    getf(gpu, out[0], din, n);
    getf(gpu, out[1], dw, r->C);
    get_act(gpu, out[2], dact, n);
    bufs_free(gpu);
}

static void test_rmsnorm(int32_t T, int32_t C) {
    rms_arg r = {.T = T, .C = C};
    size_t n = (size_t)r.T * r.C;
    r.in = kt_rand(n, 2.0);
    r.w = rand_act(r.C, 1.0);
    r.dout = rand_act(n, 1.0);
    r.din0 = kt_rand(n, 1.0);
    r.dw0 = kt_rand(r.C, 1.0);
    r.rstd = kt_floats(r.T);
    float *tmp[2] = {kt_floats(n), r.rstd};
    rms_forward(0, tmp, &r);
    free(tmp[0]);
    size_t lf[2] = {n, (size_t)r.T}, lb[3] = {n, (size_t)r.C, n};
    compare("rmsnorm_forward", rms_forward, &r, "AF", lf);
    compare("rmsnorm_backward", rms_backward, &r, "FFA", lb);
    free(r.in); free(r.w); free(r.dout); free(r.din0); free(r.dw0); free(r.rstd);
}

// Rows normalized in a batch of T (past TR_CUDA_DECODE_ROWS: a warp a row) have the bits of the
// same rows normalized alone (a block a row, as in a decode step), forward and input gradient.
static void test_rmsnorm_rows(int32_t T, int32_t C, int32_t alone) {
    rms_arg r = {.T = T, .C = C};
    size_t n = (size_t)T * C, na = (size_t)alone * C;
    r.in = kt_rand(n, 2.0);
    r.w = rand_act(C, 1.0);
    r.dout = rand_act(n, 1.0);
    r.din0 = kt_rand(n, 1.0);
    r.dw0 = kt_rand(C, 1.0);
    r.rstd = kt_floats(T);
    float *all[2] = {kt_floats(n), r.rstd}, *one[2] = {kt_floats(na), kt_floats(alone)};
    rms_forward(1, all, &r);
    r.T = alone;
    rms_forward(1, one, &r);
    CHECKF(kt_same_bits(all[0], one[0], na) && kt_same_bits(all[1], one[1], (size_t)alone),
           "rmsnorm_forward T=%d C=%d: %d rows alone differ from the batch's", T, C, alone);
    float *dw = kt_floats(C), *dall = kt_floats(n), *done = kt_floats(na);
    float *aall = kt_floats(n), *aone = kt_floats(na);
    float *ball[3] = {dall, dw, aall}, *bone[3] = {done, dw, aone};
    r.T = T;
    rms_backward(1, ball, &r);
    r.T = alone;
    rms_backward(1, bone, &r);
    CHECKF(kt_same_bits(dall, done, na) && kt_same_bits(aall, aone, na),
           "rmsnorm_backward T=%d C=%d: %d rows alone differ from the batch's", T, C, alone);
    // din_act is the updated din as convert rounds it
    size_t off = 0;
    for (size_t i = 0; i < n; i++)
        off += !kt_same_bits(&aall[i], prec == TR_BF16 ? &(float){kt_round_bf16(dall[i])}
                                                        : &dall[i], 1);
    CHECKF(off == 0, "rmsnorm_backward T=%d C=%d: %zu of din_act are not din rounded", T, C, off);
    free(aall);
    free(aone);
    printf("rmsnorm T=%d C=%d: %d rows alone have the batch's bits\n", T, C, alone);
    free(all[0]); free(one[0]); free(one[1]); free(dw); free(dall); free(done);
    free(r.in); free(r.w); free(r.dout); free(r.din0); free(r.dw0); free(r.rstd);
}

// --- head_rmsnorm: heads [off, off + H*D) of rows of stride ld --------------------------------

typedef struct hrms_arg {
    int32_t T, H, D, ld, off;
    float *x, *w, *dout, *dw0, *rstd;   // x, dout: [T, ld]; rstd: the CPU forward's
} hrms_arg;

static void hrms_forward(int gpu, float **out, void *arg) {
    hrms_arg *r = arg;
    tr_backend *be = be_of(gpu);
    size_t n = (size_t)r->T * r->ld;
    void *x = put_act(gpu, r->x, n), *o = put_act(gpu, NULL, n), *w = put_wt(gpu, r->w, r->D);
    float *rstd = putt(gpu, NULL, (size_t)r->T * r->H, TR_F32);
    be->ops->head_rmsnorm_forward(be, elem(o, r->off, be->act), rstd, elem(x, r->off, be->act),
                                  w, 1e-6f, r->T, r->H, r->D, r->ld);
    float *full = kt_floats(n);
    get_act(gpu, full, o, n);
    unpack_rows("head_rmsnorm_forward", out[0], full, r->T, r->ld, r->off, r->H * r->D, 1);
    getf(gpu, out[1], rstd, (size_t)r->T * r->H);
    free(full);
    bufs_free(gpu);
}

static void hrms_backward(int gpu, float **out, void *arg) {
    hrms_arg *r = arg;
    tr_backend *be = be_of(gpu);
    size_t n = (size_t)r->T * r->ld;
    void *x = put_act(gpu, r->x, n), *dout = put_act(gpu, r->dout, n), *din = put_act(gpu, NULL, n);
    void *w = put_wt(gpu, r->w, r->D);
    float *rstd = putf(gpu, r->rstd, (size_t)r->T * r->H), *dw = putf(gpu, r->dw0, r->D);
    be->ops->head_rmsnorm_backward(be, elem(din, r->off, be->act), dw,
                                   elem(dout, r->off, be->act), elem(x, r->off, be->act), w,
                                   rstd, r->T, r->H, r->D, r->ld);
    float *full = kt_floats(n);
    get_act(gpu, full, din, n);
    unpack_rows("head_rmsnorm_backward", out[0], full, r->T, r->ld, r->off, r->H * r->D, 1);
    getf(gpu, out[1], dw, r->D);
    free(full);
    bufs_free(gpu);
}

// Qwen3-style q and k norms read in place from a fused [q;k;v] row: q (H heads at column 0)
// and k (KVH heads after q), rows of stride (H + 2 KVH) D.
static void test_head_rmsnorm(int32_t T, int32_t H, int32_t KVH, int32_t D) {
    hrms_arg r = {.T = T, .D = D, .ld = (H + 2 * KVH) * D};
    size_t n = (size_t)T * r.ld;
    r.x = rand_act(n, 2.0);
    r.dout = rand_act(n, 1.0);
    r.w = rand_act(D, 1.0);
    r.dw0 = kt_rand(D, 1.0);
    for (int pass = 0; pass < 2; pass++) {
        r.H = pass == 0 ? H : KVH;
        r.off = pass == 0 ? 0 : H * D;
        size_t nv = (size_t)T * r.H * D, nr = (size_t)T * r.H;
        r.rstd = kt_floats(nr);
        float *tmp[2] = {kt_floats(nv), r.rstd};
        hrms_forward(0, tmp, &r);
        free(tmp[0]);
        size_t lf[2] = {nv, nr}, lb[2] = {nv, (size_t)D};
        compare(pass == 0 ? "head_rmsnorm_fwd q" : "head_rmsnorm_fwd k", hrms_forward, &r, "AF",
                lf);
        compare(pass == 0 ? "head_rmsnorm_bwd q" : "head_rmsnorm_bwd k", hrms_backward, &r, "AF",
                lb);
        free(r.rstd);
    }
    free(r.x); free(r.dout); free(r.w); free(r.dw0);
}

// --- rope: in place on heads [off, off + nh*D) of rows of stride ld ---------------------------

typedef struct rope_arg {
    int32_t T, H, D, ld, off;
    float *x, *inv_freq;
    int32_t *pos;
} rope_arg;

static void rope_op(int gpu, float **out, void *arg, int backward) {
    rope_arg *r = arg;
    tr_backend *be = be_of(gpu);
    size_t n = (size_t)r->T * r->ld;
    void *x = put_act(gpu, r->x, n);
    float *f = putf(gpu, r->inv_freq, r->D / 2);
    int32_t *pos = puti(gpu, r->pos, r->T);
    void *v = elem(x, r->off, be->act);
    if (backward) be->ops->rope_backward(be, v, r->ld, pos, f, r->T, r->H, r->D);
    else be->ops->rope_forward(be, v, r->ld, pos, f, r->T, r->H, r->D);
    float *full = kt_floats(n);
    get_act(gpu, full, x, n);
    unpack_rows("rope", out[0], full, r->T, r->ld, r->off, r->H * r->D, 0);
    size_t changed = 0;   // in place: the rest of each row is left as it was
    for (int32_t t = 0; t < r->T; t++)
        for (int32_t c = 0; c < r->ld; c++) {
            size_t i = (size_t)t * r->ld + c;
            if (c < r->off || c >= r->off + r->H * r->D)
                changed += memcmp(&full[i], &r->x[i], sizeof(float)) != 0;
        }
    CHECKF(changed == 0, "rope: %zu elements outside the strided view changed", changed);
    free(full);
    bufs_free(gpu);
}
static void rope_fwd(int gpu, float **out, void *arg) { rope_op(gpu, out, arg, 0); }
static void rope_bwd(int gpu, float **out, void *arg) { rope_op(gpu, out, arg, 1); }

// q and k of a fused [q;k;v] row, positions past 1000 included (large angles).
static void test_rope(int32_t T, int32_t H, int32_t KVH, int32_t D) {
    rope_arg r = {.T = T, .D = D, .ld = (H + 2 * KVH) * D};
    r.x = rand_act((size_t)T * r.ld, 1.0);
    r.inv_freq = kt_floats(D / 2);
    for (int32_t i = 0; i < D / 2; i++) r.inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
    r.pos = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) r.pos[t] = t < 40 ? t : 1000 + 37 * t;
    for (int pass = 0; pass < 2; pass++) {
        r.H = pass == 0 ? H : KVH;
        r.off = pass == 0 ? 0 : H * D;
        size_t l[1] = {(size_t)T * r.H * D};
        compare(pass == 0 ? "rope_forward q" : "rope_forward k", rope_fwd, &r, "A", l);
        compare(pass == 0 ? "rope_backward q" : "rope_backward k", rope_bwd, &r, "A", l);
    }
    free(r.x); free(r.inv_freq); free(r.pos);
}

// --- rope_kv_write: generation's rotation and cache write in one pass ------------------------

typedef struct rkv_arg {
    int32_t T, H, KVH, D, ld, n_blocks, block_size;
    int32_t *slot, *pos;
    float *rows, *k0, *v0, *inv_freq;   // rows: [T, ld] fused; k0, v0: the pools before
    int split;                          // rope_forward, then kv_write, instead of the one op
} rkv_arg;

// Outputs: the rows after (q and k rotated in place), then the k and v pools.
static void rkv_run(int gpu, float **out, void *arg) {
    rkv_arg *w = arg;
    tr_backend *be = be_of(gpu);
    size_t pool = (size_t)w->n_blocks * w->block_size * w->KVH * w->D, n = (size_t)w->T * w->ld;
    tr_kv_pages kv = {.k_pool = put_act(gpu, w->k0, pool), .v_pool = put_act(gpu, w->v0, pool),
                      .block_size = w->block_size, .n_blocks = w->n_blocks,
                      .n_kv_heads = w->KVH, .head_dim = w->D};
    void *rows = put_act(gpu, w->rows, n);
    int32_t *slot = puti(gpu, w->slot, w->T), *pos = puti(gpu, w->pos, w->T);
    float *f = putf(gpu, w->inv_freq, w->D / 2);
    void *v = elem(rows, (size_t)(w->H + w->KVH) * w->D, be->act);
    if (w->split) {
        be->ops->rope_forward(be, rows, w->ld, pos, f, w->T, w->H + w->KVH, w->D);
        be->ops->kv_write(be, &kv, slot, elem(rows, (size_t)w->H * w->D, be->act), v, w->ld,
                          w->T);
    } else {
        be->ops->rope_kv_write(be, rows, v, w->ld, pos, f, w->T, w->H, &kv, slot);
    }
    get_act(gpu, out[0], rows, n);
    get_act(gpu, out[1], kv.k_pool, pool);
    get_act(gpu, out[2], kv.v_pool, pool);
    bufs_free(gpu);
}

// T rows at positions past 1000 too, into scattered distinct slots of a noisy pool, one row a
// padding row (slot -1: nothing written): against the CPU, and on the GPU bit for bit the two
// ops it replaces. T = 40 runs the decode-sized launch (a thread a head), T = 2100 the other.
static void test_rope_kv_write(int32_t T, int32_t H, int32_t KVH, int32_t D) {
    rkv_arg w = {.T = T, .H = H, .KVH = KVH, .D = D, .ld = (H + 2 * KVH) * D + 8,
                 .block_size = 16};
    w.n_blocks = (T + 15) / 16 + 4;
    int32_t n_slots = w.n_blocks * w.block_size;
    size_t pool = (size_t)n_slots * KVH * D, n = (size_t)T * w.ld;
    int32_t *perm = kt_malloc((size_t)n_slots * sizeof(int32_t));
    for (int32_t i = 0; i < n_slots; i++) perm[i] = (int32_t)(((int64_t)i * 7919) % n_slots);
    perm[T / 2] = -1;
    w.slot = perm;   // distinct (7919 is prime to every n_slots here), one padding row
    w.pos = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) w.pos[t] = t < 20 ? t : 1000 + 37 * t;
    w.inv_freq = kt_floats(D / 2);
    for (int32_t i = 0; i < D / 2; i++) w.inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
    w.rows = rand_act(n, 1.0);
    w.k0 = rand_act(pool, 1.0);
    w.v0 = rand_act(pool, 1.0);
    size_t l[3] = {n, pool, pool};
    compare("rope_kv_write", rkv_run, &w, "AAA", l);
    float *one[3], *two[3];
    for (int i = 0; i < 3; i++) {
        one[i] = kt_floats(l[i]);
        two[i] = kt_floats(l[i]);
    }
    rkv_run(1, one, &w);
    w.split = 1;
    rkv_run(1, two, &w);
    int same = 1;
    for (int i = 0; i < 3; i++) same &= kt_same_bits(one[i], two[i], l[i]);
    CHECKF(same, "rope_kv_write T=%d: differs from rope_forward then kv_write", T);
    printf("  %-5s rope_kv_write T=%d = rope_forward + kv_write: %s\n", tr_dt_name(prec), T,
           same ? "bitwise" : "NO");
    for (int i = 0; i < 3; i++) {
        free(one[i]);
        free(two[i]);
    }
    free(perm); free(w.pos); free(w.inv_freq); free(w.rows); free(w.k0); free(w.v0);
}

// --- attention_decode_rope: a decode step's rotation, cache write and attention at once ------

typedef struct drope_arg {
    int32_t B, H, KVH, D, ld, max_blocks, n_blocks;
    int32_t *table, *seq_len, *slot, *pos;
    float *rows, *k0, *v0, *inv_freq;
    int split;   // rope_kv_write, then attention_decode, instead of the one op
} drope_arg;

// Outputs: attention's rows, x after (q and k rotated), the k and v pools.
static void drope_run(int gpu, float **out, void *arg) {
    drope_arg *w = arg;
    tr_backend *be = be_of(gpu);
    size_t pool = (size_t)w->n_blocks * 16 * w->KVH * w->D, n = (size_t)w->B * w->ld;
    size_t no = (size_t)w->B * w->H * w->D;
    tr_kv_pages kv = {.k_pool = put_act(gpu, w->k0, pool), .v_pool = put_act(gpu, w->v0, pool),
                      .block_size = 16, .n_blocks = w->n_blocks, .n_kv_heads = w->KVH,
                      .head_dim = w->D};
    void *rows = put_act(gpu, w->rows, n), *o = put_act(gpu, NULL, no);
    int32_t *slot = puti(gpu, w->slot, w->B), *pos = puti(gpu, w->pos, w->B);
    int32_t *table = puti(gpu, w->table, (size_t)w->B * w->max_blocks);
    int32_t *len = puti(gpu, w->seq_len, w->B);
    float *f = putf(gpu, w->inv_freq, w->D / 2);
    void *v = elem(rows, (size_t)(w->H + w->KVH) * w->D, be->act);
    if (w->split) {
        be->ops->rope_kv_write(be, rows, v, w->ld, pos, f, w->B, w->H, &kv, slot);
        be->ops->attention_decode(be, o, rows, w->ld, &kv, table, w->max_blocks, len, w->B,
                                  w->H);
    } else {
        be->ops->attention_decode_rope(be, o, rows, v, w->ld, pos, f, &kv, slot, table,
                                       w->max_blocks, len, w->B, w->H);
    }
    get_act(gpu, out[0], o, no);
    get_act(gpu, out[1], rows, n);
    get_act(gpu, out[2], kv.k_pool, pool);
    get_act(gpu, out[3], kv.v_pool, pool);
    bufs_free(gpu);
}

// B sequences of up to ctx tokens in scattered 16-slot blocks of a noisy pool, each row the
// sequence's next token (its slot the last of its context; one a padding row: slot -1, one
// slot read): on the GPU the one op against rope_kv_write then attention_decode, bit for bit
// in every output, with each decode kernel; on the CPU they are those two ops.
static void test_decode_rope(int32_t B, int32_t H, int32_t KVH, int32_t D, int32_t ctx) {
    drope_arg w = {.B = B, .H = H, .KVH = KVH, .D = D, .ld = (H + 2 * KVH) * D + 8};
    w.max_blocks = (ctx + 15) / 16;
    w.n_blocks = B * w.max_blocks + 3;
    size_t nt = (size_t)B * w.max_blocks;
    w.table = kt_malloc(nt * sizeof(int32_t));
    for (size_t i = 0; i < nt; i++) w.table[i] = (int32_t)(((int64_t)i * 7919) % w.n_blocks);
    w.seq_len = kt_malloc((size_t)B * sizeof(int32_t));
    w.pos = kt_malloc((size_t)B * sizeof(int32_t));
    w.slot = kt_malloc((size_t)B * sizeof(int32_t));
    for (int32_t b = 0; b < B; b++) {
        // the whole context, one token, and lengths on both sides of chunk edges among them
        int32_t len = b == 0 ? ctx : b == 1 ? 1 : b == 2 ? 257 : 1 + (b * 613 + 7) % ctx;
        if (len > ctx) len = ctx;
        w.seq_len[b] = len;
        w.pos[b] = len - 1;
        w.slot[b] = w.table[(size_t)b * w.max_blocks + (len - 1) / 16] * 16 + (len - 1) % 16;
    }
    w.slot[B / 2] = -1;   // a padding row: writes nothing, reads one slot
    w.seq_len[B / 2] = 1;
    w.pos[B / 2] = 0;
    w.inv_freq = kt_floats(D / 2);
    for (int32_t i = 0; i < D / 2; i++) w.inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
    size_t pool = (size_t)w.n_blocks * 16 * KVH * D;
    w.rows = rand_act((size_t)B * w.ld, 1.0);
    w.k0 = rand_act(pool, 1.0);
    w.v0 = rand_act(pool, 1.0);
    size_t l[4] = {(size_t)B * H * D, (size_t)B * w.ld, pool, pool};
    float *one[4], *two[4];
    for (int i = 0; i < 4; i++) {
        one[i] = kt_floats(l[i]);
        two[i] = kt_floats(l[i]);
    }
    w.split = 1;
    drope_run(1, two, &w);
    w.split = 0;
    // the split walk rotates in a launch of its own first: the op's path then
    static const char *kernel[3] = {"walk", "shared chunk", "split walk"};
    const int rope_was = tr_backend_cuda_decode_rope(&gpu_be, 1);
    for (int k = 0; k < 3; k++) {
        const int was = tr_backend_cuda_decode_coop(&gpu_be, k == 1);
        const int split_was = tr_backend_cuda_decode_split(&gpu_be, k == 2);
        CHECKF(split_was >= 0, "attention_decode_rope: the split walk's memory could not be made");
        drope_run(1, one, &w);
        tr_backend_cuda_decode_split(&gpu_be, split_was < 0 ? 0 : split_was);
        tr_backend_cuda_decode_coop(&gpu_be, was);
        int same = 1;
        for (int i = 0; i < 4; i++) {
            const int s = kt_same_bits(one[i], two[i], l[i]);
            CHECKF(s, "attention_decode_rope (%s) B=%d D=%d: output %d differs from "
                   "rope_kv_write then attention_decode", kernel[k], B, D, i);
            same &= s;
        }
        printf("  %-5s attention_decode_rope (%s) B=%d H=%d/%d D=%d ctx<=%d = rope_kv_write + "
               "attention_decode: %s\n", tr_dt_name(prec), kernel[k], B, H, KVH, D, ctx,
               same ? "bitwise" : "NO");
    }
    tr_backend_cuda_decode_rope(&gpu_be, rope_was);
    for (int i = 0; i < 4; i++) {
        free(one[i]);
        free(two[i]);
    }
    free(w.table); free(w.seq_len); free(w.pos); free(w.slot); free(w.inv_freq);
    free(w.rows); free(w.k0); free(w.v0);
}

// --- attention over a fused [q;k;v] buffer ---------------------------------------------------

// In the bf16 pass the tensor-core kernels (head dimensions 64 and 128) round P, and in the
// backward dS = P (dP - delta) scale, to bf16 before the products P V, P^T dO, dS^T Q and
// dS K, as flash attention does; the CPU keeps them fp32 and rounds only each output. bf16
// keeps 8 significant bits, so such a rounding moves a factor by at most 2^-8 of itself, and
// an output element sum_j x_j y_j whose x_j are rounded moves by at most 2^-8 M with
// M = sum_j |x_j| |y_j|, computed on the host in double from the same inputs (att_mag):
//   out[i,h,d] = sum_j P_ij |v_jd|;  dv[j,g,d] = sum over the group's h and i of P_ij |dO_id|;
//   dq[i,h,d] = scale sum_j P_ij (|dP_ij| + |delta_i|) |k_jd|; dk likewise over h and i, |q_id|
// (|dS| <= P (|dP| + |delta|) scale also bounds what fp32 cancellation in dP - delta loses).
// With the output's own rounding (BF16_REL, as for every A output) and fp32 reordering
// relative to the largest such magnitude sum, elementwise
//   |cuda - cpu| <= BF16_REL max(|cuda|, |cpu|) + 2^-8 M + TOL max M.
// The bound holds for the row kernels too (they round only the output), so the bf16 pass
// applies it to every head dimension. The fp32 pass runs the row kernels: TOL as elsewhere.
#define ATT_P_REL 0x1p-8

typedef struct att_arg {
    int32_t T, H, KVH, D, ld, n_docs;
    int32_t *doc_start, *pos;
    int32_t *prefix;    // tr_doc_layout.prefix (NULL: none)
    float *qkv;    // [T, ld]: q at column 0, k at H*D, v at (H+KVH)*D, then padding
    float *dout;   // [T, H*D]
    float *out, *lse;   // the CPU forward's, input to the backward on both backends
} att_arg;

static int32_t att_doc_of(const att_arg *a, int32_t t) {
    int32_t d = 0;
    while (a->doc_start[d + 1] <= t) d++;
    return d;
}

// The rows of token t's context in order (its document's prefix, then its document's tokens
// up to t) into rows (room for T); returns how many.
static int32_t att_context(const att_arg *a, int32_t t, int32_t *rows) {
    int32_t d = att_doc_of(a, t), n = 0, p = a->prefix ? a->prefix[d] : -1;
    if (p >= 0)
        for (int32_t j = a->doc_start[p]; j < a->doc_start[p + 1]; j++) rows[n++] = j;
    for (int32_t j = a->doc_start[d]; j <= t; j++) rows[n++] = j;
    return n;
}

// pos of a layout: each token's position in its context (documents with a prefix start at
// its length).
static void att_positions(att_arg *a) {
    for (int32_t d = 0; d < a->n_docs; d++) {
        int32_t p = a->prefix ? a->prefix[d] : -1;
        int32_t L = p >= 0 ? a->doc_start[p + 1] - a->doc_start[p] : 0;
        for (int32_t t = a->doc_start[d]; t < a->doc_start[d + 1]; t++)
            a->pos[t] = L + t - a->doc_start[d];
    }
}

// The magnitude sums M above (any of the outputs may be NULL: not computed), each zeroed here.
static void att_mag(const att_arg *a, double *mo, double *mq, double *mk, double *mv) {
    int32_t T = a->T, H = a->H, KVH = a->KVH, D = a->D, G = H / KVH;
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    double scale = 1.0 / sqrt((double)D), *p = kt_malloc((size_t)T * sizeof(double));
    int32_t *rows = kt_malloc((size_t)T * sizeof(int32_t));
    if (mo) memset(mo, 0, nq * sizeof(double));
    if (mq) memset(mq, 0, nq * sizeof(double));
    if (mk) memset(mk, 0, nk * sizeof(double));
    if (mv) memset(mv, 0, nk * sizeof(double));
    for (int32_t h = 0; h < H; h++)
        for (int32_t i = 0; i < T; i++) {
            int32_t g = h / G, n = att_context(a, i, rows);
            const float *q = a->qkv + (size_t)i * a->ld + (size_t)h * D;
            const float *go = a->dout + ((size_t)i * H + h) * D;
            const float *o = a->out + ((size_t)i * H + h) * D;
            double mx = -INFINITY, l = 0.0;
            for (int32_t j = 0; j < n; j++) {   // j: the key's place in the context
                const float *k = a->qkv + (size_t)rows[j] * a->ld + (size_t)(H + g) * D;
                double acc = 0.0;
                for (int32_t d = 0; d < D; d++) acc += (double)q[d] * k[d];
                p[j] = acc * scale;
                if (p[j] > mx) mx = p[j];
            }
            for (int32_t j = 0; j < n; j++) l += (p[j] = exp(p[j] - mx));
            double delta = 0.0;
            for (int32_t d = 0; d < D; d++) delta += (double)go[d] * o[d];
            size_t qi = ((size_t)i * H + h) * D;
            for (int32_t j = 0; j < n; j++) {
                const float *k = a->qkv + (size_t)rows[j] * a->ld + (size_t)(H + g) * D;
                const float *v = k + (size_t)KVH * D;
                double pj = p[j] / l, dp = 0.0;
                size_t kj = ((size_t)rows[j] * KVH + g) * D;
                for (int32_t d = 0; d < D; d++) dp += (double)go[d] * v[d];
                double w = pj * (fabs(dp) + fabs(delta)) * scale;
                for (int32_t d = 0; d < D; d++) {
                    if (mo) mo[qi + d] += pj * fabs(v[d]);
                    if (mq) mq[qi + d] += w * fabs(k[d]);
                    if (mk) mk[kj + d] += w * fabs(q[d]);
                    if (mv) mv[kj + d] += pj * fabs(go[d]);
                }
            }
        }
    free(p);
    free(rows);
}

// The ATT_P_REL rule over n elements: returns the violations (NaNs among them), and the
// largest |cuda - cpu| as a fraction of its allowance.
static size_t att_check(const float *g, const float *c, const double *m, size_t n,
                        double *worst) {
    double mmax = 0.0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i] > mmax) mmax = m[i];
    *worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - (double)c[i]);
        double big = fabs(g[i]) > fabs(c[i]) ? fabs(g[i]) : fabs(c[i]);
        double tol = BF16_REL * big + ATT_P_REL * m[i] + TOL * mmax;
        if (!(d <= tol)) bad++;
        if (d / tol > *worst) *worst = d / tol;
    }
    return bad;
}

// compare() for attention: the CPU once, the GPU twice (bitwise equal; in bf16 the second run
// on the mma.sync kernels where the first took the wgmma ones); output i is 'A' (an A-dtype
// output: the ATT_P_REL rule against mag[i] in the bf16 pass) or 'F' (TOL).
static void att_compare(const char *name, op_fn op, void *arg, const char *kinds,
                        const size_t *len, double *const *mag) {
    int n_out = (int)strlen(kinds);
    float *ref[4], *a[4], *b[4];
    for (int i = 0; i < n_out; i++) {
        ref[i] = kt_floats(len[i]);
        a[i] = kt_floats(len[i]);
        b[i] = kt_floats(len[i]);
    }
    op(0, ref, arg);
    op(1, a, arg);
    // the second run on the mma.sync kernels where the wgmma ones ran first: the same bits
    const int was = tr_backend_cuda_wgmma(&gpu_be, 0), wg = was && prec == TR_BF16;
    op(1, b, arg);
    tr_backend_cuda_wgmma(&gpu_be, was);
    for (int i = 0; i < n_out; i++) {
        double e = tr_test_rel_err(a[i], ref[i], len[i]);
        CHECKF(kt_same_bits(a[i], b[i], len[i]), "%s output %d: two cuda runs differ%s", name, i,
               wg ? " (wgmma, then mma.sync)" : "");
        printf("  %-5s %-34s out %d (%c): max err / scale %.2e", tr_dt_name(prec), name, i,
               kinds[i], e);
        if (kinds[i] == 'A' && prec == TR_BF16) {
            double worst;
            size_t bad = att_check(a[i], ref[i], mag[i], len[i], &worst);
            CHECKF(bad == 0, "%s output %d: %zu of %zu elements past the bf16 P/dS allowance",
                   name, i, bad, len[i]);
            printf(", worst %.2f of allowance%s\n", worst, bad ? " (PAST TOLERANCE)" : "");
        } else {
            CHECKF(e <= TOL, "%s output %d: cuda vs cpu rel err %.3g", name, i, e);
            printf("%s\n", kt_same_bits(a[i], ref[i], len[i]) ? ", bitwise" : "");
        }
        free(ref[i]);
        free(a[i]);
        free(b[i]);
    }
}

static tr_doc_layout att_docs(int gpu, const att_arg *a) {
    tr_doc_layout d = {.n_tokens = a->T, .n_docs = a->n_docs,
                       .doc_start = puti(gpu, a->doc_start, a->n_docs + 1),
                       .pos = puti(gpu, a->pos, a->T),
                       .prefix = a->prefix ? puti(gpu, a->prefix, a->n_docs) : NULL};
    return d;
}

static void att_forward(int gpu, float **out, void *arg) {
    att_arg *a = arg;
    tr_backend *be = be_of(gpu);
    size_t nq = (size_t)a->T * a->H * a->D;
    tr_doc_layout docs = att_docs(gpu, a);
    void *qkv = put_act(gpu, a->qkv, (size_t)a->T * a->ld);
    void *o = put_act(gpu, NULL, nq);
    float *lse = putt(gpu, NULL, (size_t)a->T * a->H, TR_F32);
    be->ops->attention_forward(be, o, lse, qkv, elem(qkv, (size_t)a->H * a->D, be->act),
                               elem(qkv, (size_t)(a->H + a->KVH) * a->D, be->act), a->ld, &docs,
                               a->H, a->KVH, a->D);
    get_act(gpu, out[0], o, nq);
    getf(gpu, out[1], lse, (size_t)a->T * a->H);
    bufs_free(gpu);
}

// dq, dk, dv written into one NaN-filled [T, ld] buffer at q's, k's and v's columns: every
// element of the three views written, the padding left alone.
static void att_backward(int gpu, float **out, void *arg) {
    att_arg *a = arg;
    tr_backend *be = be_of(gpu);
    size_t nq = (size_t)a->T * a->H * a->D, n = (size_t)a->T * a->ld;
    int32_t kc = a->H * a->D, vc = (a->H + a->KVH) * a->D, w = a->KVH * a->D;
    tr_doc_layout docs = att_docs(gpu, a);
    void *qkv = put_act(gpu, a->qkv, n), *d = put_act(gpu, NULL, n);
    void *o = put_act(gpu, a->out, nq), *dout = put_act(gpu, a->dout, nq);
    float *lse = putf(gpu, a->lse, (size_t)a->T * a->H);
    be->ops->attention_backward(be, d, elem(d, kc, be->act), elem(d, vc, be->act), dout, o, lse,
                                qkv, elem(qkv, kc, be->act), elem(qkv, vc, be->act), a->ld,
                                &docs, a->H, a->KVH, a->D);
    float *full = kt_floats(n), *tmp = kt_floats((size_t)a->T * (vc + w));
    get_act(gpu, full, d, n);
    unpack_rows("attention_backward", tmp, full, a->T, a->ld, 0, vc + w, 1);
    // tmp: [T, (H + 2 KVH) D] packed; split into dq, dk, dv
    unpack_rows("dq", out[0], tmp, a->T, vc + w, 0, kc, 0);
    unpack_rows("dk", out[1], tmp, a->T, vc + w, kc, w, 0);
    unpack_rows("dv", out[2], tmp, a->T, vc + w, vc, w, 0);
    free(tmp);
    free(full);
    bufs_free(gpu);
}

// Decode of chosen tokens over a paged cache built from the same k, v: each sequence holds
// the keys of the token's context (a shared prefix's copied in front of its document's, as
// generation holds them) up to the token, in blocks of block_size slots placed in a scattered
// order; the queries are the tokens' fused rows (stride ld). Returns in out[0] the decode rows.
typedef struct dec_arg {
    const att_arg *a;
    int32_t B, max_blocks, n_blocks, block_size;
    int32_t *tok, *seq_len, *table;
    float *kp, *vp, *qd;
} dec_arg;

static void dec_build(dec_arg *d, const att_arg *a, const int32_t *tok, int32_t B,
                      int32_t block_size) {
    d->a = a;
    d->B = B;
    d->block_size = block_size;
    d->tok = kt_malloc((size_t)B * sizeof(int32_t));
    d->seq_len = kt_malloc((size_t)B * sizeof(int32_t));
    d->max_blocks = 0;
    int32_t *rows = kt_malloc((size_t)a->T * sizeof(int32_t));
    for (int32_t b = 0; b < B; b++) {
        int32_t t = tok[b];
        d->tok[b] = t;
        d->seq_len[b] = att_context(a, t, rows);
        int32_t nb = (d->seq_len[b] + d->block_size - 1) / d->block_size;
        if (nb > d->max_blocks) d->max_blocks = nb;
    }
    d->n_blocks = B * d->max_blocks;
    size_t slot_f = (size_t)a->KVH * a->D, pool = (size_t)d->n_blocks * d->block_size * slot_f;
    d->kp = kt_fill(pool, nan_f());   // slots past a sequence's end must never be read
    d->vp = kt_fill(pool, nan_f());
    d->table = kt_malloc((size_t)d->n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < d->n_blocks; i++) d->table[i] = i;
    for (int32_t i = d->n_blocks - 1; i > 0; i--) {   // Fisher-Yates: a scattered permutation
        int32_t r = (int32_t)((kt_uniform() + 1.0) * 0.5 * (i + 1)), tmp = d->table[i];
        if (r > i) r = i;
        d->table[i] = d->table[r];
        d->table[r] = tmp;
    }
    d->qd = kt_floats((size_t)B * a->ld);
    for (int32_t b = 0; b < B; b++) {
        att_context(a, d->tok[b], rows);
        for (int32_t j = 0; j < d->seq_len[b]; j++) {
            int32_t blk = d->table[b * d->max_blocks + j / d->block_size];
            size_t dst = ((size_t)blk * d->block_size + j % d->block_size) * slot_f;
            const float *row = a->qkv + (size_t)rows[j] * a->ld;
            memcpy(d->kp + dst, row + (size_t)a->H * a->D, slot_f * sizeof(float));
            memcpy(d->vp + dst, row + (size_t)(a->H + a->KVH) * a->D, slot_f * sizeof(float));
        }
        memcpy(d->qd + (size_t)b * a->ld, a->qkv + (size_t)d->tok[b] * a->ld,
               (size_t)a->ld * sizeof(float));
    }
    free(rows);
}

static void dec_free(dec_arg *d) {
    free(d->tok); free(d->seq_len); free(d->table); free(d->kp); free(d->vp); free(d->qd);
}

static void dec_run(int gpu, float **out, void *arg) {
    dec_arg *d = arg;
    const att_arg *a = d->a;
    tr_backend *be = be_of(gpu);
    size_t pool = (size_t)d->n_blocks * d->block_size * a->KVH * a->D;
    size_t no = (size_t)d->B * a->H * a->D;
    tr_kv_pages kv = {.k_pool = put_act(gpu, d->kp, pool), .v_pool = put_act(gpu, d->vp, pool),
                      .block_size = d->block_size, .n_blocks = d->n_blocks,
                      .n_kv_heads = a->KVH, .head_dim = a->D};
    int32_t *table = puti(gpu, d->table, d->n_blocks), *seq_len = puti(gpu, d->seq_len, d->B);
    void *q = put_act(gpu, d->qd, (size_t)d->B * a->ld), *o = put_act(gpu, NULL, no);
    be->ops->attention_decode(be, o, q, a->ld, &kv, table, d->max_blocks, seq_len, d->B, a->H);
    get_act(gpu, out[0], o, no);
    bufs_free(gpu);
}

// Decoded tokens: every document's last token, the middle of the last document, the first
// token of documents with a prefix (the context's first position past it), and in documents
// whose context is longer than a softmax chunk (the backend's, TR_CUDA_SOFTMAX_CHUNK unless
// the environment sets another) the tokens on either side of each chunk edge, so the decode's
// split and fold are exercised; at most 16.
static int32_t att_decode_tokens(const att_arg *a, int32_t *tok) {
    int32_t n = 0, last = a->doc_start[a->n_docs - 1];
    const int32_t chunk = tr_backend_cuda_softmax_chunk(&gpu_be);
    for (int32_t d = 0; d < a->n_docs && n < 8; d++)
        if (a->doc_start[d + 1] > a->doc_start[d]) tok[n++] = a->doc_start[d + 1] - 1;
    tok[n++] = last + (a->T - last) / 2;
    for (int32_t d = 0; d < a->n_docs && n < 12; d++)
        if (a->prefix && a->prefix[d] >= 0 && a->doc_start[d + 1] > a->doc_start[d])
            tok[n++] = a->doc_start[d];
    for (int32_t t = 0; t < a->T && n < 16; t++)
        if (a->pos[t] % chunk == chunk - 1 || (a->pos[t] > 0 && a->pos[t] % chunk == 0))
            tok[n++] = t;
    return n;
}

// Documents of 1..40 tokens over T tokens (more than a warp's 32 of them, many in one tile);
// returns how many. ds has room for T + 1 entries.
static int32_t att_short_docs(int32_t *ds, int32_t T) {
    int32_t n = 0, t = 0;
    uint32_t s = 5u;
    ds[0] = 0;
    while (t < T) {
        s = s * 1664525u + 1013904223u;
        t = t + 1 + (int32_t)((s >> 8) % 40u) < T ? t + 1 + (int32_t)((s >> 8) % 40u) : T;
        ds[++n] = t;
    }
    return n;
}

// The layout a shared prefix stands for: each document with a prefix becomes one document,
// the prefix's rows copied in front of its own; the others (prefix documents among them)
// stay. map[t]: token t's row there. The copied rows take dout 0, so their queries add nothing
// to any gradient (dP = delta = 0 give dS = 0, and P dO = 0), and the out and lse of the row
// they copy (the same context, so their P stay finite).
static void att_unshare(const att_arg *a, att_arg *u, int32_t *map) {
    size_t HD = (size_t)a->H * a->D;
    *u = *a;
    u->prefix = NULL;
    for (int32_t d = 0; d < a->n_docs; d++)
        if (a->prefix[d] >= 0)
            u->T += a->doc_start[a->prefix[d] + 1] - a->doc_start[a->prefix[d]];
    u->doc_start = kt_malloc((size_t)(a->n_docs + 1) * sizeof(int32_t));
    u->pos = kt_malloc((size_t)u->T * sizeof(int32_t));
    u->qkv = kt_floats((size_t)u->T * a->ld);
    u->dout = kt_floats((size_t)u->T * HD);
    u->out = kt_floats((size_t)u->T * HD);
    u->lse = kt_floats((size_t)u->T * a->H);
    int32_t r = 0;
    for (int32_t d = 0; d < a->n_docs; d++) {
        u->doc_start[d] = r;
        for (int own = a->prefix[d] < 0; own < 2; own++) {
            int32_t e = own ? d : a->prefix[d];
            for (int32_t t = a->doc_start[e]; t < a->doc_start[e + 1]; t++, r++) {
                memcpy(u->qkv + (size_t)r * a->ld, a->qkv + (size_t)t * a->ld,
                       (size_t)a->ld * sizeof(float));
                memcpy(u->out + r * HD, a->out + t * HD, HD * sizeof(float));
                memcpy(u->lse + (size_t)r * a->H, a->lse + (size_t)t * a->H,
                       (size_t)a->H * sizeof(float));
                if (own) memcpy(u->dout + r * HD, a->dout + t * HD, HD * sizeof(float));
                else memset(u->dout + r * HD, 0, HD * sizeof(float));
                if (own) map[t] = r;
            }
        }
    }
    u->doc_start[a->n_docs] = r;
    att_positions(u);
}

// A layout with shared prefixes against its unshared equivalent (att_unshare), both on the
// GPU. Forward: every row's out and lse bitwise the mapped row's, the property that makes
// decode over generation's paged context (in context order) reproduce training's rows.
// Backward (same out, lse and dout): dq the mapped row's, dk and dv the mapped row's plus, on
// a prefix's rows, the sum of its copies'. P and dS are the same bits in both layouts (same
// scores, lse and delta, rounded alike), so what differs is the order of fp32 sums (TOL) and,
// on a prefix's rows, each copy's own rounding before the host's sum: half an ulp of each,
// at most 2^-8 of the sum of the copies' magnitudes, which M bounds (every query the copies
// see is one the prefix's row sees). So att_check's rule against the shared layout's M holds
// as it stands; mag: M of dq, dk, dv (bf16 pass), the fp32 pass TOL.
static void att_shared_vs_unshared(att_arg *a, double *const *mag) {
    int32_t T = a->T, H = a->H;
    size_t HD = (size_t)H * a->D, KD = (size_t)a->KVH * a->D;
    att_arg u;
    int32_t *map = kt_malloc((size_t)T * sizeof(int32_t));
    att_unshare(a, &u, map);
    float *fs[2] = {kt_floats(T * HD), kt_floats((size_t)T * H)};
    float *fu[2] = {kt_floats(u.T * HD), kt_floats((size_t)u.T * H)};
    att_forward(1, fs, a);
    att_forward(1, fu, &u);
    int32_t differ = 0, first = -1;
    for (int32_t t = 0; t < T; t++)
        if (!kt_same_bits(fs[0] + t * HD, fu[0] + map[t] * HD, HD) ||
            !kt_same_bits(fs[1] + (size_t)t * H, fu[1] + (size_t)map[t] * H, (size_t)H)) {
            if (first < 0) first = t;
            differ++;
        }
    CHECKF(differ == 0, "shared prefix: %d forward rows differ from the unshared layout's, "
           "the first of token %d", differ, first);
    printf("  %-5s attention_fwd T%d pfx vs unshared T%d: %s\n", tr_dt_name(prec), T, u.T,
           differ ? "DIFFER" : "bitwise");

    size_t len[3] = {T * HD, T * KD, T * KD}, ulen[3] = {u.T * HD, u.T * KD, u.T * KD};
    float *bs[3], *bu[3], *want[3];
    for (int i = 0; i < 3; i++) {
        bs[i] = kt_floats(len[i]);
        bu[i] = kt_floats(ulen[i]);
        want[i] = kt_floats(len[i]);
    }
    att_backward(1, bs, a);
    att_backward(1, bu, &u);
    for (int32_t t = 0; t < T; t++) {
        int32_t d = att_doc_of(a, t);
        memcpy(want[0] + t * HD, bu[0] + map[t] * HD, HD * sizeof(float));
        for (int i = 1; i < 3; i++)
            for (size_t c = 0; c < KD; c++) {
                double x = bu[i][map[t] * KD + c];
                for (int32_t e = d + 1; e < a->n_docs && a->prefix[e] == d; e++)   // the copies
                    x += bu[i][(u.doc_start[e] + t - a->doc_start[d]) * KD + c];
                want[i][t * KD + c] = (float)x;
            }
    }
    static const char *const what[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        double e = tr_test_rel_err(bs[i], want[i], len[i]);
        printf("  %-5s attention_bwd T%d pfx vs unshared %s: max err / scale %.2e",
               tr_dt_name(prec), T, what[i], e);
        if (prec == TR_BF16) {
            double worst;
            size_t bad = att_check(bs[i], want[i], mag[i], len[i], &worst);
            CHECKF(bad == 0, "shared prefix: %s: %zu of %zu elements past the unshared layout's "
                   "allowance", what[i], bad, len[i]);
            printf(", worst %.2f of allowance%s\n", worst, bad ? " (PAST TOLERANCE)" : "");
        } else {
            CHECKF(e <= TOL, "shared prefix: %s: rel err %.3g against the unshared layout",
                   what[i], e);
            printf("%s\n", kt_same_bits(bs[i], want[i], len[i]) ? ", bitwise" : "");
        }
        free(bs[i]); free(bu[i]); free(want[i]);
    }
    free(fs[0]); free(fs[1]); free(fu[0]); free(fu[1]); free(map);
    free(u.doc_start); free(u.pos); free(u.qkv); free(u.dout); free(u.out); free(u.lse);
}

// Keys whose scale grows along each document's context, by 1 + position / 64: a later tile's
// maximum then passes a row's reference point by more than the kernels' slack (2^8) every few
// tiles, so that their rescaling runs (and the wide forward's split P V), which keys of one
// scale almost never make happen.
static void att_ramp_keys(att_arg *a) {
    for (int32_t t = 0; t < a->T; t++) {
        const float f = 1.0f + (float)a->pos[t] / 64.0f;
        float *k = a->qkv + (size_t)t * a->ld + (size_t)a->H * a->D;
        for (int32_t c = 0; c < a->KVH * a->D; c++) {
            k[c] *= f;
            if (prec == TR_BF16) k[c] = h_f32(h_bf16(k[c]));
        }
    }
}

// pad: extra columns after v in each row (strides that no fused width explains; a multiple of
// 8 keeps rows 16-byte aligned, anything else takes the kernels' element loads). prefix:
// tr_doc_layout.prefix, or NULL; with one, the layout is also checked against its unshared
// equivalent (att_shared_vs_unshared). ramp: keys growing along the context (att_ramp_keys).
static void test_attention_keys(int32_t T, int32_t n_docs, const int32_t *doc_start,
                                const int32_t *prefix, int32_t H, int32_t KVH, int32_t D,
                                int32_t pad, int32_t block_size, bool ramp) {
    att_arg a = {.T = T, .H = H, .KVH = KVH, .D = D, .n_docs = n_docs,
                 .ld = (H + 2 * KVH) * D + pad};
    size_t nq = (size_t)T * H * D, nk = (size_t)T * KVH * D;
    a.doc_start = kt_malloc((size_t)(n_docs + 1) * sizeof(int32_t));
    memcpy(a.doc_start, doc_start, (size_t)(n_docs + 1) * sizeof(int32_t));
    if (prefix) {
        a.prefix = kt_malloc((size_t)n_docs * sizeof(int32_t));
        memcpy(a.prefix, prefix, (size_t)n_docs * sizeof(int32_t));
    }
    a.pos = kt_malloc((size_t)T * sizeof(int32_t));
    att_positions(&a);
    a.qkv = rand_act((size_t)T * a.ld, 2.0);   // v's scale 2 too: the outputs stay near 1
    if (ramp) att_ramp_keys(&a);
    a.dout = rand_act(nq, 1.0);
    a.out = kt_floats(nq);
    a.lse = kt_floats((size_t)T * H);
    float *fo[2] = {a.out, a.lse};
    att_forward(0, fo, &a);
    double *mo = kt_malloc(nq * sizeof(double)), *mq = kt_malloc(nq * sizeof(double));
    double *mk = kt_malloc(nk * sizeof(double)), *mv = kt_malloc(nk * sizeof(double));
    if (prec == TR_BF16) {
        att_mag(&a, mo, mq, mk, mv);
    } else {   // unused by the fp32 rule
        memset(mo, 0, nq * sizeof(double));
        memset(mq, 0, nq * sizeof(double));
        memset(mk, 0, nk * sizeof(double));
        memset(mv, 0, nk * sizeof(double));
    }
    char name[96];
    const char *pfx = prefix ? " pfx" : "";
    if (ramp) pfx = prefix ? " pfx ramp" : " ramp";
    snprintf(name, sizeof name, "attention_fwd T%d H%d/%d D%d ld%d%s", T, H, KVH, D, a.ld, pfx);
    size_t lf[2] = {nq, (size_t)T * H}, lb[3] = {nq, nk, nk};
    double *mf[2] = {mo, NULL}, *mb[3] = {mq, mk, mv};
    att_compare(name, att_forward, &a, "AF", lf, mf);
    snprintf(name, sizeof name, "attention_bwd T%d H%d/%d D%d ld%d%s", T, H, KVH, D, a.ld, pfx);
    att_compare(name, att_backward, &a, "AAA", lb, mb);

    int32_t tok[16];
    int32_t B = att_decode_tokens(&a, tok);
    dec_arg d;
    dec_build(&d, &a, tok, B, block_size);
    size_t ld[1] = {(size_t)B * H * D};
    double *md = kt_malloc(ld[0] * sizeof(double)), *mdp[1] = {md};
    for (int32_t b = 0; b < B; b++)
        memcpy(md + (size_t)b * H * D, mo + (size_t)tok[b] * H * D, (size_t)H * D * sizeof(double));
    snprintf(name, sizeof name, "attention_decode B%d ctx<=%d bs%d%s", B,
             d.max_blocks * block_size, block_size, pfx);
    att_compare(name, dec_run, &d, "A", ld, mdp);
    float *fwd[2] = {kt_floats(nq), kt_floats((size_t)T * H)}, *dec[1] = {kt_floats(ld[0])};
    att_forward(1, fwd, &a);
    // every decode kernel, the per-warp walk, the shared chunk (where it runs: otherwise the
    // walk again) and the split walk (wherever it fits: contexts of two chunks and more),
    // against the forward's rows
    static const char *kernel[3] = {"walk", "shared chunk", "split walk"};
    for (int k = 0; k < 3; k++) {
        const int was = tr_backend_cuda_decode_coop(&gpu_be, k == 1);
        const int split_was = tr_backend_cuda_decode_split(&gpu_be, k == 2);
        CHECKF(split_was >= 0, "attention_decode: the split walk's memory could not be made");
        dec_run(1, dec, &d);
        tr_backend_cuda_decode_split(&gpu_be, split_was < 0 ? 0 : split_was);
        tr_backend_cuda_decode_coop(&gpu_be, was);
        int same = 1;
        for (int32_t b = 0; b < B; b++) {
            int s = kt_same_bits(dec[0] + (size_t)b * H * D, fwd[0] + (size_t)tok[b] * H * D,
                                 (size_t)H * D);
            CHECKF(s, "attention_decode (%s) row of token %d (position %d) differs from the cuda "
                   "forward's", kernel[k], tok[b], d.seq_len[b] - 1);
            same &= s;
        }
        printf("  %-5s attention_decode (%s) %d tokens (positions up to %d) vs cuda forward: "
               "%s\n", tr_dt_name(prec), kernel[k], B, d.max_blocks * block_size - 1,
               same ? "bitwise" : "DIFFER");
    }
    free(fwd[0]); free(fwd[1]); free(dec[0]); free(md);
    dec_free(&d);
    if (prefix) att_shared_vs_unshared(&a, mb);
    free(mo); free(mq); free(mk); free(mv);
    free(a.doc_start); free(a.prefix); free(a.pos); free(a.qkv); free(a.dout); free(a.out);
    free(a.lse);
}

static void test_attention(int32_t T, int32_t n_docs, const int32_t *doc_start,
                           const int32_t *prefix, int32_t H, int32_t KVH, int32_t D, int32_t pad,
                           int32_t block_size) {
    test_attention_keys(T, n_docs, doc_start, prefix, H, KVH, D, pad, block_size, false);
}

// --- kv_write -------------------------------------------------------------------------------

typedef struct kvw_arg {
    int32_t T, H, KVH, D, ld, n_blocks, block_size;
    int32_t *slot;
    float *rows, *k0, *v0;   // rows: [T, ld] fused; k0, v0: the pools before
} kvw_arg;

static void kvw_run(int gpu, float **out, void *arg) {
    kvw_arg *w = arg;
    tr_backend *be = be_of(gpu);
    size_t pool = (size_t)w->n_blocks * w->block_size * w->KVH * w->D;
    tr_kv_pages kv = {.k_pool = put_act(gpu, w->k0, pool), .v_pool = put_act(gpu, w->v0, pool),
                      .block_size = w->block_size, .n_blocks = w->n_blocks,
                      .n_kv_heads = w->KVH, .head_dim = w->D};
    void *rows = put_act(gpu, w->rows, (size_t)w->T * w->ld);
    int32_t *slot = puti(gpu, w->slot, w->T);
    be->ops->kv_write(be, &kv, slot, elem(rows, (size_t)w->H * w->D, be->act),
                      elem(rows, (size_t)(w->H + w->KVH) * w->D, be->act), w->ld, w->T);
    get_act(gpu, out[0], kv.k_pool, pool);
    get_act(gpu, out[1], kv.v_pool, pool);
    bufs_free(gpu);
}

// T tokens' k and v from fused rows into distinct scattered slots of a noisy pool: equal to
// the CPU's pools and to the host's own placement, bit for bit.
static void test_kv_write(int32_t T, int32_t H, int32_t KVH, int32_t D) {
    kvw_arg w = {.T = T, .H = H, .KVH = KVH, .D = D, .ld = (H + 2 * KVH) * D + 3,
                 .n_blocks = 12, .block_size = 16};
    int32_t n_slots = w.n_blocks * w.block_size, width = KVH * D;
    size_t pool = (size_t)n_slots * width;
    int32_t *perm = kt_malloc((size_t)n_slots * sizeof(int32_t));
    for (int32_t i = 0; i < n_slots; i++) perm[i] = i;
    for (int32_t i = n_slots - 1; i > 0; i--) {
        int32_t r = (int32_t)((kt_uniform() + 1.0) * 0.5 * (i + 1)), tmp = perm[i];
        if (r > i) r = i;
        perm[i] = perm[r];
        perm[r] = tmp;
    }
    w.slot = perm;   // the first T of a permutation: distinct
    w.rows = rand_act((size_t)T * w.ld, 1.0);
    w.k0 = rand_act(pool, 1.0);
    w.v0 = rand_act(pool, 1.0);
    size_t l[2] = {pool, pool};
    compare("kv_write", kvw_run, &w, "XX", l);
    float *o[2] = {kt_floats(pool), kt_floats(pool)};
    kvw_run(1, o, &w);
    float *ek = kt_copy(w.k0, pool), *ev = kt_copy(w.v0, pool);
    for (int32_t t = 0; t < T; t++) {
        memcpy(ek + (size_t)w.slot[t] * width, w.rows + (size_t)t * w.ld + (size_t)H * D,
               (size_t)width * sizeof(float));
        memcpy(ev + (size_t)w.slot[t] * width, w.rows + (size_t)t * w.ld + (size_t)(H + KVH) * D,
               (size_t)width * sizeof(float));
    }
    CHECKF(kt_same_bits(o[0], ek, pool) && kt_same_bits(o[1], ev, pool),
           "kv_write: the pools are not the rows placed in their slots");
    free(o[0]); free(o[1]); free(ek); free(ev);
    free(perm); free(w.rows); free(w.k0); free(w.v0);
}

// --- add -------------------------------------------------------------------------------------

typedef struct add_arg {
    size_t n;
    float *a, *b;
} add_arg;

static void add_run(int gpu, float **out, void *arg) {
    add_arg *s = arg;
    float *a = putf(gpu, s->a, s->n), *b = putf(gpu, s->b, s->n);
    be_of(gpu)->ops->add(be_of(gpu), a, a, b, s->n);   // in place, as the residual stream adds
    getf(gpu, out[0], a, s->n);
    bufs_free(gpu);
}

// One rounding per element, nothing fused: the CPU's bits.
static void test_add(size_t n) {
    add_arg s = {.n = n, .a = kt_rand(n, 3.0), .b = kt_rand(n, 1e-3)};
    compare("add", add_run, &s, "X", &n);
    free(s.a); free(s.b);
}

// --- swiglu ---------------------------------------------------------------------------------

typedef struct sw_arg {
    int32_t T, I;
    float *gu, *dout;
} sw_arg;

static void swiglu_fwd(int gpu, float **out, void *arg) {
    sw_arg *s = arg;
    size_t n = (size_t)s->T * s->I;
    void *gu = put_act(gpu, s->gu, 2 * n), *o = put_act(gpu, NULL, n);
    be_of(gpu)->ops->swiglu_forward(be_of(gpu), o, gu, s->T, s->I);
    get_act(gpu, out[0], o, n);
    bufs_free(gpu);
}

static void swiglu_bwd(int gpu, float **out, void *arg) {
    sw_arg *s = arg;
    size_t n = (size_t)s->T * s->I;
    void *gu = put_act(gpu, s->gu, 2 * n), *go = put_act(gpu, s->dout, n);
    void *dgu = put_act(gpu, NULL, 2 * n);
    be_of(gpu)->ops->swiglu_backward(be_of(gpu), dgu, go, gu, s->T, s->I);
    get_act(gpu, out[0], dgu, 2 * n);
    bufs_free(gpu);
}

static void test_swiglu(int32_t T, int32_t I) {
    sw_arg s = {.T = T, .I = I};
    size_t n = (size_t)T * I;
    s.gu = rand_act(2 * n, 6.0);
    s.dout = rand_act(n, 1.0);
    size_t l1[1] = {n}, l2[1] = {2 * n};
    compare("swiglu_forward", swiglu_fwd, &s, "A", l1);
    compare("swiglu_backward", swiglu_bwd, &s, "A", l2);
    free(s.gu); free(s.dout);
}

// --- adamw ----------------------------------------------------------------------------------

typedef struct adam_arg {
    size_t n;
    int32_t n_segs, steps;
    const tr_adamw_seg *segs;
    float *p, *g, *m0, *v0;
    double sumsq;
    float max_norm;
    int with_work;
} adam_arg;

static tr_adamw_args adam_args(const adam_arg *a, float *p, void *work, const float *g,
                               float *m, float *v, const tr_adamw_seg *segs,
                               const double *sumsq, tr_dt wt) {
    tr_adamw_args r = {.p = p, .work = work, .g = g, .m = m, .v = v, .n = a->n, .segs = segs,
                       .n_segs = a->n_segs, .sumsq = sumsq, .max_norm = a->max_norm,
                       .lr = 1e-2f, .b1 = 0.9f, .b2 = 0.95f, .eps = 1e-8f, .t = 1, .wt = wt};
    return r;
}

// `steps` AdamW steps; out: p, m, v, and the working copy (poisoned before: written).
static void adamw_run(int gpu, float **out, void *arg) {
    adam_arg *a = arg;
    tr_backend *be = be_of(gpu);
    float *p = putf(gpu, a->p, a->n), *g = putf(gpu, a->g, a->n);
    float *m = putf(gpu, a->m0, a->n), *v = putf(gpu, a->v0, a->n);
    void *work = a->with_work ? putt(gpu, NULL, a->n, be->wt) : NULL;
    tr_adamw_seg *segs = put(gpu, a->segs, (size_t)a->n_segs * sizeof(tr_adamw_seg));
    double *sumsq = put(gpu, &a->sumsq, sizeof(double));
    for (int32_t t = 1; t <= a->steps; t++) {
        tr_adamw_args x = adam_args(a, p, work, g, m, v, segs, sumsq, be->wt);
        x.t = t;
        be->ops->adamw(be, &x);
    }
    getf(gpu, out[0], p, a->n);
    getf(gpu, out[1], m, a->n);
    getf(gpu, out[2], v, a->n);
    if (a->with_work) gett(gpu, out[3], work, a->n, be->wt);
    bufs_free(gpu);
}

// The same steps on the GPU, one call per segment (a one-segment range each): the per-tensor
// way, which the one-launch range must reproduce bit for bit.
static void adamw_per_segment(float **out, const adam_arg *a) {
    tr_backend *be = &gpu_be;
    float *p = putf(1, a->p, a->n), *g = putf(1, a->g, a->n);
    float *m = putf(1, a->m0, a->n), *v = putf(1, a->v0, a->n);
    void *work = putt(1, NULL, a->n, be->wt);
    double *sumsq = put(1, &a->sumsq, sizeof(double));
    tr_adamw_seg *one = put(1, NULL, (size_t)a->n_segs * sizeof(tr_adamw_seg));
    for (int32_t s = 0; s < a->n_segs; s++) {
        tr_adamw_seg seg = {.begin = 0, .end = a->segs[s].end - a->segs[s].begin,
                            .wd = a->segs[s].wd};
        char msg[256];
        if (tr_cuda_copy_h2d(one + s, &seg, sizeof seg, msg, sizeof msg) != 0) die("h2d", msg);
    }
    for (int32_t t = 1; t <= a->steps; t++)
        for (int32_t s = 0; s < a->n_segs; s++) {
            size_t b = a->segs[s].begin;
            adam_arg part = *a;
            part.n = a->segs[s].end - b;
            part.n_segs = 1;
            tr_adamw_args x = adam_args(&part, p + b, elem(work, b, be->wt), g + b, m + b, v + b,
                                        one + s, sumsq, be->wt);
            x.t = t;
            be->ops->adamw(be, &x);
        }
    getf(1, out[0], p, a->n);
    getf(1, out[1], m, a->n);
    getf(1, out[2], v, a->n);
    gett(1, out[3], work, a->n, be->wt);
    bufs_free(1);
}

// Segments with their own weight decay (one of a single element, one without decay); three
// steps without clipping, with clipping (c ~ 0.1), with a max_norm that does not bind (c = 1:
// the unclipped bits), and with a non-finite sum of squares (nothing written at all). The
// working copy must be the masters rounded by convert's rule, bit for bit.
static void test_adamw(size_t n) {
    tr_adamw_seg segs[5] = {{0, 1000, 0.1f, 0}, {1000, 1001, 0.0f, 0}, {1001, 50000, 0.05f, 0},
                            {50000, n - 3, 0.0f, 0}, {n - 3, n, 0.2f, 0}};
    adam_arg a = {.n = n, .n_segs = 5, .steps = 3, .segs = segs, .sumsq = 5.0, .max_norm = 0.0f,
                  .with_work = 1};
    a.p = kt_rand(n, 6.0);
    a.g = kt_rand(n, 1.0);
    a.m0 = kt_rand(n, 0.1);
    a.v0 = kt_fill(n, 0.01f);
    size_t l4[4] = {n, n, n, n};
    float *o1[4], *o2[4];
    for (int i = 0; i < 4; i++) {
        o1[i] = kt_floats(n);
        o2[i] = kt_floats(n);
    }
    compare("adamw", adamw_run, &a, "FFFA", l4);
    adamw_run(1, o1, &a);
    float *rounded = kt_floats(n);
    for (size_t i = 0; i < n; i++)
        rounded[i] = prec == TR_BF16 ? h_f32(h_bf16(o1[0][i])) : o1[0][i];
    CHECKF(kt_same_bits(o1[3], rounded, n), "adamw: the working copy is not the rounded masters");
    adamw_per_segment(o2, &a);
    int same = 1;
    for (int i = 0; i < 4; i++) same &= kt_same_bits(o1[i], o2[i], n);
    CHECKF(same, "adamw: one launch over the segments differs from a call per segment");
    printf("  %-5s adamw one launch vs per segment: %s\n", tr_dt_name(prec),
           same ? "bitwise" : "DIFFER");

    a.max_norm = 10.0f;   // sqrt(5) + 1e-6 < 10: c = 1
    adamw_run(1, o2, &a);
    same = 1;
    for (int i = 0; i < 4; i++) same &= kt_same_bits(o1[i], o2[i], n);
    CHECKF(same, "adamw: a max_norm that does not bind changes the update");

    a.max_norm = 1.0f;
    a.sumsq = 100.0;   // c = 1 / (10 + 1e-6)
    compare("adamw clipped", adamw_run, &a, "FFFA", l4);
    adamw_run(1, o2, &a);
    same = 1;
    for (int i = 0; i < 3; i++) same &= !kt_same_bits(o1[i], o2[i], n);
    CHECKF(same, "adamw: clipping changed nothing");

    static const double bad[2] = {NAN, INFINITY};
    for (int k = 0; k < 2; k++) {
        a.sumsq = bad[k];
        for (int gpu = 0; gpu < 2; gpu++) {
            adamw_run(gpu, o2, &a);
            int kept = kt_same_bits(o2[0], a.p, n) && kt_same_bits(o2[1], a.m0, n) &&
                       kt_same_bits(o2[2], a.v0, n);
            size_t work_written = 0;
            for (size_t i = 0; i < n; i++) work_written += !isnan(o2[3][i]);
            CHECKF(kept && work_written == 0, "adamw on %s with sumsq %g wrote (work: %zu)",
                   gpu ? "cuda" : "cpu", bad[k], work_written);
        }
    }
    printf("  %-5s adamw skips a non-finite step on both backends: checked\n",
           tr_dt_name(prec));
    for (int i = 0; i < 4; i++) {
        free(o1[i]);
        free(o2[i]);
    }
    free(rounded); free(a.p); free(a.g); free(a.m0); free(a.v0);
}

// sumsq over sizes below one block, across several, and past the block-count cap: into a
// device double holding 0 (twice: the same bits) and one holding 0.5, which must end as the
// single rounding of 0.5 + the first. CPU and CUDA order the additions inside a block
// differently (4 lanes vs a 256-thread tree), so they agree to rounding, not bitwise: for
// random positive terms that is about sqrt(16384) * 2^-53 ~ 1e-14 relative, while a lost or
// repeated block partial (at least 1/1024 of the sum) is far above 1e-12.
static void test_sumsq(void) {
    static const size_t sizes[] = {1, 1000, 16384 * 5 + 17, (size_t)16384 * 1024 + 4099};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        float *x = kt_rand(n, 3.0);
        double want = 0.0, a, b, c, zero = 0.0, half = 0.5;
        cpu_be.ops->sumsq(&cpu_be, &want, x, n);
        float *dx = putf(1, x, n);
        double *acc_a = put(1, &zero, sizeof zero), *acc_b = put(1, &zero, sizeof zero);
        double *acc_c = put(1, &half, sizeof half);
        gpu_be.ops->sumsq(&gpu_be, acc_a, dx, n);
        gpu_be.ops->sumsq(&gpu_be, acc_b, dx, n);
        gpu_be.ops->sumsq(&gpu_be, acc_c, dx, n);
        get(1, &a, acc_a, sizeof a);
        get(1, &b, acc_b, sizeof b);
        get(1, &c, acc_c, sizeof c);
        bufs_free(1);
        double rel = fabs(a - want) / want;
        CHECKF(rel <= 1e-12, "sumsq n=%zu: cuda %.17g cpu %.17g", n, a, want);
        CHECKF(memcmp(&a, &b, sizeof a) == 0, "sumsq n=%zu: two cuda runs differ", n);
        CHECKF(c == 0.5 + a, "sumsq n=%zu into 0.5: %.17g, want %.17g", n, c, 0.5 + a);
        printf("  sumsq n=%-10zu rel err %.2e\n", n, rel);
        free(x);
    }
}

// --- logsoftmax -------------------------------------------------------------------------------

typedef struct lsm_arg {
    int32_t T, V, v0;   // v0: the first column of a vocab-parallel rank's share
    int32_t *target;
    float *logits, *dlogprob, *dentropy, *lse;   // lse: the CPU forward's, for the backward
    double *mean;                                // the CPU's row means (vocab-parallel backward)
} lsm_arg;

// Logits are A (this pass's values, rand_act), read by both backends as they are.
static void lsm_fwd(int gpu, float **out, void *arg) {
    lsm_arg *l = arg;
    void *x = put_act(gpu, l->logits, (size_t)l->T * l->V);
    int32_t *tg = puti(gpu, l->target, l->T);
    float *lp = putt(gpu, NULL, l->T, TR_F32), *ent = putt(gpu, NULL, l->T, TR_F32);
    float *lse = putt(gpu, NULL, l->T, TR_F32);
    be_of(gpu)->ops->logsoftmax_forward(be_of(gpu), lp, ent, lse, x, tg, l->T, l->V);
    getf(gpu, out[0], lp, l->T);
    getf(gpu, out[1], ent, l->T);
    getf(gpu, out[2], lse, l->T);
    bufs_free(gpu);
}

// Both terms, the logprob term alone, and both terms written over the logits.
static void lsm_bwd(int gpu, float **out, void *arg) {
    lsm_arg *l = arg;
    size_t n = (size_t)l->T * l->V;
    void *x = put_act(gpu, l->logits, n), *xin = put_act(gpu, l->logits, n);
    float *lse = putf(gpu, l->lse, l->T);
    int32_t *tg = puti(gpu, l->target, l->T);
    float *glp = putf(gpu, l->dlogprob, l->T), *gent = putf(gpu, l->dentropy, l->T);
    void *dx = put_act(gpu, NULL, n), *dx2 = put_act(gpu, NULL, n);
    tr_backend *be = be_of(gpu);
    be->ops->logsoftmax_backward(be, dx, glp, gent, x, lse, tg, l->T, l->V);
    be->ops->logsoftmax_backward(be, dx2, glp, NULL, x, lse, tg, l->T, l->V);
    be->ops->logsoftmax_backward(be, xin, glp, gent, xin, lse, tg, l->T, l->V);
    get_act(gpu, out[0], dx, n);
    get_act(gpu, out[1], dx2, n);
    get_act(gpu, out[2], xin, n);
    bufs_free(gpu);
}

// One rank's statistics (as floats: m, s, sx, the target's logit) and its backward from the
// CPU's whole-row lse and means, out of place and in place.
static void lsm_vp(int gpu, float **out, void *arg) {
    lsm_arg *l = arg;
    size_t n = (size_t)l->T * l->V;
    tr_backend *be = be_of(gpu);
    void *x = put_act(gpu, l->logits, n), *xin = put_act(gpu, l->logits, n);
    int32_t *tg = puti(gpu, l->target, l->T);
    double *st = put(gpu, NULL, (size_t)l->T * 4 * sizeof(double));
    double *mean = put(gpu, l->mean, (size_t)l->T * sizeof(double));
    float *lse = putf(gpu, l->lse, l->T), *glp = putf(gpu, l->dlogprob, l->T);
    float *gent = putf(gpu, l->dentropy, l->T);
    void *dx = put_act(gpu, NULL, n);
    be->ops->logsoftmax_vp_stats(be, st, x, tg, l->v0, l->T, l->V);
    be->ops->logsoftmax_vp_backward(be, dx, glp, gent, x, lse, mean, tg, l->v0, l->T, l->V);
    be->ops->logsoftmax_vp_backward(be, xin, glp, gent, xin, lse, mean, tg, l->v0, l->T, l->V);
    double *h = kt_malloc((size_t)l->T * 4 * sizeof(double));
    get(gpu, h, st, (size_t)l->T * 4 * sizeof(double));
    for (int32_t t = 0; t < l->T; t++)
        for (int k = 0; k < 4; k++) out[k][t] = (float)h[(size_t)t * 4 + k];
    get_act(gpu, out[4], dx, n);
    get_act(gpu, out[5], xin, n);
    free(h);
    bufs_free(gpu);
}

// The CUDA forward and backward of the same rows at a 16-byte aligned address (16-byte
// loads) and one element past it (element loads): the same bits, since the order of the sums
// depends on V alone; and the backward over its own logits equals the one written elsewhere.
static void lsm_layout(const lsm_arg *l) {
    size_t n = (size_t)l->T * l->V, as = tr_dt_size(prec);
    char msg[256];
    void *xa = kt_to(l->logits, n, prec);
    void *x0 = put_act(1, l->logits, n);
    char *x1 = put(1, NULL, (n + 1) * as);
    if (tr_cuda_copy_h2d(x1 + as, xa, n * as, msg, sizeof msg) != 0) die("h2d", msg);
    int32_t *tg = puti(1, l->target, l->T);
    float *f0 = putf(1, NULL, 3 * (size_t)l->T), *f1 = putf(1, NULL, 3 * (size_t)l->T);
    float *lse = putf(1, l->lse, l->T), *glp = putf(1, l->dlogprob, l->T);
    float *gent = putf(1, l->dentropy, l->T);
    char *d1 = put(1, NULL, (n + 1) * as);
    void *d0 = put_act(1, NULL, n);
    tr_backend *be = &gpu_be;
    int32_t T = l->T;
    be->ops->logsoftmax_forward(be, f0, f0 + T, f0 + 2 * T, x0, tg, T, l->V);
    be->ops->logsoftmax_forward(be, f1, f1 + T, f1 + 2 * T, x1 + as, tg, T, l->V);
    be->ops->logsoftmax_backward(be, d0, glp, gent, x0, lse, tg, T, l->V);
    be->ops->logsoftmax_backward(be, d1 + as, glp, gent, x1 + as, lse, tg, T, l->V);
    be->ops->logsoftmax_backward(be, x0, glp, gent, x0, lse, tg, T, l->V);   // in place
    float *h0 = kt_floats(3 * (size_t)T), *h1 = kt_floats(3 * (size_t)T);
    char *g0 = kt_malloc(n * as), *g1 = kt_malloc(n * as), *g2 = kt_malloc(n * as);
    getf(1, h0, f0, 3 * (size_t)T);
    getf(1, h1, f1, 3 * (size_t)T);
    get(1, g0, d0, n * as);
    get(1, g1, d1 + as, n * as);
    get(1, g2, x0, n * as);
    bufs_free(1);
    int same = kt_same_bits(h0, h1, 3 * (size_t)T) && memcmp(g0, g1, n * as) == 0;
    CHECKF(same, "logsoftmax T=%d V=%d: a row one element off 16 bytes gives other bits", T, l->V);
    CHECKF(memcmp(g2, g0, n * as) == 0, "logsoftmax_backward T=%d V=%d: in place differs", T,
           l->V);
    printf("  %-5s logsoftmax T=%d V=%d aligned = misaligned rows, in place = out of place: %s\n",
           tr_dt_name(prec), T, l->V, same && memcmp(g2, g0, n * as) == 0 ? "bitwise" : "NO");
    free(xa); free(h0); free(h1); free(g0); free(g1); free(g2);
}

// A row's 1024 virtual threads played by 1, 2 or 4 blocks: the forward's three outputs and the
// backward's gradient have the same bits whichever the launch picks.
static void lsm_row_ctas(const lsm_arg *l) {
    size_t n = (size_t)l->T * l->V, as = tr_dt_size(prec);
    int32_t T = l->T;
    tr_backend *be = &gpu_be;
    float *h[4];
    char *g[4];
    int same = 1;
    for (int i = 0; i < 4; i++) {   // auto, then 1, 2 and 4 blocks a row
        int ctas = i == 0 ? 0 : 1 << (i - 1);
        tr_backend_cuda_force_row_ctas(be, ctas);
        void *x = put_act(1, l->logits, n), *d = put_act(1, NULL, n);
        int32_t *tg = puti(1, l->target, T);
        float *f = putf(1, NULL, 3 * (size_t)T), *lse = putf(1, l->lse, T);
        float *glp = putf(1, l->dlogprob, T), *gent = putf(1, l->dentropy, T);
        be->ops->logsoftmax_forward(be, f, f + T, f + 2 * T, x, tg, T, l->V);
        be->ops->logsoftmax_backward(be, d, glp, gent, x, lse, tg, T, l->V);
        h[i] = kt_floats(3 * (size_t)T);
        g[i] = kt_malloc(n * as);
        getf(1, h[i], f, 3 * (size_t)T);
        get(1, g[i], d, n * as);
        bufs_free(1);
        if (i > 0) same &= kt_same_bits(h[0], h[i], 3 * (size_t)T) && memcmp(g[0], g[i], n * as) == 0;
    }
    tr_backend_cuda_force_row_ctas(be, 0);
    CHECKF(same, "logsoftmax T=%d V=%d: 1, 2 or 4 blocks a row give other bits", T, l->V);
    printf("  %-5s logsoftmax T=%d V=%d rows on 1, 2, 4 blocks: %s\n", tr_dt_name(prec), T, l->V,
           same ? "bitwise equal" : "NO");
    for (int i = 0; i < 4; i++) {
        free(h[i]);
        free(g[i]);
    }
}

// Logits of this pass's activation dtype on both backends.
static void test_logsoftmax(int32_t T, int32_t V) {
    lsm_arg l = {.T = T, .V = V, .v0 = 7};
    size_t n = (size_t)T * V;
    l.logits = rand_act(n, 8.0);
    l.target = kt_malloc((size_t)T * sizeof(int32_t));
    for (int32_t t = 0; t < T; t++) l.target[t] = t % 5 == 4 ? -1 : (t * 7919) % V;
    l.dlogprob = kt_rand(T, 1.0);
    l.dentropy = kt_rand(T, 1.0);
    l.lse = kt_floats(T);
    l.mean = kt_malloc((size_t)T * sizeof(double));
    void *xa = kt_to(l.logits, n, prec);
    double *st = kt_malloc((size_t)T * 4 * sizeof(double));
    cpu_be.ops->logsoftmax_forward(&cpu_be, NULL, NULL, l.lse, xa, l.target, T, V);
    // The row's lse and means as one rank of the vocab-parallel ops sees them (targets are
    // vocabulary ids, columns start at v0).
    cpu_be.ops->logsoftmax_vp_stats(&cpu_be, st, xa, l.target, l.v0, T, V);
    cpu_be.ops->logsoftmax_vp_combine(&cpu_be, NULL, NULL, l.lse, l.mean, st, l.target, 1, T);
    size_t lf[3] = {(size_t)T, (size_t)T, (size_t)T}, lb[3] = {n, n, n};
    size_t lv[6] = {(size_t)T, (size_t)T, (size_t)T, (size_t)T, n, n};
    compare("logsoftmax_forward", lsm_fwd, &l, "FFF", lf);
    compare("logsoftmax_backward", lsm_bwd, &l, "AAA", lb);
    compare("logsoftmax_vp", lsm_vp, &l, "FFFFAA", lv);
    lsm_layout(&l);
    lsm_row_ctas(&l);
    free(l.logits); free(l.target); free(l.dlogprob); free(l.dentropy); free(l.lse);
    free(l.mean); free(xa); free(st);
}

// --- buffers: fill, rows, KV block copies, decode rows, convert (exact: CUDA equals CPU) ------

static void same_bytes(const char *name, const void *cpu, const void *gpu, size_t bytes) {
    CHECKF(memcmp(cpu, gpu, bytes) == 0, "%s: cuda differs from cpu", name);
    printf("  %-28s %zu bytes, bitwise equal: %s\n", name, bytes,
           memcmp(cpu, gpu, bytes) == 0 ? "yes" : "NO");
}

static uint8_t *rand_bytes(size_t n) {
    uint8_t *b = kt_malloc(n);
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)((kt_uniform() + 1.0) * 128.0);
    return b;
}

// fill of an inner range: both ends are left alone
static void fill_run(int gpu, void *out, const float *x, size_t n) {
    float *d = putf(gpu, x, n);
    be_of(gpu)->ops->fill(be_of(gpu), d + 3, -2.5f, n - 7);
    get(gpu, out, d, n * sizeof(float));
    bufs_free(gpu);
}

typedef struct rows_arg {
    int32_t n_src, n, n_scatter;
    size_t row_bytes, shift;   // shift: bytes the source starts past its allocation's start
    uint8_t *src, *dst0;
    int32_t *gidx, *sidx;
} rows_arg;

// gather then scatter of the gathered rows; out: the gathered rows, then dst
static void rows_run(int gpu, uint8_t *out, const rows_arg *r) {
    size_t sb = (size_t)r->n_src * r->row_bytes, ob = (size_t)r->n * r->row_bytes;
    uint8_t *src = (uint8_t *)put(gpu, NULL, sb + r->shift) + r->shift;
    if (gpu) {
        char msg[256];
        if (tr_cuda_copy_h2d(src, r->src, sb, msg, sizeof msg) != 0) die("h2d", msg);
    } else {
        memcpy(src, r->src, sb);
    }
    uint8_t *o = put(gpu, NULL, ob), *dst = put(gpu, r->dst0, sb);
    int32_t *gidx = puti(gpu, r->gidx, r->n), *sidx = puti(gpu, r->sidx, r->n_scatter);
    be_of(gpu)->ops->gather_rows(be_of(gpu), o, src, gidx, r->n, r->row_bytes);
    be_of(gpu)->ops->scatter_rows(be_of(gpu), dst, o, sidx, r->n_scatter, r->row_bytes);
    get(gpu, out, o, ob);
    get(gpu, out + ob, dst, sb);
    bufs_free(gpu);
}

static void test_rows(int32_t n_src, int32_t n, size_t row_bytes, size_t shift) {
    rows_arg r = {.n_src = n_src, .n = n, .row_bytes = row_bytes, .shift = shift,
                  .n_scatter = n < n_src ? n : n_src};
    size_t sb = (size_t)n_src * row_bytes, ob = (size_t)n * row_bytes;
    r.src = rand_bytes(sb);
    r.dst0 = rand_bytes(sb);
    r.gidx = kt_malloc((size_t)n * sizeof(int32_t));
    r.sidx = kt_malloc((size_t)n_src * sizeof(int32_t));
    for (int32_t i = 0; i < n; i++) r.gidx[i] = (int32_t)((kt_uniform() + 1.0) * 0.5 * n_src) % n_src;
    for (int32_t i = 0; i < n_src; i++) r.sidx[i] = n_src - 1 - i;
    uint8_t *a = kt_malloc(ob + sb), *b = kt_malloc(ob + sb);
    rows_run(0, a, &r);
    rows_run(1, b, &r);
    char name[64];
    snprintf(name, sizeof name, "rows %zu B +%zu", row_bytes, shift);
    same_bytes(name, a, b, ob + sb);
    free(r.src); free(r.dst0); free(r.gidx); free(r.sidx); free(a); free(b);
}

// a block of `rows` rows of `width` bytes out of rows src_ld apart (from byte c0) into rows
// dst_ld apart (at byte c1) of a buffer that starts as dst0; out: that buffer
static void copy_2d_run(int gpu, uint8_t *out, const uint8_t *src0, const uint8_t *dst0, size_t src_ld,
                        size_t dst_ld, size_t c0, size_t c1, size_t width, size_t rows) {
    uint8_t *src = put(gpu, src0, rows * src_ld), *dst = put(gpu, dst0, rows * dst_ld);
    be_of(gpu)->ops->copy_2d(be_of(gpu), dst + c1, dst_ld, src + c0, src_ld, width, rows);
    get(gpu, out, dst, rows * dst_ld);
    bufs_free(gpu);
}

static void test_copy_2d(size_t src_ld, size_t dst_ld, size_t c0, size_t c1, size_t width, size_t rows) {
    uint8_t *src = rand_bytes(rows * src_ld), *dst = rand_bytes(rows * dst_ld);
    uint8_t *a = kt_malloc(rows * dst_ld), *b = kt_malloc(rows * dst_ld);
    copy_2d_run(0, a, src, dst, src_ld, dst_ld, c0, c1, width, rows);
    copy_2d_run(1, b, src, dst, src_ld, dst_ld, c0, c1, width, rows);
    same_bytes("copy_2d", a, b, rows * dst_ld);
    free(src); free(dst); free(a); free(b);
}

// all-layer copy-on-write over a pool of L x NB blocks of BS slots of `slot` bytes
static void kv_copy_run(int gpu, uint8_t *out, int32_t L, int32_t NB, int32_t BS, size_t slot,
                        const uint8_t *k, const uint8_t *v, const int32_t *src,
                        const int32_t *dst, const int32_t *ns, int32_t n) {
    size_t layer = (size_t)NB * BS * slot, bytes = (size_t)L * layer;
    tr_kv_pool pool = {.k = put(gpu, k, bytes), .v = put(gpu, v, bytes), .layer_bytes = layer,
                       .n_layers = L, .block_size = BS, .slot_bytes = slot};
    int32_t *ds = puti(gpu, src, n), *dd = puti(gpu, dst, n), *dn = puti(gpu, ns, n);
    be_of(gpu)->ops->kv_copy_blocks(be_of(gpu), &pool, ds, dd, dn, n);
    get(gpu, out, pool.k, bytes);
    get(gpu, out + bytes, pool.v, bytes);
    bufs_free(gpu);
}

static void test_kv_copy(size_t slot) {
    const int32_t L = 3, NB = 12, BS = 16, n = 5;   // no pair writes a block another reads
    static const int32_t src[] = {0, 7, 2, 3, 0}, dst[] = {4, 5, 6, 8, 11};
    static const int32_t ns[] = {16, 1, 0, 9, 15};
    size_t bytes = (size_t)L * NB * BS * slot;
    uint8_t *k = rand_bytes(bytes), *v = rand_bytes(bytes);
    uint8_t *a = kt_malloc(2 * bytes), *b = kt_malloc(2 * bytes);
    kv_copy_run(0, a, L, NB, BS, slot, k, v, src, dst, ns, n);
    kv_copy_run(1, b, L, NB, BS, slot, k, v, src, dst, ns, n);
    char name[64];
    snprintf(name, sizeof name, "kv_copy_blocks %zu B", slot);
    same_bytes(name, a, b, 2 * bytes);
    free(k); free(v); free(a); free(b);
}

// convert of n values from in_t to out_t on one backend; out: the result's bytes
static void convert_run(int gpu, void *out, tr_dt out_t, const void *in, tr_dt in_t,
                        size_t n) {
    void *din = put(gpu, in, n * tr_dt_size(in_t));
    void *dout = put(gpu, NULL, n * tr_dt_size(out_t));
    be_of(gpu)->ops->convert(be_of(gpu), dout, out_t, din, in_t, n);
    get(gpu, out, dout, n * tr_dt_size(out_t));
    bufs_free(gpu);
}

// One conversion on both backends against the host's reference bytes `want`. fp16 NaNs are
// the one case two exact conversions may disagree on (whether a signalling NaN is made
// quiet), so where nan16 is given, those elements need only be NaNs of the same sign.
static void convert_case(const char *name, tr_dt out_t, const void *in, tr_dt in_t,
                         size_t n, const void *want, const uint8_t *nan16) {
    size_t bytes = n * tr_dt_size(out_t);
    uint8_t *c = kt_malloc(bytes), *g = kt_malloc(bytes);
    convert_run(0, c, out_t, in, in_t, n);
    convert_run(1, g, out_t, in, in_t, n);
    size_t bad_g = 0, bad_c = 0, es = tr_dt_size(out_t);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *w = (const uint8_t *)want + i * es;
        if (nan16 && nan16[i]) {
            float fg = out_t == TR_F32 ? ((float *)g)[i] : h_f32(((uint16_t *)g)[i]);
            float fc = out_t == TR_F32 ? ((float *)c)[i] : h_f32(((uint16_t *)c)[i]);
            float fw = out_t == TR_F32 ? ((const float *)want)[i]
                                       : h_f32(((const uint16_t *)want)[i]);
            bad_g += !isnan(fg) || signbit(fg) != signbit(fw);
            bad_c += !isnan(fc) || signbit(fc) != signbit(fw);
            continue;
        }
        bad_g += memcmp(g + i * es, w, es) != 0;
        bad_c += memcmp(c + i * es, w, es) != 0;
    }
    CHECKF(bad_g == 0, "convert %s: %zu of %zu cuda values wrong", name, bad_g, n);
    CHECKF(bad_c == 0, "convert %s: %zu of %zu cpu values wrong", name, bad_c, n);
    printf("  convert %-20s %8zu values: cuda %s, cpu %s\n", name, n,
           bad_g ? "WRONG" : "exact", bad_c ? "WRONG" : "exact");
    free(c);
    free(g);
}

// Every bf16 and every fp16 pattern to fp32 (and fp16 on to bf16); fp32 ties, their
// neighbours, NaN and inf patterns and random patterns to bf16; same-dtype copies.
static void test_convert(void) {
    const size_t nh = 65536, nr = (size_t)1 << 20, nf = 3 * nh + nr;
    uint16_t *h = kt_malloc(nh * sizeof(uint16_t));
    uint32_t *f = kt_malloc(nf * sizeof(uint32_t));
    for (size_t i = 0; i < nh; i++) h[i] = (uint16_t)i;
    for (size_t i = 0; i < nh; i++) {   // NaN patterns included: the payload rule too
        f[3 * i] = (uint32_t)i << 16 | 0x8000u;
        f[3 * i + 1] = (uint32_t)i << 16 | 0x7fffu;
        f[3 * i + 2] = (uint32_t)i << 16 | 0x0001u;
    }
    for (size_t i = 0; i < nr; i++) {
        uint32_t hi = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        uint32_t lo = (uint32_t)((kt_uniform() + 1.0) * 32768.0) & 0xffffu;
        f[3 * nh + i] = hi << 16 | lo;
    }
    float *wf = kt_floats(nf > nh ? nf : nh);
    uint16_t *wh = kt_malloc(nf * sizeof(uint16_t));
    uint8_t *nan16 = kt_malloc(nh);

    for (size_t i = 0; i < nh; i++) wf[i] = h_f32(h[i]);
    convert_case("bf16 -> fp32", TR_F32, h, TR_BF16, nh, wf, NULL);
    for (size_t i = 0; i < nf; i++) wh[i] = h_bf16(((const float *)f)[i]);
    convert_case("fp32 -> bf16", TR_BF16, f, TR_F32, nf, wh, NULL);
    for (size_t i = 0; i < nh; i++) {
        wf[i] = h_f16(h[i]);
        nan16[i] = (h[i] & 0x7c00u) == 0x7c00u && (h[i] & 0x3ffu) != 0;
    }
    convert_case("fp16 -> fp32", TR_F32, h, TR_F16, nh, wf, nan16);
    for (size_t i = 0; i < nh; i++) wh[i] = h_bf16(wf[i]);
    convert_case("fp16 -> bf16", TR_BF16, h, TR_F16, nh, wh, nan16);
    convert_case("fp32 -> fp32 (copy)", TR_F32, f, TR_F32, nf, f, NULL);
    convert_case("bf16 -> bf16 (copy)", TR_BF16, h, TR_BF16, nh, h, NULL);
    free(h); free(f); free(wf); free(wh); free(nan16);
}

// decode_rows on one backend: n rows continuing from pos and drawn but those patch names, the
// embedding rows of a vocabulary slice too; the six outputs back in out (ids, pos, slot, len,
// emb_ids: n each; doc_start: n + 1).
static void decode_rows_run(int gpu, int32_t n, int32_t w, int32_t bs, const int32_t *pos,
                            const int32_t *drawn, const int32_t *patch, const int32_t *tables,
                            int32_t *out) {
    tr_backend *be = be_of(gpu);
    int32_t *ids = puti(gpu, NULL, n), *p = puti(gpu, pos, n), *slot = puti(gpu, NULL, n);
    int32_t *len = puti(gpu, NULL, n), *emb = puti(gpu, NULL, n), *doc = puti(gpu, NULL, n + 1);
    tr_decode_rows_args a = {.ids = ids, .pos = p, .slot = slot, .len = len, .doc_start = doc,
                             .emb_ids = emb, .drawn = puti(gpu, drawn, n),
                             .patch = puti(gpu, patch, 1 + 3 * (size_t)patch[0]),
                             .tables = puti(gpu, tables, (size_t)n * w), .w = w, .bs = bs,
                             .n = n, .v0 = 30000, .V = 40000};
    be->ops->decode_rows(be, &a);
    int32_t *outs[] = {ids, p, slot, len, emb};
    for (int i = 0; i < 5; i++) get(gpu, out + (size_t)i * n, outs[i], (size_t)n * sizeof(int32_t));
    get(gpu, out + 5 * (size_t)n, doc, ((size_t)n + 1) * sizeof(int32_t));
    bufs_free(gpu);
}

// A decode step's rows advanced on both backends from the same random state: 512 rows (a
// top bucket), every fifth patched, some of those as padding.
static void test_decode_rows(void) {
    const int32_t n = 512, w = 9, bs = 16;
    int32_t *pos = kt_malloc(n * sizeof(int32_t)), *drawn = kt_malloc(n * sizeof(int32_t));
    int32_t *tables = kt_malloc((size_t)n * w * sizeof(int32_t));
    int32_t *patch = kt_malloc((1 + 3 * (size_t)n) * sizeof(int32_t));
    int32_t *a = kt_malloc((6 * (size_t)n + 1) * sizeof(int32_t));
    int32_t *b = kt_malloc((6 * (size_t)n + 1) * sizeof(int32_t));
    patch[0] = 0;
    for (int32_t r = 0; r < n; r++) {
        pos[r] = (int32_t)((kt_uniform() + 1.0) * 0.5 * (w * bs - 2)) % (w * bs - 1);
        drawn[r] = (int32_t)((kt_uniform() + 1.0) * 75000.0);
        for (int32_t j = 0; j < w; j++)
            tables[(size_t)r * w + j] = (int32_t)((kt_uniform() + 1.0) * 2000.0);
        if (r % 5 == 0) {
            int32_t *e = patch + 1 + 3 * patch[0]++;
            e[0] = r;
            e[1] = drawn[r] / 2;
            e[2] = r % 3 == 0 ? -1 : pos[r];
        }
    }
    decode_rows_run(0, n, w, bs, pos, drawn, patch, tables, a);
    decode_rows_run(1, n, w, bs, pos, drawn, patch, tables, b);
    same_bytes("decode_rows", a, b, (6 * (size_t)n + 1) * sizeof(int32_t));
    free(pos); free(drawn); free(tables); free(patch); free(a); free(b);
}

// The prefetch op (a hint beside the stream), in both of its modes: queued eagerly and inside
// a recording, aligned and not, it leaves a copy it overlaps with the bytes it read, waits to
// be joined until a sync or the recording's end, and makes no failure.
static void test_prefetch_mode(int mode) {
    tr_backend *be = &gpu_be;
    char msg[256];
    const size_t n = (size_t)3 << 20;   // 12 MB: many bulk prefetches, several blocks
    float *x = kt_rand(n, 1.0), *y = kt_floats(n);
    float *src = putf(1, x, n), *dst = putf(1, NULL, n), *dst2 = putf(1, NULL, n);
    CHECKF(tr_backend_cuda_prefetch(be, mode) == 0, "prefetch %d: turning it on failed", mode);
    be->ops->prefetch(be, NULL, 64);
    be->ops->prefetch(be, (const char *)src + 4, 8);   // no whole 16-byte piece: nothing
    CHECKF(tr_backend_cuda_prefetch_pending(be) == 0, "prefetch %d: a no-op left a fork", mode);
    be->ops->prefetch(be, src, n * sizeof(float));
    CHECKF(tr_backend_cuda_prefetch_pending(be) == 1, "prefetch %d: no fork", mode);
    be->ops->prefetch(be, (const char *)src + 4, n * sizeof(float) - 4);   // misaligned start
    be->ops->copy(be, dst, src, n * sizeof(float));
    CHECKF(be->ops->sync(be, "prefetch", msg, sizeof msg) == 0, "prefetch %d: %s", mode, msg);
    CHECKF(tr_backend_cuda_prefetch_pending(be) == 0, "prefetch %d: forked after a sync", mode);
    getf(1, y, dst, n);
    same_bytes("prefetch, then copy", x, y, n * sizeof(float));

    void *exec = NULL;
    int rc = be->ops->graph_begin(be);
    CHECKF(rc >= 0, "prefetch %d: graph_begin failed", mode);
    if (rc == 0) {
        be->ops->prefetch(be, src, n * sizeof(float));
        be->ops->copy(be, dst2, src, n * sizeof(float));
        be->ops->prefetch(be, dst2, n * sizeof(float));
        CHECKF(be->ops->graph_end(be, &exec) == 0 && exec, "prefetch %d: graph_end failed", mode);
        CHECKF(tr_backend_cuda_prefetch_pending(be) == 0, "prefetch %d: a recording left a fork",
               mode);
        for (int i = 0; i < 2 && exec; i++) be->ops->graph_launch(be, exec);
        CHECKF(be->ops->sync(be, "prefetch graph", msg, sizeof msg) == 0, "prefetch %d: %s",
               mode, msg);
        be->ops->graph_free(be, exec);
        getf(1, y, dst2, n);
        same_bytes("prefetch recorded, then copy", x, y, n * sizeof(float));
    }
    CHECKF(tr_backend_cuda_prefetch(be, 0) == 0, "prefetch %d: turning it off failed", mode);
    be->ops->prefetch(be, src, n * sizeof(float));
    CHECKF(tr_backend_cuda_prefetch_pending(be) == 0, "prefetch %d: forked while off", mode);
    bufs_free(1);
    free(x); free(y);
    printf("prefetch %d: eager and recorded, the copies exact\n", mode);
}

static void test_prefetch(void) {
    test_prefetch_mode(1);
    test_prefetch_mode(2);
}

static void test_buffers(void) {
    size_t n = 100003;
    float *x = kt_rand(n, 1.0);
    uint8_t *a = kt_malloc(n * sizeof(float)), *b = kt_malloc(n * sizeof(float));
    fill_run(0, a, x, n);
    fill_run(1, b, x, n);
    same_bytes("fill", a, b, n * sizeof(float));
    free(x); free(a); free(b);

    test_rows(300, 500, 64, 0);     // 16-byte words
    test_rows(300, 500, 64, 4);     // misaligned source: 4-byte words
    test_rows(300, 500, 20, 0);     // 4-byte words
    test_rows(300, 500, 7, 0);      // bytes
    test_rows(40, 30, 70000, 0);    // long rows
    test_copy_2d(3072, 1536, 1536, 0, 1536, 896);   // half the columns of a bf16 o_proj
    test_copy_2d(1536, 3072, 0, 1536, 1536, 896);   // and back
    test_copy_2d(40, 40, 3, 5, 30, 7);              // unaligned
    test_kv_copy(2 * 64 * sizeof(float));
    test_kv_copy(12);
    test_kv_copy(6);
    test_decode_rows();
    test_prefetch();
}

// --- sampling ---------------------------------------------------------------------------------

typedef struct smp_arg {
    int32_t B, V;
    float *logits;
    tr_sample_row *rows;
} smp_arg;

typedef struct smp_out {
    int32_t *ids, n_near;
    float *lp, *lp_lsm;   // the op's logprobs; logsoftmax_forward's for the drawn ids
} smp_out;

// sample over rows [b0, b0 + nb) on one backend, n_near counted from 0; then that backend's
// logsoftmax_forward with the drawn ids as targets.
static void smp_run(int gpu, const smp_arg *s, int32_t b0, int32_t nb, smp_out *o) {
    tr_backend *be = be_of(gpu);
    void *x = put_act(gpu, s->logits + (size_t)b0 * s->V, (size_t)nb * s->V);
    tr_sample_row *rows = put(gpu, s->rows + b0, (size_t)nb * sizeof(tr_sample_row));
    int32_t zero = 0, *ids = puti(gpu, NULL, nb), *n_near = puti(gpu, &zero, 1);
    float *lp = putf(gpu, NULL, nb), *lp_lsm = putf(gpu, NULL, nb), *lse = putf(gpu, NULL, nb);
    void *scratch = put(gpu, NULL, be->ops->sample_scratch_bytes(be, nb, s->V));
    be->ops->sample(be, ids, lp, x, rows, nb, s->V, tr_sample_rows_ranked(s->rows + b0, nb, s->V),
                    scratch, n_near);
    be->ops->logsoftmax_forward(be, lp_lsm, NULL, lse, x, ids, nb, s->V);
    get(gpu, o->ids, ids, (size_t)nb * sizeof(int32_t));
    get(gpu, &o->n_near, n_near, sizeof(int32_t));
    getf(gpu, o->lp, lp, nb);
    getf(gpu, o->lp_lsm, lp_lsm, nb);
    bufs_free(gpu);
}

static void smp_out_alloc(smp_out *o, int32_t B) {
    o->ids = kt_malloc((size_t)B * sizeof(int32_t));
    o->lp = kt_floats(B);
    o->lp_lsm = kt_floats(B);
}

static void smp_out_free(smp_out *o) { free(o->ids); free(o->lp); free(o->lp_lsm); }

enum { SMP_RANDOM, SMP_TIED, SMP_ZEROS, SMP_EQUAL };

// B rows over every parameter combination (greedy, temperatures, top-k below, at and past V,
// top-p), each row with its own stream position. CUDA draws the CPU's ids except in draws it
// counts as near (each mismatched row, drawn alone, must count 1), and near draws are rare;
// its logprobs are its logsoftmax_forward's bits; two CUDA runs agree bitwise; a row drawn
// alone equals the batch's. `expect_near`: draws the rows are built to make near.
static void test_sample(int32_t B, int32_t V, int kind, uint64_t salt, float top_p_all,
                        int32_t expect_near) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    smp_arg s = {.B = B, .V = V, .logits = kt_floats((size_t)B * V),
                 .rows = kt_malloc((size_t)B * sizeof(tr_sample_row))};
    for (int32_t b = 0; b < B; b++) {
        float *lg = s.logits + (size_t)b * V;
        for (int32_t i = 0; i < V; i++) {
            double x = 4.0 * kt_uniform();
            lg[i] = kind == SMP_TIED ? (float)(floor(x * 2.0) / 2.0)
                    : kind == SMP_ZEROS ? (i % 3 == 0 ? 0.0f : i % 3 == 1 ? -0.0f : (float)(x - 4.5))
                    : kind == SMP_EQUAL ? 0.5f
                                        : (float)x;
            if (prec == TR_BF16) lg[i] = h_f32(h_bf16(lg[i]));   // logits are A
        }
        uint64_t c = salt + (uint64_t)b * 13;
        s.rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                    .top_p = top_ps[c / 24 % 4],
                                    .seed = 0x9e3779b97f4a7c15ull * (salt + 1) + (uint64_t)b,
                                    .counter = (uint64_t)(b * 37 % 1000), .used = 4};
        if (b % 3 == 1) s.rows[b].used = 1 + b % 3;   // inside a block (counter >= 1)
        if (s.rows[b].used < 4 && s.rows[b].counter == 0) s.rows[b].counter = 1;
        if (top_p_all > 0.0f) {
            s.rows[b].temperature = 1.0f;
            s.rows[b].top_k = 0;
            s.rows[b].top_p = top_p_all;
        }
    }
    smp_out cpu, g1, g2, sel, alone;
    smp_out_alloc(&cpu, B);
    smp_out_alloc(&g1, B);
    smp_out_alloc(&g2, B);
    smp_out_alloc(&sel, B);
    smp_out_alloc(&alone, 1);
    smp_run(0, &s, 0, B, &cpu);
    smp_run(1, &s, 0, B, &g1);
    smp_run(1, &s, 0, B, &g2);
    CHECKF(memcmp(g1.ids, g2.ids, (size_t)B * sizeof(int32_t)) == 0 &&
           kt_same_bits(g1.lp, g2.lp, B) && g1.n_near == g2.n_near,
           "sample B=%d V=%d: two cuda runs differ", B, V);
    // top-k rows ranked by a sort of the whole row instead of the select: the same draws
    tr_backend_cuda_topk_select(&gpu_be, 0);
    smp_run(1, &s, 0, B, &sel);
    tr_backend_cuda_topk_select(&gpu_be, 1);
    CHECKF(memcmp(g1.ids, sel.ids, (size_t)B * sizeof(int32_t)) == 0 &&
           kt_same_bits(g1.lp, sel.lp, B) && g1.n_near == sel.n_near,
           "sample B=%d V=%d: top-k rows sorted draw otherwise than selected", B, V);
    CHECKF(kt_same_bits(g1.lp, g1.lp_lsm, B),
           "sample B=%d V=%d: logprobs are not cuda logsoftmax_forward's", B, V);
    int32_t mismatched = 0, uncounted = 0, batch_alone = 1;
    for (int32_t b = 0; b < B; b++) {
        smp_run(1, &s, b, 1, &alone);
        batch_alone &= alone.ids[0] == g1.ids[b] && kt_same_bits(alone.lp, &g1.lp[b], 1);
        if (cpu.ids[b] == g1.ids[b]) continue;
        mismatched++;
        uncounted += alone.n_near != 1;
        printf("  sample row %d: cpu %d, cuda %d (near on cuda: %d)\n", b, cpu.ids[b],
               g1.ids[b], alone.n_near);
    }
    CHECKF(batch_alone, "sample B=%d V=%d: rows drawn alone differ from the batch", B, V);
    CHECKF(uncounted == 0, "sample B=%d V=%d: %d of %d differing draws not counted near", B, V,
           uncounted, mismatched);
    CHECKF(g1.n_near >= mismatched && g1.n_near >= expect_near,
           "sample B=%d V=%d: n_near %d below %d mismatches or %d built near draws", B, V,
           g1.n_near, mismatched, expect_near);
    // A uniform target falls within 1e-12 of the total of one of the kept set's boundaries
    // with probability at most 2e-12 * V per draw (< 1e-6 here): even 2 extra near draws are
    // wildly unlikely, so more means the count or the sums are wrong.
    CHECKF(g1.n_near <= expect_near + 2, "sample B=%d V=%d: %d near draws", B, V, g1.n_near);
    // the same id's logprob on both backends: logsoftmax rounding apart, TOL as above
    float *lc = kt_floats(B), *lg = kt_floats(B);
    int32_t m = 0;
    for (int32_t b = 0; b < B; b++)
        if (cpu.ids[b] == g1.ids[b]) {
            lc[m] = cpu.lp[b];
            lg[m++] = g1.lp[b];
        }
    double e = tr_test_rel_err(lg, lc, (size_t)m);
    CHECKF(e <= TOL, "sample B=%d V=%d: logprob rel err %.3g", B, V, e);
    printf("  sample B=%-3d V=%-6d ids differing %d, near cpu %d cuda %d, logprob err %.2e\n",
           B, V, mismatched, cpu.n_near, g1.n_near, e);
    free(lc); free(lg);
    smp_out_free(&cpu); smp_out_free(&g1); smp_out_free(&g2);
    smp_out_free(&sel); smp_out_free(&alone);
    free(s.logits); free(s.rows);
}

// Vocab-parallel sampling on the GPU: B rows of V random logits split over R ranks' columns,
// the ranks' lists, chained sums, walks and the pick run as engine/sample_tp.c runs them
// (every rank's outputs placed where a gather would put them, rows whose top-p cut lies past
// the lists asked again alone with longer ones). Its ids are the CPU sample op's except in
// draws it counts near; two GPU runs agree.
static int32_t svp_col0(int32_t V, int32_t R, int32_t r) { return (int32_t)((int64_t)V * r / R); }

typedef struct svp_bufs {   // the GPU's buffers of every rank
    int32_t R, V;
    float *lg[4];
    tr_sample_row *rows;
    tr_sample_cand *cand;
    double *sums, *walk;
    int32_t *hits, *ids, *near;
    void *scratch;
} svp_bufs;

// One exchange for rows [b0, b0 + n) with lists of k; their ids into ids_out.
static void svp_draw(const svp_bufs *d, int32_t b0, int32_t n, int32_t k, int32_t *ids_out) {
    tr_backend *be = &gpu_be;
    const int32_t R = d->R;
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = svp_col0(d->V, R, r), vr = svp_col0(d->V, R, r + 1) - v0;
        be->ops->sample_vp_top(be, d->cand + (size_t)r * n * k, d->lg[r] + (size_t)b0 * vr, v0, n, vr, k,
                               d->scratch);
    }
    for (int32_t pass = 0; pass < 2; pass++)
        for (int32_t r = 0; r < R; r++) {
            int32_t v0 = svp_col0(d->V, R, r), vr = svp_col0(d->V, R, r + 1) - v0;
            be->ops->sample_vp_scan(be, pass ? d->walk : d->sums + (size_t)r * n, d->hits + (size_t)r * n * 3,
                                    d->lg[r] + (size_t)b0 * vr, d->rows + b0, d->cand,
                                    r ? d->sums + (size_t)(r - 1) * n : NULL,
                                    pass ? d->sums + (size_t)(R - 1) * n : NULL, R, k, v0, n, vr);
        }
    be->ops->sample_vp_pick(be, d->ids + b0, d->near, d->cand, d->hits, d->sums + (size_t)(R - 1) * n,
                            d->rows + b0, R, k, n, d->V, d->scratch);
    get(1, ids_out + b0, d->ids + b0, (size_t)n * sizeof(int32_t));
}

// The vocab-parallel ops read fp32 logits: in the bf16 pass the values the sample op sees (the
// logits rounded to bf16, widened exactly), as engine/sample_tp.c hands them over.
static void svp_run(const smp_arg *s, int32_t R, int32_t *ids, int32_t *n_near) {
    const int32_t B = s->B, V = s->V, k_max = svp_col0(V, R, R) - svp_col0(V, R, R - 1) + 1;
    svp_bufs d = {.R = R, .V = V};
    for (int32_t r = 0; r < R; r++) {
        int32_t v0 = svp_col0(V, R, r), vr = svp_col0(V, R, r + 1) - v0;
        float *part = kt_floats((size_t)B * vr);
        for (int32_t b = 0; b < B; b++) memcpy(part + (size_t)b * vr, s->logits + (size_t)b * V + v0, (size_t)vr * 4);
        if (prec == TR_BF16)
            for (size_t i = 0; i < (size_t)B * vr; i++) part[i] = h_f32(h_bf16(part[i]));
        d.lg[r] = putf(1, part, (size_t)B * vr);
        free(part);
    }
    size_t n_cand = (size_t)R * B * k_max;
    int32_t zero = 0;
    d.rows = put(1, s->rows, (size_t)B * sizeof(tr_sample_row));
    d.cand = put(1, NULL, n_cand * sizeof(tr_sample_cand));
    d.sums = put(1, NULL, (size_t)R * B * sizeof(double));
    d.walk = put(1, NULL, (size_t)B * sizeof(double));
    d.hits = puti(1, NULL, (size_t)R * B * 3);
    d.ids = puti(1, NULL, B);
    d.near = puti(1, &zero, 1);
    d.scratch = put(1, NULL, gpu_be.ops->sample_vp_scratch_bytes(&gpu_be, B, k_max, n_cand));
    int32_t k = 256 < k_max ? 256 : k_max;
    svp_draw(&d, 0, B, k, ids);
    for (int32_t b = 0; b < B; b++)
        for (int32_t kk = k; ids[b] < 0 && kk < k_max;) {
            kk = kk * 8 < k_max ? kk * 8 : k_max;
            svp_draw(&d, b, 1, kk, ids);
        }
    get(1, n_near, d.near, sizeof(int32_t));
    bufs_free(1);
}

static void test_sample_vp(int32_t B, int32_t V, int32_t R, uint64_t salt) {
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const float top_ps[] = {1.0f, 0.95f, 0.6f, 0.1f};
    const int32_t top_ks[] = {0, 1, 3, 50, V, V + 5};
    smp_arg s = {.B = B, .V = V, .logits = kt_rand((size_t)B * V, 4.0),
                 .rows = kt_malloc((size_t)B * sizeof(tr_sample_row))};
    for (int32_t b = 0; b < B; b++) {
        uint64_t c = salt + (uint64_t)b * 13;
        s.rows[b] = (tr_sample_row){.temperature = temps[c % 4], .top_k = top_ks[c / 4 % 6],
                                    .top_p = top_ps[c / 24 % 4], .seed = salt * 7919 + (uint64_t)b,
                                    .counter = (uint64_t)(b * 37 % 1000), .used = 4};
    }
    smp_out cpu;
    smp_out_alloc(&cpu, B);
    smp_run(0, &s, 0, B, &cpu);
    int32_t *g1 = kt_malloc((size_t)B * sizeof(int32_t)), *g2 = kt_malloc((size_t)B * sizeof(int32_t));
    int32_t near1, near2, mismatched = 0;
    svp_run(&s, R, g1, &near1);
    svp_run(&s, R, g2, &near2);
    CHECKF(memcmp(g1, g2, (size_t)B * sizeof(int32_t)) == 0 && near1 == near2,
           "sample_vp B=%d V=%d R=%d: two cuda runs differ", B, V, R);
    for (int32_t b = 0; b < B; b++) mismatched += g1[b] != cpu.ids[b];
    printf("  sample_vp B=%-3d V=%-6d R=%d: ids differing from the cpu sample op %d, near %d\n", B, V, R,
           mismatched, near1);
    CHECKF(mismatched <= near1 && near1 <= 2, "sample_vp B=%d V=%d R=%d: %d ids differ, %d near draws",
           B, V, R, mismatched, near1);
    smp_out_free(&cpu);
    free(g1); free(g2); free(s.logits); free(s.rows);
}

// Scratch sized for B rows must serve fewer (callers size it once for their largest batch).
static void test_sample_scratch(void) {
    int mono = 1;
    static const int32_t vs[] = {1, 1000, 152064};
    for (int i = 0; i < 3; i++) {
        size_t prev = 0;
        for (int32_t B = 1; B <= 512; B++) {
            size_t b = gpu_be.ops->sample_scratch_bytes(&gpu_be, B, vs[i]);
            mono &= b >= prev;
            prev = b;
        }
    }
    CHECKF(mono, "sample_scratch_bytes is not monotone in B");
}

// --- run-to-run determinism at model sizes (GPU only) ------------------------------------------

// Attention forward and backward three times over one packed row: the same bits every time
// (fixed tiles, fixed reduction orders, no atomics). prefix: tr_doc_layout.prefix or NULL.
static void att_determinism(int32_t T, int32_t n_docs, int32_t *doc_start, int32_t *prefix,
                            int32_t H, int32_t KVH, int32_t D) {
    att_arg a = {.T = T, .H = H, .KVH = KVH, .D = D, .n_docs = n_docs};
    a.ld = (a.H + 2 * a.KVH) * a.D;
    size_t nq = (size_t)a.T * a.H * a.D, nk = (size_t)a.T * a.KVH * a.D;
    a.doc_start = doc_start;
    a.prefix = prefix;
    a.pos = kt_malloc((size_t)a.T * sizeof(int32_t));
    att_positions(&a);
    a.qkv = rand_act((size_t)a.T * a.ld, 2.0);
    a.dout = rand_act(nq, 1.0);
    a.out = kt_floats(nq);
    a.lse = kt_floats((size_t)a.T * a.H);
    float *f0[2] = {a.out, a.lse}, *f1[2] = {kt_floats(nq), kt_floats((size_t)a.T * a.H)};
    float *b0[3] = {kt_floats(nq), kt_floats(nk), kt_floats(nk)};
    float *b1[3] = {kt_floats(nq), kt_floats(nk), kt_floats(nk)};
    att_forward(1, f0, &a);   // the first run's out and lse feed every backward
    att_backward(1, b0, &a);
    int same = 1;
    for (int r = 1; r < 3; r++) {
        att_forward(1, f1, &a);
        att_backward(1, b1, &a);
        same &= kt_same_bits(f1[0], f0[0], nq) && kt_same_bits(f1[1], f0[1], (size_t)a.T * a.H) &&
                kt_same_bits(b1[0], b0[0], nq) && kt_same_bits(b1[1], b0[1], nk) &&
                kt_same_bits(b1[2], b0[2], nk);
    }
    CHECKF(same, "attention T=%d H=%d/%d D=%d: runs differ", a.T, a.H, a.KVH, a.D);
    printf("  %-5s attention T=%d docs=%d%s H=%d/%d D=%d fwd+bwd, 3 runs: %s\n",
           tr_dt_name(prec), a.T, n_docs, prefix ? " (shared prefixes)" : "", a.H, a.KVH, a.D,
           same ? "bitwise identical" : "DIFFER");
    for (int i = 0; i < 3; i++) {
        free(b0[i]);
        free(b1[i]);
    }
    free(f1[0]); free(f1[1]);
    free(a.pos); free(a.qkv); free(a.dout); free(a.out); free(a.lse);
}

// Three runs of a 7B-layer-sized GEMM (forward, and backward into fresh gradients) and of
// attention forward and backward over packed documents at two model shapes must give the
// same bits every time: fixed algorithms without split-K, fixed reduction orders, no atomics.
static void test_determinism(void) {
    const int32_t T = 2048, IC = 4096, OC = 4096;
    float *in = rand_act((size_t)T * IC, 1.0), *w = rand_act((size_t)OC * IC, 0.02);
    float *dout = rand_act((size_t)T * OC, 1.0);
    size_t no = (size_t)T * OC, nw = (size_t)OC * IC, nin = (size_t)T * IC;
    float *ref[3] = {kt_floats(no), kt_floats(nin), kt_floats(nw)};
    float *cur[3] = {kt_floats(no), kt_floats(nin), kt_floats(nw)};
    int same = 1;
    for (int r = 0; r < 3; r++) {
        float **o = r == 0 ? ref : cur;
        void *din = put_act(1, in, nin), *dw8 = put_wt(1, w, nw), *ddo = put_act(1, dout, no);
        void *out = put_act(1, NULL, no), *gin = put_act(1, NULL, nin);
        float *gw = putf(1, NULL, nw);
        gpu_be.ops->matmul_forward(&gpu_be, out, din, dw8, NULL, T, IC, OC, 0);
        gpu_be.ops->matmul_backward(&gpu_be, gin, gw, NULL, ddo, din, dw8, T, IC, OC);
        get_act(1, o[0], out, no);
        get_act(1, o[1], gin, nin);
        getf(1, o[2], gw, nw);
        bufs_free(1);
        if (r > 0)
            same &= kt_same_bits(o[0], ref[0], no) && kt_same_bits(o[1], ref[1], nin) &&
                    kt_same_bits(o[2], ref[2], nw);
    }
    CHECKF(same, "matmul %dx%dx%d: runs differ", T, IC, OC);
    printf("  %-5s matmul %dx%dx%d fwd+bwd, 3 runs: %s\n", tr_dt_name(prec), T, IC, OC,
           same ? "bitwise identical" : "DIFFER");
    for (int i = 0; i < 3; i++) {
        free(ref[i]);
        free(cur[i]);
    }
    free(in); free(w); free(dout);

    int32_t docs7b[] = {0, 700, 2048};
    att_determinism(2048, 2, docs7b, NULL, 8, 2, 128);
    int32_t docs05b[] = {0, 300, 1800, 3000, 4096};   // Qwen2.5-0.5B heads, packed documents
    att_determinism(4096, 4, docs05b, NULL, 14, 2, 64);
    // GRPO: two prompts of 255 tokens, each with 8 samples of 257 seeing it
    int32_t grpo[19], grpo_pfx[18];
    grpo[0] = 0;
    for (int32_t d = 0; d < 18; d++) {
        grpo[d + 1] = grpo[d] + (d % 9 == 0 ? 255 : 257);
        grpo_pfx[d] = d % 9 == 0 ? -1 : d - d % 9;
    }
    att_determinism(grpo[18], 18, grpo, grpo_pfx, 14, 2, 64);
}

static int section(const char *only, const char *name) {
    return !only || strcmp(only, name) == 0;
}

// The ops of one precision pass; sections whose ops are fp32 only run in the fp32 pass.
static void run_pass(const char *only) {
    int f32 = prec == TR_F32;
    if (section(only, "matmul")) {
        test_matmul(70, 96, 130);      // odd sizes: no tile divides them
        test_matmul(256, 512, 256);
        test_matmul(1, 33, 8);
        test_matmul(33, 1024, 96);     // a long reduction
        test_matmul(700, 64, 130);     // the bias gradient in several chunks of tokens
        test_matmul_batch_invariance(512, 384);
        test_matmul_batch_invariance(96, 130);
        // value and score heads: narrow outputs at a long batch (the product cuBLASLt's
        // n = 8192 choice did not run), and their rows' bits alone vs in a batch
        test_matmul(16177, 896, 1);
        test_matmul(70, 96, 3);
        test_matmul_batch_invariance(896, 1);
        test_matmul_batch_invariance(96, 3);
        if (prec == TR_BF16) test_matmul_split();
        if (prec == TR_BF16) test_matmul_seqk_all();
        if (prec == TR_BF16) {   // Qwen2.5-0.5B's gate/up, and shapes that cut tiles short
            const int32_t Ts[] = {1, 7, 64, 200};
            for (size_t t = 0; t < sizeof Ts / sizeof Ts[0]; t++) {
                test_matmul_swiglu(Ts[t], 896, 4864);
                test_matmul_swiglu(Ts[t], 96, 104);
            }
        }
    }
    if (section(only, "embedding")) {
        test_embedding(300, 96, 50, 0);
        test_embedding(1, 33, 5, 0);
        test_embedding(5000, 600, 7, 0);        // long runs; three column blocks
        test_embedding(4096, 64, 100000, 3);    // mostly distinct ids, one on every third token
        if (f32) test_embedding_scratch();
    }
    if (section(only, "rmsnorm")) {
        test_rmsnorm(70, 300);
        test_rmsnorm(700, 96);                  // several chunks in the weight gradient
        test_rmsnorm(600, 896);                 // a warp a row, columns past a lane's 8 slots
        test_rmsnorm_rows(600, 896, 64);
        test_rmsnorm_rows(530, 300, 7);         // a ragged last column block
        test_head_rmsnorm(90, 4, 2, 64);
        test_head_rmsnorm(33, 3, 1, 128);
    }
    if (section(only, "rope")) {
        test_rope(90, 3, 1, 64);
        // blocks of several tokens (from 2048), the last one short of the unrolled four
        test_rope(2053, 2, 1, 128);
    }
    if (section(only, "attention")) {
        // a decode step's three ops in one: Qwen2.5-0.5B's and -1.5B's heads, and 4 a kv head
        test_decode_rope(12, 14, 2, 64, 700);
        test_decode_rope(9, 12, 2, 128, 600);
        test_decode_rope(5, 32, 8, 128, 300);
        // documents straddling tiles, one of a single token; an odd stride (element loads)
        test_attention(300, 3, (const int32_t[]){0, 37, 38, 300}, NULL, 4, 2, 64, 0, 16);
        // keys growing along the context: the reference points move, the outputs rescale
        test_attention_keys(600, 2, (const int32_t[]){0, 40, 600}, NULL, 4, 2, 64, 0, 16, true);
        test_attention_keys(600, 2, (const int32_t[]){0, 40, 600}, NULL, 4, 2, 128, 0, 16, true);
        test_attention(160, 1, (const int32_t[]){0, 160}, NULL, 8, 2, 128, 5, 16);
        // Qwen2.5-0.5B's group of 7 (decode rows 8..15 are padding), a padded aligned stride
        test_attention(200, 4, (const int32_t[]){0, 5, 6, 130, 200}, NULL, 14, 2, 64, 8, 16);
        // one kv head for 4, edges on and just past a tile edge, T no multiple of a tile
        test_attention(260, 4, (const int32_t[]){0, 64, 65, 200, 260}, NULL, 4, 1, 128, 8, 32);
        // blocks of 24 slots: decode's copies look slots up by division (powers of two shift)
        test_attention(260, 4, (const int32_t[]){0, 64, 65, 200, 260}, NULL, 4, 1, 128, 8, 24);
        // rows past one and two softmax chunks (the forward's fold, the decode's split)
        test_attention(1300, 2, (const int32_t[]){0, 100, 1300}, NULL, 2, 1, 64, 8, 16);
        test_attention(2400, 2, (const int32_t[]){0, 2300, 2400}, NULL, 2, 2, 128, 0, 64);
        // many short documents: several per tile, more than 32 in the backward's tile order
        int32_t short_docs[701];
        test_attention(700, att_short_docs(short_docs, 700), short_docs, NULL, 2, 1, 64, 8, 16);
        // head dimensions without tensor-core kernels: the row kernels, forward and decode
        test_attention(50, 2, (const int32_t[]){0, 20, 50}, NULL, 3, 3, 24, 1, 16);   // D < 32
        test_attention(90, 2, (const int32_t[]){0, 33, 90}, NULL, 4, 2, 96, 0, 16);
        // shared prefixes (prefix[d]: the document whose tokens stand before d's): a prefix of
        // 37 tokens (no tile's multiple) with three dependents, then an unrelated document
        test_attention(300, 5, (const int32_t[]){0, 37, 57, 121, 251, 300},
                       (const int32_t[]){-1, 0, 0, 0, -1}, 4, 2, 64, 8, 16);
        // GRPO: a prompt of 255 tokens and 8 samples of 257, Qwen2.5-0.5B's heads
        test_attention(2311, 9,
                       (const int32_t[]){0, 255, 512, 769, 1026, 1283, 1540, 1797, 2054, 2311},
                       (const int32_t[]){-1, 0, 0, 0, 0, 0, 0, 0, 0}, 14, 2, 64, 8, 16);
        // prefixes of whole tiles (128, 64) after an unrelated document, a one-token dependent
        test_attention(530, 8, (const int32_t[]){0, 50, 178, 278, 279, 312, 376, 466, 530},
                       (const int32_t[]){-1, -1, 1, 1, 1, -1, 5, 5}, 8, 2, 128, 0, 32);
        // contexts past one and two softmax chunks, the first edge inside the prefix; an odd
        // stride (element loads of the gathered rows)
        test_attention(2130, 3, (const int32_t[]){0, 1100, 1130, 2130},
                       (const int32_t[]){-1, 0, 0}, 2, 1, 64, 3, 16);
        // the row kernels (head dimensions without tensor-core kernels)
        test_attention(90, 3, (const int32_t[]){0, 33, 53, 90}, (const int32_t[]){-1, 0, 0}, 4,
                       2, 96, 0, 16);
        test_attention(50, 4, (const int32_t[]){0, 10, 11, 30, 50},
                       (const int32_t[]){-1, 0, 0, -1}, 3, 3, 24, 1, 16);
    }
    if (section(only, "kv_write")) test_kv_write(40, 4, 2, 64);
    if (section(only, "rope_kv_write")) {
        test_rope_kv_write(40, 14, 2, 64);
        test_rope_kv_write(2100, 4, 2, 64);
    }
    if (section(only, "swiglu")) {
        test_swiglu(37, 1001);
        test_swiglu(37, 1024);   // bf16: 16-byte groups of 8 columns
    }
    if (section(only, "add")) test_add(300001);
    if (section(only, "adamw")) test_adamw(100003);
    if (section(only, "sumsq") && f32) test_sumsq();
    if (section(only, "logsoftmax")) {
        test_logsoftmax(40, 3001);    // odd rows: element loads from the second row on
        test_logsoftmax(3, 100);      // a short last chunk
        test_logsoftmax(17, 4104);    // 16-byte loads, rows of whole chunks
        test_logsoftmax(4, 151936);   // Qwen2's vocabulary
        test_logsoftmax(300, 4104);   // more rows than SMs: a block a row, registers ahead
    }
    if (section(only, "buffers") && f32) test_buffers();
    if (section(only, "convert") && f32) test_convert();
    if (section(only, "sample")) {
        test_sample(96, 1000, SMP_RANDOM, 0, 0.0f, 0);
        test_sample(96, 1000, SMP_TIED, 1, 0.0f, 0);
        test_sample(96, 257, SMP_ZEROS, 2, 0.0f, 0);
        test_sample(96, 5, SMP_TIED, 3, 0.0f, 0);
        test_sample(96, 3000, SMP_RANDOM, 4, 0.0f, 0);
        test_sample(4, 1000, SMP_EQUAL, 6, 0.5f, 4);       // the cut meets top_p's limit exactly
        test_sample_scratch();
        test_sample_vp(96, 1000, 2, 7);
        test_sample_vp(96, 3001, 3, 8);
    }
    if (section(only, "sample_vocab"))   // apart: slow under compute-sanitizer
        test_sample(24, 152064, SMP_RANDOM, 5, 0.0f, 0);   // a real vocabulary
    if (section(only, "determinism")) test_determinism();
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    const char *which = argc > 2 ? argv[2] : NULL;
    int n_dev = tr_cuda_device_count();
    if (n_dev == 0) {
        printf("test_cuda_ops: no CUDA device, skipped\n");
        return 77;
    }
    char msg[512];
    tr_cuda_device_info info;
    if (tr_cuda_device_query(0, &info, msg, sizeof msg) != 0) die("device", msg);
    printf("device 0: %s, sm_%d%d, %d SMs\n", info.name, info.major, info.minor, info.n_sms);
    // The op tests hand the CPU backend host arrays on purpose: guarded mode (for the code
    // above kernels/) is off for them.
    unsetenv("TROUPE_CPU_GUARD");
    static const tr_dt passes[2] = {TR_F32, TR_BF16};
    for (int p = 0; p < 2; p++) {
        prec = passes[p];
        if (which && strcmp(which, tr_dt_name(prec)) != 0) continue;
        printf("%s pass:\n", tr_dt_name(prec));
        if (tr_backend_cpu_init(&cpu_be, 2, prec) != 0) die("tr_backend_cpu_init", "failed");
        if (tr_backend_cuda_init(&gpu_be, 0, prec, -1) != 0) {
            tr_backend_cuda_status(&gpu_be, msg, sizeof msg);
            die("tr_backend_cuda_init", msg);
        }
        CHECKF(gpu_be.act == prec && gpu_be.wt == prec && cpu_be.act == prec &&
                   cpu_be.wt == prec,
               "backends report act %s/%s, wt %s/%s for the %s pass", tr_dt_name(gpu_be.act),
               tr_dt_name(cpu_be.act), tr_dt_name(gpu_be.wt), tr_dt_name(cpu_be.wt),
               tr_dt_name(prec));
        kt_seed(14);
        run_pass(only);
        CHECKF(tr_backend_cuda_status(&gpu_be, msg, sizeof msg) == 0, "cuda backend: %s", msg);
        tr_backend_cuda_free(&gpu_be);
        tr_backend_cpu_free(&cpu_be);
    }
    return tr_test_summary("test_cuda_ops");
}
