// GPTDataset-style sampling: per part a document order (epochs of shuffled documents), a
// sample index (where each window starts in that order) and a window order (shuffled within
// each epoch, so the first E epochs' draws cover every token E times); a greedy blend picks
// the part for every draw so each prefix's share tracks its weight at every prefix of the
// stream.
#include "data/sampler.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/shuffle.h"
#include "engine/rng.h"

int tr_split_parse(const char *split, double frac[3], tr_err *err) {
    frac[0] = frac[1] = frac[2] = 0;
    if (!split || !*split) {
        frac[0] = 1;
        return 0;
    }
    const char *p = split;
    double sum = 0;
    for (int i = 0;; i++) {
        if (i >= 3) return tr_errf(err, TR_EINVAL, "split '%s': at most 3 parts", split);
        char *end;
        double v = strtod(p, &end);
        if (end == p || !(v >= 0) || !isfinite(v))
            return tr_errf(err, TR_EINVAL, "split '%s': expected non-negative numbers like "
                           "969,30,1", split);
        frac[i] = v;
        sum += v;
        p = end;
        if (*p == '\0') break;
        if (*p != ',' && *p != '/')
            return tr_errf(err, TR_EINVAL, "split '%s': unexpected '%c'", split, *p);
        p++;
    }
    if (!(sum > 0)) return tr_errf(err, TR_EINVAL, "split '%s': parts sum to 0", split);
    for (int i = 0; i < 3; i++) frac[i] /= sum;
    return 0;
}

void tr_split_bounds(const double frac[3], int64_t n_docs, int64_t idx[4]) {
    idx[0] = 0;
    // Python's round() is half-to-even, as is rint() in the default rounding mode.
    for (int i = 0; i < 3; i++) idx[i + 1] = idx[i] + (int64_t)rint(frac[i] * (double)n_docs);
    int64_t diff = idx[3] - n_docs;
    for (int i = 1; i < 4; i++) {
        idx[i] -= diff;
        if (idx[i] < 0) idx[i] = 0;
    }
}

static void part_free(tr_sampler_part *p) {
    tr_indexed_close(&p->ds);
    free(p->doc_order);
    free(p->sample_pos);
    free(p->sample_off);
    free(p->order);
}

void tr_sampler_free(tr_sampler *s) {
    for (int32_t i = 0; i < s->n_parts; i++) part_free(&s->parts[i]);
    free(s->parts);
    free(s->blend_part);
    free(s->blend_index);
    memset(s, 0, sizeof *s);
}

static uint64_t part_seed(uint64_t seed, int32_t prefix, int32_t split, int32_t epoch, int kind) {
    uint64_t a = tr_rng_derive(seed, (uint64_t)prefix * 4 + (uint64_t)split);
    return tr_rng_derive(a, (uint64_t)epoch * 2 + (uint64_t)kind);
}

