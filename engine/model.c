// The decoder trunk: buffer allocation, the activation arena, and the forward/backward
// passes from token ids to the final RMSNorm and back. Every numeric step is an op of the
// backend table; this file only decides shapes, order and where each tensor lives, and, under
// tensor parallelism, where the all-reduces go (Megatron's places: after the vocab-parallel
// embedding and each row-parallel projection forward, before each norm backward), or with
// sequence parallelism the reduce-scatters and all-gathers that replace them.
#include "engine/model.h"

#include <assert.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/arena.h"
#include "engine/checkpoint.h"
#include "engine/device.h"
#include "engine/model_tp.h"
#include "engine/rng.h"

// Arena layout (T = max_tokens, C = hidden, Q = n_heads*head_dim, K = n_kv_heads*head_dim,
// QKV = Q + 2K, H = n_heads, G = n_kv_heads, I = intermediate, L = n_layers, V = vocab,
// R = logit_rows, N = head outputs per token (num_labels; 1 for the value head)), in
// elements of A (the activation dtype) or F (fp32), every region rounded up to 64 bytes:
//   residual   F (L+1) x T*C        training; inference keeps one, updated in place (two,
//                                   alternating, under sequence parallelism)
//   per layer  A T*(2C + QKV + Q + 3I)  F T*(C + H + 2)   training: L sets; inference: one
//              (whose res_mid is the residual buffer, F T*C less, without sequence parallelism)
//              + A T*QKV, F T*(H + G) with QK-norm (Qwen3): q and k after the per-head norm
//              next to the projection's raw rows, and each head's rstd
//   lnf A T*C, lnf_rstd F T
//   LM head:   logits A R*V, lse F T; value/score head: head_out F T*N
//   training:  d_res F T*C, d_res_a A T*C (none when A is fp32: d_res serves), d_ln A T*C,
//              d_qkv A T*QKV, d_att A T*Q, d_gu A T*2I, d_act A T*I, with a value/score
//              head d_head_out F T*N + A T*N (the LM head's d_logits overwrite its logits);
//              with QK-norm d_qkv_n A T*QKV
// Under tensor parallelism C stays whole and Q, K, I and V are the rank's; vp_stats (LM),
// vp_mean (LM, training) and tp_red F T*C (training, A not fp32) follow. Sequence
// parallelism shards the regions between the tensor-parallel blocks along the sequence:
// with Ts = ceil(T / tp) rows, the residual stream, ln1, ln2, res_mid, their rstd, lnf_rstd
// and d_res take Ts rows instead of T, d_res_a is always its own A T*C, and sp_ln A T*C and
// sp_red F T*C (which serves as tp_red) are added once: per layer and token training saves
// (1 - 1/tp) of 2C values of A and 2C + 2 of F (troupe info --tp N prints it).
// Per token that is about L(2C + QKV + Q + 3I) elements of A and (L+1)C + L(C + H) of F
// when training: for a Qwen2-0.5B shape (C 896, Q 896, K 128, H 14, I 4864, L 24) 0.44 M
// values of A and 0.04 M of F, 1.0 MB a token in bf16 (1.9 MB in fp32), 4.3 GB for a
// 4096-token micro-batch; the 3I term (SwiGLU) dominates. Inference keeps one layer set, so
// its arena does not grow with L. Callers size micro-batches with tr_model_arena_bytes. A
// model on a worker arena has both layouts over the same memory, laid out by
// tr_model_bind_acts when a phase begins (engine/arena.h).

#define TR_ALIGN_BYTES 64

static size_t round_up(size_t n) { return (n + TR_ALIGN_BYTES - 1) / TR_ALIGN_BYTES * TR_ALIGN_BYTES; }

static int32_t head_width(const tr_model_config *cfg) {
    if (cfg->head == TR_HEAD_SCORE) return cfg->num_labels;
    if (cfg->head == TR_HEAD_VALUE) return 1;
    return 0;
}

static int32_t default_logit_rows(int32_t vocab, int32_t max_tokens) {
    int64_t rows = (int64_t)(32u << 20) / 4 / vocab;
    if (rows < 1) rows = 1;
    if (rows > max_tokens) rows = max_tokens;
    return (int32_t)rows;
}

static void *offset_bytes(void *p, size_t bytes) { return (char *)p + bytes; }

// Bytes of n values in the model's activation dtype.
static size_t act_bytes(const tr_model *m, size_t n) { return n * tr_dt_size(m->act); }

// Walks the arena layout once; with base == NULL it only counts, so the size formula and
// the views can never disagree. cfg is the rank's (tr_tp_local_config) and V its vocabulary
// rows. Returns bytes.
static size_t layout_arena(const tr_model_config *cfg, const tr_tp *tp, int32_t T, int32_t R,
                           bool training, bool recompute, tr_dt act, void *base_, tr_acts *a) {
    char *base = base_;
    size_t off = 0;
    const size_t C = (size_t)cfg->hidden_size, Q = (size_t)cfg->n_heads * cfg->head_dim;
    const size_t K = (size_t)cfg->n_kv_heads * cfg->head_dim, I = (size_t)cfg->intermediate_size;
    const size_t QKV = Q + 2 * K;
    const size_t H = (size_t)cfg->n_heads, G = (size_t)cfg->n_kv_heads;
    const size_t V = (size_t)tp->vocab;
    const size_t N = (size_t)head_width(cfg), t = (size_t)T;
    // Rows of the buffers sequence parallelism shards: the most any rank holds.
    const size_t ts = tp->sp ? (size_t)tr_tp_seq_max_rows(T, tp->size) : t;
    const size_t A = tr_dt_size(act), F = sizeof(float);
    const int32_t L = cfg->n_layers;
#define TAKE(ptr, n, es)                                   \
    do {                                                   \
        if (base) (ptr) = (void *)(base + off);            \
        off += round_up((n) * (es));                       \
    } while (0)
    // Inference updates the residual stream in place: every residual[l] and res_mid are one
    // buffer, and the projections add into it (row_parallel skips its copy). Under sequence
    // parallelism a rank's rows move between buffers, so it keeps two and alternates.
    const bool in_place = !training && !tp->sp;
    int32_t n_res = training ? L + 1 : in_place ? 1 : 2;
    float *res_bufs[2] = {NULL, NULL};
    for (int32_t l = 0; l < n_res; l++) {
        float *p = NULL;
        TAKE(p, ts * C, F);
        if (base) {
            if (training) a->residual[l] = p;
            else res_bufs[l] = p;
        }
    }
    if (base && !training)
        for (int32_t l = 0; l <= L; l++) a->residual[l] = res_bufs[in_place ? 0 : l % 2];
    // With recompute, training keeps the residual stream only: the backward of each layer
    // runs its forward again into the one set first (tr_model_backward).
    const bool every_layer = training && !recompute;
    int32_t n_sets = every_layer ? L : 1;
    for (int32_t l = 0; l < n_sets; l++) {
        tr_layer_acts la = {0};
        TAKE(la.ln1, ts * C, A);
        TAKE(la.ln1_rstd, ts, F);
        TAKE(la.qkv, t * QKV, A);
        TAKE(la.att, t * Q, A);
        TAKE(la.att_lse, t * H, F);
        if (!in_place) TAKE(la.res_mid, ts * C, F);
        else if (base) la.res_mid = res_bufs[0];
        TAKE(la.ln2, ts * C, A);
        TAKE(la.ln2_rstd, ts, F);
        TAKE(la.gu, t * 2 * I, A);
        TAKE(la.act, t * I, A);
        if (cfg->qk_norm) {
            TAKE(la.qkv_n, t * QKV, A);
            TAKE(la.q_rstd, t * H, F);
            TAKE(la.k_rstd, t * G, F);
        }
        if (base) {
            void *qk = cfg->qk_norm ? la.qkv_n : la.qkv;
            la.q = qk;
            la.k = offset_bytes(qk, Q * A);
            la.v = offset_bytes(la.qkv, (Q + K) * A);
            if (every_layer) a->layers[l] = la;
            else
                for (int32_t j = 0; j < L; j++) a->layers[j] = la;
        }
    }
    if (base) {
        a->logits = a->lse = a->head_out = a->d_res = a->d_head_out = NULL;
        a->d_res_a = a->d_lnf = a->d_ln = a->d_qkv = a->d_qkv_n = a->d_att = NULL;
        a->d_gu = a->d_act = a->d_head_out_a = NULL;
        a->vp_stats = a->vp_mean = NULL;
        a->tp_red = a->sp_red = NULL;
        a->sp_ln = NULL;
    }
    TAKE(a->lnf, t * C, A);
    TAKE(a->lnf_rstd, ts, F);
    if (cfg->head == TR_HEAD_LM) {
        TAKE(a->logits, (size_t)R * V, A);
        TAKE(a->lse, t, F);
    } else {
        TAKE(a->head_out, t * N, F);
    }
    if (training) {
        TAKE(a->d_res, ts * C, F);
        // Under sequence parallelism d_res holds the rank's rows and d_res_a every rank's.
        if (act != TR_F32 || tp->sp) TAKE(a->d_res_a, t * C, A);
        else if (base) a->d_res_a = a->d_res;
        TAKE(a->d_ln, t * C, A);
        TAKE(a->d_qkv, t * QKV, A);
        TAKE(a->d_att, t * Q, A);
        TAKE(a->d_gu, t * 2 * I, A);
        TAKE(a->d_act, t * I, A);
        if (cfg->qk_norm) TAKE(a->d_qkv_n, t * QKV, A);
        if (cfg->head != TR_HEAD_LM) {
            TAKE(a->d_head_out, t * N, F);
            TAKE(a->d_head_out_a, t * N, A);
        }
        if (base) a->d_lnf = a->d_ln;
    }
    if (tp->size > 1) {
        if (cfg->head == TR_HEAD_LM) TAKE(a->vp_stats, (size_t)tp->size * R * 4, sizeof(double));
        if (cfg->head == TR_HEAD_LM && training) TAKE(a->vp_mean, t, sizeof(double));
        if (tp->sp) {
            TAKE(a->sp_ln, t * C, A);
            TAKE(a->sp_red, t * C, F);
            // Backward's widened reductions never overlap sp_red's uses.
            if (base && training) a->tp_red = a->sp_red;
        } else if (training && act != TR_F32) {
            TAKE(a->tp_red, t * C, F);
        }
    }
#undef TAKE
    return off;
}

