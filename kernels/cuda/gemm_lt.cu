// cuBLASLt products of the bf16 path. Each shape's algorithm is chosen by a fixed rule
// (plan_choose) among those the heuristic offers that reduce every dot product in one
// sequence (reduction scheme NONE: no split-K, nothing summed in a second pass or by
// atomics), once, and kept with the shape's descriptors in the backend context (the one
// exception: tr_lt_gemm.split_k, decode-sized forward products with batch invariance off). So
// one shape always computes the same bits on every run, and no timing decides a bit: a
// decode-sized product may settle on a faster kernel (another algorithm, or the sequential-k
// kernel of gemm_seqk.cu), but only among those whose outputs equal its plan's (plan_settle,
// at the end of this file). Pointer alignments are part of the shape because the heuristic's
// choice depends on them; they are counted up to 16 bytes (what the tensor-core kernels'
// vector loads need), so that the same product on buffers at different offsets, as every
// layer's are, is one plan and not one for each power of two. In the batch-invariant mode a
// forward product's algorithm ignores its token count n as well (plan_choose_any_n), so that
// a row's bits do not depend on the batch around it.
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/gemm_lt.cuh"
#include "kernels/cuda/gemm_seqk.cuh"

// Largest power of two up to 16 that divides the address.
static int32_t align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int32_t al = 16;
    while (al > 1 && a % (uintptr_t)al != 0) al >>= 1;
    return al;
}

// Teardown: failures here have nobody to report to.
static void plan_release(tr_lt_plan *p) {
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    if (p->a) cublasLtMatrixLayoutDestroy(p->a);
    if (p->b) cublasLtMatrixLayoutDestroy(p->b);
    if (p->d) cublasLtMatrixLayoutDestroy(p->d);
    memset(p, 0, sizeof *p);
}

void tr_cuda_lt_plans_free(tr_cuda_ctx *ctx) {
    for (int32_t i = 0; i < ctx->n_plans; i++) plan_release(&ctx->plans[i]);
    ctx->n_plans = ctx->next_plan = 0;
}

static int lt_check(tr_backend *be, cublasStatus_t s, int line, const char *what) {
    return tr_cuda_check_blas(be, s, __FILE__, line, what);
}
#define LT_CHECK(be, call) lt_check((be), (call), __LINE__, #call)

static int set_desc(tr_backend *be, cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr,
                    const void *value, size_t bytes) {
    return LT_CHECK(be, cublasLtMatmulDescSetAttribute(op, attr, value, bytes));
}

static int set_pref(tr_backend *be, cublasLtMatmulPreference_t pref,
                    cublasLtMatmulPreferenceAttributes_t attr, const void *value, size_t bytes) {
    return LT_CHECK(be, cublasLtMatmulPreferenceSetAttribute(pref, attr, value, bytes));
}

// The algorithms the heuristic ranks for this shape that work without split-K, best first,
// at most cap. Returns how many, or -1 with the failure recorded.
static int plan_candidates(tr_backend *be, const tr_lt_plan *p, cublasLtMatmulAlgo_t *out,
                           int cap) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    const tr_lt_key *key = &p->key;
    cublasLtMatmulPreference_t pref = NULL;
    if (LT_CHECK(be, cublasLtMatmulPreferenceCreate(&pref))) return -1;
    uint64_t ws = TR_CUDA_LT_WORKSPACE;
    uint32_t scheme = key->split_k ? CUBLASLT_REDUCTION_SCHEME_MASK : CUBLASLT_REDUCTION_SCHEME_NONE;
    uint32_t aa = (uint32_t)key->align_a, ab = (uint32_t)key->align_b;
    uint32_t ad = (uint32_t)key->align_d;
    cublasLtMatmulHeuristicResult_t res[16];
    int found = 0, n = -1;
    if (!set_pref(be, pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws) &&
        !set_pref(be, pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &scheme, sizeof scheme) &&
        !set_pref(be, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof aa) &&
        !set_pref(be, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof ab) &&
        !set_pref(be, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof ad) &&
        !set_pref(be, pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof ad)) {
        // NOT_SUPPORTED is how the heuristic says it found nothing: the caller reports it.
        cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->a, p->b, p->d, p->d,
                                                          pref, 16, res, &found);
        if (s != CUBLAS_STATUS_SUCCESS && s != CUBLAS_STATUS_NOT_SUPPORTED)
            tr_cuda_check_blas(be, s, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic");
        else if (s != CUBLAS_STATUS_SUCCESS)
            found = 0;
        n = 0;
        for (int i = 0; !ctx->failed && i < found && n < cap; i++) {
            int32_t splits = 1;
            size_t got = 0;
            if (res[i].state != CUBLAS_STATUS_SUCCESS) continue;
            if (LT_CHECK(be, cublasLtMatmulAlgoConfigGetAttribute(
                                 &res[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                 sizeof splits, &got)))
                break;
            // the mask should have excluded it; never rely on it
            if (splits > 1 && !key->split_k) continue;
            out[n++] = res[i].algo;
        }
        if (ctx->failed) n = -1;
    }
    if (LT_CHECK(be, cublasLtMatmulPreferenceDestroy(pref))) n = -1;
    return n;
}