// Builds the document order, sample index and window order of one part for want draws.
static int part_build(tr_sampler_part *p, int32_t prefix, const tr_sampler_config *cfg,
                      int64_t want, tr_err *err) {
    int64_t nd = p->doc_end - p->doc_begin, L = cfg->seq_len;
    p->tokens_per_epoch = 0;
    for (int64_t d = p->doc_begin; d < p->doc_end; d++)
        p->tokens_per_epoch += tr_indexed_doc_tokens(&p->ds, d);
    int64_t T = p->tokens_per_epoch;
    if (want == 0) return 0;
    if (T < 2)
        return tr_errf(err, TR_EINVAL, "%s: split %d has %" PRId64 " tokens in %" PRId64
                       " documents: nothing to sample", cfg->prefixes[prefix], cfg->split_index,
                       T, nd);
    // Epochs so that E*T tokens hold want windows of L+1 tokens sharing one token each.
    int64_t E = 1;
    while ((E * T - 1) / L < want) E++;
    if (E > INT32_MAX || E * nd > (int64_t)1 << 40)
        return tr_errf(err, TR_ERANGE, "%s: %" PRId64 " samples need %" PRId64 " epochs",
                       cfg->prefixes[prefix], want, E);
    p->n_epochs = (int32_t)E;
    p->n_samples = want;
    p->doc_order = malloc((size_t)(E * nd) * sizeof *p->doc_order);
    p->sample_pos = malloc((size_t)want * sizeof *p->sample_pos);
    p->sample_off = malloc((size_t)want * sizeof *p->sample_off);
    p->order = malloc((size_t)want * sizeof *p->order);
    if (!p->doc_order || !p->sample_pos || !p->sample_off || !p->order)
        return tr_errf(err, TR_ENOMEM, "%s: out of memory for the index of %" PRId64 " samples",
                       cfg->prefixes[prefix], want);
    for (int64_t e = 0; e < E; e++) {
        int64_t *o = p->doc_order + e * nd;
        for (int64_t d = 0; d < nd; d++) o[d] = p->doc_begin + d;
        tr_shuffle_i64(o, nd, part_seed(cfg->seed, prefix, cfg->split_index, (int32_t)e, 0));
    }
    // Window j starts at token j*L of the concatenated stream.
    int64_t pos = 0, doc_tokens = tr_indexed_doc_tokens(&p->ds, p->doc_order[0]), base = 0;
    for (int64_t j = 0; j < want; j++) {
        int64_t start = j * L;
        while (start >= base + doc_tokens) {
            base += doc_tokens;
            pos++;
            doc_tokens = tr_indexed_doc_tokens(&p->ds, p->doc_order[pos]);
        }
        p->sample_pos[j] = pos;
        p->sample_off[j] = (int32_t)(start - base);
    }
    // Shuffle windows within each epoch: epoch e owns windows starting in [e*T, (e+1)*T).
    for (int64_t e = 0, j0 = 0; e < E && j0 < want; e++) {
        int64_t j1 = ((e + 1) * T + L - 1) / L;
        if (j1 > want) j1 = want;
        for (int64_t j = j0; j < j1; j++) p->order[j] = j;
        tr_shuffle_i64(p->order + j0, j1 - j0,
                       part_seed(cfg->seed, prefix, cfg->split_index, (int32_t)e, 1));
        j0 = j1;
    }
    return 0;
}

int tr_sampler_init(tr_sampler *s, const tr_sampler_config *cfg, tr_err *err) {
    memset(s, 0, sizeof *s);
    if (cfg->n_prefixes < 1) return tr_errf(err, TR_EINVAL, "sampler: no dataset prefixes");
    if (cfg->seq_len < 1) return tr_errf(err, TR_EINVAL, "sampler: seq_len %d", cfg->seq_len);
    if (cfg->n_samples < 0) return tr_errf(err, TR_EINVAL, "sampler: negative sample count");
    if (cfg->split_index < 0 || cfg->split_index > 2)
        return tr_errf(err, TR_EINVAL, "sampler: split index %d", cfg->split_index);
    double frac[3], wsum = 0;
    if (tr_split_parse(cfg->split, frac, err)) return -1;
    for (int32_t i = 0; i < cfg->n_prefixes; i++) {
        double w = cfg->weights ? cfg->weights[i] : 1.0;
        if (!(w > 0) || !isfinite(w))
            return tr_errf(err, TR_EINVAL, "sampler: weight %g of %s must be positive", w,
                           cfg->prefixes[i]);
        wsum += w;
    }
    s->seq_len = cfg->seq_len;
    s->n_samples = cfg->n_samples;
    s->parts = calloc((size_t)cfg->n_prefixes, sizeof *s->parts);
    s->blend_part = malloc((size_t)(cfg->n_samples ? cfg->n_samples : 1) * sizeof *s->blend_part);
    s->blend_index = malloc((size_t)(cfg->n_samples ? cfg->n_samples : 1) * sizeof *s->blend_index);
    int64_t *count = calloc((size_t)cfg->n_prefixes, sizeof *count);
    if (!s->parts || !s->blend_part || !s->blend_index || !count) {
        free(count);
        tr_sampler_free(s);
        return tr_errf(err, TR_ENOMEM, "sampler: out of memory for %" PRId64 " samples",
                       cfg->n_samples);
    }
    // Megatron's blending: draw k goes to the part furthest behind weight * max(k, 1).
    for (int64_t k = 0; k < cfg->n_samples; k++) {
        double kk = k > 0 ? (double)k : 1.0;
        int32_t best = 0;
        double best_err = 0;
        for (int32_t i = 0; i < cfg->n_prefixes; i++) {
            double w = (cfg->weights ? cfg->weights[i] : 1.0) / wsum;
            double e = w * kk - (double)count[i];
            if (i == 0 || e > best_err) {
                best = i;
                best_err = e;
            }
        }
        s->blend_part[k] = best;
        s->blend_index[k] = count[best]++;
    }
    int rc = 0;
    for (int32_t i = 0; i < cfg->n_prefixes && !rc; i++) {
        tr_sampler_part *p = &s->parts[i];
        if (tr_indexed_open(&p->ds, cfg->prefixes[i], err)) {
            rc = -1;
            break;
        }
        s->n_parts = i + 1;
        int64_t b[4];
        tr_split_bounds(frac, p->ds.n_docs, b);
        p->doc_begin = b[cfg->split_index];
        p->doc_end = b[cfg->split_index + 1];
        rc = part_build(p, i, cfg, count[i], err);
    }
    free(count);
    if (rc) {
        tr_sampler_free(s);
        return -1;
    }
    return 0;
}

