// The train ops. RL (policy and critic): ppo_epochs passes over the rollouts, each split
// into mini_batches optimizer steps; a mini-batch runs as micro-batches of whole sequences
// (separate documents), and for each micro-batch the engine's loss (engine/loss.h) turns the
// head outputs into dL/dlogprob or dL/dvalue, normalized over the whole mini-batch so the
// micro-batches add up to the mini-batch loss. SFT: one step of token-mean cross entropy.
// With data-parallel ranks each rank trains on its share of every mini-batch (or of the
// rows), with the denominators, the optimizer steps and the metrics of the whole batch.
#include <stdlib.h>
#include <string.h>

#include "roles/client.h"
#include "roles/rollout_wire.h"
#include "roles/worker_impl.h"

// A mini-batch's micro-batches (mb_plan.h) and the engine's view of each.
typedef struct plan {
    tr_mb_plan mp;
    tr_micro_batch *mbs;   // [mp.n]
} plan;

typedef struct rl_ctx {
    tr_role_ctx *role;
    const tr_rollouts *r;
    const float *adv, *old, *ref;        // policy
    const float *ret, *old_v;            // critic
    const tr_loss_norm *norm;
    const plan *p;
    // padded [rows x cols] scratch, cap floats each
    int64_t cap;
    uint8_t *mask;
    float *a, *b, *c, *d, *e, *ga, *ge;
    // metrics summed over the call
    double loss, pg_loss, kl, entropy, tok_clip, tok_clip_lo, tok_clip_hi, tok_dual, tok_akl, tok_ratio;
    double v_clip, v_mean;
    int64_t tokens;
    double flops;   // of the forward and backward passes (tr_model_forward_flops)
} rl_ctx;

static void plan_free(plan *p) {
    tr_mb_plan_free(&p->mp);
    free(p->mbs);
    memset(p, 0, sizeof *p);
}

// Packs sequences [s0, s1) into micro-batches of at most the model's max_tokens, in order.
static int plan_build(tr_role_ctx *role, const tr_rollouts *r, int32_t s0, int32_t s1, plan *p, tr_err *err) {
    if (tr_mb_plan_build(r, s0, s1, role->model.max_tokens, role->share_prompts, &p->mp, err))
        return tr_err_wrap(err, "train");
    if (!(p->mbs = calloc((size_t)p->mp.n + 1, sizeof *p->mbs))) return tr_errf(err, TR_ENOMEM, "train: out of memory");
    for (int32_t i = 0; i < p->mp.n; i++) {
        const tr_pack *pk = &p->mp.packs[i];
        // ones: the loss callback carries every weight
        p->mbs[i] = (tr_micro_batch){.ids = pk->ids, .targets = pk->targets, .weights = role->mb.weights,
                                     .docs = pk->docs};
    }
    return 0;
}

// Rows and columns of a micro-batch's padded layout: one row per sequence (seqs[0, n)), one
// column per scored response token.
static void mb_shape(const tr_rollouts *r, const int32_t *seqs, int32_t n_seqs, int32_t *rows, int32_t *cols) {
    int32_t c = 0;
    for (int32_t k = 0; k < n_seqs; k++) {
        int32_t i = seqs[k];
        int32_t len = (int32_t)(r->offset[i + 1] - r->offset[i]);
        int32_t n = len - tr_first_scored(r->prompt_len[i]);
        if (r->response_len[i] < n) n = r->response_len[i];
        if (n > c) c = n;
    }
    *rows = n_seqs;
    *cols = c > 0 ? c : 1;
}

// Row i's scored tokens t in [t0, len): column t - t0, head row o + t - 1.
static void row_range(const tr_rollouts *r, int32_t i, int32_t *t0, int32_t *len) {
    *len = (int32_t)(r->offset[i + 1] - r->offset[i]);
    *t0 = tr_first_scored(r->prompt_len[i]);
    int32_t p = r->prompt_len[i];
    if (*t0 < p) *t0 = p;
}

