// The train calls (policy.train, policy.train_sft, critic.train): the batch is cut into each
// data-parallel rank's share, balanced by tokens, before anything is sent. RL: every
// mini-batch (a contiguous part of the sequences, the same whatever the DP size) is split
// among the ranks, so each rank takes the same optimizer steps on its share of each; SFT:
// the rows are. Every rank of a tensor-parallel group gets its data-parallel rank's share.
#include <stdlib.h>
#include <string.h>

#include "roles/client.h"
#include "roles/client_impl.h"
#include "roles/rollout_wire.h"

void tr_split_tokens(const int64_t *cum, int64_t n, int32_t parts, int64_t *bounds) {
    bounds[0] = 0;
    for (int32_t k = 1; k < parts; k++) {
        double target = (double)cum[n] * k / parts;
        int64_t i = bounds[k - 1];
        while (i < n && (double)cum[i + 1] <= target) i++;
        if (i < n && (double)cum[i + 1] - target < target - (double)cum[i]) i++;
        bounds[k] = i;
    }
    bounds[parts] = n;
}

typedef struct train_ctx {
    const tr_train_batch *b;
    const tr_sft_batch *sft;
    bool critic;
    tr_train_metrics *out;
    int32_t dp, tp, M;
    int64_t *rows;       // SFT: [dp + 1] row bounds
    tr_rollouts *sub;    // RL: [dp] each rank's sequences, mini-batch after mini-batch
    float **tok;         // RL: [dp * 3] per-token arrays of sub (advantages or returns, old, ref)
    int32_t *mb_seqs;    // RL: [dp * M] each rank's sequences per mini-batch
} train_ctx;

static void train_ctx_free(train_ctx *c) {
    for (int32_t d = 0; c->sub && d < c->dp; d++) tr_rollouts_free(&c->sub[d]);
    for (int32_t k = 0; c->tok && k < 3 * c->dp; k++) free(c->tok[k]);
    free(c->rows);
    free(c->sub);
    free(c->tok);
    free(c->mb_seqs);
}

// Appends sequence i of r (and its per-token values) to rank d's share.
static int take_seq(train_ctx *c, int32_t d, const tr_rollouts *r, int32_t i, const float *const src[3],
                    int64_t *filled, tr_err *err) {
    tr_rollouts *s = &c->sub[d];
    int64_t o = r->offset[i], len = r->offset[i + 1] - o;
    if (tr_rollouts_append(s, r->group[i], r->sample[i], r->tokens + o, r->prompt_len[i], r->tokens + o + r->prompt_len[i],
                           NULL, r->response_len[i], (enum tr_finish)r->finish[i], NULL, NULL, NULL, err))
        return -1;
    s->version[s->n - 1] = r->version[i];
    for (int k = 0; k < 3; k++)
        if (src[k]) memcpy(c->tok[3 * d + k] + *filled, src[k] + o, (size_t)len * sizeof(float));
    *filled += len;
    return 0;
}