// The rank's shape from the options (size 0: the whole model).
static int opts_tp(const tr_model_config *cfg, const tr_model_opts *opts, tr_tp *tp, tr_err *err) {
    int32_t size = opts->tp_size > 0 ? opts->tp_size : 1;
    if (tr_tp_init(tp, cfg, size, size > 1 ? opts->tp_rank : 0, err) != 0) return -1;
    tp->sp = size > 1 && opts->sequence_parallel;
    return 0;
}

static int32_t opts_logit_rows(const tr_tp *tp, const tr_model_opts *opts) {
    int32_t R = opts->logit_rows > 0 ? opts->logit_rows : default_logit_rows(tp->vocab, opts->max_tokens);
    return R > opts->max_tokens ? opts->max_tokens : R;
}

int32_t tr_model_logit_rows(const tr_model_config *cfg, const tr_model_opts *opts) {
    tr_tp tp;
    tr_err err;
    return opts_tp(cfg, opts, &tp, &err) != 0 ? 0 : opts_logit_rows(&tp, opts);
}

size_t tr_model_arena_bytes(const tr_model_config *cfg, const tr_model_opts *opts, tr_dt act) {
    tr_tp tp;
    tr_err err;
    if (opts_tp(cfg, opts, &tp, &err) != 0) return 0;
    tr_model_config lc = tr_tp_local_config(cfg, &tp);
    tr_acts a;
    return layout_arena(&lc, &tp, opts->max_tokens, opts_logit_rows(&tp, opts), opts->training,
                        opts->recompute, act, NULL, &a);
}

size_t tr_model_acts_bytes(const tr_model *m, bool training) {
    tr_acts a;
    return layout_arena(&m->lcfg, &m->tp, m->max_tokens, m->logit_rows, training, m->recompute,
                        m->act, NULL, &a);
}

int tr_model_bind_acts(tr_model *m, void *base, size_t bytes, bool training, tr_err *err) {
    if (m->owns_arena)
        return tr_errf(err, TR_EINVAL, "model: its activation arena is its own; only a model "
                       "set up on the caller's memory (opts.acts) is laid out again");
    if (training && !m->training)
        return tr_errf(err, TR_EINVAL, "model: the training layout needs a model set up for "
                       "training");
    size_t need = tr_model_acts_bytes(m, training);
    if (!base || bytes < need || ((uintptr_t)base % 64) != 0)
        return tr_errf(err, TR_EINVAL, "model: %s activations of %d tokens need %zu bytes at a "
                       "64-byte boundary; the memory given has %zu%s",
                       training ? "training" : "inference", m->max_tokens, need, bytes,
                       base && ((uintptr_t)base % 64) != 0 ? " (misaligned)" : "");
    m->arena = base;
    m->arena_bytes = bytes;
    m->acts_training = training;
    m->logits_cached = false;
    layout_arena(&m->lcfg, &m->tp, m->max_tokens, m->logit_rows, training, m->recompute, m->act,
                 base, &m->acts);
    m->layer_held = -1;
    return 0;
}

static size_t float_bytes(size_t n) { return round_up((n ? n : 1) * sizeof(float)); }

// Outputs per token of the head: num_labels for a score head (a score per document, at most
// one document per token), else 1 (a logprob or a value).
static int32_t outputs_per_token(const tr_model_config *cfg) {
    return cfg->head == TR_HEAD_SCORE && cfg->num_labels > 1 ? cfg->num_labels : 1;
}

// The batch and head arrays in backend memory, laid out once; with base NULL it only counts.
static size_t layout_io(tr_model *m, char *base) {
    size_t T = (size_t)m->max_tokens, N = (size_t)outputs_per_token(&m->cfg), off = 0;
#define IO_TAKE(ptr, type, n)                                  \
    do {                                                       \
        if (base) (ptr) = (type *)(base + off);                \
        off += float_bytes(n);                                 \
    } while (0)
    IO_TAKE(m->d_ids, int32_t, T);
    IO_TAKE(m->d_pos, int32_t, T);
    IO_TAKE(m->d_doc_start, int32_t, T + 1);
    IO_TAKE(m->d_prefix, int32_t, T);
    IO_TAKE(m->d_emb_ids, int32_t, T);
    IO_TAKE(m->d_targets, int32_t, T);
    IO_TAKE(m->d_out, float, T * N);
    IO_TAKE(m->d_entropy, float, T);
    IO_TAKE(m->d_dout, float, T * N);
    IO_TAKE(m->d_dentropy, float, T);
#undef IO_TAKE
    return off;
}

// What the model's shapes and batch must satisfy on any backend.
static int check_shapes(const tr_model_config *cfg, const tr_model_opts *opts, tr_err *err) {
    if (opts->max_tokens < 1)
        return tr_errf(err, TR_EINVAL, "model: max_tokens must be >= 1, got %d",
                       opts->max_tokens);
    if (cfg->head_dim < 2 || cfg->head_dim % 2 != 0)
        return tr_errf(err, TR_EINVAL, "model: head_dim must be even, got %d", cfg->head_dim);
    if (cfg->n_kv_heads < 1 || cfg->n_heads % cfg->n_kv_heads != 0)
        return tr_errf(err, TR_EINVAL, "model: num_attention_heads %d is not a multiple of "
                       "num_key_value_heads %d", cfg->n_heads, cfg->n_kv_heads);
    if (cfg->head != TR_HEAD_LM && head_width(cfg) < 1)
        return tr_errf(err, TR_EINVAL, "model: num_labels must be >= 1, got %d",
                       cfg->num_labels);
    return 0;
}

