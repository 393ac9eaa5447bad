// SFT samples in flat buffers (one ids array, one mask array, offsets per sample) and
// first-fit packing over a bounded window of open rows, so packing stays linear in the
// number of samples while rows end up nearly full.
#include "data/sft.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/jsonl.h"
#include "data/shuffle.h"

void tr_sft_free(tr_sft_dataset *d) {
    free(d->off);
    free(d->ids);
    free(d->mask);
    free(d->line);
    memset(d, 0, sizeof *d);
}

static int reserve(tr_sft_dataset *d, int64_t samples, int64_t tokens, tr_err *err) {
    if (samples + 1 > d->cap_samples) {
        int64_t c = d->cap_samples ? d->cap_samples * 2 : 1024;
        while (c < samples + 1) c *= 2;
        int64_t *o = realloc(d->off, (size_t)c * sizeof *o);
        if (!o) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " samples", c);
        d->off = o;
        int64_t *l = realloc(d->line, (size_t)c * sizeof *l);
        if (!l) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " samples", c);
        d->line = l;
        d->cap_samples = c;
    }
    if (tokens > d->cap_tokens) {
        int64_t c = d->cap_tokens ? d->cap_tokens * 2 : 65536;
        while (c < tokens) c *= 2;
        int32_t *i = realloc(d->ids, (size_t)c * sizeof *i);
        if (!i) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " tokens", c);
        d->ids = i;
        uint8_t *m = realloc(d->mask, (size_t)c);
        if (!m) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " tokens", c);
        d->mask = m;
        d->cap_tokens = c;
    }
    return 0;
}

int tr_sft_add(tr_sft_dataset *d, const tr_chat_format *chat, const tr_chat_msg *msgs, size_t n,
               int32_t max_len, int policy, int64_t line, tr_err *err) {
    tr_chat_tokens t = {0};
    if (tr_chat_render(chat, msgs, n, false, &t, err)) {
        tr_chat_tokens_free(&t);
        return -1;
    }
    size_t keep = t.n;
    if (max_len > 0 && keep > (size_t)max_len) {
        if (policy == TR_SFT_DROP) {
            d->n_dropped++;
            tr_chat_tokens_free(&t);
            return 0;
        }
        keep = (size_t)max_len;
        d->n_truncated++;
    }
    size_t trained = 0;
    for (size_t i = 1; i < keep; i++) trained += t.mask[i];  // token 0 is never a target
    if (!trained) {
        d->n_untrained++;
        tr_chat_tokens_free(&t);
        return 0;
    }
    if (d->n == 0 && reserve(d, 0, 0, err)) {
        tr_chat_tokens_free(&t);
        return -1;
    }
    if (d->n == 0) d->off[0] = 0;
    int64_t at = d->off[d->n];
    if (reserve(d, d->n + 1, at + (int64_t)keep, err)) {
        tr_chat_tokens_free(&t);
        return -1;
    }
    memcpy(d->ids + at, t.ids, keep * sizeof *t.ids);
    memcpy(d->mask + at, t.mask, keep);
    d->line[d->n] = line;
    d->off[++d->n] = at + (int64_t)keep;
    tr_chat_tokens_free(&t);
    return 0;
}

static const char *sharegpt_role(const char *from) {
    if (strcmp(from, "human") == 0 || strcmp(from, "user") == 0) return "user";
    if (strcmp(from, "gpt") == 0 || strcmp(from, "assistant") == 0) return "assistant";
    if (strcmp(from, "system") == 0) return "system";
    return NULL;
}

// The role of a `messages` entry as a static string (it outlives the parsed record).
static const char *chat_role(const char *role) {
    static const char *roles[] = {"system", "user", "assistant"};
    for (int i = 0; i < 3; i++)
        if (strcmp(role, roles[i]) == 0) return roles[i];
    return NULL;
}

