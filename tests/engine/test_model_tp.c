// Tensor parallelism against one rank, with forked ranks over the shared-memory communicator,
// on every fixture model (Llama, Qwen2, Llama with biases, Qwen3, the value and score heads):
// TP=2 head outputs (logprobs and entropy, values, scores) within 1e-5 of TP=1 and the same
// bits on every rank, the gradient gathered from the shards within 1e-4 (relative, per
// tensor) of TP=1's, three AdamW steps within 1e-5, and generation's tokens identical under
// greedy, temperature, top-k and top-p sampling (the ranks draw from their vocabulary
// columns, exchanging candidates and running sums, not the logits). TP=4 replicates the 2
// key/value heads (two ranks per head); TP=2 x DP=2 trains like one rank. A checkpoint saved by TP=2 is plain HF (TP=1
// loads it bit for bit) and loads into TP=2 and 4; a TP=2 trainer's state resumes at TP=1.
// bf16 (the CPU's emulated mixed precision) is held to bf16's rounding. TP sizes that split
// the query heads unevenly are refused with a message naming them. Sequence parallelism is
// held to the same limits on the same jobs, and on batches whose length tp does not divide
// (the later ranks take one row more) or is below tp (rank 0 holds no row); its generation
// draws TP=1's tokens, and its activations take less memory than TP's without it.
#include <ftw.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "engine/checkpoint.h"
#include "engine/generate.h"
#include "engine/heads.h"
#include "engine/model.h"
#include "engine/train.h"
#include "engine/train_state.h"
#include "tests/backend_test.h"
#include "tests/engine/model_util.h"
#include "tests/test.h"

#define MAXR 4          // ranks of a job
#define MAXP 65536      // floats of a fixture model's whole layout
#define MAXO 128        // head outputs of the fixture batch
#define STEPS 3
#define GEN 12          // new tokens per generated sample
#define N_GEN_REQ 6     // generation requests (the sampling settings below)
#define N_GEN_SAMPLES 2 // samples of each
#define N_GEN (N_GEN_REQ * N_GEN_SAMPLES)

typedef struct job {
    const char *model;    // fixture name
    const char *precision;
    int tp, dp;
    bool sp;                // sequence parallelism
    int prefix;             // > 0: the batch is the first document's first `prefix` tokens
    bool train, generate;
    const char *save_dir;   // tp ranks save the weights here after the steps (NULL: no)
    const char *load_dir;   // weights from here instead of the fixture (NULL: the fixture)
    const char *state_dir;  // trainer state saved here after the steps (NULL: no)
} job;

typedef struct shared {
    // Communicator bootstrap: slot g's id, written by the group's first rank.
    volatile int ready[2 * MAXR];
    char id[2 * MAXR][TR_COMM_ID_MAX];
    int32_t n_out;
    float out[MAXR][2 * MAXO];     // each rank's head outputs (logprob then entropy for an LM)
    float grads[MAXP];             // the whole gradient, gathered
    float params[MAXP];            // the whole parameters after the steps
    double loss[STEPS], norm[STEPS];
    int32_t gen[MAXR][N_GEN][GEN]; // each rank's tokens of every sample
    float gen_lp[N_GEN][GEN];
    int ok[MAXR];
} shared;

static shared *sh;

// Opens (or, as the group's first rank, creates) the communicator of bootstrap slot `slot`.
static int comm_up(tr_backend *be, int slot, int rank, int world, const char *name, tr_comm **c,
                   tr_err *err) {
    tr_comm_opts o = {.be = be, .rank = rank, .world = world, .name = name};
    *c = NULL;
    if (rank == 0) {
        if (tr_comm_create(c, &o, sh->id[slot], sizeof sh->id[slot], err)) return -1;
        __atomic_store_n(&sh->ready[slot], 1, __ATOMIC_RELEASE);
    } else {
        for (int i = 0; !__atomic_load_n(&sh->ready[slot], __ATOMIC_ACQUIRE); i++) {
            if (i > 30000) return tr_errf(err, TR_EINVAL, "no communicator id in slot %d", slot);
            usleep(1000);
        }
        if (tr_comm_open(c, &o, sh->id[slot], err)) return -1;
    }
    return tr_comm_join(*c, err) || tr_comm_wait(*c, 30000, err);
}