// Each rank's share of every mini-batch, the mini-batches being the min(mini_batches, n)
// near-equal contiguous parts of the sequences.
static int split_rl(train_ctx *c, int32_t mini_batches, tr_err *err) {
    const tr_rollouts *r = c->b->r;
    const tr_train_batch *b = c->b;
    const float *src[3] = {c->critic ? b->returns : b->advantages, c->critic ? b->old_values : b->old_logprobs,
                           c->critic ? NULL : b->ref_logprobs};
    c->M = mini_batches < r->n ? mini_batches : r->n;
    if (c->M < 1) return tr_errf(err, TR_EINVAL, "train: no sequences");
    c->sub = calloc((size_t)c->dp, sizeof *c->sub);
    c->tok = calloc((size_t)c->dp * 3, sizeof *c->tok);
    c->mb_seqs = calloc((size_t)c->dp * (size_t)c->M, sizeof *c->mb_seqs);
    int64_t *cum = malloc(((size_t)r->n + 1) * sizeof *cum), *bounds = malloc(((size_t)c->dp + 1) * sizeof *bounds);
    int64_t *filled = calloc((size_t)c->dp, sizeof *filled);
    int rc = !c->sub || !c->tok || !c->mb_seqs || !cum || !bounds || !filled ? -1 : 0;
    for (int32_t d = 0; d < c->dp && !rc; d++) {
        tr_rollouts_init(&c->sub[d]);
        for (int k = 0; k < 3 && !rc; k++)
            if (src[k] && !(c->tok[3 * d + k] = malloc((size_t)(r->n_tokens ? r->n_tokens : 1) * sizeof(float)))) rc = -1;
    }
    if (rc) rc = tr_errf(err, TR_ENOMEM, "train: out of memory for the data-parallel shares");
    for (int32_t m = 0; m < c->M && !rc; m++) {
        int32_t s0 = (int32_t)((int64_t)r->n * m / c->M), s1 = (int32_t)((int64_t)r->n * (m + 1) / c->M);
        cum[0] = 0;
        for (int32_t i = s0; i < s1; i++) cum[i - s0 + 1] = cum[i - s0] + (r->offset[i + 1] - r->offset[i]);
        tr_split_tokens(cum, s1 - s0, c->dp, bounds);
        for (int32_t d = 0; d < c->dp && !rc; d++) {
            c->mb_seqs[(size_t)d * c->M + m] = (int32_t)(bounds[d + 1] - bounds[d]);
            for (int64_t i = s0 + bounds[d]; i < s0 + bounds[d + 1] && !rc; i++)
                rc = take_seq(c, d, r, (int32_t)i, src, &filled[d], err);
        }
    }
    free(cum);
    free(bounds);
    free(filled);
    return rc;
}

static int split_sft(train_ctx *c, tr_err *err) {
    const tr_sft_batch *s = c->sft;
    int64_t *cum = malloc(((size_t)s->n_rows + 1) * sizeof *cum);
    c->rows = malloc(((size_t)c->dp + 1) * sizeof *c->rows);
    if (!cum || !c->rows) {
        free(cum);
        return tr_errf(err, TR_ENOMEM, "train_sft: out of memory");
    }
    // Every row is computed whole, padding included: its cost is row_len tokens.
    for (int32_t i = 0; i <= s->n_rows; i++) cum[i] = (int64_t)i * s->row_len;
    tr_split_tokens(cum, s->n_rows, c->dp, c->rows);
    free(cum);
    return 0;
}

static void build_sft(const train_ctx *c, int32_t d, tr_msg_writer *w, const char *op, uint64_t id) {
    const tr_sft_batch *s = c->sft;
    int64_t r0 = c->rows[d], r1 = c->rows[d + 1], nd = 0, d0 = 0;
    for (int64_t i = 0; i < r0; i++) d0 += (int64_t)s->n_docs[i] + 1;
    for (int64_t i = r0; i < r1; i++) nd += (int64_t)s->n_docs[i] + 1;
    int64_t nt = (r1 - r0) * s->row_len, nr = r1 - r0;
    tr_msg_begin_request(w, op, id, 6);
    tr_msg_put_int(w, "n_rows", nr);
    tr_msg_put_int(w, "row_len", s->row_len);
    tr_msg_put_tensor(w, "ids", TR_DTYPE_I32, 1, &nt, nt ? s->ids + r0 * s->row_len : NULL);
    tr_msg_put_tensor(w, "targets", TR_DTYPE_I32, 1, &nt, nt ? s->targets + r0 * s->row_len : NULL);
    tr_msg_put_tensor(w, "doc_start", TR_DTYPE_I32, 1, &nd, nd ? s->doc_start + d0 : NULL);
    tr_msg_put_tensor(w, "n_docs", TR_DTYPE_I32, 1, &nr, nr ? s->n_docs + r0 : NULL);
}

