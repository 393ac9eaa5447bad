// Encoding and checked decoding of rollout batches. Decoding validates every length before
// touching the token arrays, so a peer's lying lengths cannot make us read past a tensor.
#include "roles/rollout_wire.h"

#include <stdlib.h>
#include <string.h>

static void put_i32(tr_msg_writer *w, const char *key, const int32_t *x, int64_t n) {
    tr_msg_put_tensor(w, key, TR_DTYPE_I32, 1, &n, x);
}

static void put_texts(tr_msg_writer *w, const char *key, char *const *t, int32_t first, int32_t count,
                      bool nil_ok) {
    tr_msg_put_array(w, key, (uint32_t)count);
    for (int32_t i = first; i < first + count; i++) {
        const char *s = t ? t[i] : NULL;
        if (s)
            tr_msg_put_str(w, NULL, s);
        else if (nil_ok)
            tr_msg_put_nil(w, NULL);
        else
            tr_msg_put_str(w, NULL, "{}");
    }
}

void tr_rollouts_put(tr_msg_writer *w, const char *key, const tr_rollouts *r, int32_t first,
                     int32_t count, unsigned parts) {
    uint32_t n_keys = 4 + ((parts & TR_RO_IDS) ? 3 : 0) + ((parts & TR_RO_LOGPROBS) ? 1 : 0) +
                      ((parts & TR_RO_TEXT) ? 3 : 0) + ((parts & TR_RO_VERSION) ? 1 : 0);
    int64_t t0 = count ? r->offset[first] : 0, t1 = count ? r->offset[first + count] : 0;
    int64_t nt = t1 - t0, ns = count;
    tr_msg_put_map(w, key, n_keys);
    tr_msg_put_int(w, "n", count);
    put_i32(w, "prompt_len", count ? r->prompt_len + first : NULL, ns);
    put_i32(w, "response_len", count ? r->response_len + first : NULL, ns);
    put_i32(w, "tokens", nt ? r->tokens + t0 : NULL, nt);
    if (parts & TR_RO_IDS) {
        put_i32(w, "group", count ? r->group + first : NULL, ns);
        put_i32(w, "sample", count ? r->sample + first : NULL, ns);
        tr_msg_put_tensor(w, "finish", TR_DTYPE_U8, 1, &ns, count ? r->finish + first : NULL);
    }
    if (parts & TR_RO_LOGPROBS)
        tr_msg_put_tensor(w, "gen_logprobs", TR_DTYPE_F32, 1, &nt, nt ? r->gen_logprobs + t0 : NULL);
    if (parts & TR_RO_TEXT) {
        put_texts(w, "prompt_text", r->prompt_text, first, count, true);
        put_texts(w, "response_text", r->response_text, first, count, true);
        put_texts(w, "meta", r->meta, first, count, false);
    }
    if (parts & TR_RO_VERSION)
        tr_msg_put_tensor(w, "version", TR_DTYPE_I64, 1, &ns, count ? r->version + first : NULL);
}

void tr_token_floats_put(tr_msg_writer *w, const char *key, const tr_rollouts *r, int32_t first,
                         int32_t count, const float *x) {
    int64_t t0 = count ? r->offset[first] : 0, nt = count ? r->offset[first + count] - t0 : 0;
    tr_msg_put_tensor(w, key, TR_DTYPE_F32, 1, &nt, nt ? x + t0 : NULL);
}

// A tensor of dtype with exactly n elements under key.
static int get_vec(const tr_msg_map *m, const char *key, int dtype, int64_t n, void *out, tr_err *err) {
    tr_tensor_view t;
    if (tr_msg_get_tensor(m, key, &t, err)) return -1;
    if (t.ndim != 1 || t.numel != n)
        return tr_errf(err, TR_EINVAL, "%s: %s.%s: expected %lld elements, got %lld", m->op, m->path, key,
                       (long long)n, (long long)t.numel);
    return tr_tensor_view_copy(&t, dtype, out, (size_t)n * tr_dtype_size(dtype), key, err);
}

int tr_token_floats_get(const tr_msg_map *m, const char *key, int64_t n, float *out, tr_err *err) {
    return get_vec(m, key, TR_DTYPE_F32, n, out, err);
}

// Element i of a text array: a malloc'd NUL-terminated copy, or NULL for nil.
static int text_at(const tr_msg_array *a, uint32_t i, bool nil_ok, char **out, tr_err *err) {
    *out = NULL;
    const msgpack_object *o = &a->obj->via.array.ptr[i];
    if (nil_ok && o->type == MSGPACK_OBJECT_NIL) return 0;
    tr_msg_str s;
    if (tr_msg_array_str(a, i, &s, err)) return -1;
    if (memchr(s.ptr, '\0', s.len))
        return tr_errf(err, TR_EINVAL, "%s: %s[%u]: text holds a NUL byte", a->op, a->path, i);
    if (!(*out = strndup(s.ptr, s.len))) return tr_errf(err, TR_ENOMEM, "out of memory for rollout texts");
    return 0;
}

static int get_texts(const tr_msg_map *m, const char *key, int32_t n, tr_msg_array *a, tr_err *err) {
    if (tr_msg_get_array(m, key, a, err)) return -1;
    if (a->n != (uint32_t)n)
        return tr_errf(err, TR_EINVAL, "%s: %s.%s: %u entries for %d sequences", m->op, m->path, key, a->n, n);
    return 0;
}

