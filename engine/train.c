// The training step: gradient accumulation over micro-batches with one normalization for the
// whole step, global-norm clipping as torch.nn.utils.clip_grad_norm_ does it, and one fused
// AdamW pass over the parameters (per-tensor spans, so 1-D tensors can skip weight decay)
// that also writes the working copy.
#include "engine/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "engine/heads.h"

static int32_t outputs_per_token(const tr_model_config *cfg) {
    return cfg->head == TR_HEAD_SCORE && cfg->num_labels > 1 ? cfg->num_labels : 1;
}

size_t tr_trainer_shard_begin(size_t total, int32_t shards, int32_t shard) {
    return tr_comm_shard_begin(total, shards, shard, 16);
}

// The weight-decay spans of this rank's shard for the one AdamW call: a span per tensor part
// in the shard, stretched over the alignment gap after it (zeros, which AdamW keeps at zero),
// so that the spans tile the shard. 1-D tensors (norms, biases) skip decay unless decay_all.
// The ranges of the flat gradient that add to the global norm on this rank: every tensor
// it counts (params.h), with the alignment gaps between counted neighbours (zeros) taken
// along, so a rank that counts everything has the one span [0, total).
static int make_norm_spans(tr_trainer *tr, tr_err *err) {
    const tr_param_layout *lay = &tr->model->layout;
    tr->norm_spans = malloc(((size_t)lay->n_tensors + 1) * 2 * sizeof(size_t));
    if (!tr->norm_spans) return tr_errf(err, TR_ENOMEM, "trainer: out of memory");
    int32_t n = 0;
    bool open = false;
    for (int32_t i = 0; i < lay->n_tensors; i++) {
        const tr_tensor_desc *d = &lay->tensors[i];
        size_t end = i + 1 < lay->n_tensors ? lay->tensors[i + 1].offset : lay->total;
        if (!d->counted) {
            open = false;
            continue;
        }
        if (open) {
            tr->norm_spans[2 * n - 1] = end;
        } else {
            tr->norm_spans[2 * n] = i == 0 ? 0 : d->offset;
            tr->norm_spans[2 * n + 1] = end;
            n++;
            open = true;
        }
    }
    tr->n_norm_spans = n;
    return 0;
}

static int make_segments(tr_trainer *tr, tr_err *err) {
    const tr_model *m = tr->model;
    const size_t b = tr->shard_begin, e = tr->shard_end;
    tr_adamw_seg *segs = calloc((size_t)m->layout.n_tensors + 1, sizeof *segs);
    if (!segs) return tr_errf(err, TR_ENOMEM, "trainer: out of memory");
    int32_t n = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        const tr_tensor_desc *d = &m->layout.tensors[i];
        size_t lo = d->offset > b ? d->offset : b;
        size_t hi = d->offset + d->numel < e ? d->offset + d->numel : e;
        if (lo >= hi) continue;
        float wd = (d->ndim == 1 && !tr->opt.decay_all) ? 0.0f : (float)tr->opt.weight_decay;
        if (n > 0) segs[n - 1].end = lo - b;
        segs[n] = (tr_adamw_seg){.begin = lo - b, .end = hi - b, .wd = wd};
        n++;
    }
    if (n == 0) segs[n++] = (tr_adamw_seg){.begin = 0, .end = e - b, .wd = 0.0f};  // empty shard
    segs[0].begin = 0;
    segs[n - 1].end = e - b;
    tr->n_segs = n;
    tr->dev_segs = tr_dev_alloc(m->be, (size_t)n * sizeof *segs, "optimizer spans", err);
    int rc = tr->dev_segs ? tr_dev_upload_sync(m->be, tr->dev_segs, segs, (size_t)n * sizeof *segs,
                                               "optimizer spans", err)
                          : -1;
    free(segs);
    return rc;
}

int tr_trainer_init(tr_trainer *tr, tr_model *m, const tr_optim_cfg *opt, uint64_t seed,
                    tr_err *err) {
    return tr_trainer_init_sharded(tr, m, opt, seed, 1, 0, err);
}

