// Rollout batches: growth of the flat buffers (sequence arrays and token arrays grow
// independently, by doubling, so appending n sequences costs O(n) copies in all) and the
// response mask.
#include "roles/rollout.h"

#include <stdlib.h>
#include <string.h>

void tr_rollouts_init(tr_rollouts *r) {
    memset(r, 0, sizeof *r);
}

static void free_texts(char **t, int32_t n) {
    if (!t) return;
    for (int32_t i = 0; i < n; i++) free(t[i]);
}

void tr_rollouts_free(tr_rollouts *r) {
    free_texts(r->prompt_text, r->n);
    free_texts(r->response_text, r->n);
    free_texts(r->meta, r->n);
    free(r->group);
    free(r->sample);
    free(r->prompt_len);
    free(r->response_len);
    free(r->finish);
    free(r->offset);
    free(r->tokens);
    free(r->gen_logprobs);
    free(r->prompt_text);
    free(r->response_text);
    free(r->meta);
    free(r->version);
    memset(r, 0, sizeof *r);
}

void tr_rollouts_clear(tr_rollouts *r) {
    free_texts(r->prompt_text, r->n);
    free_texts(r->response_text, r->n);
    free_texts(r->meta, r->n);
    r->n = 0;
    r->n_tokens = 0;
    if (r->offset) r->offset[0] = 0;
}

static int grow(void **p, size_t elem, size_t cap) {
    void *q = realloc(*p, elem * cap);
    if (!q) return -1;
    *p = q;
    return 0;
}

static int reserve_seqs(tr_rollouts *r, int32_t need, tr_err *err) {
    if (need <= r->cap_seqs) return 0;
    int64_t cap = r->cap_seqs ? (int64_t)r->cap_seqs * 2 : 16;
    while (cap < need) cap *= 2;
    if (cap > INT32_MAX - 1) cap = INT32_MAX - 1;
    size_t c = (size_t)cap;
    if (grow((void **)&r->group, sizeof(int32_t), c) || grow((void **)&r->sample, sizeof(int32_t), c) ||
        grow((void **)&r->prompt_len, sizeof(int32_t), c) ||
        grow((void **)&r->response_len, sizeof(int32_t), c) || grow((void **)&r->finish, 1, c) ||
        grow((void **)&r->offset, sizeof(int64_t), c + 1) ||
        grow((void **)&r->prompt_text, sizeof(char *), c) ||
        grow((void **)&r->response_text, sizeof(char *), c) || grow((void **)&r->meta, sizeof(char *), c) ||
        grow((void **)&r->version, sizeof(int64_t), c))
        return tr_errf(err, TR_ENOMEM, "rollouts: out of memory for %lld sequences", (long long)cap);
    if (r->cap_seqs == 0) r->offset[0] = 0;
    r->cap_seqs = (int32_t)cap;
    return 0;
}

static int reserve_tokens(tr_rollouts *r, int64_t need, tr_err *err) {
    if (need <= r->cap_tokens) return 0;
    int64_t cap = r->cap_tokens ? r->cap_tokens * 2 : 1024;
    while (cap < need) cap *= 2;
    if (grow((void **)&r->tokens, sizeof(int32_t), (size_t)cap) ||
        grow((void **)&r->gen_logprobs, sizeof(float), (size_t)cap))
        return tr_errf(err, TR_ENOMEM, "rollouts: out of memory for %lld tokens", (long long)cap);
    r->cap_tokens = cap;
    return 0;
}

static int dup_text(const char *s, char **out) {
    *out = NULL;
    if (!s) return 0;
    *out = strdup(s);
    return *out ? 0 : -1;
}

int tr_rollouts_append(tr_rollouts *r, int32_t group, int32_t sample, const int32_t *prompt,
                       int32_t prompt_len, const int32_t *response, const float *gen_lp,
                       int32_t response_len, enum tr_finish finish, const char *prompt_text,
                       const char *response_text, const char *meta, tr_err *err) {
    if (prompt_len < 0 || response_len < 0 || (prompt_len > 0 && !prompt) ||
        (response_len > 0 && !response))
        return tr_errf(err, TR_EINVAL, "rollouts: sequence %d: bad lengths (prompt %d, response %d)",
                       r->n, prompt_len, response_len);
    if (r->n >= INT32_MAX - 1)
        return tr_errf(err, TR_ERANGE, "rollouts: too many sequences");
    int64_t len = (int64_t)prompt_len + response_len;
    if (reserve_seqs(r, r->n + 1, err) || reserve_tokens(r, r->n_tokens + len, err)) return -1;
    char *pt = NULL, *rt = NULL, *mt = NULL;
    if (dup_text(prompt_text, &pt) || dup_text(response_text, &rt) || dup_text(meta ? meta : "{}", &mt)) {
        free(pt);
        free(rt);
        free(mt);
        return tr_errf(err, TR_ENOMEM, "rollouts: out of memory for the texts of sequence %d", r->n);
    }
    int32_t i = r->n;
    int64_t o = r->n_tokens;
    r->group[i] = group;
    r->sample[i] = sample;
    r->prompt_len[i] = prompt_len;
    r->response_len[i] = response_len;
    r->finish[i] = (uint8_t)finish;
    if (prompt_len) memcpy(r->tokens + o, prompt, (size_t)prompt_len * sizeof(int32_t));
    if (response_len) memcpy(r->tokens + o + prompt_len, response, (size_t)response_len * sizeof(int32_t));
    memset(r->gen_logprobs + o, 0, (size_t)prompt_len * sizeof(float));
    if (gen_lp)
        memcpy(r->gen_logprobs + o + prompt_len, gen_lp, (size_t)response_len * sizeof(float));
    else
        memset(r->gen_logprobs + o + prompt_len, 0, (size_t)response_len * sizeof(float));
    r->prompt_text[i] = pt;
    r->response_text[i] = rt;
    r->meta[i] = mt;
    r->version[i] = -1;
    r->n_tokens = o + len;
    r->offset[i + 1] = r->n_tokens;
    r->n++;
    return 0;
}

void tr_rollouts_response_mask(const tr_rollouts *r, uint8_t *mask) {
    for (int32_t i = 0; i < r->n; i++) {
        int64_t o = r->offset[i];
        memset(mask + o, 0, (size_t)r->prompt_len[i]);
        memset(mask + o + r->prompt_len[i], 1, (size_t)r->response_len[i]);
    }
}