static int rl_loss(void *user, int32_t index, const tr_micro_batch *mb, int32_t n, const float *out,
                   const float *entropy, float *loss, float *dout, float *dentropy, tr_err *err) {
    rl_ctx *c = user;
    const tr_rollouts *r = c->r;
    const tr_mb_plan *mp = &c->p->mp;
    const tr_pack *pk = &mp->packs[index];
    const int32_t *seqs = mp->seqs + mp->first[index];
    int32_t ns = mp->first[index + 1] - mp->first[index], B, T;
    (void)mb;
    mb_shape(r, seqs, ns, &B, &T);
    size_t nn = (size_t)B * (size_t)T;
    memset(c->mask, 0, nn);
    memset(c->a, 0, nn * sizeof(float));
    memset(c->b, 0, nn * sizeof(float));
    memset(c->c, 0, nn * sizeof(float));
    memset(c->d, 0, nn * sizeof(float));
    memset(c->e, 0, nn * sizeof(float));
    bool critic = c->role->kind == TR_ROLE_CRITIC;
    for (int32_t q = 0; q < ns; q++) {
        int32_t t0, len, i = seqs[q];
        int64_t off = r->offset[i];
        row_range(r, i, &t0, &len);
        for (int32_t t = t0; t < len; t++) {
            size_t k = (size_t)q * T + (size_t)(t - t0);
            int32_t o = tr_pack_row(pk, q, t - 1);   // predicts token t
            c->mask[k] = 1;
            c->a[k] = out[o];
            if (critic) {
                c->b[k] = c->old_v[off + t];
                c->c[k] = c->ret[off + t];
            } else {
                c->b[k] = c->old[off + t];
                c->c[k] = c->adv[off + t];
                if (c->ref) c->d[k] = c->ref[off + t];
                if (entropy) c->e[k] = entropy[o];
            }
        }
    }
    memset(loss, 0, (size_t)n * sizeof(float));
    memset(dout, 0, (size_t)n * sizeof(float));
    int rc;
    int64_t ntok;
    if (critic) {
        tr_value_loss_in in = {.B = B, .T = T, .mask = c->mask, .values = c->a, .old_values = c->b,
                               .returns = c->c, .norm = c->norm};
        tr_value_loss_out vo;
        rc = tr_value_loss(c->role->value_clip, c->role->loss.agg, &in, &vo, c->ga, err);
        if (rc) return -1;
        loss[0] = (float)vo.loss;
        c->loss += vo.loss;
        ntok = vo.n_tokens;
        c->v_clip += vo.clip_frac * (double)ntok;
        c->v_mean += vo.value_mean * (double)ntok;
    } else {
        tr_policy_loss_in in = {.B = B, .T = T, .mask = c->mask, .logp = c->a, .old_logp = c->b, .adv = c->c,
                                .ref_logp = c->ref ? c->d : NULL, .entropy = entropy ? c->e : NULL,
                                .norm = c->norm};
        tr_policy_loss_out po;
        bool ent_grad = c->role->loss.entropy_coef != 0 && entropy;
        rc = tr_policy_loss(&c->role->loss, &in, &po, c->ga, ent_grad ? c->ge : NULL, err);
        if (rc) return -1;
        loss[0] = (float)po.loss;
        c->loss += po.loss;
        c->pg_loss += po.pg_loss;
        c->kl += po.kl;
        c->entropy += po.entropy;
        ntok = po.n_tokens;
        c->tok_clip += po.clip_frac * (double)ntok;
        c->tok_clip_lo += po.clip_frac_low * (double)ntok;
        c->tok_clip_hi += po.clip_frac_high * (double)ntok;
        c->tok_dual += po.dual_clip_frac * (double)ntok;
        c->tok_akl += po.approx_kl * (double)ntok;
        c->tok_ratio += po.ratio_mean * (double)ntok;
        if (!ent_grad) memset(c->ge, 0, nn * sizeof(float));
    }
    c->tokens += ntok;
    for (int32_t q = 0; q < ns; q++) {
        int32_t t0, len, i = seqs[q];
        row_range(r, i, &t0, &len);
        for (int32_t t = t0; t < len; t++) {
            size_t k = (size_t)q * T + (size_t)(t - t0);
            int32_t o = tr_pack_row(pk, q, t - 1);
            dout[o] = c->ga[k];
            if (!critic && dentropy) dentropy[o] = c->ge[k];
        }
    }
    return 0;
}

