// The double-buffer protocol of shared working weights (weight_share.h): which buffer the
// trainer writes, which one a sync publishes, and the generator's mapping of each buffer
// the first time a sync names it.
#include "engine/weight_share.h"

#include <string.h>

#include "engine/device.h"

static size_t work_bytes(const tr_model *m) { return m->layout.total * tr_dt_size(m->wt); }

int tr_wshare_init(tr_wshare *s, tr_model *m, int32_t n, tr_err *err) {
    memset(s, 0, sizeof *s);
    if (n < 1 || n > 2) return tr_errf(err, TR_EINVAL, "shared weights: %d buffers (1 or 2)", n);
    s->be = m->be;
    s->n = n;
    s->bytes = work_bytes(m);
    s->published = -1;
    char msg[512];
    for (int32_t i = 0; i < n; i++)
        if (!(s->buf[i] = tr_share_alloc(m->be, s->bytes, &s->handle[i], msg, sizeof msg))) {
            tr_wshare_free(s);
            return tr_errf(err, TR_EDEVICE, "shared weights: buffer %d of %zu bytes: %s", i, s->bytes, msg);
        }
    if (tr_model_bind_work(m, s->buf[0], err)) {
        tr_wshare_free(s);
        return -1;
    }
    return 0;
}

// The buffers a trainer made (owner) or a reader mapped; a failure at teardown has nobody
// left to tell.
static void release(tr_backend *be, void *const *buf, bool owner) {
    char msg[256];
    for (int32_t i = 0; i < 2 && be; i++)
        if (buf[i]) (owner ? tr_share_free : tr_share_close)(be, buf[i], msg, sizeof msg);
}

void tr_wshare_free(tr_wshare *s) {
    release(s->be, s->buf, true);
    memset(s, 0, sizeof *s);
}

int tr_wshare_begin_write(tr_wshare *s, tr_model *m, tr_err *err) {
    if (s->n < 2 || s->cur != s->published) return 0;
    int32_t next = 1 - s->cur;
    m->be->ops->copy(m->be, s->buf[next], s->buf[s->cur], s->bytes);
    if (tr_dev_sync(m->be, "shared weights: copying the published buffer", err) ||
        tr_model_bind_work(m, s->buf[next], err))
        return -1;
    s->cur = next;
    return 0;
}

int32_t tr_wshare_publish(tr_wshare *s, int64_t version) {
    s->published = s->cur;
    s->version = version;
    return s->cur;
}

void tr_wshare_reader_init(tr_wshare_reader *r, tr_model *m) {
    memset(r, 0, sizeof *r);
    r->be = m->be;
    r->bytes = work_bytes(m);
    r->reading = -1;
}

int tr_wshare_read(tr_wshare_reader *r, tr_model *m, int32_t index, const tr_share_handle *h, size_t bytes,
                   tr_err *err) {
    if (index < 0 || index > 1 || h->len > TR_SHARE_HANDLE_MAX)
        return tr_errf(err, TR_EINVAL, "shared weights: buffer %d (0 or 1) with a handle of %u bytes", index, h->len);
    if (bytes != r->bytes)
        return tr_errf(err, TR_EINVAL, "shared weights: the trainer's buffer holds %zu bytes, this model's working "
                       "weights %zu: not the same model and layout", bytes, r->bytes);
    if (r->buf[index] && (h->len != r->handle[index].len || memcmp(h->bytes, r->handle[index].bytes, h->len) != 0))
        return tr_errf(err, TR_EINVAL, "shared weights: buffer %d comes with another handle than before", index);
    if (!r->buf[index]) {
        char msg[512];
        if (!(r->buf[index] = tr_share_open(r->be, h, bytes, msg, sizeof msg)))
            return tr_errf(err, TR_EDEVICE, "shared weights: opening the trainer's buffer %d: %s", index, msg);
        r->handle[index] = *h;
    }
    if (tr_model_bind_work(m, r->buf[index], err)) return -1;
    r->reading = index;
    return 0;
}

void tr_wshare_reader_free(tr_wshare_reader *r) {
    release(r->be, r->buf, false);
    memset(r, 0, sizeof *r);
}