// The fixture batch: 3 documents of the model's expected.safetensors (7, 12 and 5 tokens),
// or the first `prefix` tokens of the first.
static int fixture_batch(const char *model, int prefix, packed_batch *b, tr_err *err) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/models/%s/expected.safetensors", model);
    tr_st_file f;
    if (tr_st_open(&f, tr_test_src(path), err)) return -1;
    size_t n_ids = 0, n_seq = 0;
    int32_t *ids = st_ints(&f, "input_ids", &n_ids), *lens = st_ints(&f, "seq_lens", &n_seq);
    int rc = ids && lens ? 0 : tr_errf(err, TR_EFORMAT, "%s: no input_ids/seq_lens", path);
    if (!rc && prefix > 0) pack_batch(b, ids, &(int32_t){prefix < lens[0] ? prefix : lens[0]}, 1);
    else if (!rc) pack_batch(b, ids, lens, (int32_t)n_seq);
    free(ids);
    free(lens);
    tr_st_close(&f);
    return rc;
}

// Loss coefficients of output i: dL/dout and dL/dentropy (deterministic, of both signs).
static float coef(int i, int k) {
    return (float)(((i * 7 + k * 3) % 11) - 5) / 10.0f;
}

// Head forward over the batch into out (and the outputs' count), then its backward with the
// coefficients above and the trunk's backward.
static int head_pass(tr_model *m, const packed_batch *b, float *out, int32_t *n_out, tr_err *err) {
    const int32_t T = b->n_tokens;
    float c1[MAXO], c2[MAXO];
    for (int i = 0; i < MAXO; i++) {
        c1[i] = coef(i, 0);
        c2[i] = coef(i, 1);
    }
    if (tr_model_forward(m, b->ids, &b->docs, err)) return -1;
    switch (m->cfg.head) {
    case TR_HEAD_LM:
        *n_out = 2 * T;
        if (tr_lm_head_forward(m, b->targets, out, out + T, err)) return -1;
        tr_lm_head_backward(m, b->targets, c1, c2);
        break;
    case TR_HEAD_VALUE:
        *n_out = T;
        if (tr_value_head_forward(m, out, err)) return -1;
        tr_value_head_backward(m, c1);
        break;
    case TR_HEAD_SCORE:
        *n_out = b->n_docs * m->cfg.num_labels;
        if (tr_score_head_forward(m, out, err)) return -1;
        tr_score_head_backward(m, c1);
        break;
    }
    return tr_model_backward(m, err) || tr_model_reduce_grads(m, err);
}

// STEPS AdamW steps; the data-parallel rank takes documents [d0, d1) of the batch, one per
// micro-batch; value and score heads train on the coefficients as output gradients.
static int train(tr_model *m, tr_trainer *tr, const packed_batch *b, int dp, int dp_rank, tr_err *err) {
    static packed_batch docs[8];
    tr_micro_batch mbs[8];
    static float dout[8][MAXO];
    int d0 = b->n_docs * dp_rank / dp, d1 = b->n_docs * (dp_rank + 1) / dp, n = 0;
    for (int d = d0; d < d1; d++, n++) {
        int32_t len = b->doc_start[d + 1] - b->doc_start[d];
        pack_batch(&docs[n], b->ids + b->doc_start[d], &len, 1);
        for (int i = 0; i < MAXO; i++) dout[n][i] = coef(i + d, 0);
        mbs[n] = (tr_micro_batch){.ids = docs[n].ids, .docs = docs[n].docs, .targets = docs[n].targets,
                                  .dout = dout[n]};
    }
    tr_step_args args = {.loss = m->cfg.head == TR_HEAD_LM ? TR_LOSS_CROSS_ENTROPY : TR_LOSS_GRADIENT,
                         .norm = TR_NORM_TOKEN_MEAN};
    for (int s = 0; s < STEPS; s++) {
        tr_step_result res;
        if (tr_train_step(tr, mbs, n, &args, &res, err)) return -1;
        sh->loss[s] = res.loss;
        sh->norm[s] = res.grad_norm;
    }
    return 0;
}