// The aggregation denominators of this rank's share of a mini-batch: scored response
// tokens, sequences with one, and the longest response.
static void mini_counts(const tr_rollouts *r, int32_t s0, int32_t s1, double out[3]) {
    double toks = 0, seqs = 0, longest = 0;
    for (int32_t i = s0; i < s1; i++) {
        int32_t t0, len;
        row_range(r, i, &t0, &len);
        int32_t n = len > t0 ? len - t0 : 0;
        toks += n;
        if (n > 0) seqs++;
        if (r->response_len[i] > longest) longest = r->response_len[i];
    }
    out[0] = toks;
    out[1] = seqs;
    out[2] = longest;
}

// Each mini-batch's denominators over every data-parallel rank's share of it, so that the
// ranks' losses add up to the mini-batch's and every rank normalizes alike.
static int mini_norms(tr_role_ctx *role, const tr_rollouts *r, const plan *plans, int32_t M, tr_loss_norm *norms,
                      tr_err *err) {
    int32_t world = role->trainer.comm ? tr_comm_world(role->trainer.comm) : 1;
    double *mine = malloc((size_t)M * 3 * sizeof(double)), *all = malloc((size_t)M * 3 * (size_t)world * sizeof(double));
    int rc = !mine || !all ? tr_errf(err, TR_ENOMEM, "train: out of memory") : 0;
    for (int32_t m = 0; m < M && !rc; m++)
        mini_counts(r, plans[m].mp.s0, plans[m].mp.s1, mine + 3 * m);
    if (!rc) rc = tr_trainer_all_gather(&role->trainer, mine, M * 3, all, err);
    for (int32_t m = 0; m < M && !rc; m++) {
        tr_loss_norm *nm = &norms[m];
        memset(nm, 0, sizeof *nm);
        for (int32_t k = 0; k < world; k++) {
            const double *x = all + (size_t)k * (size_t)M * 3 + 3 * (size_t)m;
            nm->n_tokens += x[0];
            nm->n_seqs += x[1];
            if (x[2] > nm->max_len) nm->max_len = x[2];
        }
        if (role->max_len > 0) nm->max_len = role->max_len;
    }
    free(mine);
    free(all);
    return rc;
}

static int scratch_alloc(rl_ctx *c, int64_t cap, tr_err *err) {
    size_t n = (size_t)(cap ? cap : 1);
    c->cap = cap;
    c->mask = malloc(n);
    float **f[] = {&c->a, &c->b, &c->c, &c->d, &c->e, &c->ga, &c->ge};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = malloc(n * sizeof(float));
    if (!c->mask || !c->a || !c->b || !c->c || !c->d || !c->e || !c->ga || !c->ge)
        return tr_errf(err, TR_ENOMEM, "train: out of memory for %lld-entry loss buffers", (long long)cap);
    return 0;
}

static void scratch_free(rl_ctx *c) {
    free(c->mask);
    free(c->a);
    free(c->b);
    free(c->c);
    free(c->d);
    free(c->e);
    free(c->ga);
    free(c->ge);
}

static void put_metrics(tr_msg_writer *w, const tr_train_metrics *m, bool critic) {
    tr_msg_put_map(w, "metrics", critic ? 10 : 16);
    tr_msg_put_float(w, "flops", m->flops);
    tr_msg_put_float(w, "loss", m->loss);
    if (critic) {
        tr_msg_put_float(w, "value_loss", m->value_loss);
        tr_msg_put_float(w, "value_clip_frac", m->value_clip_frac);
        tr_msg_put_float(w, "value_mean", m->value_mean);
    } else {
        tr_msg_put_float(w, "pg_loss", m->pg_loss);
        tr_msg_put_float(w, "clip_frac", m->clip_frac);
        tr_msg_put_float(w, "clip_frac_low", m->clip_frac_low);
        tr_msg_put_float(w, "clip_frac_high", m->clip_frac_high);
        tr_msg_put_float(w, "dual_clip_frac", m->dual_clip_frac);
        tr_msg_put_float(w, "approx_kl", m->approx_kl);
        tr_msg_put_float(w, "kl", m->kl);
        tr_msg_put_float(w, "entropy", m->entropy);
        tr_msg_put_float(w, "ratio_mean", m->ratio_mean);
    }
    tr_msg_put_float(w, "grad_norm", m->grad_norm);
    tr_msg_put_float(w, "lr", m->lr);
    tr_msg_put_int(w, "tokens", m->tokens);
    tr_msg_put_int(w, "steps", m->steps);
    tr_msg_put_int(w, "step", m->step);
}