int tr_sft_parse_messages(const char *path, int64_t line, const tr_json *obj, tr_chat_msg **msgs,
                          size_t *n, tr_err *err) {
    *msgs = NULL;
    *n = 0;
    const tr_json *arr;
    bool share = false;
    if (tr_jsonl_get_array(path, line, obj, "messages", false, &arr, err)) return -1;
    if (!arr) {
        if (tr_jsonl_get_array(path, line, obj, "conversations", false, &arr, err)) return -1;
        share = true;
    }
    if (!arr)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field 'messages' (or ShareGPT "
                       "'conversations')", path, (long long)line);
    const char *field = share ? "conversations" : "messages";
    const char *rk = share ? "from" : "role", *ck = share ? "value" : "content";
    size_t m = (size_t)arr->count;
    if (m == 0) return tr_errf(err, TR_EFORMAT, "%s:%lld: '%s' is empty", path, (long long)line, field);
    tr_chat_msg *out = calloc(m, sizeof *out);
    if (!out) return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
    size_t i = 0;
    for (const tr_json *e = arr->child; e; e = e->next, i++) {
        if (e->type != TR_JSON_OBJECT) {
            free(out);
            return tr_errf(err, TR_EFORMAT, "%s:%lld: %s[%zu] must be an object, got %s", path,
                           (long long)line, field, i, tr_jsonl_type_name(e));
        }
        const tr_json *rv = tr_json_get(e, rk), *cv = tr_json_get(e, ck);
        // A missing field is named before a mistyped one.
        const char *bad = !rv ? rk : !cv ? ck : rv->type != TR_JSON_STRING ? rk
                        : cv->type != TR_JSON_STRING ? ck : NULL;
        if (bad) {
            const tr_json *bv = tr_json_get(e, bad);
            free(out);
            if (!bv)
                return tr_errf(err, TR_EFORMAT, "%s:%lld: %s[%zu]: missing field '%s'", path,
                               (long long)line, field, i, bad);
            return tr_errf(err, TR_EFORMAT, "%s:%lld: %s[%zu].%s must be a string, got %s", path,
                           (long long)line, field, i, bad, tr_jsonl_type_name(bv));
        }
        const char *role = rv->str, *content = cv->str;
        size_t clen = cv->len;
        if (share) {
            const char *r = sharegpt_role(role);
            if (!r) {
                free(out);
                return tr_errf(err, TR_EFORMAT, "%s:%lld: conversations[%zu].from '%s' is not "
                               "human, gpt or system", path, (long long)line, i, role);
            }
            role = r;
        } else if (!chat_role(role)) {
            free(out);
            return tr_errf(err, TR_EFORMAT, "%s:%lld: messages[%zu].role '%s' is not system, user "
                           "or assistant", path, (long long)line, i, role);
        } else {
            role = chat_role(role);
        }
        out[i].role = role;
        out[i].content = content;
        out[i].content_len = clen;
    }
    *msgs = out;
    *n = m;
    return 0;
}

int tr_sft_load(tr_sft_dataset *d, const char *path, const tr_chat_format *chat, int32_t max_len,
                int policy, tr_err *err) {
    memset(d, 0, sizeof *d);
    if (policy != TR_SFT_DROP && policy != TR_SFT_TRUNCATE)
        return tr_errf(err, TR_EINVAL, "%s: unknown length policy %d", path, policy);
    tr_jsonl r;
    if (tr_jsonl_open(&r, path, err)) return -1;
    int rc = 0;
    for (;;) {
        tr_json_doc doc;
        int got = tr_jsonl_next(&r, &doc, err);
        if (got <= 0) {
            rc = got;
            break;
        }
        tr_chat_msg *msgs;
        size_t n;
        rc = tr_sft_parse_messages(path, r.line, doc.root, &msgs, &n, err);
        if (!rc) {
            rc = tr_sft_add(d, chat, msgs, n, max_len, policy, r.line, err);
            if (rc) tr_err_wrap(err, "%s:%lld", path, (long long)r.line);
            free(msgs);
        }
        tr_json_free(&doc);
        if (rc) break;
    }
    tr_jsonl_close(&r);
    if (rc) tr_sft_free(d);
    return rc;
}

// ---- packing ----

void tr_sft_packing_free(tr_sft_packing *p) {
    free(p->row_off);
    free(p->items);
    memset(p, 0, sizeof *p);
}

#define TR_SFT_OPEN_ROWS 64