static int algo_attr(const cublasLtMatmulAlgo_t *algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;   // every attribute read here is a 32-bit enum or count
    size_t got = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(algo, attr, &v, sizeof v, &got) !=
        CUBLAS_STATUS_SUCCESS)
        return -1;
    return (int)v;
}

// cuBLAS 13's Hopper kernels (TMA, warpgroup MMA) carry this algorithm id. For a few shapes
// the heuristic ranks an older kernel first although it offers one of these: the 0.5B
// model's o_proj weight gradient (m = n = 896, k = 16384) ran 358 us with its first choice
// (id 41) and 79 us with its first id-66 candidate; of the 30 products of a 0.5B and a 1.5B
// training step, no other first choice was an older kernel (bench_cuda gemm on an H200).
#define LT_HOPPER_ALGO_ID 66

// The heuristic's first algorithm without split-K, or its first Hopper kernel when it ranks
// an older one first. A pure function of the shape: no timing decides it.
// Returns 0, or -1 with the failure recorded.
static int plan_choose(tr_backend *be, tr_lt_plan *p) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    const tr_lt_key *key = &p->key;
    cublasLtMatmulAlgo_t algos[16];
    int n = plan_candidates(be, p, algos, 16);
    if (n > 0) {
        int pick = 0;
        for (int i = 0; i < n && !key->split_k; i++)
            if (algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_ID) == LT_HOPPER_ALGO_ID) {
                pick = i;
                break;
            }
        p->algo = algos[pick];
        return 0;
    }
    if (n == 0) {
        char why[256];
        snprintf(why, sizeof why,
                 "no algorithm without split-K for m=%lld n=%lld k=%lld op(A)=%c op(B)=%c "
                 "types %d,%d->%d, alignments %d/%d/%d",
                 (long long)key->m, (long long)key->n, (long long)key->k,
                 key->ta == CUBLAS_OP_N ? 'N' : 'T', key->tb == CUBLAS_OP_N ? 'N' : 'T',
                 key->a_type, key->b_type, key->d_type, key->align_a, key->align_b,
                 key->align_d);
        tr_cuda_record(ctx, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", why);
    }
    return -1;
}

static int plan_make(tr_backend *be, const tr_lt_key *key, const void *bias, tr_lt_plan *p);

// A batch-invariant product's algorithm: the rule's choice for the same product at n =
// ctx->any_n_at (TR_CUDA_ANY_N), checked to run this n. The
// leading dimensions do not depend on n, so the two keys differ in n alone. Returns 0, or -1
// with the failure recorded.
static int plan_choose_any_n(tr_backend *be, tr_lt_plan *p, const void *bias) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    tr_lt_key ck = p->key;
    ck.any_n = 0;
    ck.n = ctx->any_n_at;
    tr_lt_plan c;
    if (plan_make(be, &ck, bias, &c) != 0) return -1;
    p->algo = c.algo;
    plan_release(&c);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    if (cublasLtMatmulAlgoCheck(ctx->lt, p->op, p->a, p->b, p->d, p->d, &p->algo, &r) !=
            CUBLAS_STATUS_SUCCESS ||
        r.workspaceSize > TR_CUDA_LT_WORKSPACE) {
        char why[200];
        snprintf(why, sizeof why, "batch-invariant product: the algorithm chosen at n=%d does not "
                 "run m=%lld n=%lld k=%lld", ctx->any_n_at, (long long)p->key.m, (long long)p->key.n,
                 (long long)p->key.k);
        tr_cuda_record(ctx, __FILE__, __LINE__, "cublasLtMatmulAlgoCheck", why);
        return -1;
    }
    return 0;
}