int tr_trainer_init_sharded(tr_trainer *tr, tr_model *m, const tr_optim_cfg *opt, uint64_t seed,
                            int32_t shards, int32_t shard, tr_err *err) {
    memset(tr, 0, sizeof *tr);
    if (shards < 1 || shard < 0 || shard >= shards)
        return tr_errf(err, TR_EINVAL, "trainer: shard %d of %d", shard, shards);
    if (!m->training || !m->grads)
        return tr_errf(err, TR_EINVAL, "trainer: the model was not set up for training");
    if (!(opt->lr >= 0) || !(opt->beta1 >= 0 && opt->beta1 < 1) ||
        !(opt->beta2 >= 0 && opt->beta2 < 1) || !(opt->eps > 0) || !(opt->weight_decay >= 0))
        return tr_errf(err, TR_EINVAL, "trainer: need lr >= 0, 0 <= betas < 1, eps > 0, "
                       "weight_decay >= 0 (got lr %g, betas %g %g, eps %g, weight_decay %g)",
                       opt->lr, opt->beta1, opt->beta2, opt->eps, opt->weight_decay);
    const tr_lr_schedule *s = &opt->schedule;
    // A warmup longer than the run is cut to it (schedule.h), so it is no error here.
    if (s->warmup_steps < 0 || s->total_steps < 0 || !(s->min_lr_ratio >= 0 && s->min_lr_ratio <= 1) ||
        (s->kind != TR_LR_CONSTANT && s->total_steps < 1))
        return tr_errf(err, TR_EINVAL, "trainer: schedule %s needs warmup_steps >= 0, "
                       "total_steps >= 0 (linear, cosine: >= 1) and min_lr_ratio in [0, 1] (got "
                       "%lld, %lld, %g)", tr_lr_kind_name(s->kind), (long long)s->warmup_steps,
                       (long long)s->total_steps, s->min_lr_ratio);
    tr->model = m;
    tr->opt = *opt;
    tr_rng_init(&tr->rng, seed);
    tr->shards = shards;
    tr->shard = shard;
    tr->shard_counts = malloc((size_t)shards * sizeof *tr->shard_counts);
    if (!tr->shard_counts) return tr_errf(err, TR_ENOMEM, "trainer: out of memory");
    for (int32_t r = 0; r < shards; r++)
        tr->shard_counts[r] = tr_trainer_shard_begin(m->layout.total, shards, r + 1) -
                              tr_trainer_shard_begin(m->layout.total, shards, r);
    tr->shard_begin = tr_trainer_shard_begin(m->layout.total, shards, shard);
    tr->shard_end = tr->shard_begin + tr->shard_counts[shard];
    size_t n = tr->shard_end - tr->shard_begin;
    tr->adam_m = tr_dev_zalloc(m->be, (n ? n : 1) * sizeof(float), "Adam first moments", err);
    tr->adam_v = tr->adam_m ? tr_dev_zalloc(m->be, (n ? n : 1) * sizeof(float),
                                            "Adam second moments", err) : NULL;
    if (!tr->adam_v) {
        tr_trainer_free(tr);
        return -1;
    }
    tr->max_out = m->max_tokens * outputs_per_token(&m->cfg);
    size_t k = (size_t)tr->max_out;
    tr->out = malloc(k * sizeof(float));
    tr->entropy = malloc(k * sizeof(float));
    tr->loss = malloc(k * sizeof(float));
    tr->dout = malloc(k * sizeof(float));
    tr->dentropy = malloc(k * sizeof(float));
    tr->weights = malloc(k * sizeof(float));
    tr->dev_sumsq = tr_dev_alloc(m->be, sizeof(double), "gradient norm", err);
    if (!tr->dev_sumsq || make_segments(tr, err) != 0 || make_norm_spans(tr, err) != 0) {
        tr_trainer_free(tr);
        return -1;
    }
    if (!tr->out || !tr->entropy || !tr->loss || !tr->dout || !tr->dentropy || !tr->weights) {
        tr_trainer_free(tr);
        return tr_errf(err, TR_ENOMEM, "trainer: cannot allocate %d-output loss scratch",
                       tr->max_out);
    }
    return 0;
}

void tr_trainer_free(tr_trainer *tr) {
    if (tr->model) {
        tr_dev_free(tr->model->be, tr->adam_m);
        tr_dev_free(tr->model->be, tr->adam_v);
        tr_dev_free(tr->model->be, tr->dev_sumsq);
        tr_dev_free(tr->model->be, tr->dev_segs);
    }
    free(tr->out);
    free(tr->entropy);
    free(tr->loss);
    free(tr->dout);
    free(tr->dentropy);
    free(tr->weights);
    free(tr->shard_counts);
    free(tr->norm_spans);
    memset(tr, 0, sizeof *tr);
}

