// Token sampling on the GPU. The rows that top-k or top-p rank are sorted by (logit
// descending, id ascending) with CUB's stable segmented radix sort; then one block per row
// takes the host sampler's steps (kernels/cpu/sample.c) in the same order: weights
// exp((z - max) / T) in double, the top-k set, top-p's cut, the total, and the walk of one
// Philox uniform. Every prefix sum has one shape, set by the length of the walk alone: each
// thread sums a contiguous segment of it in one pass, an ordered scan of those sums gives
// each segment its start, and a search walks only the one segment holding its target, so a
// row costs about one pass of exps (two for top-p without top-k). Sums group differently
// from the host's sequential ones, so a draw within TR_SAMPLE_NEAR of a boundary may pick a
// neighbouring id; those are counted. Logits are the activation dtype (float or bf16),
// widened exactly where they are read; the rank order reads the sorted keys, which hold them.
// A row's "block" is a cluster of 1 to 4 blocks (logsoftmax_row.cuh): its TR_LSM_VT virtual
// threads own the segments, the blocks exchange their segment sums through distributed shared
// memory, and each then holds the whole row's layout and walks the one segment a search needs
// itself, so that only the row's reductions cross blocks.
#include <limits.h>

// Every draw launches with staging memory (sample_run): the passes need no register copy.
#define TR_LSM_STAGED_ONLY 1

#include "kernels/cuda/cuda_ctx.cuh"
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/logsoftmax_row.cuh"
#include "kernels/cuda/rank_sort.cuh"
#include "kernels/cuda/sample_topk.cuh"
#include "kernels/philox.h"

// The block shape of logsoftmax_forward, so that the logprobs are its bits; a row's segments
// are its virtual threads'.
#define SMP_THREADS TR_LSM_THREADS
#define SMP_SEGS TR_LSM_VT

size_t tr_cuda_sample_scratch_bytes(tr_backend *be, int32_t B, int32_t V) {
    tr_rank_sort s;
    if (B <= 0 || V <= 0 || tr_rank_sort_layout(be, "sample", B, V, NULL, &s) != 0) return 0;
    return s.total;
}

// ---- ranking ----

__device__ inline bool smp_use_k(const tr_sample_row &r, int32_t V) {
    return r.top_k > 0 && r.top_k < V;
}

__device__ inline bool smp_ranked(const tr_sample_row &r, int32_t V) {
    return r.temperature != 0.0f && (smp_use_k(r, V) || r.top_p < 1.0f);
}

// Keys and ids (0..V-1, so the stable descending sort leaves ties in id order) of the ranked
// rows the sort ranks, and every row's segment (empty for the rest: rows drawn unranked, and
// top-k rows that sample_topk_kernel ranks when select is on).
template <typename A>
__global__ void sample_keys_kernel(uint32_t *keys, int32_t *ids, int32_t *begin, int32_t *end,
                                   const A *logits, const tr_sample_row *rows, int32_t B,
                                   int32_t V, bool select) {
    for (int32_t b = blockIdx.x; b < B; b += gridDim.x) {
        bool ranked = smp_ranked(rows[b], V) && !tr_topk_selected(rows[b], V, select);
        size_t base = (size_t)b * V;
        if (threadIdx.x == 0) {
            begin[b] = (int32_t)base;
            end[b] = (int32_t)(ranked ? base + V : base);
        }
        if (!ranked) continue;
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            keys[base + i] = tr_rank_key(tr_f32(logits[base + i]));
            ids[base + i] = i;
        }
    }
}

// ---- row-wide steps (every thread of the row's cluster calls each) ----

struct smp_op_max {
    __device__ int32_t operator()(int32_t a, int32_t b) const { return a > b ? a : b; }
};