typedef struct rl_in {
    tr_rollouts r;
    float *x, *y, *z;     // policy: advantages, old_logprobs, ref_logprobs; critic: returns, old_values
    int32_t *mb_seqs;     // [M] this rank's sequences in each mini-batch, in order
    int32_t M;            // mini-batches (optimizer steps per epoch), the same on every rank
} rl_in;

static void rl_in_free(rl_in *in) {
    tr_rollouts_free(&in->r);
    free(in->x);
    free(in->y);
    free(in->z);
    free(in->mb_seqs);
}

// The mini-batch split: as the controller gives it (each data-parallel rank's share of every
// mini-batch), or min(mini_batches, n) near-equal contiguous parts of this call's sequences.
static int get_split(tr_role_ctx *role, const tr_msg_map *a, rl_in *in, tr_err *err) {
    const tr_rollouts *r = &in->r;
    if (!tr_msg_has(a, "mini_batch_seqs")) {
        if (role->dp > 1)
            return tr_errf(err, TR_EINVAL, "train: %d data-parallel ranks need mini_batch_seqs", role->dp);
        if (r->n < 1) return tr_errf(err, TR_EINVAL, "train: no sequences");
        in->M = role->mini_batches < r->n ? role->mini_batches : r->n;
        if (!(in->mb_seqs = malloc((size_t)in->M * sizeof *in->mb_seqs)))
            return tr_errf(err, TR_ENOMEM, "train: out of memory");
        for (int32_t m = 0; m < in->M; m++)
            in->mb_seqs[m] = (int32_t)((int64_t)r->n * (m + 1) / in->M - (int64_t)r->n * m / in->M);
        return 0;
    }
    tr_tensor_view t;
    if (tr_msg_get_tensor(a, "mini_batch_seqs", &t, err)) return -1;
    if (t.ndim != 1 || t.numel < 1 || t.numel > role->mini_batches)
        return tr_errf(err, TR_EINVAL, "train: args.mini_batch_seqs: %lld mini-batches (1..%d)", (long long)t.numel,
                       role->mini_batches);
    in->M = (int32_t)t.numel;
    if (!(in->mb_seqs = malloc((size_t)in->M * sizeof *in->mb_seqs)))
        return tr_errf(err, TR_ENOMEM, "train: out of memory");
    if (tr_tensor_view_copy(&t, TR_DTYPE_I32, in->mb_seqs, (size_t)in->M * sizeof(int32_t), "mini_batch_seqs", err))
        return -1;
    int64_t sum = 0;
    for (int32_t m = 0; m < in->M; m++) {
        if (in->mb_seqs[m] < 0) return tr_errf(err, TR_EINVAL, "train: args.mini_batch_seqs[%d] is negative", m);
        sum += in->mb_seqs[m];
    }
    if (sum != r->n)
        return tr_errf(err, TR_EINVAL, "train: args.mini_batch_seqs adds up to %lld, %d sequences were sent",
                       (long long)sum, r->n);
    if (r->n < 1 && role->dp < 2) return tr_errf(err, TR_EINVAL, "train: no sequences");
    return 0;
}

// The weights that sampled the rollouts must be the ones the controller says: the trainer's
// current weights (weight_lag 0), or those it had before its previous train call (1, the
// one-step-off pipeline). A sequence of unknown version (-1) is not checked.
static int check_versions(tr_role_ctx *role, const tr_msg_map *a, const tr_rollouts *r, tr_err *err) {
    if (!tr_msg_has(a, "weight_lag")) return 0;
    int64_t lag;
    if (tr_msg_get_int(a, "weight_lag", &lag, err)) return -1;
    if (lag < 0 || lag > 1)
        return tr_errf(err, TR_EINVAL, "train: weight_lag %lld (0: the current weights, 1: the previous ones)",
                       (long long)lag);
    int64_t want = lag == 0 ? role->trainer.step : role->prev_train_step;
    for (int32_t i = 0; i < r->n; i++) {
        if (r->version[i] < 0 || r->version[i] == want) continue;
        if (want < 0)
            return tr_errf(err, TR_EINVAL, "train: sequence %d was sampled with the weights of step %lld, but %s has "
                           "taken no train step since it started or loaded, so it has no previous weights "
                           "(weight_lag 1)", i, (long long)r->version[i], role->id);
        return tr_errf(err, TR_EINVAL, "train: sequence %d was sampled with the weights of step %lld; with weight_lag "
                       "%lld %s expects step %lld (stale or mixed-up rollouts)", i, (long long)r->version[i],
                       (long long)lag, role->id, (long long)want);
    }
    return 0;
}