// Number of head outputs of a micro-batch: tokens, or documents x labels for scores.
static int32_t n_outputs(const tr_model_config *cfg, const tr_micro_batch *mb) {
    if (cfg->head == TR_HEAD_SCORE) return mb->docs.n_docs * cfg->num_labels;
    return mb->docs.n_tokens;
}

// Fills w[0..n) with the micro-batch's loss weights and returns their sum.
static double fill_weights(const tr_model_config *cfg, const tr_micro_batch *mb, float *w,
                           int32_t n) {
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        float x = 1.0f;
        if (mb->weights) x = mb->weights[i];
        else if (cfg->head == TR_HEAD_LM && mb->targets && mb->targets[i] < 0) x = 0.0f;
        w[i] = x;
        sum += x;
    }
    return sum;
}

static int check_micro_batch(const tr_trainer *tr, const tr_micro_batch *mb, int32_t i,
                             const tr_step_args *args, tr_err *err) {
    const tr_model_config *cfg = &tr->model->cfg;
    int32_t T = mb->docs.n_tokens;
    if (T < 1 || T > tr->model->max_tokens || mb->docs.n_docs < 1 || mb->docs.n_docs > T)
        return tr_errf(err, TR_EINVAL, "micro-batch %d: %d tokens in %d documents (the model "
                       "takes 1..%d tokens)", i, T, mb->docs.n_docs, tr->model->max_tokens);
    if (cfg->head == TR_HEAD_LM && !mb->targets)
        return tr_errf(err, TR_EINVAL, "micro-batch %d: the LM head needs targets", i);
    if (args->loss == TR_LOSS_CROSS_ENTROPY && cfg->head != TR_HEAD_LM)
        return tr_errf(err, TR_EINVAL, "micro-batch %d: cross entropy needs an LM head", i);
    if (args->loss == TR_LOSS_GRADIENT && !mb->dout)
        return tr_errf(err, TR_EINVAL, "micro-batch %d: loss 'gradient' needs dout", i);
    if (mb->weights)
        for (int32_t k = 0; k < n_outputs(cfg, mb); k++)
            if (!isfinite(mb->weights[k]) || mb->weights[k] < 0)
                return tr_errf(err, TR_EINVAL, "micro-batch %d: weight %d is %g (need a finite "
                               "value >= 0)", i, k, mb->weights[k]);
    return 0;
}

static int head_forward(tr_model *m, const tr_micro_batch *mb, float *out, float *entropy,
                        tr_err *err) {
    switch (m->cfg.head) {
    case TR_HEAD_LM: return tr_lm_head_forward(m, mb->targets, out, entropy, err);
    case TR_HEAD_VALUE: return tr_value_head_forward(m, out, err);
    case TR_HEAD_SCORE: return tr_score_head_forward(m, out, err);
    }
    return tr_errf(err, TR_EINVAL, "unknown head");
}

static void head_backward(tr_model *m, const tr_micro_batch *mb, const float *dout,
                          const float *dentropy) {
    switch (m->cfg.head) {
    case TR_HEAD_LM: tr_lm_head_backward(m, mb->targets, dout, dentropy); break;
    case TR_HEAD_VALUE: tr_value_head_backward(m, dout); break;
    case TR_HEAD_SCORE: tr_score_head_backward(m, dout); break;
    }
}