// Greedy: the highest logit, the lowest id on ties (a total order, so any combining order
// finds the same winner: the row is read in the log-softmax's chunks).
__device__ inline void smp_better(float &bv, int32_t &bi, float v, int32_t i) {
    if (i != INT_MAX && (bi == INT_MAX || v > bv || (v == bv && i < bi))) {
        bv = v;
        bi = i;
    }
}

struct smp_best {
    float v;
    int32_t i;
};
__device__ __forceinline__ smp_best tr_lsm_shfl(smp_best b, int o) {
    return {tr_lsm_shfl(b.v, o), tr_lsm_shfl(b.i, o)};
}
struct smp_op_better {
    __device__ smp_best operator()(smp_best a, smp_best b) const {
        smp_better(a.v, a.i, b.v, b.i);
        return a;
    }
};

template <typename A>
__device__ int32_t smp_argmax(const A *x, int32_t V) {
    smp_best b = {-INFINITY, INT_MAX};
#pragma unroll 1
    for (int32_t u = 0; u < tr_lsm_uses(); u++)
        tr_lsm_each(tr_lsm_row_src(x, V), tr_lsm_vt(u), TR_LSM_VT, tr_lsm_chunks(V),
                    [&](int32_t c, int32_t n, const float *v) {
#pragma unroll
                        for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
                            if (k < n) smp_better(b.v, b.i, v[k], c * TR_LSM_CHUNK + k);
                    });
    return tr_lsm_reduce1(b, smp_op_better(), smp_best{-INFINITY, INT_MAX}).i;
}

// ---- weights ----

// 2^(j/32), j < 32, each rounded to nearest: the table of smp_exp.
__device__ const double smp_exp2_tab[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0,
};

// The constants of smp_exp_in that are no immediate operand, in constant memory, where a
// product reads them as operands: as literals each took two moves into registers for every
// value weighed (Nsight Compute: about a quarter of the weights' pass).
__constant__ double smp_exp_c[7] = {
    0x1.8p52,                // adding it rounds to an integer in the low word
    0x1.71547652b82fep+5,    // 32 / ln2
    -0x1.62e42fefa39efp-6,   // -ln2/32 in two parts (Cody-Waite)
    -0x1.abc9e3b39803fp-61,
    1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0,
};

// exp(d) in double within about 1 ulp, for d in [-700, 0], where the weights lie (d <= 0)
// but for values far below the row's maximum: d = (32e + j) ln2/32 + r with |r| <= ln2/64,
// exp(d) = 2^e 2^(j/32) e^r, e^r - 1 by its degree-6 Taylor polynomial (truncation below
// 0.05 ulp). About 11 double operations against exp()'s 18, and these are the cost of a row;
// within an ulp of the exact value (as exp() is), far inside TR_SAMPLE_NEAR.
__device__ __forceinline__ double smp_exp_in(double d) {
    const double magic = smp_exp_c[0];
    double t = fma(d, smp_exp_c[1], magic);   // d * 32 / ln2
    int32_t k = __double2loint(t);
    double kd = t - magic;
    double r = fma(kd, smp_exp_c[2], d);
    r = fma(kd, smp_exp_c[3], r);
    double a = fma(r, smp_exp_c[4], smp_exp_c[5]);
    a = fma(a, r, smp_exp_c[6]);
    a = fma(a, r, 1.0 / 6.0);
    a = fma(a, r, 0.5);
    a = fma(a, r, 1.0);
    double tj = __ldg(&smp_exp2_tab[k & 31]);
    double y = fma(tj, __dmul_rn(a, r), tj);   // in [0.98, 1.98]: scaling stays normal
    int32_t e = k >> 5;                          // floor(k / 32), >= -1011
    return __hiloint2double(__double2hiint(y) + (int32_t)((uint32_t)e << 20),
                            __double2loint(y));
}

// Whether d is smp_exp_in's, and exp(d) where it is not: 0 below -746 (exp() is 0 below
// -745.14), exp() itself for the rest (scaling into subnormals, d > 0, NaN).
__device__ __forceinline__ bool smp_exp_inside(double d) { return d >= -700.0 && d <= 0.0; }
__device__ inline double smp_exp_out(double d) { return d < -746.0 ? 0.0 : exp(d); }