// Generation's sampling settings: greedy; the whole vocabulary at two temperatures (every
// rank's running sum passed on); top-k (the ranks' candidate lists alone); top-p (the nucleus
// cut on the lists against the whole row's mass); top-p within top-k.
static const tr_sample_params GEN_PARAMS[N_GEN_REQ] = {
    {.temperature = 0.0f, .top_p = 1.0f},
    {.temperature = 1.0f, .top_p = 1.0f},
    {.temperature = 1.6f, .top_p = 1.0f},
    {.temperature = 0.7f, .top_k = 5, .top_p = 1.0f},
    {.temperature = 1.3f, .top_p = 0.9f},
    {.temperature = 1.0f, .top_k = 40, .top_p = 0.6f},
};

// N_GEN_SAMPLES samples of the first document's first 5 tokens under each setting.
static int generate(tr_model *m, const packed_batch *b, int rank, tr_err *err) {
    tr_generator g;
    tr_gen_opts go = {.kv_tokens = 512, .block_size = 4};
    if (tr_generator_init(&g, m, &go, err)) return -1;
    tr_gen_request reqs[N_GEN_REQ];
    for (int k = 0; k < N_GEN_REQ; k++)
        reqs[k] = (tr_gen_request){.prompt = b->ids, .n_prompt = 5, .n_samples = N_GEN_SAMPLES,
                                   .sampling = GEN_PARAMS[k], .seed = 11 + (uint64_t)k,
                                   .max_new_tokens = GEN};
    tr_gen_output outs[N_GEN];
    int rc = tr_generate(&g, reqs, N_GEN_REQ, outs, err);
    for (int k = 0; !rc && k < N_GEN; k++)
        for (int i = 0; i < GEN; i++) {
            sh->gen[rank][k][i] = i < outs[k].n_tokens ? outs[k].tokens[i] : -1;
            if (rank == 0) sh->gen_lp[k][i] = i < outs[k].n_tokens ? outs[k].logprobs[i] : 0.0f;
        }
    if (!rc) tr_gen_outputs_free(outs, N_GEN);
    tr_generator_free(&g);
    return rc;
}

static const tr_optim_cfg OPT = {.lr = 1e-2, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-3f,
                                 .weight_decay = 0.05f, .max_grad_norm = 0.5f,
                                 .schedule = {.kind = TR_LR_CONSTANT}};

static int rank_run(const job *jb, int rank, tr_backend *be, tr_model *m, tr_comm **tpc, tr_comm **dpc,
                    tr_trainer *tr, tr_err *err) {
    const int tp_rank = rank % jb->tp, dp_rank = rank / jb->tp;
    char dir[512];
    snprintf(dir, sizeof dir, "tests/fixtures/models/%s", jb->model);
    tr_model_opts o = {.max_tokens = 64, .training = jb->train, .tp_size = jb->tp, .tp_rank = tp_rank,
                       .sequence_parallel = jb->sp};
    if (tr_model_load(m, jb->load_dir ? jb->load_dir : tr_test_src(dir), be, &o, err)) return -1;
    if (jb->tp > 1 && (comm_up(be, dp_rank, tp_rank, jb->tp, "tp", tpc, err) ||
                       tr_model_set_tp_comm(m, *tpc, err)))
        return -1;
    packed_batch b;
    if (fixture_batch(jb->model, jb->prefix, &b, err)) return -1;
    if (jb->generate) return generate(m, &b, rank, err);
    if (!jb->train) {   // forward only: the head outputs
        if (tr_model_forward(m, b.ids, &b.docs, err)) return -1;
        sh->n_out = b.n_tokens;
        return tr_lm_head_forward(m, b.targets, sh->out[rank], NULL, err);
    }
    int32_t n_out = 0;
    if (head_pass(m, &b, sh->out[rank], &n_out, err)) return -1;
    sh->n_out = n_out;
    if (tr_model_gather_full(m, true, dp_rank == 0 && tp_rank == 0 ? sh->grads : NULL, err)) return -1;
    if (tr_trainer_init_sharded(tr, m, &OPT, 3, jb->dp, dp_rank, err)) return -1;
    if (jb->dp > 1 && (comm_up(be, MAXR + tp_rank, dp_rank, jb->dp, "dp", dpc, err) ||
                       tr_trainer_set_comm(tr, *dpc, err)))
        return -1;
    if (train(m, tr, &b, jb->dp, dp_rank, err)) return -1;
    tr_ckpt_save_opts so = {.dtype = TR_ST_F32};
    if (jb->save_dir && dp_rank == 0 && tr_model_save(m, jb->save_dir, &so, err)) return -1;
    if (jb->state_dir && tr_train_state_save(tr, jb->state_dir, err)) return -1;
    return tr_model_gather_full(m, false, dp_rank == 0 && tp_rank == 0 ? sh->params : NULL, err);
}