// Forward and backward of one micro-batch; adds sum_i w_i l_i to *loss_sum.
static int micro_step(tr_trainer *tr, const tr_micro_batch *mb, int32_t index,
                      const tr_step_args *args, double inv_w, double *loss_sum, tr_err *err) {
    tr_model *m = tr->model;
    const bool lm = m->cfg.head == TR_HEAD_LM;
    const bool want_entropy = lm && args->loss == TR_LOSS_CALLBACK;
    if (tr_model_forward(m, mb->ids, &mb->docs, err) != 0 ||
        head_forward(m, mb, tr->out, want_entropy ? tr->entropy : NULL, err) != 0)
        return tr_err_wrap(err, "micro-batch %d", index);
    const int32_t n = n_outputs(&m->cfg, mb);
    fill_weights(&m->cfg, mb, tr->weights, n);
    bool use_dentropy = false;
    switch (args->loss) {
    case TR_LOSS_CROSS_ENTROPY:
        for (int32_t i = 0; i < n; i++) {
            tr->loss[i] = -tr->out[i];
            tr->dout[i] = -1.0f;
        }
        break;
    case TR_LOSS_GRADIENT:
        memset(tr->loss, 0, (size_t)n * sizeof(float));
        memcpy(tr->dout, mb->dout, (size_t)n * sizeof(float));
        if (lm && mb->dentropy) {
            memcpy(tr->dentropy, mb->dentropy, (size_t)n * sizeof(float));
            use_dentropy = true;
        }
        break;
    case TR_LOSS_CALLBACK:
        memset(tr->dentropy, 0, (size_t)n * sizeof(float));
        if (args->loss_fn(args->user, index, mb, n, tr->out, want_entropy ? tr->entropy : NULL,
                          tr->loss, tr->dout, tr->dentropy, err) != 0)
            return tr_err_wrap(err, "micro-batch %d: loss", index);
        use_dentropy = lm;
        break;
    }
    for (int32_t i = 0; i < n; i++) {
        float s = (float)(tr->weights[i] * inv_w);
        if (tr->weights[i] != 0.0f) *loss_sum += (double)tr->weights[i] * tr->loss[i];
        tr->dout[i] *= s;
        if (use_dentropy) tr->dentropy[i] *= s;
    }
    head_backward(m, mb, tr->dout, use_dentropy ? tr->dentropy : NULL);
    if (tr_model_backward(m, err) != 0) return tr_err_wrap(err, "micro-batch %d", index);
    return 0;
}

static int train_step(tr_trainer *tr, const tr_micro_batch *mbs, int32_t n, const tr_step_args *args,
                      tr_step_result *res, tr_err *err);

int tr_trainer_set_comm(tr_trainer *tr, tr_comm *comm, tr_err *err) {
    if (tr->comm) return tr_errf(err, TR_EINVAL, "trainer: already has a data-parallel communicator");
    if (tr->step != 0)
        return tr_errf(err, TR_EINVAL, "trainer: joining data-parallel ranks after %lld steps", (long long)tr->step);
    if (tr_comm_world(comm) != tr->shards || tr_comm_rank(comm) != tr->shard)
        return tr_errf(err, TR_EINVAL, "trainer: its optimizer is shard %d of %d, the communicator's rank is %d of %d",
                       tr->shard, tr->shards, tr_comm_rank(comm), tr_comm_world(comm));
    tr->comm = comm;
    return 0;
}

// x[0..n) of host doubles through backend memory and one collective.
static int host_collective(tr_trainer *tr, const double *x, int32_t n, double *out, bool gather, tr_err *err) {
    tr_backend *be = tr->model->be;
    int32_t world = tr_comm_world(tr->comm), rank = tr_comm_rank(tr->comm);
    size_t total = (size_t)n * (gather ? (size_t)world : 1);
    double *d = tr_dev_alloc(be, (total ? total : 1) * sizeof(double), "data-parallel reduction", err);
    if (!d) {
        tr_comm_abort(tr->comm, err->msg);
        return -1;
    }
    size_t *counts = gather ? malloc((size_t)world * sizeof *counts) : NULL;
    int rc = gather && !counts ? tr_errf(err, TR_ENOMEM, "trainer: out of memory") : 0;
    for (int32_t r = 0; counts && r < world; r++) counts[r] = (size_t)n;
    if (!rc) rc = tr_dev_upload_sync(be, d + (gather ? (size_t)rank * (size_t)n : 0), x, (size_t)n * sizeof(double),
                                     "data-parallel reduction", err);
    if (!rc) rc = gather ? tr_comm_all_gather(tr->comm, d, counts, TR_COMM_F64, err)
                         : tr_comm_all_reduce(tr->comm, d, (size_t)n, TR_COMM_F64, err);
    if (!rc) rc = tr_dev_download_sync(be, out, d, total * sizeof(double), "data-parallel reduction", err);
    if (rc) tr_comm_abort(tr->comm, err->msg);
    free(counts);
    tr_dev_free(be, d);
    return rc;
}

int tr_trainer_all_sum(tr_trainer *tr, double *x, int32_t n, tr_err *err) {
    if (!tr->comm || n < 1) return 0;
    return host_collective(tr, x, n, x, false, err);
}