// exp(d) in double within about 1 ulp.
__device__ inline double smp_exp(double d) {
    return smp_exp_inside(d) ? smp_exp_in(d) : smp_exp_out(d);
}

// ---- the walk order: a row's weights in segments ----

// The logit a sorted key holds (tr_rank_key inverted; -0 came back as +0, of equal weight).
__device__ __forceinline__ float smp_key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// The weights of a row in walk order: id order from the logits, or rank order from the
// sorted keys (which hold the logits' values: no gather through the sorted ids). A source of
// chunks for tr_lsm_each: chunk c is walk positions [8c, 8c + 8) below n.
template <typename A>
struct smp_src {
    const A *x;             // id order, when keys is NULL
    const uint32_t *keys;   // rank order
    bool vec;               // 16-byte loads allowed
    double mx, inv_t;
    int32_t n;              // walk positions

    // A key chunk's raw words are its keys (0 past the count).
    __device__ __forceinline__ int32_t fetch(int32_t c, int32_t end, tr_lsm_raw &r) const {
        return keys ? tr_lsm_fetch(keys, n, c, end, vec, r) : tr_lsm_fetch(x, n, c, end, vec, r);
    }
    __device__ __forceinline__ int32_t count(int32_t c, int32_t end) const {
        return tr_lsm_count(n, c, end);
    }
    __device__ __forceinline__ int raw_bytes() const {
        return keys ? 4 * TR_LSM_CHUNK : (int)sizeof(A) * TR_LSM_CHUNK;
    }
    __device__ __forceinline__ void stage(int32_t c, int32_t end, unsigned char *slot) const {
        const bool async = vec && count(c, end) == TR_LSM_CHUNK;
        tr_lsm_raw r;
        if (!async) fetch(c, end, r);
        const size_t i0 = (size_t)c * TR_LSM_CHUNK;
        if (keys) tr_lsm_stage_raw(slot, keys + i0, raw_bytes(), async, r);
        else tr_lsm_stage_raw(slot, x + i0, raw_bytes(), async, r);
    }
    __device__ __forceinline__ void widen(const tr_lsm_raw &r, float v[TR_LSM_CHUNK]) const {
        if (!keys) return tr_lsm_widen(x, r, v);
#pragma unroll
        for (int32_t k = 0; k < TR_LSM_CHUNK; k++) v[k] = smp_key_value(r.w[k]);
    }
};

// The weights w[0, cnt) of loaded values (0 past cnt) and their sum, added one by one from
// 0: the chunk sum, the same bits wherever a chunk is weighed.
template <typename A>
__device__ __forceinline__ double smp_weigh(const smp_src<A> &s, const float v[TR_LSM_CHUNK],
                                            int32_t cnt, double w[TR_LSM_CHUNK]) {
    // Every value takes smp_exp_in (a value outside its range takes it at 0) and its weight
    // is chosen after, rather than each behind a branch of its own, which kept the values'
    // dependent chains of products from overlapping (Nsight Compute: most of the pass's
    // stalls waited on them). Values outside it (far below the maximum at a low temperature,
    // or NaN) are weighed again by smp_exp_out.
    double d[TR_LSM_CHUNK];
    bool rare = false;
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
        d[k] = __dmul_rn((double)v[k] - s.mx, s.inv_t);
        const bool in = smp_exp_inside(d[k]);
        const double f = smp_exp_in(in ? d[k] : 0.0);
        w[k] = k < cnt && in ? f : 0.0;
        rare |= k < cnt && !in;
    }
    if (rare) {
#pragma unroll
        for (int32_t k = 0; k < TR_LSM_CHUNK; k++)
            if (k < cnt && !smp_exp_inside(d[k])) w[k] = smp_exp_out(d[k]);
    }
    // the weights past cnt are 0 and a sum of weights is never -0: adding them leaves it
    double sum = 0.0;