// The model's backend memory (weights, gradients, batch arrays, pinned decode rows, scratch
// and the activation arena unless the caller lends one); -1 with err naming the buffer.
static int alloc_device(tr_model *m, tr_backend *be, const tr_model_opts *opts, tr_err *err) {
    size_t pbytes = float_bytes(m->layout.total);
    int rc = 0;
    // fp32 masters for a model that trains, or when they are the working weights; a bf16
    // working copy beside them (or alone, for a model that never trains), unless the caller
    // binds its own.
    m->external_work = opts->external_work;
    if ((m->training || (m->wt == TR_F32 && !m->external_work)) &&
        !(m->params = tr_dev_zalloc(be, pbytes, "model parameters (fp32 masters)", err)))
        rc = -1;
    if (!rc && m->external_work) m->work = NULL;
    else if (!rc && m->wt == TR_F32) m->work = m->params;
    else if (!rc && !(m->work = tr_dev_zalloc(be, round_up(m->layout.total * tr_dt_size(m->wt)),
                                              "model working weights", err)))
        rc = -1;
    if (!rc && m->training && !(m->grads = tr_dev_zalloc(be, pbytes, "model gradients", err)))
        rc = -1;
    if (!rc && !(m->inv_freq = tr_dev_alloc(be, float_bytes((size_t)m->cfg.head_dim / 2),
                                            "RoPE frequencies", err)))
        rc = -1;
    if (!rc && !(m->io = tr_dev_alloc(be, layout_io(m, NULL), "batch arrays", err))) rc = -1;
    size_t emb_bytes = m->training ? be->ops->embedding_scratch_bytes(be, m->max_tokens) : 0;
    if (!rc && emb_bytes > 0 &&
        !(m->emb_scratch = tr_dev_alloc(be, emb_bytes, "embedding backward scratch", err)))
        rc = -1;
    for (int32_t i = 0; m->training && i < m->layout.n_tensors; i++)
        m->grad_sum_n += (size_t)m->layout.tensors[i].grad_slots * m->layout.tensors[i].numel;
    if (!rc && m->grad_sum_n > 0 &&
        !(m->grad_sum = tr_dev_alloc(be, float_bytes(m->grad_sum_n), "tensor-parallel gradient "
                                     "sums", err)))
        rc = -1;
    if (!rc && opts->acts) {
        m->arena = opts->acts;
        m->arena_bytes = opts->acts_bytes;
    } else if (!rc) {
        m->arena = tr_dev_alloc(be, m->arena_bytes ? m->arena_bytes : 64, "activation arena", err);
        m->owns_arena = m->arena != NULL;
        if (!m->arena) rc = -1;
    }
    return rc;
}

int tr_model_init(tr_model *m, const tr_model_config *cfg, tr_backend *be,
                  const tr_model_opts *opts, tr_err *err) {
    memset(m, 0, sizeof *m);
    if (check_shapes(cfg, opts, err) != 0) return -1;
    if (opts_tp(cfg, opts, &m->tp, err) != 0) return tr_err_wrap(err, "model");
    m->cfg = *cfg;
    m->lcfg = tr_tp_local_config(cfg, &m->tp);
    m->be = be;
    m->training = opts->training;
    m->max_tokens = opts->max_tokens;
    m->recompute = opts->training && opts->recompute;
    m->layer_held = -1;
    m->logit_rows = opts_logit_rows(&m->tp, opts);
    if (tr_param_layout_init_tp(&m->layout, cfg, &m->tp, err) != 0) return tr_err_wrap(err, "model");

    const int32_t L = cfg->n_layers;
    m->act = be->act;
    m->wt = be->wt;
    m->qkv_ld = (m->lcfg.n_heads + 2 * m->lcfg.n_kv_heads) * cfg->head_dim;
    m->arena_bytes = layout_arena(&m->lcfg, &m->tp, m->max_tokens, m->logit_rows, m->training,
                                  m->recompute, m->act, NULL, &m->acts);
    if (opts->acts && (opts->acts_bytes < m->arena_bytes || ((uintptr_t)opts->acts % 64) != 0)) {
        size_t need = m->arena_bytes;
        tr_param_layout_free(&m->layout);
        return tr_errf(err, TR_EINVAL, "model: %s activations of %d tokens need %zu bytes at a "
                       "64-byte boundary; the memory given has %zu%s",
                       opts->training ? "training" : "inference", opts->max_tokens, need,
                       opts->acts_bytes,
                       ((uintptr_t)opts->acts % 64) != 0 ? " (misaligned)" : "");
    }
    // Host bookkeeping first, then backend memory: the failure message names the buffer.
    m->acts.residual = calloc((size_t)L + 1, sizeof(float *));
    m->acts.layers = calloc((size_t)(L > 0 ? L : 1), sizeof(tr_layer_acts));
    m->ids = malloc((size_t)m->max_tokens * sizeof(int32_t));
    m->pos = malloc((size_t)m->max_tokens * sizeof(int32_t));
    m->doc_start = malloc(((size_t)m->max_tokens + 1) * sizeof(int32_t));
    m->prefix = malloc((size_t)m->max_tokens * sizeof(int32_t));
    m->host_rows = malloc((size_t)m->max_tokens * sizeof(int32_t));
    m->emb_ids = malloc((size_t)m->max_tokens * sizeof(int32_t));
    double *inv = malloc((size_t)cfg->head_dim / 2 * sizeof(double));
    float *inv_f = malloc((size_t)cfg->head_dim / 2 * sizeof(float));
    if (!m->acts.residual || !m->acts.layers || !m->ids || !m->pos || !m->doc_start ||
        !m->prefix || !m->host_rows || !m->emb_ids || !inv || !inv_f) {
        free(inv);
        free(inv_f);
        tr_model_free(m);
        return tr_errf(err, TR_ENOMEM, "model: out of host memory for %d-token batches",
                       opts->max_tokens);
    }
    tr_config_rope_inv_freq(cfg, inv);
    for (int32_t i = 0; i < cfg->head_dim / 2; i++) inv_f[i] = (float)inv[i];
    free(inv);
    int rc = alloc_device(m, be, opts, err);
    if (!rc) {
        layout_io(m, m->io);
        be->ops->upload(be, m->inv_freq, inv_f, (size_t)cfg->head_dim / 2 * sizeof(float));
        rc = tr_dev_sync(be, "model set-up", err);
    }
    free(inv_f);
    if (rc != 0) {
        tr_model_free(m);
        return tr_err_wrap(err, "model");
    }
    m->acts_training = m->training;
    layout_arena(&m->lcfg, &m->tp, m->max_tokens, m->logit_rows, m->training, m->recompute,
                 m->act, m->arena, &m->acts);
    if ((m->work && tr_params_views(&m->w, &m->layout, cfg, m->work, tr_dt_size(m->wt), err) != 0) ||
        (m->grads &&
         tr_params_views(&m->g, &m->layout, cfg, m->grads, sizeof(float), err) != 0)) {
        tr_model_free(m);
        return tr_err_wrap(err, "model");
    }
    m->docs.doc_start = m->d_doc_start;
    m->docs.pos = m->d_pos;
    m->host_docs.doc_start = m->doc_start;
    m->host_docs.pos = m->pos;
    return 0;
}

void tr_model_free(tr_model *m) {
    tr_params_free_views(&m->w);
    tr_params_free_views(&m->g);
    tr_param_layout_free(&m->layout);
    if (m->be) {
        if (m->work != m->params && !m->external_work) tr_dev_free(m->be, m->work);
        tr_dev_free(m->be, m->params);
        tr_dev_free(m->be, m->grads);
        tr_dev_free(m->be, m->inv_freq);
        tr_dev_free(m->be, m->io);
        tr_dev_free(m->be, m->emb_scratch);
        tr_dev_free(m->be, m->grad_sum);
        if (m->owns_arena) tr_dev_free(m->be, m->arena);
    }
    free(m->acts.residual);
    free(m->acts.layers);
    free(m->ids);
    free(m->pos);
    free(m->doc_start);
    free(m->prefix);
    free(m->host_rows);
    free(m->emb_ids);
    memset(m, 0, sizeof *m);
}

int tr_model_set_tp_comm(tr_model *m, tr_comm *comm, tr_err *err) {
    if (m->tp.size < 2)
        return tr_errf(err, TR_EINVAL, "model: set up without tensor parallelism (tp_size 1)");
    if (tr_comm_world(comm) != m->tp.size || tr_comm_rank(comm) != m->tp.rank)
        return tr_errf(err, TR_EINVAL, "model: tensor-parallel rank %d of %d, the communicator's "
                       "rank is %d of %d", m->tp.rank, m->tp.size, tr_comm_rank(comm),
                       tr_comm_world(comm));
    m->tp_comm = comm;
    return 0;
}