// Descriptors for the shape in key (bias: the pointer the heuristic sees for its alignment)
// and its algorithm. Returns 0, or -1 with the failure recorded and p released.
static int plan_make(tr_backend *be, const tr_lt_key *key, const void *bias, tr_lt_plan *p) {
    memset(p, 0, sizeof *p);
    p->key = *key;
    cublasOperation_t ta = (cublasOperation_t)key->ta, tb = (cublasOperation_t)key->tb;
    // stored (not transposed) shapes: op(A) is m x k, op(B) is k x n
    uint64_t a_rows = (uint64_t)(ta == CUBLAS_OP_N ? key->m : key->k);
    uint64_t a_cols = (uint64_t)(ta == CUBLAS_OP_N ? key->k : key->m);
    uint64_t b_rows = (uint64_t)(tb == CUBLAS_OP_N ? key->k : key->n);
    uint64_t b_cols = (uint64_t)(tb == CUBLAS_OP_N ? key->n : key->k);
    int ok = !LT_CHECK(be, cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F)) &&
             !set_desc(be, p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) &&
             !set_desc(be, p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) &&
             !LT_CHECK(be, cublasLtMatrixLayoutCreate(&p->a, (cudaDataType_t)key->a_type, a_rows,
                                                      a_cols, key->lda)) &&
             !LT_CHECK(be, cublasLtMatrixLayoutCreate(&p->b, (cudaDataType_t)key->b_type, b_rows,
                                                      b_cols, key->ldb)) &&
             !LT_CHECK(be, cublasLtMatrixLayoutCreate(&p->d, (cudaDataType_t)key->d_type,
                                                      (uint64_t)key->m, (uint64_t)key->n,
                                                      key->ldd));
    if (ok && key->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        ok = !set_desc(be, p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi) &&
             !set_desc(be, p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    }
    if (ok && (key->any_n ? plan_choose_any_n(be, p, bias) : plan_choose(be, p)) == 0) return 0;
    plan_release(p);
    return -1;
}

// The context's plan for key, made on first use; the oldest plan gives way when all slots
// are taken (a remade plan chooses the same algorithm: the heuristic is a pure function).
static tr_lt_plan *plan_get(tr_backend *be, const tr_lt_key *key, const void *bias) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    for (int32_t i = 0; i < ctx->n_plans; i++)
        if (memcmp(&ctx->plans[i].key, key, sizeof *key) == 0) return &ctx->plans[i];
    tr_lt_plan *p;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ctx->n_plans < TR_CUDA_LT_PLANS) {
        p = &ctx->plans[ctx->n_plans];
        if (plan_make(be, key, bias, p) != 0) return NULL;
        ctx->n_plans++;
    } else {
        p = &ctx->plans[ctx->next_plan];
        ctx->next_plan = (ctx->next_plan + 1) % TR_CUDA_LT_PLANS;
        plan_release(p);   // a released slot's zero key matches no product (m, n, k > 0)
        if (plan_make(be, key, bias, p) != 0) return NULL;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (ctx->prof) {
        ctx->prof->plans_made++;
        ctx->prof->plan_ms += 1e3 * (double)(t1.tv_sec - t0.tv_sec) +
                              1e-6 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    return p;
}

// The plan key of a product: every field the heuristic sees, zeroed first (compared with memcmp).
static void key_of(const tr_lt_gemm *g, tr_lt_key *key) {
    memset(key, 0, sizeof *key);
    key->ta = (int32_t)g->ta;
    key->tb = (int32_t)g->tb;
    key->m = g->m;
    key->n = g->n;
    key->k = g->k;
    key->lda = g->lda;
    key->ldb = g->ldb;
    key->ldd = g->ldd;
    key->a_type = (int32_t)g->a_type;
    key->b_type = (int32_t)g->b_type;
    key->d_type = (int32_t)g->d_type;
    key->bias = g->bias != NULL;
    key->align_a = align_of(g->a);
    key->align_b = align_of(g->b);
    // C has D's layout and the plan's alignment for both
    key->align_d = g->c && align_of(g->c) < align_of(g->d) ? align_of(g->c) : align_of(g->d);
    key->align_bias = g->bias ? align_of(g->bias) : 0;
    key->any_n = g->any_n;
    key->split_k = g->split_k && !g->any_n;
}

static int plan_settle(tr_backend *be, tr_lt_plan *p, const tr_lt_gemm *g);

int tr_lt_matmul(tr_backend *be, const tr_lt_gemm *g) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    tr_lt_key key;
    key_of(g, &key);
    tr_lt_plan *p = plan_get(be, &key, g->bias);
    if (!p) return -1;
    // The sequential-k kernel and the timing of candidates add into D itself: for them an
    // accumulating product into another buffer starts D as a copy of C.
    tr_lt_gemm in_place;
    if (g->accumulate && g->c && g->c != g->d && (p->seqk || (g->timed && !p->settled))) {
        const size_t bytes = (size_t)(g->ldd * g->n) * (g->d_type == CUDA_R_32F ? 4 : 2);
        if (TR_CUDA_CHECK(be, cudaMemcpyAsync(g->d, g->c, bytes, cudaMemcpyDeviceToDevice,
                                              ctx->stream)))
            return -1;
        in_place = *g;
        in_place.c = NULL;
        g = &in_place;
    }
    const void *c = g->c ? g->c : g->d;
    if (g->bias && set_desc(be, p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                            sizeof g->bias))
        return -1;
    if (g->timed && !p->settled && plan_settle(be, p, g) != 0) return -1;
    // The settled kernel takes every product of the plan's key (shape, types, alignments);
    // were it to refuse one (1: nothing queued), algo, whose bits it has, runs it.
    const int sq = p->seqk ? tr_gemm_seqk_cfg(be, g, p->seqk - 1) : 1;
    if (sq < 0) return -1;
    const float one = 1.0f, zero = 0.0f;
    if (sq > 0 && LT_CHECK(be, cublasLtMatmul(ctx->lt, p->op, &one, g->a, p->a, g->b, p->b,
                                              g->accumulate ? &one : &zero, c, p->d, g->d,
                                              p->d, &p->algo, ctx->lt_ws, TR_CUDA_LT_WORKSPACE,
                                              ctx->stream)))
        return -1;
    if (ctx->prof) tr_cuda_prof_mark(ctx, g->name ? g->name : "gemm", g->m, g->n, g->k);
    return 0;
}