static int rl_in_get(tr_role_ctx *role, const tr_msg_map *a, rl_in *in, tr_err *err) {
    bool critic = role->kind == TR_ROLE_CRITIC;
    static const char *const pkeys[] = {"rollouts", "advantages", "old_logprobs", "ref_logprobs", "mini_batch_seqs",
                                        "weight_lag", NULL};
    static const char *const ckeys[] = {"rollouts", "returns", "old_values", "mini_batch_seqs", NULL};
    if (tr_msg_check_keys(a, critic ? ckeys : pkeys, err) || tr_worker_get_rollouts(role, a, &in->r, err)) return -1;
    const tr_rollouts *r = &in->r;
    size_t n = (size_t)r->n_tokens;
    bool has_ref = !critic && tr_msg_has(a, "ref_logprobs");
    in->x = malloc((n ? n : 1) * sizeof(float));
    in->y = malloc((n ? n : 1) * sizeof(float));
    in->z = has_ref ? malloc((n ? n : 1) * sizeof(float)) : NULL;
    if (!in->x || !in->y || (has_ref && !in->z))
        return tr_errf(err, TR_ENOMEM, "train: out of memory for %zu tokens", n);
    if (tr_token_floats_get(a, critic ? "returns" : "advantages", r->n_tokens, in->x, err) ||
        tr_token_floats_get(a, critic ? "old_values" : "old_logprobs", r->n_tokens, in->y, err) ||
        (has_ref && tr_token_floats_get(a, "ref_logprobs", r->n_tokens, in->z, err)))
        return -1;
    if (!critic && role->loss.kl_coef != 0 && !has_ref)
        return tr_errf(err, TR_EINVAL, "train: the KL loss (kl_coef %g) needs ref_logprobs", role->loss.kl_coef);
    if (!critic && check_versions(role, a, r, err)) return -1;
    return get_split(role, a, in, err);
}

// Micro-batch plans of every mini-batch and the largest padded loss layout among them.
static int build_plans(tr_role_ctx *role, const rl_in *in, plan *plans, int64_t *cap, tr_err *err) {
    int32_t s0 = 0;
    *cap = 0;
    for (int32_t m = 0; m < in->M; m++) {
        if (plan_build(role, &in->r, s0, s0 + in->mb_seqs[m], &plans[m], err)) return -1;
        s0 += in->mb_seqs[m];
        for (int32_t i = 0; i < plans[m].mp.n; i++) {
            int32_t B, T;
            const tr_mb_plan *mp = &plans[m].mp;
            mb_shape(&in->r, mp->seqs + mp->first[i], mp->first[i + 1] - mp->first[i], &B, &T);
            if ((int64_t)B * T > *cap) *cap = (int64_t)B * T;
        }
    }
    return 0;
}

// ppo_epochs passes, one optimizer step per mini-batch (on every rank, with or without data).
static int run_epochs(tr_role_ctx *role, const rl_in *in, const plan *plans, const tr_loss_norm *norms, rl_ctx *c,
                      tr_train_metrics *mt, double *gn, tr_err *err) {
    for (int32_t e = 0; e < role->ppo_epochs; e++)
        for (int32_t m = 0; m < in->M; m++) {
            c->norm = &norms[m];
            c->p = &plans[m];
            for (int32_t i = 0; i < plans[m].mp.n; i++)
                c->flops += 3 * tr_model_forward_flops(&role->model.cfg, &plans[m].mp.packs[i].docs);
            tr_step_args sa = {.loss = TR_LOSS_CALLBACK, .norm = TR_NORM_SUM, .loss_fn = rl_loss, .user = c};
            tr_step_result res;
            if (tr_train_step(&role->trainer, plans[m].mbs, plans[m].mp.n, &sa, &res, err))
                return tr_err_wrap(err, "train: epoch %d mini-batch %d", e, m);
            mt->steps++;
            *gn += res.grad_norm;
            mt->lr = res.lr;
            mt->step = res.step;
        }
    return 0;
}