int tr_model_load(tr_model *m, const char *dir, tr_backend *be, const tr_model_opts *opts,
                  tr_err *err) {
    tr_model_config cfg;
    memset(m, 0, sizeof *m);
    if (tr_checkpoint_load_config(dir, &cfg, err) != 0) return -1;
    if (tr_model_init(m, &cfg, be, opts, err) != 0) return tr_err_wrap(err, "%s", dir);
    if (tr_model_load_weights(m, dir, false, err) != 0) {
        tr_model_free(m);
        return -1;
    }
    return 0;
}

// Pinned host memory of the parameter buffer's size (fp32), for checkpoint I/O.
static float *param_staging(tr_model *m, const char *what, tr_err *err) {
    return tr_dev_alloc_host(m->be, m->layout.total * sizeof(float), what, err);
}

int tr_model_bind_work(tr_model *m, void *work, tr_err *err) {
    if (!m->external_work || !work)
        return tr_errf(err, TR_EINVAL, "model: working weights are bound only to a model made with external_work");
    tr_params_free_views(&m->w);
    m->work = work;
    return tr_params_views(&m->w, &m->layout, &m->cfg, work, tr_dt_size(m->wt), err);
}

int tr_model_refresh_work(tr_model *m, tr_err *err) {
    if (m->work == m->params) return 0;
    if (!m->params) return tr_errf(err, TR_EINVAL, "model: no fp32 masters to refresh from");
    if (!m->work) return tr_errf(err, TR_EINVAL, "model: no working weights bound (external_work)");
    m->be->ops->convert(m->be, m->work, m->wt, m->params, TR_F32, m->layout.total);
    return tr_dev_sync(m->be, "working weights", err);
}

// A model without masters (bf16, never trains) loads each tensor's file bytes raw into a
// device scratch and converts them on the device into the working copy: no fp32 copy of the
// weights on the host, and the file's bf16 arrives as it is. Chunks bound the scratch.
#define RAW_CHUNK_BYTES ((size_t)64 << 20)
typedef struct raw_load {
    tr_model *m;
    void *tmp;
} raw_load;

static int raw_tensor(void *ctx, const tr_tensor_desc *d, const void *data, enum tr_st_dtype st,
                      tr_err *err) {
    raw_load *r = ctx;
    tr_model *m = r->m;
    tr_dt dt = st == TR_ST_BF16 ? TR_BF16 : st == TR_ST_F16 ? TR_F16 : TR_F32;
    size_t es = tr_dt_size(dt), ws = tr_dt_size(m->wt), per = RAW_CHUNK_BYTES / es;
    void *part = NULL;
    if (d->split != TR_SPLIT_NONE) {   // a tensor-parallel rank's slice of the file's tensor
        if (!(part = malloc(d->numel * es)))
            return tr_errf(err, TR_ENOMEM, "loading '%s': out of memory", d->name);
        tr_tensor_slice(d, data, es, part);
        data = part;
    }
    for (size_t off = 0; off < d->numel; off += per) {
        size_t n = d->numel - off < per ? d->numel - off : per;
        m->be->ops->upload(m->be, r->tmp, (const char *)data + off * es, n * es);
        m->be->ops->convert(m->be, (char *)m->work + (d->offset + off) * ws, m->wt, r->tmp, dt, n);
    }
    // The upload reads the mapped file until the next sync, and the loader unmaps it after.
    int rc = tr_dev_sync(m->be, "loading weights", err);
    free(part);
    return rc;
}

static int load_raw(tr_model *m, const char *dir, bool backbone, tr_err *err) {
    raw_load r = {.m = m, .tmp = tr_dev_alloc(m->be, RAW_CHUNK_BYTES, "checkpoint scratch", err)};
    if (!r.tmp) return -1;
    int rc = tr_checkpoint_load_to(dir, &m->cfg, &m->layout, backbone, raw_tensor, &r, err);
    tr_dev_free(m->be, r.tmp);
    return rc;
}

int tr_model_load_weights(tr_model *m, const char *dir, bool backbone, tr_err *err) {
    if (!m->params) return load_raw(m, dir, backbone, err);
    float *buf = param_staging(m, "checkpoint staging", err);
    if (!buf) return -1;
    int rc = 0;
    // A backbone load leaves the heads as they are, so the staging starts from the model.
    if (backbone) rc = tr_model_read_params(m, buf, err);
    if (!rc) rc = backbone ? tr_checkpoint_load_backbone(dir, &m->cfg, &m->layout, buf, err)
                           : tr_checkpoint_load(dir, &m->cfg, &m->layout, buf, err);
    if (!rc) rc = tr_model_write_params(m, buf, err);
    tr_dev_free_host(m->be, buf);
    return rc;
}

int tr_model_save(tr_model *m, const char *dir, const tr_ckpt_save_opts *opts, tr_err *err) {
    if (m->tp.size > 1) return tr_model_save_gathered(m, dir, opts, err);
    float *buf = param_staging(m, "checkpoint staging", err);
    if (!buf) return -1;
    int rc = tr_model_read_params(m, buf, err);
    if (!rc) rc = tr_checkpoint_save(dir, &m->cfg, &m->layout, buf, opts, err);
    tr_dev_free_host(m->be, buf);
    return rc;
}

int tr_model_read_params(tr_model *m, float *host, tr_err *err) {
    if (m->params)
        return tr_dev_download_sync(m->be, host, m->params, m->layout.total * sizeof(float),
                                    "reading parameters", err);
    return tr_dev_download_as_f32(m->be, host, m->work, m->wt, m->layout.total,
                                  "reading parameters", err);
}

int tr_model_write_params(tr_model *m, const float *host, tr_err *err) {
    if (!m->params)
        return tr_dev_upload_as(m->be, m->work, m->wt, host, m->layout.total,
                                "writing parameters", err);
    if (tr_dev_upload_sync(m->be, m->params, host, m->layout.total * sizeof(float),
                           "writing parameters", err) != 0)
        return -1;
    return tr_model_refresh_work(m, err);
}

// An element-wise copy needs the same tensors at the same places: names, slices and offsets.
static bool same_layout(const tr_param_layout *a, const tr_param_layout *b) {
    if (a->total != b->total || a->n_tensors != b->n_tensors || a->tp.size != b->tp.size ||
        a->tp.rank != b->tp.rank)
        return false;
    for (int32_t i = 0; i < a->n_tensors; i++) {
        const tr_tensor_desc *x = &a->tensors[i], *y = &b->tensors[i];
        if (x->offset != y->offset || x->numel != y->numel || x->begin != y->begin ||
            strcmp(x->name, y->name) != 0)
            return false;
    }
    return true;
}

bool tr_model_can_copy_weights(const tr_model *dst, const tr_model *src) {
    return dst != src && same_layout(&dst->layout, &src->layout) && (!dst->params || src->params) &&
           (dst->work || dst->params);
}

int tr_model_copy_weights(tr_model *dst, const tr_model *src, tr_err *err) {
    if (!tr_model_can_copy_weights(dst, src))
        return tr_errf(err, TR_EINVAL, "copying weights: the models lay out other tensors or "
                       "slices, or masters would come from a model without them");
    const tr_ops *op = dst->be->ops;
    const size_t n = dst->layout.total;
    if (dst->params) {
        op->convert(dst->be, dst->params, TR_F32, src->params, TR_F32, n);
        if (tr_dev_sync(dst->be, "copying weights", err) != 0) return -1;
        return tr_model_refresh_work(dst, err);
    }
    // A load rounds the checkpoint's values into the working weights once: from src's masters
    // (the values it loaded, exactly), or from its working weights when they are the same dtype.
    if (src->params) op->convert(dst->be, dst->work, dst->wt, src->params, TR_F32, n);
    else if (src->wt == dst->wt) op->convert(dst->be, dst->work, dst->wt, src->work, src->wt, n);
    else return tr_errf(err, TR_EINVAL, "copying weights: no masters, and working weights of another dtype");
    return tr_dev_sync(dst->be, "copying weights", err);
}

int tr_model_read_grads(tr_model *m, float *host, tr_err *err) {
    if (!m->grads) return tr_errf(err, TR_EINVAL, "model: no gradients (not set up for training)");
    return tr_dev_download_sync(m->be, host, m->grads, m->layout.total * sizeof(float),
                                "reading gradients", err);
}

size_t tr_model_n_params(const tr_model *m) {
    // layout.total includes the alignment padding between tensors; count real elements, of
    // the whole tensors when this rank holds slices.
    size_t n = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) n += m->layout.tensors[i].full_numel;
    return n;
}