int tr_lt_seqk_best(tr_backend *be, const tr_lt_gemm *g) {
    tr_lt_key key;
    key_of(g, &key);
    const tr_lt_plan *p = plan_get(be, &key, g->bias);
    return p && p->settled ? p->seqk_best - 1 : -1;
}

// ---- one candidate run and timed (the probes below, plan_settle) ----

// A candidate is a cuBLASLt algorithm of the plan, or (seqk >= 0) the sequential-k kernel in
// its configuration seqk (gemm_seqk.cu; algo is then not read): both are run and timed the
// same way.
#define LT_ALGO -1

// One run of plan p's product g into g->d by the candidate (algo, seqk), reset from d0 first
// when accumulating. Returns 0, 1 when cuBLASLt refuses the algorithm or the sequential-k
// kernel the product (not recorded: a candidate that does not run is only left out), or -1
// with a failure recorded.
static int probe_run(tr_backend *be, tr_lt_plan *p, const cublasLtMatmulAlgo_t *algo, int seqk,
                     const tr_lt_gemm *g, const void *d0, size_t dbytes, int reset) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (reset && g->accumulate &&
        TR_CUDA_CHECK(be, cudaMemcpyAsync(g->d, d0, dbytes, cudaMemcpyDeviceToDevice, ctx->stream)))
        return -1;
    if (seqk >= 0) return tr_gemm_seqk_cfg(be, g, seqk);
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(ctx->lt, p->op, &one, g->a, p->a, g->b, p->b,
                          g->accumulate ? &one : &zero, g->d, p->d, g->d, p->d, algo,
                          ctx->lt_ws, TR_CUDA_LT_WORKSPACE, ctx->stream) == CUBLAS_STATUS_SUCCESS
               ? 0 : 1;
}

// L2 flushed before each timed run: bytes written over to evict the operands (twice the
// H200's 50 MB L2), so that a product is timed as a decode step runs it, its weights read
// from HBM; timed hot, a kernel that reuses L2 better looks faster than it is there.
#define LT_FLUSH_BYTES ((size_t)128 << 20)

// Microseconds a run of the candidate (algo, seqk) takes from cold L2 (flush: LT_FLUSH_BYTES
// of scratch), the least of five after one warm-up; -1 when a run fails (recorded only if not
// the candidate's).
static double probe_time(tr_backend *be, tr_lt_plan *p, const cublasLtMatmulAlgo_t *algo,
                         int seqk, const tr_lt_gemm *g, void *flush, cudaEvent_t e0,
                         cudaEvent_t e1) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    double best = -1.0;
    for (int r = 0; r < 6; r++) {
        float ms = 0.0f;
        if (TR_CUDA_CHECK(be, cudaMemsetAsync(flush, r, LT_FLUSH_BYTES, ctx->stream)) ||
            TR_CUDA_CHECK(be, cudaEventRecord(e0, ctx->stream)) ||
            probe_run(be, p, algo, seqk, g, NULL, 0, 0) != 0 ||
            TR_CUDA_CHECK(be, cudaEventRecord(e1, ctx->stream)) ||
            TR_CUDA_CHECK(be, cudaEventSynchronize(e1)) ||
            TR_CUDA_CHECK(be, cudaEventElapsedTime(&ms, e0, e1)))
            return -1.0;
        if (r > 0 && (best < 0 || 1e3 * ms < best)) best = 1e3 * ms;
    }
    return best;
}

// ---- the candidates of one shape, timed (bench_cuda gemm) ----