int tr_sampler_get(const tr_sampler *s, int64_t k, int32_t *out, int32_t *doc_start,
                   int32_t *n_docs, tr_err *err) {
    if (k < 0 || k >= s->n_samples)
        return tr_errf(err, TR_ERANGE, "sampler: sample %" PRId64 " of %" PRId64, k, s->n_samples);
    const tr_sampler_part *p = &s->parts[s->blend_part[k]];
    int64_t j = p->order[s->blend_index[k]];
    int64_t pos = p->sample_pos[j], off = p->sample_off[j], need = (int64_t)s->seq_len + 1, got = 0;
    int64_t n_total = (int64_t)p->n_epochs * (p->doc_end - p->doc_begin);
    int32_t nd = 0;
    if (doc_start) doc_start[nd] = 0;
    while (got < need) {
        if (pos >= n_total)
            return tr_errf(err, TR_ERANGE, "%s: sample %" PRId64 " runs past the last epoch",
                           p->ds.prefix, k);
        int64_t doc = p->doc_order[pos], got0 = got;
        // Walk the document's sequences to the token offset, then copy.
        int64_t s0 = tr_indexed_doc_index(&p->ds, doc), s1 = tr_indexed_doc_index(&p->ds, doc + 1);
        int64_t skip = off;
        for (int64_t q = s0; q < s1 && got < need; q++) {
            int64_t len = tr_indexed_seq_len(&p->ds, q);
            if (skip >= len) {
                skip -= len;
                continue;
            }
            int64_t take = len - skip;
            if (take > need - got) take = need - got;
            if (tr_indexed_read(&p->ds, q, skip, take, out + got, err)) return -1;
            got += take;
            skip = 0;
        }
        // An empty document adds no boundary: tr_doc_layout has no zero-length documents.
        if (doc_start && got0 > 0 && off == 0 && got > got0) doc_start[++nd] = (int32_t)got0;
        pos++;
        off = 0;
    }
    if (doc_start) {
        doc_start[++nd] = (int32_t)need;
        *n_docs = nd;
    } else if (n_docs) {
        *n_docs = 0;
    }
    return 0;
}

int tr_sampler_next(tr_sampler *s, int32_t *out, tr_err *err) {
    if (s->next >= s->n_samples) return 0;
    if (tr_sampler_get(s, s->next, out, NULL, NULL, err)) return -1;
    s->next++;
    return 1;
}

void tr_sampler_seek(tr_sampler *s, int64_t k) { s->next = k; }