// The call's metrics over every data-parallel rank: sums of the per-rank parts, then means.
static int finish_metrics(tr_role_ctx *role, const rl_ctx *c, double gn, tr_train_metrics *mt, tr_err *err) {
    double v[] = {c->loss, c->pg_loss, c->kl, c->entropy, c->tok_clip, c->tok_clip_lo, c->tok_clip_hi, c->tok_dual,
                  c->tok_akl, c->tok_ratio, c->v_clip, c->v_mean, (double)c->tokens, c->flops};
    if (tr_trainer_all_sum(&role->trainer, v, (int32_t)(sizeof v / sizeof v[0]), err)) return -1;
    double steps = mt->steps > 0 ? (double)mt->steps : 1, tok = v[12] > 0 ? v[12] : 1;
    mt->loss = v[0] / steps;
    mt->grad_norm = gn / steps;
    mt->tokens = (int64_t)v[12];
    mt->flops = v[13];
    if (role->kind == TR_ROLE_CRITIC) {
        mt->value_loss = v[0] / steps;
        mt->value_clip_frac = v[10] / tok;
        mt->value_mean = v[11] / tok;
        return 0;
    }
    mt->pg_loss = v[1] / steps;
    mt->kl = v[2] / steps;
    mt->entropy = v[3] / steps;
    mt->clip_frac = v[4] / tok;
    mt->clip_frac_low = v[5] / tok;
    mt->clip_frac_high = v[6] / tok;
    mt->dual_clip_frac = v[7] / tok;
    mt->approx_kl = v[8] / tok;
    mt->ratio_mean = v[9] / tok;
    return 0;
}

int tr_worker_op_train(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    if (!role->has_trainer) return tr_errf(err, TR_EINVAL, "train: %s was initialized without train", role->id);
    if (role->dp > 1 && !role->trainer.comm)
        return tr_errf(err, TR_EINVAL, "train: %s is one of %d data-parallel ranks but has no communicator (comm_ready)",
                       role->id, role->dp);
    bool critic = role->kind == TR_ROLE_CRITIC;
    rl_in in;
    memset(&in, 0, sizeof in);
    tr_rollouts_init(&in.r);
    rl_ctx c;
    memset(&c, 0, sizeof c);
    int rc = rl_in_get(role, &req->args, &in, err);
    plan *plans = rc ? NULL : calloc((size_t)(uint32_t)in.M, sizeof *plans);
    tr_loss_norm *norms = rc ? NULL : calloc((size_t)(uint32_t)in.M, sizeof *norms);
    if (!rc && (!plans || !norms)) rc = tr_errf(err, TR_ENOMEM, "train: out of memory");
    int64_t cap = 0;
    if (!rc) rc = build_plans(role, &in, plans, &cap, err);
    if (!rc) rc = scratch_alloc(&c, cap, err);
    if (!rc) rc = mini_norms(role, &in.r, plans, in.M, norms, err);
    c.role = role;
    c.r = &in.r;
    c.adv = critic ? NULL : in.x;
    c.old = critic ? NULL : in.y;
    c.ref = critic ? NULL : in.z;
    c.ret = critic ? in.x : NULL;
    c.old_v = critic ? in.y : NULL;
    tr_train_metrics mt;
    memset(&mt, 0, sizeof mt);
    double gn = 0;
    int64_t step_before = role->trainer.step;
    if (!rc) rc = tr_worker_begin_write(role, err);
    if (!rc) rc = run_epochs(role, &in, plans, norms, &c, &mt, &gn, err);
    if (!rc) role->prev_train_step = step_before;
    if (!rc) rc = finish_metrics(role, &c, gn, &mt, err);
    if (!rc) {
        tr_msg_begin_reply(rep, req->id, 1);
        put_metrics(rep, &mt, critic);
        int64_t packed = 0;
        for (int32_t m = 0; m < in.M; m++) packed += plans[m].mp.tokens;
        tr_worker_logf(role, "train: %d sequences here, %lld steps, loss %.6g, grad norm %.4g, lr %.3g; %lld tokens "
                       "packed as %lld", in.r.n, (long long)mt.steps, mt.loss, mt.grad_norm, mt.lr,
                       (long long)in.r.n_tokens, (long long)packed);
    } else if (role->trainer.comm) {
        // The other ranks may be waiting in a collective this rank will never reach.
        tr_comm_abort(role->trainer.comm, err->msg);
    }
    for (int32_t m = 0; plans && m < in.M; m++) plan_free(&plans[m]);
    free(plans);
    free(norms);
    scratch_free(&c);
    rl_in_free(&in);
    return rc;
}