extern "C" int tr_backend_cuda_gemm_probe(tr_backend *be, int ta, int tb, int64_t m, int64_t n,
                                          int64_t k, int d_f32, int accumulate, int bias,
                                          const char *label) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->lt) return -1;
    void *a = NULL, *b = NULL, *d = NULL, *bv = NULL, *flush = NULL;
    size_t db = d_f32 ? 4 : 2;
    if (TR_CUDA_CHECK(be, cudaMalloc(&flush, LT_FLUSH_BYTES)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&a, (size_t)(m * k) * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&b, (size_t)(k * n) * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&d, (size_t)(m * n) * db)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&bv, (size_t)m * db)) ||
        // Small nonzero values (0x3c3c in every bf16: 0.0115): zeros run faster than data.
        TR_CUDA_CHECK(be, cudaMemsetAsync(a, 0x3c, (size_t)(m * k) * 2, ctx->stream)) ||
        TR_CUDA_CHECK(be, cudaMemsetAsync(b, 0x3c, (size_t)(k * n) * 2, ctx->stream)) ||
        TR_CUDA_CHECK(be, cudaMemsetAsync(d, 0, (size_t)(m * n) * db, ctx->stream)) ||
        TR_CUDA_CHECK(be, cudaMemsetAsync(bv, 0, (size_t)m * db, ctx->stream)))
        goto out;
    {
        tr_lt_gemm g = {.ta = (cublasOperation_t)ta, .tb = (cublasOperation_t)tb, .m = m, .n = n,
                        .k = k, .a = a, .lda = ta == CUBLAS_OP_N ? m : k, .a_type = CUDA_R_16BF,
                        .b = b, .ldb = tb == CUBLAS_OP_N ? k : n, .b_type = CUDA_R_16BF,
                        .d = d, .ldd = m, .d_type = d_f32 ? CUDA_R_32F : CUDA_R_16BF,
                        .accumulate = accumulate != 0, .bias = bias ? bv : NULL, .name = label};
        tr_lt_key key;
        key_of(&g, &key);   // fresh allocations: 16-byte alignments, as the engine's buffers
        tr_lt_plan p;
        if (plan_make(be, &key, g.bias, &p) != 0) goto out;
        cublasLtMatmulAlgo_t algos[16];
        int na = plan_candidates(be, &p, algos, 16);
        cudaEvent_t e0 = NULL, e1 = NULL;
        if (na < 0 || TR_CUDA_CHECK(be, cudaEventCreate(&e0)) ||
            TR_CUDA_CHECK(be, cudaEventCreate(&e1)))
            na = 0;
        for (int i = 0; i < na && !ctx->failed; i++) {
            const double us = probe_time(be, &p, &algos[i], LT_ALGO, &g, flush, e0, e1);
            printf("  %-12s m=%-6lld n=%-6lld k=%-6lld #%-2d algo %3d tile %3d stages %3d "
                   "swizzle %d cluster %2d: %8.1f us %6.0f TFLOP/s%s\n",
                   label, (long long)m, (long long)n, (long long)k, i,
                   algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_ID),
                   algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_TILE_ID),
                   algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_STAGES_ID),
                   algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
                   algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), us,
                   us > 0 ? 2e-6 * (double)m * (double)n * (double)k / us : 0.0,
                   us < 0 ? "  (failed)"
                   : memcmp(&algos[i], &p.algo, sizeof p.algo) == 0 ? "  <- used" : "");
        }
        if (e0) cudaEventDestroy(e0);
        if (e1) cudaEventDestroy(e1);
        plan_release(&p);
    }
out:
    cudaFree(a);
    cudaFree(b);
    cudaFree(d);
    cudaFree(bv);
    cudaFree(flush);
    return ctx->failed ? -1 : 0;
}

// ---- a decode step's forward products: each candidate against the batch-invariant plan ----

// Uniform bf16 values in [-1, 1) from a fixed LCG (the same data on every run).
static void probe_fill_bf16(tr_bf16 *h, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1u;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        h[i] = __float2bfloat16_rn((float)(s >> 8) * (2.0f / 16777216.0f) - 1.0f);
    }
}

// Outputs of d whose bits differ from ref (dbytes bytes, elements of esize).
static int64_t probe_diff(tr_backend *be, const void *d, const unsigned char *ref,
                          unsigned char *got, size_t dbytes, size_t esize) {
    if (TR_CUDA_CHECK(be, cudaMemcpy(got, d, dbytes, cudaMemcpyDeviceToHost))) return -1;
    int64_t bad = 0;
    for (size_t i = 0; i < dbytes; i += esize) bad += memcmp(got + i, ref + i, esize) != 0;
    return bad;
}