double tr_model_forward_flops(const tr_model_config *c, const tr_doc_layout *docs) {
    double d = c->hidden_size, qkv = (double)(c->n_heads + 2 * c->n_kv_heads) * c->head_dim;
    double layer = d * qkv + (double)c->n_heads * c->head_dim * d + 3.0 * d * c->intermediate_size;
    double head = c->head == TR_HEAD_LM ? (double)c->vocab_size * d
                  : c->head == TR_HEAD_SCORE ? (double)c->num_labels * d : d;
    double pairs = 0;   // (query, key) pairs over the batch
    for (int32_t e = 0; e < docs->n_docs; e++) {
        double n = docs->doc_start[e + 1] - docs->doc_start[e], pl = 0;
        int32_t p = docs->prefix ? docs->prefix[e] : -1;
        if (p >= 0) pl = docs->doc_start[p + 1] - docs->doc_start[p];
        pairs += n * pl + n * (n + 1) / 2;
    }
    return 2.0 * docs->n_tokens * (c->n_layers * layer + head) +
           4.0 * c->n_layers * (double)c->n_heads * c->head_dim * pairs;
}

// n normals times std into p from rng's position, in pieces on up to TR_INIT_THREADS threads:
// each piece seeks to its own draws (two words each), so the values are the sequential ones
// and do not depend on the thread count. A 1.5B-parameter model is 1.5e9 draws of a log and a
// cosine: a minute on one core.
#define TR_INIT_THREADS 16
#define TR_INIT_PIECE ((size_t)1 << 20)

typedef struct init_piece {
    float *p;
    size_t n;
    tr_rng rng;
    float std;
} init_piece;

static void *init_piece_run(void *arg) {
    init_piece *c = arg;
    for (size_t j = 0; j < c->n; j++) c->p[j] = c->std * tr_rng_normal(&c->rng);
    return NULL;
}

static void draw_normals(float *p, size_t n, tr_rng *rng, float std) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    size_t k = n / TR_INIT_PIECE;
    if (k > (size_t)(cores > 0 ? cores : 1)) k = (size_t)(cores > 0 ? cores : 1);
    if (k > TR_INIT_THREADS) k = TR_INIT_THREADS;
    init_piece pieces[TR_INIT_THREADS];
    pthread_t threads[TR_INIT_THREADS];
    bool started[TR_INIT_THREADS] = {false};
    uint64_t w0 = tr_rng_position(rng);
    size_t per = k > 1 ? (n + k - 1) / k : n;
    for (size_t t = 0; t < (k > 1 ? k : 1); t++) {
        size_t b = t * per, e = b + per < n ? b + per : n;
        pieces[t] = (init_piece){.p = p + b, .n = e > b ? e - b : 0, .rng = *rng, .std = std};
        tr_rng_seek(&pieces[t].rng, w0 + 2 * (uint64_t)b);
        // A thread that cannot start leaves its piece to this one, below.
        if (t > 0) started[t] = pthread_create(&threads[t], NULL, init_piece_run, &pieces[t]) == 0;
    }
    init_piece_run(&pieces[0]);
    for (size_t t = 1; t < k; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        else init_piece_run(&pieces[t]);
    }
    tr_rng_seek(rng, w0 + 2 * (uint64_t)n);
}

int tr_model_init_weights(tr_model *m, uint64_t seed, float std, tr_err *err) {
    float *buf = param_staging(m, "initial weights", err);
    if (!buf) return -1;
    memset(buf, 0, m->layout.total * sizeof(float));
    // Whole tensors are drawn in order and a tensor-parallel rank keeps its slices, so every
    // tensor-parallel size starts from the same weights.
    size_t most = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++)
        if (m->layout.tensors[i].full_numel > most) most = m->layout.tensors[i].full_numel;
    float *whole = m->tp.size > 1 ? malloc(most * sizeof(float)) : NULL;
    if (m->tp.size > 1 && !whole) {
        tr_dev_free_host(m->be, buf);
        return tr_errf(err, TR_ENOMEM, "initial weights: out of memory");
    }
    tr_rng rng;
    tr_rng_init(&rng, seed);
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        const tr_tensor_desc *t = &m->layout.tensors[i];
        float *p = t->split != TR_SPLIT_NONE ? whole : buf + t->offset;
        size_t n = t->full_numel;
        size_t len = strlen(t->name);
        bool is_norm = len >= 11 && strcmp(t->name + len - 11, "norm.weight") == 0;
        bool is_bias = len >= 5 && strcmp(t->name + len - 5, ".bias") == 0;
        if (is_norm || is_bias)
            for (size_t j = 0; j < n; j++) p[j] = is_norm ? 1.0f : 0.0f;
        else
            draw_normals(p, n, &rng, std);
        if (t->split != TR_SPLIT_NONE) tr_tensor_slice(t, whole, sizeof(float), buf + t->offset);
    }
    free(whole);
    int rc = tr_model_write_params(m, buf, err);
    tr_dev_free_host(m->be, buf);
    return rc;
}

void tr_model_zero_grad(tr_model *m) {
    if (m->grads) m->be->ops->fill(m->be, m->grads, 0.0f, m->layout.total);
}


static int check_batch(const tr_model *m, const int32_t *ids, const tr_doc_layout *docs,
                       tr_err *err) {
    int32_t T = docs->n_tokens, V = m->cfg.vocab_size;
    if (T < 1 || T > m->max_tokens)
        return tr_errf(err, TR_ERANGE, "model forward: %d tokens, the model was set up for "
                       "1..%d per micro-batch", T, m->max_tokens);
    if (docs->n_docs < 1 || docs->n_docs > T)
        return tr_errf(err, TR_EINVAL, "model forward: %d documents for %d tokens",
                       docs->n_docs, T);
    if (docs->doc_start[0] != 0 || docs->doc_start[docs->n_docs] != T)
        return tr_errf(err, TR_EINVAL, "model forward: documents must cover tokens 0..%d "
                       "(doc_start[0] = %d, doc_start[%d] = %d)", T, docs->doc_start[0],
                       docs->n_docs, docs->doc_start[docs->n_docs]);
    for (int32_t d = 0; d < docs->n_docs; d++)
        if (docs->doc_start[d + 1] <= docs->doc_start[d])
            return tr_errf(err, TR_EINVAL, "model forward: document %d is empty or out of "
                           "order (starts at %d, next at %d)", d, docs->doc_start[d],
                           docs->doc_start[d + 1]);
    for (int32_t d = 0; docs->prefix && d < docs->n_docs; d++) {
        int32_t p = docs->prefix[d];
        if (p < -1 || p >= d || (p >= 0 && docs->prefix[p] != -1) ||
            (p >= 0 && p != d - 1 && docs->prefix[d - 1] != p))
            return tr_errf(err, TR_EINVAL, "model forward: document %d has prefix %d; a prefix "
                           "is an earlier document without one, and the documents sharing it "
                           "follow it directly", d, p);
    }
    for (int32_t t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= V)
            return tr_errf(err, TR_ERANGE, "model forward: token %d has id %d, outside the "
                           "vocabulary [0, %d)", t, ids[t], V);
        if (docs->pos[t] < 0)
            return tr_errf(err, TR_EINVAL, "model forward: token %d has position %d", t,
                           docs->pos[t]);
    }
    return 0;
}

// Rows of the residual stream (and of the norms' outputs) this rank holds in the current
// batch of T: all of them, or its part under sequence parallelism.
static int32_t seq_rows(const tr_model *m, int32_t T) { return m->tp.sp ? m->sp_rows : T; }

// Row r of an activation-dtype [.., C] buffer.
static void *act_row(const tr_model *m, void *p, int32_t r) {
    return offset_bytes(p, act_bytes(m, (size_t)r * m->cfg.hidden_size));
}