#pragma unroll
    for (int32_t k = 0; k < TR_LSM_CHUNK; k++) sum = sum + w[k];
    return sum;
}

// Walk positions [0, n) in chunks of TR_LSM_CHUNK; segment t (virtual thread t's) is the
// chunks [c0, c1), ceil(chunks / SMP_SEGS) of them a segment from segment 0 on (the last ones
// may be short or empty). The shape depends on n alone.
__device__ __forceinline__ void smp_chunks(int32_t n, int32_t t, int32_t *c0, int32_t *c1) {
    int32_t nc = tr_lsm_chunks(n), per = (nc + SMP_SEGS - 1) / SMP_SEGS;
    int32_t a = t * per < nc ? t * per : nc;
    *c0 = a;
    *c1 = nc - a < per ? nc : a + per;
}

// The cumulative weight B(r) of walk position r in chunk c of thread t's segment, from
// four sums added one by one: the carry C[g] of the thread's group of SMP_GROUP segments,
// the segments of that group before t (p[t]), the chunks of t's segment before c, the
// chunk's weights through r: B(r) = C[g] + (p[t] + (chunks + weights)). Each level's last
// partial sum is the very sum the level above took (a segment's chunks add up to the
// segment sum in q[t] = p[t] + sum; a group's to C[g + 1] = C[g] + q), so B never
// decreases, ends at the total C[32] and stays put at a weight 0: a target in [0, total)
// lies in exactly one position's [B(r - 1), B(r)), whatever rounding did.
#define SMP_GROUP (SMP_SEGS / 32)

struct smp_hit {
    int32_t r;              // the position found (n: none)
    double before, cum;     // B(r - 1) (0 before position 0) and B(r)
};

struct smp_shared {
    double v[SMP_SEGS];         // segment sums
    double p[SMP_SEGS];         // the group's segments before t, added one by one
    double q[SMP_SEGS];         // ... through t
    double c[33];               // group carries, added one by one; c[32] is the total
    smp_hit hit;
};

// Pass 1: each thread sums its segment (chunk sums added one by one from 0), each block takes
// the other blocks' sums, then its warp 0 lays out p, q and c: every block of the row holds
// the same layout. Returns the total of positions [0, s.n). Every thread of the cluster calls.
template <typename A>
__device__ double smp_sums(smp_shared &sh, const smp_src<A> &s) {
    const int32_t n = s.n, C = tr_lsm_ctas(), rank = tr_lsm_rank();
    __syncthreads();   // the previous walk may still read sh
#pragma unroll 1
    for (int32_t u = 0; u < tr_lsm_uses(); u++) {
        int32_t c0, c1;
        smp_chunks(n, tr_lsm_vt(u), &c0, &c1);
        double sum = 0.0;
        tr_lsm_each(s, c0, 1, c1, [&](int32_t, int32_t cnt, const float *v) {
            double w[TR_LSM_CHUNK];
            sum = sum + smp_weigh(s, v, cnt, w);
        });
        sh.v[tr_lsm_vt(u)] = sum;
    }
    if (C > 1) {   // the other blocks' segments
        cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
        cl.sync();
        for (int32_t i = (int32_t)threadIdx.x; i < SMP_SEGS; i += SMP_THREADS) {
            const int32_t r = i / SMP_THREADS % C;   // virtual thread i's block
            if (r != rank) sh.v[i] = cl.map_shared_rank(&sh, (unsigned)r)->v[i];
        }
        cl.sync();   // the remote reads are done before any block writes v again
    } else {
        __syncthreads();
    }
    int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        double acc = 0.0;
        for (int j = 0; j < SMP_GROUP; j++) {
            int i = lane * SMP_GROUP + j;
            sh.p[i] = acc;
            acc = acc + sh.v[i];
            sh.q[i] = acc;
        }
        sh.c[lane] = acc;
        __syncwarp();
        if (lane == 0) {
            double carry = 0.0;
            for (int g = 0; g < 32; g++) {
                double a = sh.c[g];
                sh.c[g] = carry;
                carry = carry + a;
            }
            sh.c[32] = carry;
        }
    }
    __syncthreads();
    return sh.c[32];
}