extern "C" int tr_backend_cuda_gemm_decode_probe(tr_backend *be, int64_t T, int64_t IC,
                                                 int64_t OC, int out_f32, int accumulate,
                                                 int bias, const char *label) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->lt || T <= 0 || IC <= 0 || OC <= 0) return -1;
    const size_t esize = out_f32 ? 4 : 2, dbytes = (size_t)(T * OC) * esize;
    const size_t nx = (size_t)(T * IC), nw = (size_t)(OC * IC);
    const size_t nh = (nx > nw ? nx : nw) > dbytes / 2 ? (nx > nw ? nx : nw) : dbytes / 2;
    tr_bf16 *h = (tr_bf16 *)malloc(nh * sizeof(tr_bf16));
    unsigned char *ref = (unsigned char *)malloc(dbytes), *got = (unsigned char *)malloc(dbytes);
    void *x = NULL, *w = NULL, *bv = NULL, *d = NULL, *d0 = NULL, *flush = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    tr_lt_plan own;
    memset(&own, 0, sizeof own);
    if (!h || !ref || !got) goto out;
    if (TR_CUDA_CHECK(be, cudaMalloc(&x, nx * 2)) || TR_CUDA_CHECK(be, cudaMalloc(&w, nw * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&bv, (size_t)OC * 2)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&d, dbytes)) || TR_CUDA_CHECK(be, cudaMalloc(&d0, dbytes)) ||
        TR_CUDA_CHECK(be, cudaMalloc(&flush, LT_FLUSH_BYTES)) ||
        TR_CUDA_CHECK(be, cudaEventCreate(&e0)) || TR_CUDA_CHECK(be, cudaEventCreate(&e1)))
        goto out;
    probe_fill_bf16(h, nx, 1);
    if (TR_CUDA_CHECK(be, cudaMemcpy(x, h, nx * 2, cudaMemcpyHostToDevice))) goto out;
    probe_fill_bf16(h, nw, 2);
    if (TR_CUDA_CHECK(be, cudaMemcpy(w, h, nw * 2, cudaMemcpyHostToDevice))) goto out;
    probe_fill_bf16(h, (size_t)OC, 3);
    if (TR_CUDA_CHECK(be, cudaMemcpy(bv, h, (size_t)OC * 2, cudaMemcpyHostToDevice))) goto out;
    probe_fill_bf16(h, dbytes / 2, 4);   // any bits: the accumulated output's start
    if (TR_CUDA_CHECK(be, cudaMemcpy(d0, h, dbytes, cudaMemcpyHostToDevice))) goto out;
    {
        // as matmul.cu issues a forward product: out^T[OC, T] = w[OC, IC] . in^T[IC, T]
        tr_lt_gemm g = {.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N, .m = OC, .n = T, .k = IC,
                        .a = w, .lda = IC, .a_type = CUDA_R_16BF,
                        .b = x, .ldb = IC, .b_type = CUDA_R_16BF,
                        .d = d, .ldd = OC, .d_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF,
                        .accumulate = accumulate != 0, .bias = bias && !out_f32 ? bv : NULL,
                        .any_n = true, .name = label};
        tr_lt_key key;
        key_of(&g, &key);
        tr_lt_plan *inv = plan_get(be, &key, g.bias);   // the batch-invariant mode's plan
        if (!inv || probe_run(be, inv, &inv->algo, LT_ALGO, &g, d0, dbytes, 1) ||
            TR_CUDA_CHECK(be, cudaMemcpy(ref, d, dbytes, cudaMemcpyDeviceToHost)))
            goto out;
        printf("  %-8s T=%-4lld %5lld x %-6lld batch-invariant plan (algo %d tile %d): %7.1f us\n",
               label, (long long)T, (long long)OC, (long long)IC,
               algo_attr(&inv->algo, CUBLASLT_ALGO_CONFIG_ID),
               algo_attr(&inv->algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
               probe_time(be, inv, &inv->algo, LT_ALGO, &g, flush, e0, e1));
        // the sequential-k kernel's configurations (those it refuses for the shape left out)
        for (int c = 0; c < TR_SEQK_CONFIGS; c++) {
            const int run = probe_run(be, inv, NULL, c, &g, d0, dbytes, 1);
            if (run < 0) goto out;
            if (run > 0) continue;
            const int64_t bad = probe_diff(be, d, ref, got, dbytes, esize);
            printf("    seqk  #%-2d %s: %7.1f us, %lld of %lld outputs differ\n", c,
                   tr_gemm_seqk_name(c), probe_time(be, inv, NULL, c, &g, flush, e0, e1),
                   (long long)bad, (long long)(T * OC));
        }
        for (int split = 0; split < 2; split++) {
            g.any_n = false;
            g.split_k = split != 0;
            key_of(&g, &key);
            if (plan_make(be, &key, g.bias, &own) != 0) goto out;
            cublasLtMatmulAlgo_t algos[16];
            int na = plan_candidates(be, &own, algos, 16);
            for (int i = 0; i < na; i++) {
                int64_t bad = -1;
                if (probe_run(be, &own, &algos[i], LT_ALGO, &g, d0, dbytes, 1) == 0)
                    bad = probe_diff(be, d, ref, got, dbytes, esize);
                int32_t splits = algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_SPLITK_NUM);
                printf("    %s #%-2d algo %3d tile %3d stages %3d splits %2d cluster %2d: "
                       "%7.1f us, %lld of %lld outputs differ%s\n",
                       split ? "split" : "whole", i, algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_ID),
                       algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_TILE_ID),
                       algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_STAGES_ID), splits,
                       algo_attr(&algos[i], CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID),
                       probe_time(be, &own, &algos[i], LT_ALGO, &g, flush, e0, e1),
                       (long long)bad, (long long)(T * OC),
                       memcmp(&algos[i], &own.algo, sizeof own.algo) == 0 ? "  <- rule" : "");
            }
            plan_release(&own);
        }
    }