int tr_trainer_all_gather(tr_trainer *tr, const double *x, int32_t n, double *all, tr_err *err) {
    if (!tr->comm) {
        memcpy(all, x, (size_t)n * sizeof(double));
        return 0;
    }
    return host_collective(tr, x, n, all, true, err);
}

// A step that fails on one rank must not leave the others waiting in a collective for it.
static int step_failed(tr_trainer *tr, tr_err *err) {
    if (tr->comm) tr_comm_abort(tr->comm, err->msg);
    if (tr->model->tp_comm) tr_comm_abort(tr->model->tp_comm, err->msg);
    return -1;
}

// The gradient's sum of squares in dev_sumsq: this rank's counted spans inside its shard,
// summed over the data-parallel ranks and then the tensor-parallel group (every rank gets
// the same bits). Without either it stays on the device, so the step's one wait comes after
// the update.
static int grad_sumsq(tr_trainer *tr, tr_err *err) {
    tr_model *m = tr->model;
    const tr_ops *op = m->be->ops;
    double zero = 0.0, sumsq = 0.0;
    op->upload(m->be, tr->dev_sumsq, &zero, sizeof zero);
    for (int32_t i = 0; i < tr->n_norm_spans; i++) {
        size_t lo = tr->norm_spans[2 * i] > tr->shard_begin ? tr->norm_spans[2 * i] : tr->shard_begin;
        size_t hi = tr->norm_spans[2 * i + 1] < tr->shard_end ? tr->norm_spans[2 * i + 1] : tr->shard_end;
        if (lo < hi) op->sumsq(m->be, tr->dev_sumsq, m->grads + lo, hi - lo);
    }
    if (!tr->comm && !m->tp_comm) return 0;
    op->download(m->be, &sumsq, tr->dev_sumsq, sizeof sumsq);
    if (tr_dev_sync(m->be, "gradient norm", err) != 0 || tr_trainer_all_sum(tr, &sumsq, 1, err))
        return -1;
    op->upload(m->be, tr->dev_sumsq, &sumsq, sizeof sumsq);
    if (m->tp_comm) return tr_comm_all_reduce(m->tp_comm, tr->dev_sumsq, 1, TR_COMM_F64, err);
    return 0;
}

int tr_train_step(tr_trainer *tr, const tr_micro_batch *mbs, int32_t n, const tr_step_args *args,
                  tr_step_result *res, tr_err *err) {
    int rc = train_step(tr, mbs, n, args, res, err);
    return rc ? step_failed(tr, err) : 0;
}

