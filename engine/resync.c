// Weight resync over a communicator: a six-element header (format, version, senders, dtype,
// bucket length, model fingerprint) broadcast by rank 0 first, so receivers check the model
// before anything is overwritten and every rank learns how the senders' buffers are cut, then
// each sender's working weights bucket by bucket. Buckets bound what one broadcast holds (and
// the staging a receiver of another layout needs) and are the unit a later overlap of
// transfer and resharding will pipeline.
#include "engine/resync.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/device.h"
#include "engine/reshard.h"

#define RESYNC_FORMAT 0x7472737932LL   // "trsy2"
enum { H_FORMAT, H_VERSION, H_SENDERS, H_DTYPE, H_PER, H_PRINT, HDR_N };
#define CHECKSUM_CHUNK ((size_t)4 << 20)

// The one place that says what generation reads: the working weights (the fp32 masters
// themselves when the working dtype is fp32, else the bf16 copy AdamW writes).
tr_resync_view tr_resync_weights(tr_model *m) {
    return (tr_resync_view){.buf = m->work, .n = m->layout.total,
                            .dtype = m->wt == TR_BF16 ? TR_COMM_BF16 : TR_COMM_F32};
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Fails the sync for every rank: the others are blocked in a broadcast.
static int fail(tr_comm *c, tr_err *err) {
    tr_comm_abort(c, err->msg);
    return -1;
}

// Broadcasts the header from rank 0 through a small buffer of backend memory (collectives
// move backend memory only); hdr holds rank 0's header on every rank afterwards.
static int header(tr_comm *c, tr_backend *be, int64_t *hdr, tr_err *err) {
    int64_t *d = tr_dev_alloc(be, HDR_N * sizeof(int64_t), "resync header", err);
    if (!d) return fail(c, err);
    int rc = tr_comm_rank(c) == 0 ? tr_dev_upload_sync(be, d, hdr, HDR_N * sizeof(int64_t), "resync header", err) : 0;
    if (rc) fail(c, err);
    if (!rc) rc = tr_comm_broadcast(c, d, HDR_N, TR_COMM_I64, 0, err);
    if (!rc) rc = tr_dev_download_sync(be, hdr, d, HDR_N * sizeof(int64_t), "resync header", err);
    tr_dev_free(be, d);
    return rc;
}

// Whether this rank can take part as the header says: a sender is tensor-parallel rank k of
// the senders' group at rank k, a receiver comes after them, and everyone holds the model
// and dtype rank 0 sends.
static int check_header(tr_comm *c, tr_model *m, const int64_t *hdr, bool sender, tr_err *err) {
    int32_t r = tr_comm_rank(c);
    tr_resync_view v = tr_resync_weights(m);
    uint64_t print = tr_reshard_fingerprint(&m->layout);
    if (hdr[H_FORMAT] != RESYNC_FORMAT || hdr[H_PER] < 1 || hdr[H_SENDERS] < 1 ||
        hdr[H_SENDERS] >= tr_comm_world(c))
        tr_errf(err, TR_EINVAL, "resync: rank %d got a malformed header (format %llx, %lld senders of %d ranks)", r,
                (unsigned long long)hdr[H_FORMAT], (long long)hdr[H_SENDERS], tr_comm_world(c));
    else if ((uint64_t)hdr[H_PRINT] != print || hdr[H_DTYPE] != (int64_t)v.dtype)
        tr_errf(err, TR_EINVAL, "resync: rank %d holds %s weights of model %016llx; rank 0 sends %s weights of model "
                "%016llx: not the same model", r, tr_comm_dtype_name(v.dtype), (unsigned long long)print,
                hdr[H_DTYPE] >= 0 && hdr[H_DTYPE] <= TR_COMM_BF16 ? tr_comm_dtype_name((enum tr_comm_dtype)hdr[H_DTYPE])
                                                                  : "unknown",
                (unsigned long long)hdr[H_PRINT]);
    else if (sender && (hdr[H_SENDERS] != m->tp.size || r != m->tp.rank))
        tr_errf(err, TR_EINVAL, "resync: rank %d sends as tensor-parallel rank %d of %d, but the header names %lld "
                "senders (ranks 0 .. tp-1 send, rank k being tp rank k)", r, m->tp.rank, m->tp.size,
                (long long)hdr[H_SENDERS]);
    else if (!sender && r < hdr[H_SENDERS])
        tr_errf(err, TR_EINVAL, "resync: rank %d receives, but ranks 0 .. %lld send", r,
                (long long)hdr[H_SENDERS] - 1);
    else
        return 0;
    return fail(c, err);
}

// What one rank does with the senders' buckets: their layouts, and where buckets land that
// neither come from this rank nor fit its layout in place.
typedef struct plan {
    int32_t senders;
    tr_param_layout *src;     // [senders]
    size_t per;               // elements per bucket
    void *stage;              // backend memory for one bucket, or NULL when none is needed
} plan;

static void plan_free(tr_model *m, plan *p) {
    for (int32_t k = 0; p->src && k < p->senders; k++) tr_param_layout_free(&p->src[k]);
    free(p->src);
    tr_dev_free(m->be, p->stage);
}

// A receiver whose layout is sender k's takes k's buckets in place.
static bool in_place(const tr_model *m, const plan *p, int32_t k) { return m->tp.size == p->senders && m->tp.rank == k; }

static int plan_init(tr_comm *c, tr_model *m, const int64_t *hdr, plan *p, tr_err *err) {
    memset(p, 0, sizeof *p);
    p->senders = (int32_t)hdr[H_SENDERS];
    p->per = (size_t)hdr[H_PER];
    if (!(p->src = calloc((size_t)p->senders, sizeof *p->src))) {
        tr_errf(err, TR_ENOMEM, "resync: out of memory for %d layouts", p->senders);
        return fail(c, err);
    }
    bool stage = false;
    size_t longest = 0;
    for (int32_t k = 0; k < p->senders; k++) {
        tr_tp tp;
        if (tr_tp_init(&tp, &m->cfg, p->senders, k, err) || tr_param_layout_init_tp(&p->src[k], &m->cfg, &tp, err))
            return fail(c, err);
        if (k != tr_comm_rank(c) && !in_place(m, p, k)) stage = true;
        if (p->src[k].total > longest) longest = p->src[k].total;
    }
    size_t es = tr_comm_dtype_size(tr_resync_weights(m).dtype);
    size_t n = p->per < longest ? p->per : longest;
    if (stage && !(p->stage = tr_dev_alloc(m->be, (n ? n : 1) * es, "resync bucket staging", err))) return fail(c, err);
    return 0;
}

// Every sender's buffer, bucket by bucket, from rank k to all: a sender broadcasts from its
// weights, a receiver of k's layout receives in place, every other rank into the staging
// bucket, from which a receiver copies its part.
static int move(tr_comm *c, tr_model *m, const plan *p, bool sender, tr_resync_stats *st, tr_err *err) {
    tr_resync_view v = tr_resync_weights(m);
    size_t es = tr_comm_dtype_size(v.dtype);
    int32_t me = tr_comm_rank(c);
    for (int32_t k = 0; k < p->senders; k++) {
        size_t n = p->src[k].total;
        bool direct = k == me || (!sender && in_place(m, p, k));
        for (size_t off = 0; off < n; off += p->per) {
            size_t len = n - off < p->per ? n - off : p->per;
            void *buf = direct ? (uint8_t *)v.buf + off * es : p->stage;
            if (tr_comm_broadcast(c, buf, len, v.dtype, k, err))
                return tr_err_wrap(err, "resync: bucket %d (elements %zu..%zu of sender %d's %zu)", st->buckets, off,
                                   off + len, k, n);
            if (!direct && !sender) tr_reshard_range(m->be, &p->src[k], p->stage, off, len, &m->layout, v.buf, es);
            st->buckets++;
        }
        st->bytes += n * es;
    }
    if (tr_dev_sync(m->be, "resync: resharding the last bucket", err)) return fail(c, err);
    return 0;
}

static int run(tr_comm *c, tr_model *m, int64_t *hdr, bool sender, tr_resync_stats *st, tr_err *err) {
    double t0 = now_s();
    if (header(c, m->be, hdr, err) || check_header(c, m, hdr, sender, err)) return -1;
    plan p;
    int rc = plan_init(c, m, hdr, &p, err);
    if (!rc) rc = move(c, m, &p, sender, st, err);
    plan_free(m, &p);
    if (rc) return -1;
    st->version = hdr[H_VERSION];
    st->senders = p.senders;
    st->seconds = now_s() - t0;
    return 0;
}

int tr_resync_send(tr_comm *c, tr_model *m, int64_t version, size_t bucket_bytes, tr_resync_stats *st,
                   tr_err *err) {
    memset(st, 0, sizeof *st);
    tr_resync_view v = tr_resync_weights(m);
    size_t per = (bucket_bytes ? bucket_bytes : TR_RESYNC_BUCKET_DEFAULT) / tr_comm_dtype_size(v.dtype);
    int64_t hdr[HDR_N] = {RESYNC_FORMAT, version, m->tp.size, (int64_t)v.dtype, per > 0 ? (int64_t)per : 1,
                          (int64_t)tr_reshard_fingerprint(&m->layout)};
    return run(c, m, hdr, true, st, err);
}

int tr_resync_recv(tr_comm *c, tr_model *m, tr_resync_stats *st, tr_err *err) {
    memset(st, 0, sizeof *st);
    int64_t hdr[HDR_N] = {0};
    return run(c, m, hdr, false, st, err);
}

// ---- the layout-free checksum ----

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Rows [r0, r0 + rows) of tensor i's part (host copy h): each element's hash by its place in
// the whole tensor.
static uint64_t sum_rows(const tr_tensor_desc *d, int32_t i, const uint8_t *h, int64_t r0, int64_t rows, size_t es) {
    tr_rect p = tr_reshard_part(d);
    int64_t w = p.c1 - p.c0, cols = tr_reshard_full_cols(d);
    uint64_t s = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t col = 0; col < w; col++) {
            const uint8_t *e = h + ((size_t)r * (size_t)w + (size_t)col) * es;
            uint64_t bits = es == 2 ? (uint64_t)(e[0] | e[1] << 8) : (uint64_t)e[0] | (uint64_t)e[1] << 8 |
                                                                        (uint64_t)e[2] << 16 | (uint64_t)e[3] << 24;
            uint64_t at = (uint64_t)(p.r0 + r0 + r) * (uint64_t)cols + (uint64_t)(p.c0 + col);
            s += splitmix(splitmix((uint64_t)i << 48 ^ at) ^ bits);
        }
    return s;
}