out:
    plan_release(&own);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(x);
    cudaFree(w);
    cudaFree(bv);
    cudaFree(d);
    cudaFree(d0);
    cudaFree(flush);
    free(h);
    free(ref);
    free(got);
    return ctx->failed ? -1 : 0;
}

// ---- the sequential-k kernel against the batch-invariant plan (test_cuda_ops) ----

extern "C" int tr_backend_cuda_seqk_check(tr_backend *be, void *out, void *ref, const void *x,
                                          const void *w, const void *bias, int64_t T,
                                          int64_t IC, int64_t OC, int out_f32, int accumulate,
                                          int cfg) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    if (!ctx->lt || T <= 0 || IC <= 0 || OC <= 0) return -1;
    // as matmul.cu issues a forward product, in the batch-invariant mode, never settled
    tr_lt_gemm g = {.ta = CUBLAS_OP_T, .tb = CUBLAS_OP_N, .m = OC, .n = T, .k = IC,
                    .a = w, .lda = IC, .a_type = CUDA_R_16BF,
                    .b = x, .ldb = IC, .b_type = CUDA_R_16BF,
                    .d = ref, .ldd = OC, .d_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF,
                    .accumulate = accumulate != 0, .bias = bias, .any_n = true,
                    .name = "gemm seqk check"};
    tr_lt_key key;
    key_of(&g, &key);
    tr_lt_plan *inv = plan_get(be, &key, g.bias);
    if (!inv) return -1;
    // a plan kept from an earlier call holds that call's bias pointer
    if (g.bias && set_desc(be, inv->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias))
        return -1;
    const int run = probe_run(be, inv, &inv->algo, LT_ALGO, &g, NULL, 0, 0);
    if (run > 0)
        tr_cuda_record(ctx, __FILE__, __LINE__, "cublasLtMatmul",
                       "the batch-invariant plan's algorithm refused its product");
    if (run != 0) return -1;
    g.d = out;
    return tr_gemm_seqk_cfg(be, &g, cfg);
}

extern "C" int tr_backend_cuda_seqk_configs(void) { return TR_SEQK_CONFIGS; }

extern "C" const char *tr_backend_cuda_seqk_name(int cfg) { return tr_gemm_seqk_name(cfg); }

// ---- decode-sized products: the fastest kernel of the plan's bits ----
//
// A decode step's products have few rows, and which kernel serves them best is not what the
// rule picks for the shape (bench_cuda gemm_decode: at 64 rows the 0.5B shape's gate/up ran
// 14.7 us by the batch-invariant plan and 9.4 by another kernel; its down projection 15.1
// against 25.8 the other way). Every cuBLASLt Hopper kernel without split-K reduces each
// output in one chain over ascending k16 blocks, so they give the same bits (0 differing
// outputs at every decode product of both models there). The sequential-k kernel
// (gemm_seqk.cu) reduces in that chain too, on output tiles small enough to fill the device.
// So the first time such a product runs outside a recording, each algorithm the heuristic
// offers and each configuration of the sequential-k kernel that takes the product is run once
// on the product's own operands into scratch memory, those whose outputs differ from the
// plan's algorithm in any bit are dropped, and the fastest of the rest from a cold L2 (the
// plan's own unless another is 3% faster, each later candidate against the best so far) is
// kept: an algorithm in p->algo, the sequential-k kernel in p->seqk. Timing decides which
// kernel runs, never a bit of what it computes: the batch-invariant mode keeps training's
// bits, the fastest mode its rule's.

// Counts the 16-bit words in which a and b differ into *bad.
__global__ void lt_count_diff(const uint16_t *a, const uint16_t *b, size_t n,
                              unsigned long long *bad) {
    unsigned long long c = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        c += a[i] != b[i];
    if (c) atomicAdd(bad, c);
}