// On CUDA every rank takes a device of its own (NCCL puts one rank on a device).
static bool on_cuda(void) {
    const char *k = getenv("TROUPE_BACKEND");
    return k && strcmp(k, "cuda") == 0;
}

static int rank_main(const job *jb, int rank) {
    if (on_cuda()) {
        char dev[16];
        snprintf(dev, sizeof dev, "%d", rank);
        setenv("TROUPE_DEVICE", dev, 1);
    }
    tr_backend be;
    et_backend_in(&be, 1, jb->precision);
    tr_err err = {0};
    tr_model m;
    memset(&m, 0, sizeof m);
    tr_trainer tr;
    memset(&tr, 0, sizeof tr);
    tr_comm *tpc = NULL, *dpc = NULL;
    int rc = rank_run(jb, rank, &be, &m, &tpc, &dpc, &tr, &err);
    if (rc) fprintf(stderr, "%s tp %d dp %d rank %d: %s\n", jb->model, jb->tp, jb->dp, rank, err.msg);
    if (!rc) sh->ok[rank] = 1;
    tr_trainer_free(&tr);
    tr_model_free(&m);
    tr_comm_free(tpc);
    tr_comm_free(dpc);
    tr_backend_free(&be);
    return rc ? 1 : 0;
}

// Jobs of more ranks than the machine has devices (CUDA) are skipped: -1.
static int run_job(const job *jb) {
    int world = jb->tp * jb->dp;
    if (on_cuda() && world > tr_backend_cuda_devices()) return -1;
    memset(sh, 0, sizeof *sh);
    pid_t pids[MAXR];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(jb, r));
    }
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !sh->ok[r];
    }
    return bad;
}

// The whole layout of a fixture model, for per-tensor comparisons.
static int whole_layout(const char *model, tr_param_layout *lay) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/models/%s", model);
    tr_model_config cfg;
    tr_err err = {0};
    return tr_checkpoint_load_config(tr_test_src(path), &cfg, &err) || tr_param_layout_init(lay, &cfg, &err);
}

// The worst per-tensor relative error of a against b (whole layouts).
static double worst_tensor(const tr_param_layout *lay, const float *a, const float *b, const char **name) {
    double worst = 0;
    for (int32_t i = 0; i < lay->n_tensors; i++) {
        const tr_tensor_desc *d = &lay->tensors[i];
        double e = tr_test_rel_err(a + d->offset, b + d->offset, d->numel);
        if (!(e <= worst)) {
            worst = e;
            *name = d->name;
        }
    }
    return worst;
}

typedef struct tol {
    double out, grad, param;
} tol;