static void build_train(void *ctx, int32_t rank, int32_t ranks, tr_msg_writer *w, const char *op, uint64_t id) {
    (void)ranks;
    const train_ctx *c = ctx;
    int32_t d = rank / c->tp;
    if (c->sft) {
        build_sft(c, d, w, op, id);
        return;
    }
    const tr_rollouts *r = &c->sub[d];
    float *const *t = c->tok + 3 * d;
    int64_t M = c->M;
    bool lag = !c->critic && c->b->weight_lag >= 0;
    tr_msg_begin_request(w, op, id, (t[2] ? 5 : 4) + (lag ? 1 : 0));
    tr_rollouts_put(w, "rollouts", r, 0, r->n, lag ? TR_RO_VERSION : 0);
    if (lag) tr_msg_put_int(w, "weight_lag", c->b->weight_lag);
    tr_token_floats_put(w, c->critic ? "returns" : "advantages", r, 0, r->n, t[0]);
    tr_token_floats_put(w, c->critic ? "old_values" : "old_logprobs", r, 0, r->n, t[1]);
    if (t[2]) tr_token_floats_put(w, "ref_logprobs", r, 0, r->n, t[2]);
    tr_msg_put_tensor(w, "mini_batch_seqs", TR_DTYPE_I32, 1, &M, c->mb_seqs + (size_t)d * c->M);
}

int tr_train_metrics_get(const tr_msg_map *res, tr_train_metrics *m, tr_err *err) {
    memset(m, 0, sizeof *m);
    struct {
        const char *key;
        double *v;
    } f[] = {{"loss", &m->loss},
             {"pg_loss", &m->pg_loss},
             {"clip_frac", &m->clip_frac},
             {"clip_frac_low", &m->clip_frac_low},
             {"clip_frac_high", &m->clip_frac_high},
             {"dual_clip_frac", &m->dual_clip_frac},
             {"approx_kl", &m->approx_kl},
             {"kl", &m->kl},
             {"entropy", &m->entropy},
             {"ratio_mean", &m->ratio_mean},
             {"grad_norm", &m->grad_norm},
             {"lr", &m->lr},
             {"value_loss", &m->value_loss},
             {"value_clip_frac", &m->value_clip_frac},
             {"value_mean", &m->value_mean},
             {"flops", &m->flops}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (tr_msg_get_float_opt(res, f[i].key, f[i].v, err)) return -1;
    if (tr_msg_get_int_opt(res, "tokens", &m->tokens, err) || tr_msg_get_int_opt(res, "steps", &m->steps, err) ||
        tr_msg_get_int_opt(res, "step", &m->step, err))
        return -1;
    return 0;
}

static int reply_train(void *ctx, int32_t rank, const tr_msg_map *res, tr_err *err) {
    train_ctx *c = ctx;
    tr_msg_map m;
    if (tr_msg_get_map(res, "metrics", &m, err)) return -1;
    // Every rank reports the metrics of the whole batch; rank 0's are kept.
    if (rank != 0 || !c->out) return 0;
    return tr_train_metrics_get(&m, c->out, err);
}

static int train_call(tr_group *g, const char *op, train_ctx *c, tr_err *err) {
    c->tp = g->tp > 0 ? g->tp : 1;
    c->dp = g->world / c->tp;
    int rc = c->sft ? split_sft(c, err) : split_rl(c, g->mini_batches, err);
    if (!rc) {
        tr_call call = {.op = op, .build = build_train, .reply = reply_train, .ctx = c};
        rc = tr_group_call(g, &call, err);
    } else {
        tr_err_wrap(err, "%s.%s", g->role, op);
    }
    train_ctx_free(c);
    return rc;
}

int tr_policy_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err) {
    if (!b->advantages || !b->old_logprobs)
        return tr_errf(err, TR_EINVAL, "%s.train: advantages and old_logprobs are required", g->role);
    train_ctx c = {.b = b, .out = out};
    return train_call(g, "train", &c, err);
}

int tr_policy_train_sft(tr_group *g, const tr_sft_batch *b, tr_train_metrics *out, tr_err *err) {
    if (b->n_rows < 1 || b->row_len < 1)
        return tr_errf(err, TR_EINVAL, "%s.train_sft: %d rows of %d tokens", g->role, b->n_rows, b->row_len);
    train_ctx c = {.sft = b, .out = out};
    return train_call(g, "train_sft", &c, err);
}

int tr_critic_train(tr_group *g, const tr_train_batch *b, tr_train_metrics *out, tr_err *err) {
    if (!b->returns || !b->old_values)
        return tr_errf(err, TR_EINVAL, "%s.train: returns and old_values are required", g->role);
    train_ctx c = {.b = b, .critic = true, .out = out};
    return train_call(g, "train", &c, err);
}