int tr_resync_checksum(tr_model *m, uint64_t *sum, tr_err *err) {
    tr_resync_view v = tr_resync_weights(m);
    size_t es = tr_comm_dtype_size(v.dtype), cap = CHECKSUM_CHUNK;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        tr_rect p = tr_reshard_part(&m->layout.tensors[i]);
        if ((size_t)(p.c1 - p.c0) * es > cap) cap = (size_t)(p.c1 - p.c0) * es;
    }
    uint8_t *h = tr_dev_alloc_host(m->be, cap, "resync checksum staging", err);
    if (!h) return -1;
    uint64_t s = 0;
    int rc = 0;
    for (int32_t i = 0; i < m->layout.n_tensors && !rc; i++) {
        const tr_tensor_desc *d = &m->layout.tensors[i];
        tr_rect p = tr_reshard_part(d);
        size_t row = (size_t)(p.c1 - p.c0) * es;
        int64_t rows = p.r1 - p.r0, chunk = (int64_t)(cap / row);
        for (int64_t r = 0; r < rows && d->counted && !rc; r += chunk) {
            int64_t n = rows - r < chunk ? rows - r : chunk;
            rc = tr_dev_download_sync(m->be, h, (const uint8_t *)v.buf + (d->offset + (size_t)r * (row / es)) * es,
                                      (size_t)n * row, "resync checksum", err);
            if (!rc) s += sum_rows(d, i, h, r, n, es);
        }
    }
    tr_dev_free_host(m->be, h);
    if (!rc) *sum = s;
    return rc;
}