// The job's name in messages: model, precision, tp, dp, sequence parallelism, prefix.
static const char *job_name(const job *jb) {
    static char name[160];
    snprintf(name, sizeof name, "%s %s tp %d dp %d%s", jb->model, jb->precision, jb->tp, jb->dp,
             jb->sp ? " sp" : "");
    if (jb->prefix > 0) snprintf(name + strlen(name), sizeof name - strlen(name), " (%d tokens)", jb->prefix);
    return name;
}

// Trains the job's ranks (tp x dp) and compares with ref (one rank, the same batch): outputs,
// every rank's outputs the same bits, the gathered gradient, the losses and the parameters
// after the steps.
static void compare_train(job jb, const shared *ref, tol t) {
    jb.train = true;
    const char *name = job_name(&jb);
    int rc = run_job(&jb);
    if (rc < 0) {
        printf("%s: skipped (fewer devices than ranks)\n", name);
        return;
    }
    CHECKF(rc == 0, "%s: a rank failed", name);
    tr_param_layout lay;
    if (whole_layout(jb.model, &lay)) {
        CHECK(0);
        return;
    }
    int32_t n = ref->n_out;
    CHECK(sh->n_out == n);
    double e_out = tr_test_max_abs_err(sh->out[0], ref->out[0], (size_t)n);
    for (int r = 1; r < jb.tp && jb.dp == 1; r++)
        CHECKF(memcmp(sh->out[r], sh->out[0], (size_t)n * sizeof(float)) == 0,
               "%s: rank %d's outputs differ from rank 0's", name, r);
    const char *gname = "", *pname = "";
    double e_grad = jb.dp == 1 ? worst_tensor(&lay, sh->grads, ref->grads, &gname) : 0;
    double e_par = worst_tensor(&lay, sh->params, ref->params, &pname);
    printf("%s: outputs %.2g abs, gradient %.2g rel (%s), parameters after %d steps %.2g rel (%s)\n",
           name, e_out, e_grad, gname, STEPS, e_par, pname);
    CHECKF(e_out <= t.out, "%s: outputs %.3g > %.3g", name, e_out, t.out);
    CHECKF(e_grad <= t.grad, "%s: gradient %s %.3g > %.3g", name, gname, e_grad, t.grad);
    CHECKF(e_par <= t.param, "%s: parameters %s %.3g > %.3g", name, pname, e_par, t.param);
    for (int s = 0; s < STEPS; s++) CHECK_NEAR(sh->norm[s], ref->norm[s], t.grad * ref->norm[s]);
    tr_param_layout_free(&lay);
}

static const tol FP32_TOL = {.out = 1e-5, .grad = 1e-4, .param = 1e-5};

// One rank's run of the job's batch (its prefix) into ref.
static void reference(const char *model, const char *precision, int prefix, shared *ref) {
    job one = {.model = model, .precision = precision, .tp = 1, .dp = 1, .prefix = prefix, .train = true};
    CHECKF(run_job(&one) == 0, "%s %s: tp 1 failed", model, precision);
    memcpy(ref, sh, sizeof *ref);
}

static void test_model(const char *model, shared *ref) {
    reference(model, "fp32", 0, ref);
    for (int sp = 0; sp < 2; sp++)
        compare_train((job){.model = model, .precision = "fp32", .tp = 2, .dp = 1, .sp = sp}, ref, FP32_TOL);
}

// Sequence parallelism on batches tp does not divide: the first document's first 7 tokens
// at tp 4 (rows 1, 2, 2, 2) and its first 3 (rank 0 holds none) and 5 at tp 2 (2, 3).
static void test_uneven(const char *model, shared *ref) {
    const int cuts[][2] = {{7, 4}, {3, 4}, {5, 2}};
    for (int i = 0; i < 3; i++) {
        reference(model, "fp32", cuts[i][0], ref);
        compare_train((job){.model = model, .precision = "fp32", .tp = cuts[i][1], .dp = 1, .sp = true,
                            .prefix = cuts[i][0]}, ref, FP32_TOL);
    }
}