// Words of ref and d that differ, or -1 with the failure recorded.
static long long settle_diff(tr_backend *be, const void *ref, const void *d, size_t bytes,
                             unsigned long long *bad) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    unsigned long long h = 0;
    if (TR_CUDA_CHECK(be, cudaMemsetAsync(bad, 0, sizeof *bad, ctx->stream))) return -1;
    lt_count_diff<<<tr_cuda_grid(bytes / 2, 256), 256, 0, ctx->stream>>>(
        (const uint16_t *)ref, (const uint16_t *)d, bytes / 2, bad);
    if (TR_CUDA_CHECK(be, cudaGetLastError()) ||
        TR_CUDA_CHECK(be, cudaMemcpyAsync(&h, bad, sizeof h, cudaMemcpyDeviceToHost, ctx->stream)) ||
        TR_CUDA_CHECK(be, cudaStreamSynchronize(ctx->stream)))
        return -1;
    return (long long)h;
}

// Settles p's kernel as above. A product queued into a recording is left unsettled (a
// recording can neither allocate nor wait), as is one whose scratch memory is not to be had;
// both keep the plan's algorithm, as a failed settling does. Returns 0, or -1 with the
// failure recorded.
static int plan_settle(tr_backend *be, tr_lt_plan *p, const tr_lt_gemm *g) {
    tr_cuda_ctx *ctx = tr_cuda_ctx_of(be);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (TR_CUDA_CHECK(be, cudaStreamIsCapturing(ctx->stream, &cs))) return -1;
    if (cs != cudaStreamCaptureStatusNone) return 0;
    p->settled = true;
    cublasLtMatmulAlgo_t algos[16];
    const int na = plan_candidates(be, p, algos, 16);
    if (na < 0) return -1;
    const size_t bytes = (size_t)(g->ldd * g->n) * (g->d_type == CUDA_R_32F ? 4 : 2);
    void *ref = NULL, *d = NULL, *flush = NULL;
    unsigned long long *bad = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    // Scratch is optional: where it is short, the plan keeps its algorithm.
    if (cudaMalloc(&ref, bytes) != cudaSuccess || cudaMalloc(&d, bytes) != cudaSuccess ||
        cudaMalloc(&flush, LT_FLUSH_BYTES) != cudaSuccess ||
        cudaMalloc((void **)&bad, sizeof *bad) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(ref);
        cudaFree(d);
        cudaFree(flush);
        return 0;
    }
    tr_lt_gemm r = *g, t = *g;
    r.d = ref;
    t.d = d;
    double best_us = -1.0, seqk_us = -1.0;
    cublasLtMatmulAlgo_t best = p->algo;
    int best_seqk = LT_ALGO, fastest_seqk = LT_ALGO;
    // the reference from the output's present contents (what an accumulating product adds to)
    if (TR_CUDA_CHECK(be, cudaEventCreate(&e0)) || TR_CUDA_CHECK(be, cudaEventCreate(&e1)) ||
        probe_run(be, p, &p->algo, LT_ALGO, &r, g->d, bytes, 1) != 0 ||
        (best_us = probe_time(be, p, &p->algo, LT_ALGO, &t, flush, e0, e1)) < 0)
        goto out;
    // the heuristic's algorithms (i < na), then the sequential-k kernel's configurations
    // (TROUPE_CUDA_SEQK=0 leaves them out, for measuring what they add)
    for (int i = 0; i < na + (ctx->no_seqk ? 0 : TR_SEQK_CONFIGS); i++) {
        const cublasLtMatmulAlgo_t *algo = i < na ? &algos[i] : NULL;
        const int seqk = i < na ? LT_ALGO : i - na;
        if (algo && memcmp(algo, &p->algo, sizeof *algo) == 0) continue;
        int run = probe_run(be, p, algo, seqk, &t, g->d, bytes, 1);
        if (run < 0) goto out;
        if (run > 0) continue;
        long long diff = settle_diff(be, ref, d, bytes, bad);
        if (diff < 0) goto out;
        if (diff > 0) continue;   // other bits: never this product's kernel
        double us = probe_time(be, p, algo, seqk, &t, flush, e0, e1);
        if (us < 0 && ctx->failed) goto out;
        if (!algo && us >= 0 && (seqk_us < 0 || us < seqk_us)) {
            seqk_us = us;
            fastest_seqk = seqk;
        }
        if (us >= 0 && us < 0.97 * best_us) {
            best_us = us;
            if (algo) best = *algo;
            best_seqk = seqk;
        }
    }
    p->algo = best;
    p->seqk = best_seqk + 1;   // 0 (LT_ALGO + 1): the algorithm
    p->seqk_best = fastest_seqk + 1;
out:
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(ref);
    cudaFree(d);
    cudaFree(flush);
    cudaFree(bad);
    return ctx->failed ? -1 : 0;
}
