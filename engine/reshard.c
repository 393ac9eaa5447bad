// Resharding between tensor-parallel layouts: a range of a sending rank's buffer (a bucket of
// a weight sync) is cut along each tensor's rows into at most three blocks (a partial first
// row, whole rows, a partial last row); each block, intersected with the part the receiving
// layout holds, is one copy_2d from the bucket into the receiver's buffer.
#include "engine/reshard.h"

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v;
    h *= 0x100000001b3ull;   // FNV-1a's prime, one word at a time
    return h ^ (h >> 29);
}

uint64_t tr_reshard_fingerprint(const tr_param_layout *l) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < l->n_tensors; i++) {
        const tr_tensor_desc *d = &l->tensors[i];
        for (const char *c = d->name; *c; c++) h = mix(h, (uint8_t)*c);
        h = mix(mix(mix(h, (uint64_t)d->ndim), (uint64_t)d->full[0]), (uint64_t)d->full[1]);
    }
    return h;
}

int64_t tr_reshard_full_cols(const tr_tensor_desc *d) { return d->ndim == 2 ? d->full[1] : d->full[0]; }

tr_rect tr_reshard_part(const tr_tensor_desc *d) {
    bool two = d->ndim == 2;
    tr_rect r = {0, two ? d->full[0] : 1, 0, tr_reshard_full_cols(d)};
    if (d->split == TR_SPLIT_ROWS && two) {
        r.r0 = d->begin;
        r.r1 = d->begin + d->shape[0];
    } else if (d->split == TR_SPLIT_ROWS) {   // a split bias: columns of its one row
        r.c0 = d->begin;
        r.c1 = d->begin + d->shape[0];
    } else if (d->split == TR_SPLIT_COLS) {
        r.c0 = d->begin;
        r.c1 = d->begin + d->shape[1];
    }
    return r;
}

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

typedef struct copy_ctx {
    tr_backend *be;
    size_t es;
    const char *part;         // the range held, from element `off` of the sender's buffer
    size_t off, at;           // ... and the element where the sender's tensor part starts
    tr_rect s, d;             // the sender's and the receiver's parts
    char *dst;                // the receiver's tensor part
} copy_ctx;

// Block b of the full tensor (inside the sender's part): what of it the receiver holds.
static void copy_block(const copy_ctx *c, tr_rect b) {
    tr_rect x = {max64(b.r0, c->d.r0), min64(b.r1, c->d.r1), max64(b.c0, c->d.c0), min64(b.c1, c->d.c1)};
    if (x.r0 >= x.r1 || x.c0 >= x.c1) return;
    size_t ws = (size_t)(c->s.c1 - c->s.c0), wd = (size_t)(c->d.c1 - c->d.c0);
    // Inside the range held: the block's first element comes at or after element off.
    size_t local = (size_t)(x.r0 - c->s.r0) * ws + (size_t)(x.c0 - c->s.c0);
    const char *from = c->part + (c->at + local - c->off) * c->es;
    char *to = c->dst + ((size_t)(x.r0 - c->d.r0) * wd + (size_t)(x.c0 - c->d.c0)) * c->es;
    c->be->ops->copy_2d(c->be, to, wd * c->es, from, ws * c->es, (size_t)(x.c1 - x.c0) * c->es,
                        (size_t)(x.r1 - x.r0));
}

// Elements [e0, e1) of the sender's part (row-major, its width wide) as blocks of whole or
// partial rows, in the full tensor's coordinates.
static void copy_elems(const copy_ctx *c, int64_t e0, int64_t e1) {
    int64_t w = c->s.c1 - c->s.c0, ra = e0 / w, ca = e0 % w, rb = e1 / w, cb = e1 % w;
    int64_t R = c->s.r0, C = c->s.c0;
    if (ra == rb) {
        copy_block(c, (tr_rect){R + ra, R + ra + 1, C + ca, C + cb});
        return;
    }
    if (ca) copy_block(c, (tr_rect){R + ra, R + ra + 1, C + ca, C + w});
    if (ca) ra++;
    if (rb > ra) copy_block(c, (tr_rect){R + ra, R + rb, C, C + w});
    if (cb) copy_block(c, (tr_rect){R + rb, R + rb + 1, C, C + cb});
}

void tr_reshard_range(tr_backend *be, const tr_param_layout *src, const void *part, size_t off, size_t n,
                      const tr_param_layout *dst, void *dst_buf, size_t es) {
    for (int32_t i = 0; i < src->n_tensors && i < dst->n_tensors; i++) {
        const tr_tensor_desc *s = &src->tensors[i], *d = &dst->tensors[i];
        size_t b = s->offset > off ? s->offset : off;
        size_t e = s->offset + s->numel < off + n ? s->offset + s->numel : off + n;
        if (!s->counted || b >= e) continue;
        copy_ctx c = {.be = be, .es = es, .part = part, .off = off, .at = s->offset,
                      .s = tr_reshard_part(s), .d = tr_reshard_part(d), .dst = (char *)dst_buf + d->offset * es};
        copy_elems(&c, (int64_t)(b - s->offset), (int64_t)(e - s->offset));
    }
}