static int train_step(tr_trainer *tr, const tr_micro_batch *mbs, int32_t n, const tr_step_args *args,
                      tr_step_result *res, tr_err *err) {
    tr_model *m = tr->model;
    memset(res, 0, sizeof *res);
    if (n < 1 && !tr->comm) return tr_errf(err, TR_EINVAL, "train step: no micro-batches");
    if (tr->shards > 1 && !tr->comm)
        return tr_errf(err, TR_EINVAL, "train step: the optimizer is shard %d of %d but has no communicator",
                       tr->shard, tr->shards);
    if (!m->acts_training)
        return tr_errf(err, TR_EINVAL, "train step: the model's activations are laid out for "
                       "inference (a train phase of its arena lays them out for backward)");
    if (args->loss == TR_LOSS_CALLBACK && !args->loss_fn)
        return tr_errf(err, TR_EINVAL, "train step: loss 'callback' without a function");
    double w_total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (check_micro_batch(tr, &mbs[i], i, args, err) != 0) return -1;
        w_total += fill_weights(&m->cfg, &mbs[i], tr->weights, n_outputs(&m->cfg, &mbs[i]));
    }
    double W = 1.0;
    if (args->norm == TR_NORM_TOKEN_MEAN) {
        W = args->weight_total > 0 ? args->weight_total : w_total;
        if (!(args->weight_total > 0) && tr_trainer_all_sum(tr, &W, 1, err)) return -1;
        if (!(W > 0))
            return tr_errf(err, TR_EINVAL, "train step: no output carries loss weight (%d "
                           "micro-batches)", n);
    }
    tr_model_zero_grad(m);
    double loss_sum = 0;
    for (int32_t i = 0; i < n; i++)
        if (micro_step(tr, &mbs[i], i, args, 1.0 / W, &loss_sum, err) != 0) return -1;

    const tr_ops *op = m->be->ops;
    // Tensor-parallel ranks sharing a tensor add their parts of its gradient first.
    if (tr_model_reduce_grads(m, err) != 0)
        return tr_err_wrap(err, "train step %lld", (long long)tr->step + 1);
    // Every rank's gradient holds its own micro-batches; their sum is the step's gradient,
    // of which each rank needs only its shard (ZeRO-1).
    const size_t b = tr->shard_begin, e = tr->shard_end;
    if (tr->comm && (tr_comm_reduce_scatter(tr->comm, m->grads, tr->shard_counts, TR_COMM_F32, err) ||
                     tr_trainer_all_sum(tr, &loss_sum, 1, err)))
        return tr_err_wrap(err, "train step %lld", (long long)tr->step + 1);
    // The sum of squares stays in backend memory; AdamW reads it there (clip coefficient and
    // the skip of a non-finite step are decided on the device).
    double sumsq = 0.0;
    if (grad_sumsq(tr, err) != 0) return tr_err_wrap(err, "train step %lld", (long long)tr->step + 1);
    double lr = tr_lr_at(&tr->opt.schedule, tr->opt.lr, tr->step);
    size_t wsz = tr_dt_size(m->wt);
    tr_adamw_args aw = {
        .p = m->params + b,
        .work = m->work != (void *)m->params && !tr->comm ? (char *)m->work + b * wsz : NULL,
        .g = m->grads + b, .m = tr->adam_m, .v = tr->adam_v, .n = e - b,
        .segs = tr->dev_segs, .n_segs = tr->n_segs, .sumsq = tr->dev_sumsq,
        .max_norm = tr->opt.max_grad_norm > 0 ? (float)tr->opt.max_grad_norm : 0.0f,
        .lr = (float)lr, .b1 = tr->opt.beta1, .b2 = tr->opt.beta2, .eps = tr->opt.eps,
        .t = (int32_t)(tr->step + 1), .wt = m->wt,
    };
    op->adamw(m->be, &aw);
    op->download(m->be, &sumsq, tr->dev_sumsq, sizeof sumsq);
    if (tr_dev_sync(m->be, "optimizer step", err) != 0)
        return tr_err_wrap(err, "train step %lld", (long long)tr->step + 1);
    double norm = sqrt(sumsq);
    if (!isfinite(norm))
        return tr_errf(err, TR_EINVAL, "train step %lld: gradient norm is %g; update skipped",
                       (long long)tr->step + 1, norm);
    // Every rank's shard of the updated masters, to every rank, and the working copy from
    // them (gathering the narrower copy alone would leave the other shards' masters stale,
    // and checkpoints save the masters).
    if (tr->comm && (tr_comm_all_gather(tr->comm, m->params, tr->shard_counts, TR_COMM_F32, err) ||
                     tr_model_refresh_work(m, err)))
        return tr_err_wrap(err, "train step %lld: gathering the updated parameters", (long long)tr->step + 1);
    tr->step++;
    res->loss = loss_sum / W;
    res->grad_norm = norm;
    res->lr = lr;
    res->weight_total = W;
    res->step = tr->step;
    return 0;
}

int tr_eval_loss(tr_model *m, const tr_micro_batch *mbs, int32_t n, float *scratch,
                 double *loss, tr_err *err) {
    if (m->cfg.head != TR_HEAD_LM) return tr_errf(err, TR_EINVAL, "eval loss: needs an LM head");
    double sum = 0, wsum = 0;
    for (int32_t i = 0; i < n; i++) {
        const tr_micro_batch *mb = &mbs[i];
        if (!mb->targets) return tr_errf(err, TR_EINVAL, "eval loss: micro-batch %d has no targets", i);
        if (tr_model_forward(m, mb->ids, &mb->docs, err) != 0 ||
            tr_lm_head_forward(m, mb->targets, scratch, NULL, err) != 0)
            return tr_err_wrap(err, "micro-batch %d", i);
        for (int32_t t = 0; t < mb->docs.n_tokens; t++) {
            double w = mb->weights ? mb->weights[t] : (mb->targets[t] >= 0 ? 1.0 : 0.0);
            sum -= w * scratch[t];
            wsum += w;
        }
    }
    if (!(wsum > 0)) return tr_errf(err, TR_EINVAL, "eval loss: no token carries loss weight");
    *loss = sum / wsum;
    return 0;
}