int tr_sft_pack(tr_sft_packing *p, const tr_sft_dataset *d, int32_t row_len, bool pack,
                uint64_t seed, tr_err *err) {
    memset(p, 0, sizeof *p);
    if (row_len < 2) return tr_errf(err, TR_EINVAL, "packing: row length %d", row_len);
    p->row_len = row_len;
    int64_t n = d->n;
    int64_t *order = malloc((size_t)(n ? n : 1) * sizeof *order);
    int64_t *row_of = malloc((size_t)(n ? n : 1) * sizeof *row_of);
    int32_t *fill = malloc((size_t)(n ? n : 1) * sizeof *fill);
    p->row_off = calloc((size_t)n + 1, sizeof *p->row_off);
    p->items = malloc((size_t)(n ? n : 1) * sizeof *p->items);
    int rc = 0;
    if (!order || !row_of || !fill || !p->row_off || !p->items) {
        rc = tr_errf(err, TR_ENOMEM, "packing: out of memory for %" PRId64 " samples", n);
        goto done;
    }
    for (int64_t i = 0; i < n; i++) order[i] = i;
    tr_shuffle_i64(order, n, seed);
    // First fit among the last TR_SFT_OPEN_ROWS rows; rows before them are closed for good.
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t s = order[k], len = d->off[s + 1] - d->off[s], r = -1;
        if (len > row_len) {
            rc = tr_errf(err, TR_EINVAL, "packing: sample from line %" PRId64 " has %" PRId64
                         " tokens, more than the row length %d", d->line[s], len, row_len);
            goto done;
        }
        if (pack)
            for (int64_t q = rows > TR_SFT_OPEN_ROWS ? rows - TR_SFT_OPEN_ROWS : 0; q < rows && r < 0; q++)
                if (fill[q] + len <= row_len) r = q;
        if (r < 0) {
            r = rows++;
            fill[r] = 0;
        }
        fill[r] += (int32_t)len;
        row_of[k] = r;
    }
    // Group items by row, keeping the shuffled order inside each row.
    for (int64_t k = 0; k < n; k++) p->row_off[row_of[k] + 1]++;
    for (int64_t r = 0; r < rows; r++) p->row_off[r + 1] += p->row_off[r];
    for (int64_t r = 0; r < rows; r++) fill[r] = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t r = row_of[k];
        p->items[p->row_off[r] + fill[r]++] = order[k];
    }
    p->n_rows = rows;
done:
    free(order);
    free(row_of);
    free(fill);
    if (rc) tr_sft_packing_free(p);
    return rc;
}

int tr_sft_row_init(tr_sft_row *r, int32_t row_len, tr_err *err) {
    memset(r, 0, sizeof *r);
    r->ids = malloc((size_t)row_len * sizeof *r->ids);
    r->targets = malloc((size_t)row_len * sizeof *r->targets);
    r->pos = malloc((size_t)row_len * sizeof *r->pos);
    r->doc_start = malloc(((size_t)row_len + 2) * sizeof *r->doc_start);
    if (!r->ids || !r->targets || !r->pos || !r->doc_start) {
        tr_sft_row_free(r);
        return tr_errf(err, TR_ENOMEM, "out of memory for a row of %d tokens", row_len);
    }
    return 0;
}

void tr_sft_row_free(tr_sft_row *r) {
    free(r->ids);
    free(r->targets);
    free(r->pos);
    free(r->doc_start);
    memset(r, 0, sizeof *r);
}

int tr_sft_row_fill(const tr_sft_dataset *d, const tr_sft_packing *p, int64_t row, int32_t pad_id,
                    tr_sft_row *r, tr_err *err) {
    if (row < 0 || row >= p->n_rows)
        return tr_errf(err, TR_ERANGE, "packing: row %" PRId64 " of %" PRId64, row, p->n_rows);
    int32_t t = 0, nd = 0;
    r->doc_start[0] = 0;
    for (int64_t k = p->row_off[row]; k < p->row_off[row + 1]; k++) {
        int64_t s = p->items[k], a = d->off[s], len = d->off[s + 1] - a;
        for (int64_t i = 0; i < len; i++, t++) {
            r->ids[t] = d->ids[a + i];
            r->pos[t] = (int32_t)i;
            r->targets[t] = (i + 1 < len && d->mask[a + i + 1]) ? d->ids[a + i + 1] : -1;
        }
        r->doc_start[++nd] = t;
    }
    r->n_real = t;
    if (t < p->row_len) {
        for (int32_t i = 0; t < p->row_len; t++, i++) {
            r->ids[t] = pad_id;
            r->pos[t] = i;
            r->targets[t] = -1;
        }
        r->doc_start[++nd] = t;
    }
    r->n_docs = nd;
    return 0;
}