// Under sequence parallelism the ranks' parts of a row-parallel projection are
// reduce-scattered, and each rank adds the sums of its rows to its rows of the residual x
// afterwards; rank 0's part carries the bias. x cannot start rank 0's part as it does
// without sequence parallelism: which rank holds a row depends on the batch's length, and a
// row's bits must not (a rollout's logprobs are training's, bit for bit).
static int row_parallel_sp(tr_model *m, float *out, const float *x, const void *in,
                           const void *w, const void *bias, int32_t T, int32_t IC, int32_t OC,
                           tr_err *err) {
    const tr_ops *op = m->be->ops;
    float *part = m->acts.sp_red;
    op->matmul_forward(m->be, part, in, w, m->tp.rank == 0 ? bias : NULL, T, IC, OC,
                       TR_MM_OUT_F32);
    if (tr_model_sp_scatter(m, part, T, err) != 0) return -1;
    if (m->sp_rows > 0)
        op->add(m->be, out, x, part + (size_t)m->sp_row0 * OC, (size_t)m->sp_rows * OC);
    return 0;
}

// A row-parallel projection into the residual stream: out = x + in @ w^T + bias. Each rank
// holds w's columns for its part of in; rank 0 starts from x and adds the bias (once), the
// others from zero, and the all-reduce sums the parts (rank 0 first: every rank gets the
// same bits). Without tensor parallelism it is one GEMM reading x and writing out.
static int row_parallel(tr_model *m, float *out, const float *x, const void *in, const void *w,
                        const void *bias, int32_t T, int32_t IC, int32_t OC, tr_err *err) {
    const tr_ops *op = m->be->ops;
    if (m->tp.sp) return row_parallel_sp(m, out, x, in, w, bias, T, IC, OC, err);
    if (m->tp.rank == 0) {
        op->matmul_forward_add(m->be, out, x, in, w, bias, T, IC, OC);
    } else {
        op->matmul_forward(m->be, out, in, w, NULL, T, IC, OC, TR_MM_OUT_F32);
    }
    return tr_model_tp_sum(m, out, (size_t)T * OC, err);
}

// The vocab-parallel embedding into residual[0]: each rank its vocabulary's rows (zeros for
// other ranks' ids), summed over the group, or under sequence parallelism reduce-scattered
// into each rank's rows.
static int embed_forward(tr_model *m, int32_t T, tr_err *err) {
    const tr_ops *op = m->be->ops;
    const int32_t C = m->cfg.hidden_size;
    tr_acts *a = &m->acts;
    const int32_t *ids = m->tp.size > 1 ? m->d_emb_ids : m->d_ids;
    if (!m->tp.sp) {
        op->embedding_forward(m->be, a->residual[0], ids, m->w.embed, T, C);
        return tr_model_tp_sum(m, a->residual[0], (size_t)T * C, err);
    }
    op->embedding_forward(m->be, a->sp_red, ids, m->w.embed, T, C);
    if (tr_model_sp_scatter(m, a->sp_red, T, err) != 0) return -1;
    if (m->sp_rows > 0)
        op->copy(m->be, a->residual[0], a->sp_red + (size_t)m->sp_row0 * C,
                 (size_t)m->sp_rows * C * sizeof(float));
    return 0;
}

// A norm of the residual stream ahead of a column-parallel projection: out and rstd for the
// rank's rows of x. Returns the projection's input over all T rows: out, or under sequence
// parallelism every rank's rows of out gathered into acts.sp_ln (NULL when that failed).
static const void *norm_forward(tr_model *m, void *out, float *rstd, const float *x,
                                const void *w, int32_t T, tr_err *err) {
    const int32_t n = seq_rows(m, T);
    if (n > 0)
        m->be->ops->rmsnorm_forward(m->be, out, rstd, x, w, m->cfg.rms_norm_eps, n,
                                    m->cfg.hidden_size);
    if (!m->tp.sp) return out;
    return tr_model_sp_gather(m, m->acts.sp_ln, out, m->act, T, err) != 0 ? NULL : m->acts.sp_ln;
}

// The final norm: lnf, the heads' input, holds every row (gathered from the ranks' rows
// under sequence parallelism, each rank writing its rows in place).
static int final_norm_forward(tr_model *m, int32_t T, tr_err *err) {
    tr_acts *a = &m->acts;
    const int32_t row0 = m->tp.sp ? m->sp_row0 : 0, n = seq_rows(m, T);
    void *mine = act_row(m, a->lnf, row0);
    if (n > 0)
        m->be->ops->rmsnorm_forward(m->be, mine, a->lnf_rstd, a->residual[m->cfg.n_layers],
                                    m->w.final_norm, m->cfg.rms_norm_eps, n, m->cfg.hidden_size);
    return m->tp.sp ? tr_model_sp_gather(m, a->lnf, mine, m->act, T, err) : 0;
}

// Inference brings a layer's weights into the device's cache ahead of their products (the
// prefetch op, a hint that changes no result; off unless the backend has it on): o and
// gate/up at the layer's start, while its norm, qkv and attention leave memory mostly idle,
// then down and the next layer's qkv as its MLP starts. rows x cols working weights at w.
static void prefetch_weights(tr_model *m, const void *w, int32_t rows, int32_t cols) {
    if (!m->acts_training && m->be->ops->prefetch)
        m->be->ops->prefetch(m->be, w, (size_t)rows * (size_t)cols * tr_dt_size(m->wt));
}

// Layer l over the T rows of the current batch, from residual[l]: attention is the only
// step that differs between training (causal over packed documents) and generation (over the
// paged KV cache), so it is the callback; everything else is this one code path. Shapes are
// the rank's (lcfg): its heads and intermediate channels. Without `out` the down projection
// into residual[l + 1] is left out: a recompute for the backward needs everything before it.
static int layer_forward(tr_model *m, int32_t l, int32_t T, tr_attend_fn attend, void *ctx,
                         bool out, tr_err *err) {
    const tr_ops *op = m->be->ops;
    tr_backend *be = m->be;
    const tr_model_config *c = &m->lcfg;
    const int32_t C = c->hidden_size, I = c->intermediate_size;
    const int32_t H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    const int32_t Q = H * D, QKV = m->qkv_ld;
    tr_acts *a = &m->acts;
    const tr_layer_params *w = &m->w.layers[l];
    tr_layer_acts *la = &a->layers[l];
    const float *x = a->residual[l];
    prefetch_weights(m, w->wo, C, Q);
    prefetch_weights(m, w->w_gu, 2 * I, C);
    const void *in = norm_forward(m, la->ln1, la->ln1_rstd, x, w->attn_norm, T, err);
    if (!in) return -1;
    op->matmul_forward(be, la->qkv, in, w->wqkv, w->bqkv, T, C, QKV, 0);
    // With QK-norm each head's D values of q and k are normed into qkv_n; v stays put.
    if (c->qk_norm) {
        op->head_rmsnorm_forward(be, la->q, la->q_rstd, la->qkv, w->q_norm, c->rms_norm_eps,
                                 T, H, D, QKV);
        op->head_rmsnorm_forward(be, la->k, la->k_rstd, offset_bytes(la->qkv, act_bytes(m, Q)),
                                 w->k_norm, c->rms_norm_eps, T, KVH, D, QKV);
    }
    attend(ctx, m, l, la, T);   // RoPE included (generation fuses it with the cache write)
    // The projections back into the residual stream add into it in fp32.
    if (row_parallel(m, la->res_mid, x, la->att, w->wo, w->bo, T, Q, C, err) != 0) return -1;
    prefetch_weights(m, w->w_down, C, I);
    if (l + 1 < c->n_layers) prefetch_weights(m, m->w.layers[l + 1].wqkv, QKV, C);
    if (!(in = norm_forward(m, la->ln2, la->ln2_rstd, la->res_mid, w->mlp_norm, T, err)))
        return -1;
    if (!m->acts_training && op->matmul_swiglu_forward) {   // nothing reads gu again
        op->matmul_swiglu_forward(be, la->act, la->gu, in, w->w_gu, T, C, I);
    } else {
        op->matmul_forward(be, la->gu, in, w->w_gu, NULL, T, C, 2 * I, 0);
        op->swiglu_forward(be, la->act, la->gu, T, I);
    }
    if (!out) return 0;
    return row_parallel(m, a->residual[l + 1], la->res_mid, la->act, w->w_down, NULL, T, I, C,
                        err);
}

// The layer stack over the T rows already copied into m->ids / m->pos.
static int trunk_forward(tr_model *m, int32_t T, tr_attend_fn attend, void *ctx, tr_err *err) {
    const int32_t L = m->lcfg.n_layers;
    if (embed_forward(m, T, err) != 0) return -1;
    for (int32_t l = 0; l < L; l++)
        if (layer_forward(m, l, T, attend, ctx, true, err) != 0) return -1;
    // The one set now holds the top layer: its backward needs no recompute.
    m->layer_held = m->acts_training && m->recompute ? L - 1 : -1;
    return final_norm_forward(m, T, err);
}