// Warp 0: the first position of segment t whose B(r) satisfies pred (pred: false below some
// value, true from it on), when B at the segment's end does. The warp weighs 32 chunks at a
// time, chains their sums in order, and the lane whose chunk's end passes first walks it.
template <typename A, typename Pred>
__device__ smp_hit smp_walk(const smp_shared &sh, const smp_src<A> &s, int32_t t, Pred pred) {
    const int32_t n = s.n;
    int lane = threadIdx.x & 31;
    int32_t c0, c1;
    smp_chunks(n, t, &c0, &c1);
    double cg = sh.c[t / SMP_GROUP], pt = sh.p[t];
    double chain = 0.0;   // the segment's chunk sums before this round's, every lane alike
    tr_lsm_raw raw;
    int32_t next = s.fetch(c0 + lane, c1, raw);
    for (int32_t r0 = c0; r0 < c1; r0 += 32) {
        int32_t c = r0 + lane, cnt = next;
        double w[TR_LSM_CHUNK], sum = 0.0;
        float v[TR_LSM_CHUNK];
        s.widen(raw, v);
        next = s.fetch(c + 32, c1, raw);   // the next round's chunk loads meanwhile
        if (c < c1) sum = smp_weigh(s, v, cnt, w);
        double start = 0.0;   // the chunk sums before this lane's
#pragma unroll
        for (int i = 0; i < 32; i++) {
            double si = __shfl_sync(0xffffffffu, sum, i);
            if (lane == i) start = chain;
            chain = chain + si;
        }
        unsigned m = __ballot_sync(0xffffffffu, c < c1 && pred(cg + (pt + (start + sum))));
        if (m) {
            int f = __ffs(m) - 1;
            smp_hit h = {n, 0.0, 0.0};
            if (lane == f) {
                double part = 0.0, before = cg + (pt + start);
                bool found = false;
#pragma unroll
                for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
                    if (k < cnt && !found) {
                        part = part + w[k];
                        double cum = cg + (pt + (start + part));
                        if (pred(cum)) {
                            h = {c * TR_LSM_CHUNK + k, before, cum};
                            found = true;
                        }
                        before = cum;
                    }
                }
            }
            h.r = __shfl_sync(0xffffffffu, h.r, f);
            h.before = __shfl_sync(0xffffffffu, h.before, f);
            h.cum = __shfl_sync(0xffffffffu, h.cum, f);
            return h;
        }
    }
    return {n, 0.0, 0.0};   // not reached: B at the segment's end passes
}

// The first position r < s.n whose B(r) satisfies pred (r = s.n when none), for every thread:
// the segments whose end fails precede the one that holds it, so counting them finds it.
// Each block has the whole layout, so each finds it alone (the same hit).
template <typename A, typename Pred>
__device__ smp_hit smp_find(smp_shared &sh, const smp_src<A> &s, Pred pred) {
    const int32_t n = s.n;
    int32_t t = threadIdx.x, seg = 0;
    for (int32_t i = t; i < SMP_SEGS; i += SMP_THREADS)
        seg += __syncthreads_count(!pred(sh.c[i / SMP_GROUP] + sh.q[i]));
    if (seg >= SMP_SEGS) return {n, 0.0, 0.0};
    if (t < 32) {
        smp_hit h = smp_walk(sh, s, seg, pred);
        if (t == 0) sh.hit = h;
    }
    __syncthreads();
    smp_hit h = sh.hit;
    __syncthreads();   // sh.hit is written again by the next search
    return h;
}

