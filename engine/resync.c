// Weight resync over a communicator: a five-element header (format, version, element count,
// dtype, bucket length) broadcast first, so receivers check the shape before anything is
// overwritten and learn the sender's bucket size, then the weights bucket by bucket. Buckets
// bound what one broadcast holds (a staging buffer per bucket once weights are converted on
// the way) and are the unit a later overlap of conversion and transfer will pipeline.
#include "engine/resync.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/device.h"

#define RESYNC_FORMAT 0x7472737931LL   // "trsy1"
#define HDR_N 5
#define CHECKSUM_CHUNK ((size_t)4 << 20)

// The one place that says what generation reads: the working weights (the fp32 masters
// themselves when the working dtype is fp32, else the bf16 copy AdamW writes).
tr_resync_view tr_resync_weights(tr_model *m) {
    return (tr_resync_view){.buf = m->work, .n = m->layout.total,
                            .dtype = m->wt == TR_BF16 ? TR_COMM_BF16 : TR_COMM_F32};
}

static size_t dtype_size(enum tr_comm_dtype t) { return tr_comm_dtype_size(t); }

static const char *dtype_name(enum tr_comm_dtype t) { return tr_comm_dtype_name(t); }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check_rank(tr_comm *c, int32_t root, bool sender, tr_err *err) {
    int32_t r = tr_comm_rank(c);
    if (root < 0 || root >= tr_comm_world(c))
        return tr_errf(err, TR_EINVAL, "resync: root %d of a %d-rank communicator", root, tr_comm_world(c));
    if (sender != (r == root))
        return tr_errf(err, TR_EINVAL, "resync: rank %d %s, but rank %d is the sender", r,
                       sender ? "cannot send" : "cannot receive", root);
    return 0;
}

// Broadcasts the header from root through a small buffer of backend memory (collectives
// move backend memory only); hdr holds root's header on every rank afterwards.
static int header(tr_comm *c, int32_t root, tr_backend *be, int64_t *hdr, tr_err *err) {
    int64_t *d = tr_dev_alloc(be, HDR_N * sizeof(int64_t), "resync header", err);
    if (!d) {
        tr_comm_abort(c, err->msg);
        return -1;
    }
    int rc = tr_comm_rank(c) == root ? tr_dev_upload_sync(be, d, hdr, HDR_N * sizeof(int64_t), "resync header", err) : 0;
    if (rc) tr_comm_abort(c, err->msg);
    if (!rc) rc = tr_comm_broadcast(c, d, HDR_N, TR_COMM_I64, root, err);
    if (!rc) rc = tr_dev_download_sync(be, hdr, d, HDR_N * sizeof(int64_t), "resync header", err);
    tr_dev_free(be, d);
    return rc;
}

static int buckets(tr_comm *c, int32_t root, const tr_resync_view *v, size_t per, tr_resync_stats *st,
                   tr_err *err) {
    size_t es = dtype_size(v->dtype);
    for (size_t off = 0; off < v->n; off += per) {
        size_t len = v->n - off < per ? v->n - off : per;
        if (tr_comm_broadcast(c, (uint8_t *)v->buf + off * es, len, v->dtype, root, err))
            return tr_err_wrap(err, "resync: bucket %d (elements %zu..%zu of %zu)", st->buckets, off, off + len, v->n);
        st->buckets++;
    }
    st->bytes = v->n * es;
    return 0;
}

int tr_resync_send(tr_comm *c, int32_t root, tr_model *m, int64_t version, size_t bucket_bytes,
                   tr_resync_stats *st, tr_err *err) {
    memset(st, 0, sizeof *st);
    if (check_rank(c, root, true, err)) return -1;
    double t0 = now_s();
    tr_resync_view v = tr_resync_weights(m);
    size_t es = dtype_size(v.dtype);
    size_t per = (bucket_bytes ? bucket_bytes : TR_RESYNC_BUCKET_DEFAULT) / es;
    if (per < 1) per = 1;
    int64_t hdr[HDR_N] = {RESYNC_FORMAT, version, (int64_t)v.n, (int64_t)v.dtype, (int64_t)per};
    if (header(c, root, m->be, hdr, err) || buckets(c, root, &v, per, st, err)) return -1;
    st->version = version;
    st->seconds = now_s() - t0;
    return 0;
}

int tr_resync_recv(tr_comm *c, int32_t root, tr_model *m, tr_resync_stats *st, tr_err *err) {
    memset(st, 0, sizeof *st);
    if (check_rank(c, root, false, err)) return -1;
    double t0 = now_s();
    tr_resync_view v = tr_resync_weights(m);
    int64_t hdr[HDR_N] = {0};
    if (header(c, root, m->be, hdr, err)) return -1;
    if (hdr[0] != RESYNC_FORMAT || hdr[2] != (int64_t)v.n || hdr[3] != (int64_t)v.dtype || hdr[4] < 1) {
        tr_errf(err, TR_EINVAL, "resync: rank %d holds %zu %s weights; rank %d sends %lld of dtype %lld "
                "(format %llx): not the same model", tr_comm_rank(c), v.n, dtype_name(v.dtype), root,
                (long long)hdr[2], (long long)hdr[3], (unsigned long long)hdr[0]);
        tr_comm_abort(c, err->msg);
        return -1;
    }
    if (buckets(c, root, &v, (size_t)hdr[4], st, err)) return -1;
    st->version = hdr[1];
    st->seconds = now_s() - t0;
    return 0;
}

int tr_resync_checksum(tr_model *m, uint64_t *sum, tr_err *err) {
    tr_resync_view v = tr_resync_weights(m);
    size_t bytes = v.n * dtype_size(v.dtype);
    size_t cap = bytes < CHECKSUM_CHUNK ? (bytes ? bytes : 1) : CHECKSUM_CHUNK;
    uint8_t *h = tr_dev_alloc_host(m->be, cap, "resync checksum staging", err);
    if (!h) return -1;
    uint64_t f = 1469598103934665603ull;
    int rc = 0;
    for (size_t off = 0; off < bytes && !rc; off += cap) {
        size_t len = bytes - off < cap ? bytes - off : cap;
        rc = tr_dev_download_sync(m->be, h, (const uint8_t *)v.buf + off, len, "resync checksum", err);
        for (size_t i = 0; i < len && !rc; i++) f = (f ^ h[i]) * 1099511628211ull;
    }
    tr_dev_free_host(m->be, h);
    if (!rc) *sum = f;
    return rc;
}