static void attend_docs(void *ctx, tr_model *m, int32_t layer, tr_layer_acts *la, int32_t T) {
    (void)ctx;
    (void)layer;
    const tr_model_config *c = &m->lcfg;
    // k's heads follow q's in the row: one pass rotates both.
    m->be->ops->rope_forward(m->be, la->q, m->qkv_ld, m->d_pos, m->inv_freq, T,
                             c->n_heads + c->n_kv_heads, c->head_dim);
    m->be->ops->attention_forward(m->be, la->att, la->att_lse, la->q, la->k, la->v, m->qkv_ld,
                                  &m->docs, c->n_heads, c->n_kv_heads, c->head_dim);
}

// The batch the host arrays hold (ids, m->pos, m->doc_start; ids NULL: rows the device
// writes, tr_model_rows_prepare) becomes the current one: sizes and the host side ...
static void batch_host(tr_model *m, const int32_t *ids, int32_t T, int32_t n_docs, bool shared) {
    if (m->tp.size > 1 && ids) {   // the ids as rows of this rank's embedding
        for (int32_t t = 0; t < T; t++) {
            int32_t r = ids[t] - m->tp.vocab0;
            m->emb_ids[t] = r >= 0 && r < m->tp.vocab ? r : -1;
        }
    }
    m->docs.prefix = shared ? m->d_prefix : NULL;
    m->host_docs.prefix = shared ? m->prefix : NULL;
    if (m->tp.sp) {
        m->sp_row0 = tr_tp_seq_begin(T, m->tp.size, m->tp.rank);
        m->sp_rows = tr_tp_seq_begin(T, m->tp.size, m->tp.rank + 1) - m->sp_row0;
    }
    m->docs.n_tokens = m->host_docs.n_tokens = T;
    m->docs.n_docs = m->host_docs.n_docs = n_docs;
    m->logits_cached = false;
    m->layer_held = -1;
}

// ... and the copies the ops read, queued.
static void batch_upload(tr_model *m, const int32_t *ids, const int32_t *pos, const int32_t *doc_start,
                         int32_t T, int32_t n_docs, bool shared) {
    const tr_ops *op = m->be->ops;
    op->upload(m->be, m->d_ids, ids, (size_t)T * sizeof(int32_t));
    if (m->tp.size > 1) op->upload(m->be, m->d_emb_ids, m->emb_ids, (size_t)T * sizeof(int32_t));
    op->upload(m->be, m->d_pos, pos, (size_t)T * sizeof(int32_t));
    op->upload(m->be, m->d_doc_start, doc_start, ((size_t)n_docs + 1) * sizeof(int32_t));
    if (shared) op->upload(m->be, m->d_prefix, m->prefix, (size_t)n_docs * sizeof(int32_t));
}

static void set_batch(tr_model *m, int32_t T, int32_t n_docs, bool shared) {
    batch_host(m, m->ids, T, n_docs, shared);
    batch_upload(m, m->ids, m->pos, m->doc_start, T, n_docs, shared);
}

// A model on a lent arena runs only inside a phase begun for it: another phase may have
// overwritten the region since its views were laid out (stale KV blocks, another model).
static int check_phase(const tr_model *m, tr_err *err) {
    const tr_arena *a = m->shared;
    if (!a || (a->holder == m && a->epoch == m->shared_epoch)) return 0;
    return tr_errf(err, TR_EINVAL, "model forward: the activation arena is %s; a phase must "
                   "be begun for this model first", a->holder == m ? "in a later phase"
                   : a->phase == TR_PHASE_IDLE ? "idle" : "lent to another holder");
}

int tr_model_forward(tr_model *m, const int32_t *ids, const tr_doc_layout *docs, tr_err *err) {
    if (check_phase(m, err) != 0 || check_batch(m, ids, docs, err) != 0) return -1;
    const int32_t T = docs->n_tokens;
    memcpy(m->ids, ids, (size_t)T * sizeof(int32_t));
    memcpy(m->pos, docs->pos, (size_t)T * sizeof(int32_t));
    memcpy(m->doc_start, docs->doc_start, ((size_t)docs->n_docs + 1) * sizeof(int32_t));
    if (docs->prefix) memcpy(m->prefix, docs->prefix, (size_t)docs->n_docs * sizeof(int32_t));
    set_batch(m, T, docs->n_docs, docs->prefix != NULL);
    return trunk_forward(m, T, attend_docs, NULL, err);
}

// Whether a pass of T generation rows may run now.
static int rows_check(tr_model *m, int32_t T, tr_err *err) {
    if (check_phase(m, err) != 0) return -1;
    if (T < 1 || T > m->max_tokens)
        return tr_errf(err, TR_ERANGE, "model forward: %d rows, the model was set up for "
                       "1..%d per pass", T, m->max_tokens);
    return 0;
}

// Checks generation's rows and copies them into m->ids, m->pos (each row its own document).
static int rows_fill(tr_model *m, const int32_t *ids, const int32_t *pos, int32_t T,
                     tr_err *err) {
    if (rows_check(m, T, err) != 0) return -1;
    for (int32_t t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= m->cfg.vocab_size)
            return tr_errf(err, TR_ERANGE, "model forward: row %d has id %d, outside the "
                           "vocabulary [0, %d)", t, ids[t], m->cfg.vocab_size);
        if (pos[t] < 0)
            return tr_errf(err, TR_EINVAL, "model forward: row %d has position %d", t, pos[t]);
    }
    memcpy(m->ids, ids, (size_t)T * sizeof(int32_t));
    memcpy(m->pos, pos, (size_t)T * sizeof(int32_t));
    // Every row is its own document to the heads (a score per row); backward has no meaning.
    for (int32_t t = 0; t <= T; t++) m->doc_start[t] = t;
    batch_host(m, m->ids, T, T, false);
    return 0;
}

int tr_model_rows_prepare(tr_model *m, int32_t T, tr_err *err) {
    if (rows_check(m, T, err) != 0) return -1;
    batch_host(m, NULL, T, T, false);
    return 0;
}

int tr_model_rows_queue(tr_model *m, int32_t T, tr_attend_fn attend, void *ctx, tr_err *err) {
    if (T != m->docs.n_tokens)
        return tr_errf(err, TR_EINVAL, "model forward: %d rows queued, %d prepared", T,
                       m->docs.n_tokens);
    return trunk_forward(m, T, attend, ctx, err);
}

int tr_model_forward_rows(tr_model *m, const int32_t *ids, const int32_t *pos, int32_t T,
                          tr_attend_fn attend, void *ctx, tr_err *err) {
    if (rows_fill(m, ids, pos, T, err) != 0) return -1;
    batch_upload(m, m->ids, m->pos, m->doc_start, T, T, false);
    return trunk_forward(m, T, attend, ctx, err);
}

// Where the norms' backward writes d_res (fp32) in the activation dtype, the input of the
// next block's GEMM backward: this rank's rows of d_res_a; NULL where d_res_a is d_res itself
// (fp32 activations without sequence parallelism).
static void *res_grad_act_rows(tr_model *m) {
    tr_acts *a = &m->acts;
    if (a->d_res_a == (void *)a->d_res) return NULL;
    return m->tp.sp ? act_row(m, a->d_res_a, m->sp_row0) : a->d_res_a;
}

// d_res_a over all T rows, as a block's GEMM backward reads it: the last norm's backward wrote
// this rank's rows (res_grad_act_rows); under sequence parallelism every rank's are gathered.
static int res_grad_to_act(tr_model *m, int32_t T, tr_err *err) {
    tr_acts *a = &m->acts;
    if (!m->tp.sp) return 0;
    return tr_model_sp_gather(m, a->d_res_a, res_grad_act_rows(m), m->act, T, err);
}

// The input a column-parallel projection's weight gradient needs: the norm output ln over
// all T rows, gathered again from the ranks' rows under sequence parallelism (NULL when that
// failed). The forward's gather is not kept: that memory is what sequence parallelism saves.
static const void *norm_output(tr_model *m, const void *ln, int32_t T, tr_err *err) {
    if (!m->tp.sp) return ln;
    return tr_model_sp_gather(m, m->acts.sp_ln, ln, m->act, T, err) != 0 ? NULL : m->acts.sp_ln;
}