// The host sampler's draw for a row with temperature > 0 (kernels/cpu/sample.c, step by
// step); *near as the contract defines it. keys and sorted: the row's sort, when ranked.
template <typename A>
__device__ int32_t smp_draw(smp_shared &sh, const A *x, const uint32_t *keys,
                            const int32_t *sorted, int32_t V, const tr_sample_row &row,
                            float mx, bool *near) {
    bool use_k = smp_use_k(row, V), use_p = row.top_p < 1.0f, ranked = use_k || use_p;
    double inv_t = 1.0 / (double)row.temperature;
    int32_t n = use_k ? row.top_k : V;
    smp_src<A> by_id = {x, NULL, tr_lsm_aligned(x), (double)mx, inv_t, V};
    smp_src<A> w = {x, keys, tr_lsm_aligned(keys), (double)mx, inv_t, n};
    if (!ranked) w = by_id;
    // the nucleus is measured against top-k's mass, else the whole row's (id order)
    double mass = use_p && !use_k ? smp_sums(sh, by_id) : 0.0;
    double total = smp_sums(sh, w);   // sh now holds w's sums over [0, n)
    bool cut_near = false;
    int32_t kept = n;
    if (use_p) {
        if (use_k) mass = total;
        double limit = (double)row.top_p * mass, tol = TR_SAMPLE_NEAR * mass;
        if (!(limit > 0.0)) {   // nothing kept: the host falls back to rank 0
            *near = true;
            return sorted[0];
        }
        smp_hit h = smp_find(sh, w, [limit](double cum) { return cum >= limit; });
        if (h.r < n) {
            kept = h.r + 1;
            total = h.cum;   // B(kept - 1): the walk below ends there
            cut_near = fabs(h.cum - limit) <= tol || (kept >= 2 && limit - h.before <= tol);
        } else {
            cut_near = true;   // rounding left the limit above the whole set
        }
    }
    uint64_t counter = row.counter;
    int32_t used = row.used;
    uint32_t a = tr_philox_next(row.seed, &counter, &used);
    uint32_t b = tr_philox_next(row.seed, &counter, &used);
    double target = tr_philox_uniform53(a, b) * total, tol = TR_SAMPLE_NEAR * total;
    if (target < total) {   // then a position below kept holds it
        smp_hit d = smp_find(sh, w, [target](double cum) { return target < cum; });
        if (d.r < kept) {
            *near = cut_near || d.cum - target <= tol || (d.r > 0 && target - d.before <= tol);
            return ranked ? sorted[d.r] : d.r;
        }
    }
    // Rounding left the target at the very top: the last kept position with weight, else 0.
    *near = true;
    int32_t last = 0;
#pragma unroll 1
    for (int32_t u = 0; u < tr_lsm_uses(); u++) {
        int32_t c0, c1;
        smp_chunks(n, tr_lsm_vt(u), &c0, &c1);
        tr_lsm_each(w, c0, 1, c1, [&](int32_t c, int32_t cnt, const float *v) {
            double wt[TR_LSM_CHUNK];
            smp_weigh(w, v, cnt, wt);
#pragma unroll
            for (int32_t k = 0; k < TR_LSM_CHUNK; k++) {
                int32_t r = c * TR_LSM_CHUNK + k;
                if (k < cnt && r >= 1 && r < kept && wt[k] > 0.0) last = r;
            }
        });
    }
    last = tr_lsm_reduce1(last, smp_op_max(), (int32_t)0);
    return ranked ? sorted[last] : last;
}