// ---- SFT ----

static int get_i32(const tr_msg_map *a, const char *key, int64_t n, int32_t *out, tr_err *err) {
    tr_tensor_view t;
    if (tr_msg_get_tensor(a, key, &t, err)) return -1;
    if (t.ndim != 1 || t.numel != n)
        return tr_errf(err, TR_EINVAL, "train_sft: args.%s: expected %lld entries, got %lld", key, (long long)n,
                       (long long)t.numel);
    return tr_tensor_view_copy(&t, TR_DTYPE_I32, out, (size_t)n * sizeof(int32_t), key, err);
}

// Every row's documents cover it in order and every id and target is in the vocabulary;
// *trained counts the targets (the tokens that carry loss).
static int check_rows(int64_t nr, int32_t rl, int32_t V, const int32_t *ids, const int32_t *tg, const int32_t *nd,
                      const int32_t *ds, int64_t *trained, tr_err *err) {
    const int32_t *d = ds;
    for (int64_t i = 0; i < nr; i++) {
        if (d[0] != 0 || d[nd[i]] != rl)
            return tr_errf(err, TR_EINVAL, "train_sft: row %lld: documents must cover 0..%d", (long long)i, rl);
        for (int32_t k = 0; k < nd[i]; k++) {
            if (d[k + 1] <= d[k])
                return tr_errf(err, TR_EINVAL, "train_sft: row %lld: document %d is empty or out of order", (long long)i,
                               k);
            for (int32_t t = d[k]; t < d[k + 1]; t++) {
                size_t j = (size_t)(i * rl + t);
                if (ids[j] < 0 || ids[j] >= V || tg[j] < -1 || tg[j] >= V)
                    return tr_errf(err, TR_ERANGE, "train_sft: row %lld token %d: id %d or target %d outside the "
                                   "vocabulary [0, %d)", (long long)i, t, ids[j], tg[j], V);
                if (tg[j] >= 0) (*trained)++;
            }
        }
        d += nd[i] + 1;
    }
    return 0;
}