int tr_rollouts_get(const tr_msg_map *m, const char *key, int64_t max_seq_len, tr_rollouts *out,
                    tr_err *err) {
    tr_msg_map rm;
    int64_t n;
    if (tr_msg_get_map(m, key, &rm, err) || tr_msg_get_int(&rm, "n", &n, err)) return -1;
    if (n < 0 || n > INT32_MAX - 1 - (int64_t)out->n)
        return tr_errf(err, TR_ERANGE, "%s: %s.n: %lld sequences is out of range", rm.op, rm.path, (long long)n);
    static const char *const keys[] = {"n", "prompt_len", "response_len", "tokens", "group", "sample", "finish",
                                       "gen_logprobs", "prompt_text", "response_text", "meta", "version", NULL};
    if (tr_msg_check_keys(&rm, keys, err)) return -1;
    size_t ns = (size_t)n ? (size_t)n : 1;
    int32_t *plen = malloc(ns * sizeof *plen), *rlen = malloc(ns * sizeof *rlen);
    int32_t *group = calloc(ns, sizeof *group), *sample = calloc(ns, sizeof *sample);
    uint8_t *finish = calloc(ns, 1);
    int64_t *version = malloc(ns * sizeof *version);
    int32_t *tokens = NULL;
    float *lp = NULL;
    int rc = -1;
    if (!plen || !rlen || !group || !sample || !finish || !version) {
        tr_errf(err, TR_ENOMEM, "out of memory for %lld rollouts", (long long)n);
        goto done;
    }
    if (get_vec(&rm, "prompt_len", TR_DTYPE_I32, n, plen, err) ||
        get_vec(&rm, "response_len", TR_DTYPE_I32, n, rlen, err))
        goto done;
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = (int64_t)plen[i] + rlen[i];
        if (plen[i] < 0 || rlen[i] < 0 || len < 1 || (max_seq_len > 0 && len > max_seq_len)) {
            tr_errf(err, TR_EINVAL, "%s: %s: sequence %lld has prompt %d + response %d tokens (need >= 1%s%lld)",
                    rm.op, rm.path, (long long)i, plen[i], rlen[i], max_seq_len > 0 ? ", at most " : "",
                    (long long)(max_seq_len > 0 ? max_seq_len : 0));
            goto done;
        }
        total += len;
    }
    tokens = malloc((size_t)(total ? total : 1) * sizeof *tokens);
    lp = calloc((size_t)(total ? total : 1), sizeof *lp);
    if (!tokens || !lp) {
        tr_errf(err, TR_ENOMEM, "out of memory for %lld rollout tokens", (long long)total);
        goto done;
    }
    if (get_vec(&rm, "tokens", TR_DTYPE_I32, total, tokens, err)) goto done;
    bool has_ids = tr_msg_has(&rm, "group") || tr_msg_has(&rm, "sample") || tr_msg_has(&rm, "finish");
    if (has_ids && (get_vec(&rm, "group", TR_DTYPE_I32, n, group, err) ||
                    get_vec(&rm, "sample", TR_DTYPE_I32, n, sample, err) ||
                    get_vec(&rm, "finish", TR_DTYPE_U8, n, finish, err)))
        goto done;
    for (int64_t i = 0; i < n; i++) version[i] = -1;
    if (tr_msg_has(&rm, "version") && get_vec(&rm, "version", TR_DTYPE_I64, n, version, err)) goto done;
    bool has_lp = tr_msg_has(&rm, "gen_logprobs");
    if (has_lp && get_vec(&rm, "gen_logprobs", TR_DTYPE_F32, total, lp, err)) goto done;
    bool has_text = tr_msg_has(&rm, "prompt_text") || tr_msg_has(&rm, "response_text") || tr_msg_has(&rm, "meta");
    tr_msg_array pt, rt, mt;
    if (has_text && (get_texts(&rm, "prompt_text", (int32_t)n, &pt, err) ||
                     get_texts(&rm, "response_text", (int32_t)n, &rt, err) ||
                     get_texts(&rm, "meta", (int32_t)n, &mt, err)))
        goto done;
    int64_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        if (version[i] < -1) {
            tr_errf(err, TR_EINVAL, "%s: %s.version[%lld]: %lld is not a weight version (-1: unknown)", rm.op,
                    rm.path, (long long)i, (long long)version[i]);
            goto done;
        }
        if (finish[i] > TR_FINISH_LENGTH) {
            tr_errf(err, TR_EINVAL, "%s: %s.finish[%lld]: %u is not a finish reason", rm.op, rm.path,
                    (long long)i, finish[i]);
            goto done;
        }
        char *p = NULL, *r = NULL, *me = NULL;
        int trc = 0;
        if (has_text)
            trc = text_at(&pt, (uint32_t)i, true, &p, err) || text_at(&rt, (uint32_t)i, true, &r, err) ||
                  text_at(&mt, (uint32_t)i, false, &me, err);
        if (!trc)
            trc = tr_rollouts_append(out, group[i], sample[i], tokens + o, plen[i], tokens + o + plen[i],
                                     lp + o + plen[i], rlen[i], (enum tr_finish)finish[i], p, r, me, err);
        free(p);
        free(r);
        free(me);
        if (trc) goto done;
        out->version[out->n - 1] = version[i];
        o += (int64_t)plen[i] + rlen[i];
    }
    rc = 0;
done:
    free(plen);
    free(rlen);
    free(group);
    free(sample);
    free(finish);
    free(version);
    free(tokens);
    free(lp);
    return rc;
}