// One cluster of blocks of SMP_THREADS per row (grid-stride over rows).
template <typename A>
__global__ void __launch_bounds__(SMP_THREADS, 2)
sample_draw_kernel(int32_t *ids, float *logprob, int32_t *n_near, const A *logits,
                   const tr_sample_row *rows, const uint32_t *keys, const int32_t *sorted,
                   int32_t B, int32_t V) {
    __shared__ smp_shared sh;
    for (int32_t b = tr_lsm_row_first(); b < B; b += tr_lsm_row_step()) {
        const A *x = logits + (size_t)b * V;
        tr_sample_row row = rows[b];
        tr_lsm_stats st = tr_lsm_row<false>(x, V);   // the log-sum-exp alone
        bool near = false;
        int32_t id = row.temperature == 0.0f
                         ? smp_argmax(x, V)
                         : smp_draw(sh, x, keys + (size_t)b * V, sorted + (size_t)b * V, V,
                                    row, st.m, &near);
        if (tr_lsm_vt(0) == 0) {
            ids[b] = id;
            logprob[b] = tr_lsm_logprob(x, id, tr_lsm_lse(st));
            if (near) atomicAdd((int *)n_near, 1);   // an integer count: order-free
        }
    }
}

// The launches around the sort, for logits of type A; without a ranked row the draw alone (it
// reads neither keys nor sorted ids then). Each row is one cluster's work, its
// passes staged through dynamic shared memory (logsoftmax_row.cuh), two blocks an SM.
template <typename A>
static void sample_run(tr_backend *be, tr_rank_sort &s, int32_t *ids, float *logprob,
                       const A *logits, const tr_sample_row *rows, int32_t B, int32_t V,
                       bool ranked, int32_t *n_near) {
    cudaStream_t st = tr_cuda_stream(be);
    unsigned grid = tr_cuda_grid((size_t)B, 1);
    const size_t dyn = TR_LSM_STAGE_BYTES;   // TR_LSM_STAGED_ONLY
    if (TR_CUDA_CHECK(be, cudaFuncSetAttribute(sample_draw_kernel<A>,
                                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                      (int)dyn)))
        return;
    if (ranked) {
        const bool select = tr_cuda_ctx_of(be)->topk_select != 0;
        sample_keys_kernel<A><<<grid, SMP_THREADS, 0, st>>>(s.keys_in, s.ids_in, s.begin, s.end,
                                                            logits, rows, B, V, select);
        if (TR_CUDA_LAUNCHED(be, "sample keys")) return;
        if (select) {
            sample_topk_kernel<A><<<grid, TR_TOPK_THREADS, 0, st>>>(s.keys_out, s.ids_out, logits,
                                                                    rows, B, V);
            if (TR_CUDA_LAUNCHED(be, "sample top-k")) return;
        }
        // Stable: equal keys keep the id order they came in.
        if (tr_rank_sort_run(be, &s, B, V) || TR_CUDA_LAUNCHED(be, "sample sort")) return;
    }
    const int C = tr_lsm_ctas_for(tr_cuda_ctx_of(be), grid);
    if (TR_CUDA_CHECK(be, tr_lsm_launch(sample_draw_kernel<A>, grid, C, dyn, st, ids, logprob,
                                        n_near, logits, rows, (const uint32_t *)s.keys_out,
                                        (const int32_t *)s.ids_out, B, V)))
        return;
    TR_CUDA_LAUNCHED(be, "sample");
}

void tr_cuda_sample(tr_backend *be, int32_t *ids, float *logprob, const void *logits,
                    const tr_sample_row *rows, int32_t B, int32_t V, bool ranked, void *scratch,
                    int32_t *n_near) {
    if (B <= 0 || V <= 0) return;
    if (!scratch) {   // CUB would only size its storage and sort nothing
        tr_cuda_record(tr_cuda_ctx_of(be), __FILE__, __LINE__, "sample", "no scratch");
        return;
    }
    tr_rank_sort s;
    if (tr_rank_sort_layout(be, "sample", B, V, scratch, &s) != 0) return;
    if (tr_cuda_bf16(be))
        sample_run(be, s, ids, logprob, (const tr_bf16 *)logits, rows, B, V, ranked, n_near);
    else
        sample_run(be, s, ids, logprob, (const float *)logits, rows, B, V, ranked, n_near);
}