// A column-parallel projection's input gradient (this rank's part, all T rows, dtype A) is
// summed over the group before the norm it flows into: all-reduced, or under sequence
// parallelism reduce-scattered, each rank keeping its rows.
static int input_grad_sum(tr_model *m, void *buf, int32_t T, tr_err *err) {
    if (m->tp.sp) return tr_model_sp_scatter_act(m, buf, T, err);
    return tr_model_tp_sum_act(m, buf, (size_t)T * m->cfg.hidden_size, err);
}

// A norm's backward over the rank's rows: dout is the gradient of its output over all T rows
// (A), x its input and rstd its statistics (the rank's rows); adds into d_res, and with
// for_gemm writes the result in the activation dtype too (res_grad_act_rows), for the block
// whose backward comes next.
static void norm_backward(tr_model *m, float *dw, const void *dout, const float *x,
                          const void *w, const float *rstd, int32_t T, bool for_gemm) {
    const int32_t n = seq_rows(m, T);
    if (n == 0) return;
    m->be->ops->rmsnorm_backward(m->be, m->acts.d_res, for_gemm ? res_grad_act_rows(m) : NULL,
                                 dw, act_row(m, (void *)dout, m->tp.sp ? m->sp_row0 : 0), x, w,
                                 rstd, n, m->cfg.hidden_size);
}

// The backward of the attention block of layer l from d_res (the gradient of res_mid),
// ending in the gradient of ln1 (d_ln, this rank's part before its sum over the group).
static int attention_backward(tr_model *m, int32_t l, tr_err *err) {
    const tr_ops *op = m->be->ops;
    tr_backend *be = m->be;
    const tr_model_config *c = &m->lcfg;
    const int32_t T = m->docs.n_tokens, C = c->hidden_size;
    const int32_t H = c->n_heads, KVH = c->n_kv_heads, D = c->head_dim;
    const int32_t Q = H * D, K = KVH * D, QKV = m->qkv_ld;
    const tr_layer_params *w = &m->w.layers[l], *g = &m->g.layers[l];
    const tr_layer_acts *la = &m->acts.layers[l];
    tr_acts *a = &m->acts;
    if (res_grad_to_act(m, T, err) != 0) return -1;
    // The row-parallel o_proj's bias is whole on every rank, so is its gradient.
    op->matmul_backward(be, a->d_att, g->wo, g->bo, a->d_res_a, la->att, w->wo, T, Q, C);
    // Gradients of what attention read: q and k (after RoPE, and after the QK-norm when
    // there is one, so in d_qkv_n then) and v, whose gradient is already the projection's.
    void *dq = c->qk_norm ? a->d_qkv_n : a->d_qkv;
    void *dk = offset_bytes(dq, act_bytes(m, Q));
    void *dv = offset_bytes(a->d_qkv, act_bytes(m, Q + K));
    op->attention_backward(be, dq, dk, dv, a->d_att, la->att, la->att_lse, la->q, la->k, la->v,
                           QKV, &m->docs, H, KVH, D);
    op->rope_backward(be, dq, QKV, m->d_pos, m->inv_freq, T, H + KVH, D);   // dk follows dq
    if (c->qk_norm) {
        op->head_rmsnorm_backward(be, a->d_qkv, g->q_norm, dq, la->qkv, w->q_norm, la->q_rstd,
                                  T, H, D, QKV);
        op->head_rmsnorm_backward(be, offset_bytes(a->d_qkv, act_bytes(m, Q)), g->k_norm, dk,
                                  offset_bytes(la->qkv, act_bytes(m, Q)), w->k_norm,
                                  la->k_rstd, T, KVH, D, QKV);
    }
    const void *ln1 = norm_output(m, la->ln1, T, err);
    if (!ln1) return -1;
    op->matmul_backward(be, a->d_ln, g->wqkv, g->bqkv, a->d_qkv, ln1, w->wqkv, T, C, QKV);
    return 0;
}

// The MLP block of layer l from d_res (the gradient of its output), ending in the gradient
// of ln2 (d_ln, this rank's part before its sum over the group).
static int mlp_backward(tr_model *m, int32_t l, tr_err *err) {
    const tr_ops *op = m->be->ops;
    const int32_t T = m->docs.n_tokens, C = m->lcfg.hidden_size, I = m->lcfg.intermediate_size;
    const tr_layer_params *w = &m->w.layers[l], *g = &m->g.layers[l];
    const tr_layer_acts *la = &m->acts.layers[l];
    tr_acts *a = &m->acts;
    if (res_grad_to_act(m, T, err) != 0) return -1;
    op->matmul_backward(m->be, a->d_act, g->w_down, NULL, a->d_res_a, la->act, w->w_down, T, I, C);
    op->swiglu_backward(m->be, a->d_gu, a->d_act, la->gu, T, I);
    const void *ln2 = norm_output(m, la->ln2, T, err);
    if (!ln2) return -1;
    op->matmul_backward(m->be, a->d_ln, g->w_gu, NULL, a->d_gu, ln2, w->w_gu, T, C, 2 * I);
    return 0;
}

// The vocab-parallel embedding's gradient: each rank adds its vocabulary's rows for every
// token, so under sequence parallelism every rank's rows of d_res are gathered (into sp_red).
static int embed_backward(tr_model *m, tr_err *err) {
    const int32_t T = m->docs.n_tokens;
    tr_acts *a = &m->acts;
    const float *d = a->d_res;
    if (m->tp.sp) {
        if (tr_model_sp_gather(m, a->sp_red, a->d_res, TR_F32, T, err) != 0) return -1;
        d = a->sp_red;
    }
    m->be->ops->embedding_backward(m->be, m->g.embed, d, m->tp.size > 1 ? m->d_emb_ids : m->d_ids,
                                   T, m->cfg.hidden_size, m->emb_scratch);
    return 0;
}

int tr_model_backward(tr_model *m, tr_err *err) {
    const tr_model_config *c = &m->lcfg;
    const int32_t T = m->docs.n_tokens;
    tr_acts *a = &m->acts;
    // With the inference layout every layer's saved activations alias one set.
    assert(m->acts_training && m->grads);

    // Under tensor parallelism every column-parallel input gradient (the vocab-parallel LM
    // head's, [q;k;v]'s, [gate;up]'s) is this rank's part: it is summed over the group before
    // the norm it flows into, so each norm's backward sees the whole gradient on every rank
    // (on its rows under sequence parallelism; the value and score heads' are whole already).
    if (c->head == TR_HEAD_LM && input_grad_sum(m, a->d_lnf, T, err) != 0) return -1;
    // The residual gradient is the one that accumulates (every norm's backward adds into it).
    const int32_t n = seq_rows(m, T);
    if (n > 0) m->be->ops->fill(m->be, a->d_res, 0.0f, (size_t)n * c->hidden_size);
    norm_backward(m, m->g.final_norm, a->d_lnf, a->residual[c->n_layers], m->w.final_norm,
                  a->lnf_rstd, T, c->n_layers > 0);
    for (int32_t l = c->n_layers - 1; l >= 0; l--) {
        if (m->recompute && m->layer_held != l) {
            if (layer_forward(m, l, T, attend_docs, NULL, false, err) != 0) return -1;
            m->layer_held = l;
        }
        const tr_layer_params *w = &m->w.layers[l];
        const tr_layer_params *g = &m->g.layers[l];
        const tr_layer_acts *la = &a->layers[l];
        // MLP block: d_res is the gradient of residual[l + 1] and also flows straight on.
        if (mlp_backward(m, l, err) != 0 || input_grad_sum(m, a->d_ln, T, err) != 0) return -1;
        norm_backward(m, g->mlp_norm, a->d_ln, la->res_mid, w->mlp_norm, la->ln2_rstd, T, true);
        // Attention block: d_res is now the gradient of res_mid.
        if (attention_backward(m, l, err) != 0 || input_grad_sum(m, a->d_ln, T, err) != 0)
            return -1;
        // layer 0's is the embedding's gradient, read in fp32
        norm_backward(m, g->attn_norm, a->d_ln, a->residual[l], w->attn_norm, la->ln1_rstd, T,
                      l > 0);
    }
    return embed_backward(m, err);
}