// Generation at tp (and sequence parallelism) against tp 1: every sample's tokens the same
// under every sampling setting, on every rank, and their logprobs within 1e-5.
static void test_generate(const char *model, int tp, bool sp) {
    job one = {.model = model, .precision = "fp32", .tp = 1, .dp = 1, .generate = true};
    CHECKF(run_job(&one) == 0, "%s: tp 1 generation failed", model);
    static int32_t want[N_GEN][GEN];
    static float want_lp[N_GEN][GEN];
    memcpy(want, sh->gen[0], sizeof want);
    memcpy(want_lp, sh->gen_lp, sizeof want_lp);
    job par = {.model = model, .precision = "fp32", .tp = tp, .dp = 1, .sp = sp, .generate = true};
    const char *name = job_name(&par);
    CHECKF(run_job(&par) == 0, "%s: generation failed", name);
    for (int k = 0; k < N_GEN; k++) {
        const tr_sample_params *p = &GEN_PARAMS[k / N_GEN_SAMPLES];
        CHECKF(memcmp(sh->gen[0][k], want[k], sizeof want[k]) == 0, "%s: sample %d (temperature %g, "
               "top_k %d, top_p %g) differs from tp 1's", name, k % N_GEN_SAMPLES, (double)p->temperature,
               p->top_k, (double)p->top_p);
    }
    for (int r = 1; r < tp; r++)
        CHECKF(memcmp(sh->gen[r], sh->gen[0], sizeof want) == 0, "%s: rank %d drew other tokens", name, r);
    double e = tr_test_max_abs_err(&sh->gen_lp[0][0], &want_lp[0][0], (size_t)N_GEN * GEN);
    printf("%s generation: greedy, temperature, top-k and top-p samples as tp 1, logprobs %.2g abs\n", name,
           e);
    CHECKF(e <= 1e-5, "%s: generated logprobs %.3g", name, e);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

// A TP=2 run saves weights and trainer state; TP=1 loads the weights bit for bit (they are
// plain HF tensors), TP=2 and TP=4 forwards of them agree with TP=1's, and TP=1 resumes the
// trainer state (moments gathered into whole tensors).
static void test_checkpoint(const char *tmp) {
    char ck[600], st[600];
    snprintf(ck, sizeof ck, "%s/tp2", tmp);
    snprintf(st, sizeof st, "%s/tp2", tmp);
    job save = {.model = "llama3", .precision = "fp32", .tp = 2, .dp = 1, .train = true, .save_dir = ck,
                .state_dir = st};
    CHECK(run_job(&save) == 0);
    size_t n;
    {
        tr_param_layout lay;
        if (whole_layout("llama3", &lay)) return;
        n = lay.total;
        tr_param_layout_free(&lay);
    }
    float *trained = malloc(n * sizeof(float));
    memcpy(trained, sh->params, n * sizeof(float));
    // TP=1 reads the checkpoint: the same bits as the gathered parameters.
    tr_backend be;
    et_backend(&be, 1);
    tr_model m;
    tr_err err = {0};
    tr_model_opts o = {.max_tokens = 64};
    CHECKF(tr_model_load(&m, ck, &be, &o, &err) == 0, "%s", err.msg);
    float *got = malloc(n * sizeof(float));
    CHECK(tr_model_read_params(&m, got, &err) == 0);
    CHECKF(memcmp(got, trained, n * sizeof(float)) == 0, "the TP=2 checkpoint does not load bit for bit");
    tr_trainer tr;
    tr_model_free(&m);
    tr_model_opts ot = {.max_tokens = 64, .training = true};
    CHECK(tr_model_load(&m, ck, &be, &ot, &err) == 0);
    CHECKF(tr_trainer_init(&tr, &m, &OPT, 3, &err) == 0 && tr_train_state_load(&tr, st, &err) == 0,
           "TP=1 resumes a TP=2 trainer state: %s", err.msg);
    CHECK(tr.step == STEPS);
    tr_trainer_free(&tr);
    tr_model_free(&m);
    tr_backend_free(&be);
    // Forwards of the checkpoint at TP 1, 2 and 4.
    float ref[MAXO];
    for (int tp = 1; tp <= 4; tp *= 2) {
        job fw = {.model = "llama3", .precision = "fp32", .tp = tp, .dp = 1, .load_dir = ck};
        int rc = run_job(&fw);
        if (rc < 0) continue;
        CHECKF(rc == 0, "tp %d forward of the checkpoint", tp);
        if (tp == 1) memcpy(ref, sh->out[0], sizeof ref);
        double e = tr_test_max_abs_err(sh->out[tp - 1], ref, (size_t)sh->n_out);
        if (tp > 1) printf("checkpoint of tp 2 loaded at tp %d: logprobs %.2g abs from tp 1\n", tp, e);
        CHECKF(e <= 1e-5, "tp %d logprobs of the checkpoint %.3g", tp, e);
    }
    free(trained);
    free(got);
}

static void test_refused(void) {
    char path[512];
    snprintf(path, sizeof path, "tests/fixtures/models/llama3");
    tr_model_config cfg;
    tr_err err = {0};
    CHECK(tr_checkpoint_load_config(tr_test_src(path), &cfg, &err) == 0);
    tr_tp tp;
    CHECK(tr_tp_init(&tp, &cfg, 3, 0, &err) != 0);
    CHECKF(strstr(err.msg, "tp 3 does not divide the 4 query heads"), "%s", err.msg);
    cfg.n_heads = 8;
    cfg.n_kv_heads = 2;
    CHECK(tr_tp_init(&tp, &cfg, 8, 0, &err) == 0 && tp.kv_replicas == 4 && tp.n_kv_heads == 1);
    cfg.n_kv_heads = 4;
    cfg.n_heads = 12;
    CHECK(tr_tp_init(&tp, &cfg, 6, 0, &err) != 0);
    CHECKF(strstr(err.msg, "key/value heads"), "%s", err.msg);
}

int main(void) {
    if (on_cuda() && tr_backend_cuda_devices() < 2) {
        printf("tensor parallelism on CUDA needs 2 devices: skipped\n");
        return 77;
    }
    sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    shared *ref = malloc(sizeof *ref);
    if (sh == MAP_FAILED || !ref) return 1;
    test_refused();
    const char *models[] = {"llama3", "qwen2", "llama_bias", "qwen3", "value_llama3", "score_qwen2"};
    for (int i = 0; i < 6; i++) {
        test_model(models[i], ref);
        if (i == 0 || i == 3) {
            // Two key/value heads on four ranks: each head on two, their gradients summed.
            // TP=2 x DP=2 runs documents of 7, 12 and 5 tokens: 7 and 5 split unevenly.
            for (int sp = 0; sp < 2; sp++) {
                compare_train((job){.model = models[i], .precision = "fp32", .tp = 4, .dp = 1, .sp = sp},
                              ref, FP32_TOL);
                compare_train((job){.model = models[i], .precision = "fp32", .tp = 2, .dp = 2, .sp = sp},
                              ref, FP32_TOL);
            }
        }
    }
    test_uneven("qwen2", ref);
    for (int i = 0; i < 4; i++) {
        test_generate(models[i], 2, false);
        test_generate(models[i], 2, true);
    }
    test_generate("qwen3", 4, false);   // four ranks' lists and running sums
    // bf16: every partial sum rounds once more than at TP=1 (the parts of a row-parallel
    // projection are added in fp32 and the column-parallel input gradients summed in fp32,
    // each rounded to bf16), so the limits are bf16's: 2^-8 relative, a few roundings deep.
    reference("qwen3", "bf16", 0, ref);
    for (int sp = 0; sp < 2; sp++)
        compare_train((job){.model = "qwen3", .precision = "bf16", .tp = 2, .dp = 1, .sp = sp}, ref,
                      (tol){0.05, 0.05, 0.02});
    const char *tmp = tr_test_tmpdir();
    test_checkpoint(tmp);
    nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    munmap(sh, sizeof *sh);
    free(ref);
    printf("%d checks, %d failures\n", tr_test_checks, tr_test_failures);
    return tr_test_failures || !tr_test_checks;
}