int tr_worker_op_train_sft(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"n_rows", "row_len", "ids", "targets", "doc_start", "n_docs", NULL};
    const tr_msg_map *a = &req->args;
    if (!role->has_trainer) return tr_errf(err, TR_EINVAL, "train_sft: %s was initialized without train", role->id);
    if (role->dp > 1 && !role->trainer.comm)
        return tr_errf(err, TR_EINVAL, "train_sft: %s is one of %d data-parallel ranks but has no communicator "
                       "(comm_ready)", role->id, role->dp);
    int64_t nr, rl;
    if (tr_msg_check_keys(a, keys, err) || tr_msg_get_int(a, "n_rows", &nr, err) ||
        tr_msg_get_int(a, "row_len", &rl, err))
        return -1;
    int32_t T = role->model.max_tokens;
    // A data-parallel rank may get no rows; it still takes part in the step.
    if (nr < (role->dp > 1 ? 0 : 1) || rl < 1 || rl > T || nr > (1 << 24))
        return tr_errf(err, TR_EINVAL, "train_sft: %lld rows of %lld tokens (a row must fit the %d-token forward)",
                       (long long)nr, (long long)rl, T);
    size_t n = (size_t)(nr * rl);
    int32_t *ids = malloc((n + 1) * sizeof *ids), *tg = malloc((n + 1) * sizeof *tg);
    int32_t *nd = malloc((size_t)(nr + 1) * sizeof *nd), *ds = NULL;
    tr_micro_batch *mbs = calloc((size_t)nr + 1, sizeof *mbs);
    tr_pack *packs = calloc((size_t)nr + 1, sizeof *packs);
    tr_tensor_view dv;
    int rc = 0;
    if (!ids || !tg || !nd || !mbs || !packs) rc = tr_errf(err, TR_ENOMEM, "train_sft: out of memory");
    if (!rc && (get_i32(a, "ids", (int64_t)n, ids, err) || get_i32(a, "targets", (int64_t)n, tg, err) ||
                get_i32(a, "n_docs", nr, nd, err) || tr_msg_get_tensor(a, "doc_start", &dv, err)))
        rc = -1;
    int64_t total_docs = 0;
    for (int64_t i = 0; i < nr && !rc; i++) {
        if (nd[i] < 1 || nd[i] > rl) rc = tr_errf(err, TR_EINVAL, "train_sft: row %lld has %d documents", (long long)i, nd[i]);
        total_docs += nd[i] + 1;
    }
    if (!rc && dv.numel != total_docs)
        rc = tr_errf(err, TR_EINVAL, "train_sft: doc_start has %lld entries, n_docs needs %lld", (long long)dv.numel,
                     (long long)total_docs);
    if (!rc && !(ds = malloc((size_t)(total_docs + 1) * sizeof *ds)))
        rc = tr_errf(err, TR_ENOMEM, "train_sft: out of memory");
    if (!rc) rc = tr_tensor_view_copy(&dv, TR_DTYPE_I32, ds, (size_t)total_docs * sizeof *ds, "doc_start", err);
    int64_t trained = 0;
    if (!rc) rc = check_rows(nr, (int32_t)rl, role->model.cfg.vocab_size, ids, tg, nd, ds, &trained, err);
    const int32_t *d;
    // Whole rows per micro-batch, as many as fit the forward, their documents (each with the
    // targets the data gave: the loss mask) packed end to end.
    int32_t per = T / (int32_t)rl, n_mb = 0;
    d = ds;
    for (int64_t r0 = 0; r0 < nr && !rc; r0 += per) {
        int64_t r1 = r0 + per < nr ? r0 + per : nr;
        tr_pack *pk = &packs[n_mb];
        if (tr_pack_init(pk, (int32_t)((r1 - r0) * rl), err)) {
            rc = tr_err_wrap(err, "train_sft");
            break;
        }
        for (int64_t i = r0; i < r1; i++) {
            for (int32_t j = 0; j < nd[i]; j++)
                tr_pack_add(pk, ids + i * rl + d[j], tg + i * rl + d[j], d[j + 1] - d[j]);
            d += nd[i] + 1;
        }
        mbs[n_mb++] = (tr_micro_batch){.ids = pk->ids, .targets = pk->targets, .docs = pk->docs};
    }
    tr_step_result res;
    tr_step_args sa = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
    if (!rc && (tr_worker_begin_write(role, err) || tr_train_step(&role->trainer, mbs, n_mb, &sa, &res, err)))
        rc = tr_err_wrap(err, "train_sft");
    double all_trained = (double)trained;
    if (!rc) rc = tr_trainer_all_sum(&role->trainer, &all_trained, 1, err);
    if (rc && role->trainer.comm) tr_comm_abort(role->trainer.comm, err->msg);
    if (!rc) {
        tr_train_metrics m = {.loss = res.loss, .grad_norm = res.grad_norm, .lr = res.lr,
                              .tokens = (int64_t)all_trained, .steps = 1, .step = res.step};
        tr_msg_begin_reply(rep, req->id, 1);
        tr_msg_put_map(rep, "metrics", 6);
        tr_msg_put_float(rep, "loss", m.loss);
        tr_msg_put_float(rep, "grad_norm", m.grad_norm);
        tr_msg_put_float(rep, "lr", m.lr);
        tr_msg_put_int(rep, "tokens", m.tokens);
        tr_msg_put_int(rep, "steps", m.steps);
        tr_msg_put_int(rep, "step", m.step);
        tr_worker_logf(role, "train_sft: %lld rows here, %lld trained tokens in all, loss %.6g", (long long)nr,
                       (long long)m.tokens, m.loss);
    }
    for (int64_t i = 0; packs && i < nr; i++) tr_pack_free(&packs[i]);
    free(packs);
    free(ids);
    free(tg);
    free(nd);
    free(ds);
    free(mbs);
    return rc;
}
