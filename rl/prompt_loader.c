// Prompt loader: encode once, epoch-shuffled draws, batches in generate's layout.
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/shuffle.h"
#include "engine/rng.h"
#include "rl/prompt_loader.h"

int tr_prompt_loader_init(tr_prompt_loader *l, const char *path, const tr_chat_format *chat,
                          const tr_tokenizer *tok, int32_t max_prompt_len, bool shuffle,
                          uint64_t seed, tr_err *err) {
    memset(l, 0, sizeof *l);
    l->shuffle = shuffle;
    l->seed = seed;
    l->perm_epoch = -1;
    if (tr_prompts_load(&l->set, path, err)) return -1;
    int64_t n = l->set.n;
    l->item = malloc((size_t)(n > 0 ? n : 1) * sizeof *l->item);
    l->off = malloc((size_t)(n + 1) * sizeof *l->off);
    l->perm = malloc((size_t)(n > 0 ? n : 1) * sizeof *l->perm);
    if (!l->item || !l->off || !l->perm) {
        tr_prompt_loader_free(l);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory", path);
    }
    int64_t cap = 0;
    l->off[0] = 0;
    tr_chat_tokens t = {0};
    for (int64_t i = 0; i < n; i++) {
        t.n = 0;
        if (tr_prompts_encode(&l->set, i, chat, tok, &t, err)) {
            tr_chat_tokens_free(&t);
            tr_prompt_loader_free(l);
            return tr_err_wrap(err, "%s:%" PRId64, path, l->set.items[i].line);
        }
        if (t.n == 0 || t.n > (size_t)max_prompt_len) {
            l->n_skipped++;
            continue;
        }
        int64_t need = l->off[l->n] + (int64_t)t.n;
        if (need > cap) {
            int64_t c = cap ? cap * 2 : 4096;
            while (c < need) c *= 2;
            int32_t *g = realloc(l->ids, (size_t)c * sizeof *g);
            if (!g) {
                tr_chat_tokens_free(&t);
                tr_prompt_loader_free(l);
                return tr_errf(err, TR_ENOMEM, "%s: out of memory", path);
            }
            l->ids = g;
            cap = c;
        }
        memcpy(l->ids + l->off[l->n], t.ids, t.n * sizeof(int32_t));
        l->item[l->n] = i;
        l->off[l->n + 1] = need;
        if ((int32_t)t.n > l->max_len) l->max_len = (int32_t)t.n;
        l->n++;
    }
    tr_chat_tokens_free(&t);
    if (l->n == 0) {
        int64_t skipped = l->n_skipped;
        tr_prompt_loader_free(l);
        return tr_errf(err, TR_EINVAL, "%s: no usable prompt (%" PRId64 " longer than "
                       "data.max_prompt_len = %d tokens)", path, skipped, max_prompt_len);
    }
    return 0;
}

void tr_prompt_loader_free(tr_prompt_loader *l) {
    tr_prompts_free(&l->set);
    free(l->item);
    free(l->off);
    free(l->ids);
    free(l->perm);
    memset(l, 0, sizeof *l);
}

int64_t tr_prompt_loader_index(tr_prompt_loader *l, int64_t k) {
    int64_t epoch = k / l->n, j = k % l->n;
    if (!l->shuffle) return j;
    if (epoch != l->perm_epoch) {
        for (int64_t i = 0; i < l->n; i++) l->perm[i] = i;
        tr_shuffle_i64(l->perm, l->n, tr_rng_derive(l->seed, (uint64_t)epoch));
        l->perm_epoch = epoch;
    }
    return l->perm[j];
}

int tr_prompt_loader_draw(tr_prompt_loader *l, int64_t k, int32_t count, tr_prompt_draw *d,
                          tr_err *err) {
    if (count > d->cap) {
        int32_t *g = realloc(d->group, (size_t)count * sizeof *g);
        if (g) d->group = g;
        int64_t *o = realloc(d->offset, (size_t)(count + 1) * sizeof *o);
        if (o) d->offset = o;
        char **t = realloc(d->text, (size_t)count * sizeof *t);
        if (t) d->text = t;
        char **m = realloc(d->meta, (size_t)count * sizeof *m);
        if (m) d->meta = m;
        if (!g || !o || !t || !m) return tr_errf(err, TR_ENOMEM, "prompt batch: out of memory");
        d->cap = count;
    }
    int64_t need = (int64_t)count * l->max_len;
    if (need > d->cap_ids) {
        int32_t *g = realloc(d->ids, (size_t)(need > 0 ? need : 1) * sizeof *g);
        if (!g) return tr_errf(err, TR_ENOMEM, "prompt batch: out of memory");
        d->ids = g;
        d->cap_ids = need;
    }
    d->offset[0] = 0;
    for (int32_t i = 0; i < count; i++) {
        int64_t p = tr_prompt_loader_index(l, k + i);
        int64_t len = l->off[p + 1] - l->off[p];
        memcpy(d->ids + d->offset[i], l->ids + l->off[p], (size_t)len * sizeof(int32_t));
        d->offset[i + 1] = d->offset[i] + len;
        d->group[i] = i;
        const tr_prompt *pr = &l->set.items[l->item[p]];
        d->text[i] = pr->text;
        d->meta[i] = pr->meta;
    }
    d->batch = (tr_prompt_batch){count, d->ids, d->offset, d->group, d->text, d->meta};
    return 0;
}

void tr_prompt_draw_free(tr_prompt_draw *d) {
    free(d->ids);
    free(d->offset);
    free(d->group);
    free(d->text);
    free(d->meta);
    memset(d, 0, sizeof *d);
}
