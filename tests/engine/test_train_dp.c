// Data-parallel training with forked ranks over the shared-memory communicator: 5 AdamW steps
// of 2 and 3 ranks (uneven shares, and a step where one rank has no data) against the same
// steps in one process, within fp32 rounding (parameters 1e-6 relative); every rank ends with
// the same bits, two runs of a DP size give the same bits, and losses and gradient norms are
// the global ones. ZeRO-1 checkpoints: each rank's Adam moments are its shard only; a
// checkpoint saved by 2 ranks loads into 3 ranks and into one (and one saved by one rank into
// 2) with every moment bit for bit where it belongs, and the resumed runs finish like the
// uninterrupted one.
#include <ftw.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/device.h"
#include "engine/file.h"
#include "engine/model.h"
#include "engine/train.h"
#include "engine/train_state.h"
#include "tests/backend_test.h"
#include "tests/engine/model_util.h"
#include "tests/test.h"

#define MAXW 3
#define STEPS 5
#define NDOCS 9
#define MAXP 8192

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"float32\"}";

static const tr_optim_cfg OPT = {.lr = 1e-2, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-3f,
                                 .weight_decay = 0.05f, .max_grad_norm = 0.5f,
                                 .schedule = {.kind = TR_LR_COSINE, .total_steps = 10}};

typedef struct shared {
    float params[MAXW][MAXP];
    float m[MAXP], v[MAXP];           // every rank's moment shard at its place
    size_t shard_floats[MAXW];        // the moments each rank holds
    double loss[MAXW][STEPS], norm[MAXW][STEPS];
    size_t n_params;
    int64_t step_loaded;
    int ok[MAXW];
} shared;

// What one run does: steps [from, to), after loading load_dir and before saving to save_dir
// (NULL: neither), dumping the moments right after the load (or the last step).
typedef struct job {
    int world, from, to;
    const char *load_dir, *save_dir;
} job;

// Document d of step s: its length and ids (a pure function of s and d).
static int32_t doc_len(int s, int d) {
    return 3 + (d * 7 + s * 3) % 9;
}

static int32_t doc_id(int s, int d, int t) {
    return (int32_t)((s * 131 + d * 17 + t * t * 5 + t) % 31);
}

static int docs_in_step(int s) {
    return s == 2 ? 4 : NDOCS;
}

// The documents of step s that `rank` trains on: contiguous shares of the step's documents;
// in step 2 three ranks split 4 documents 2, 2 and none.
static void share(int s, int world, int rank, int *d0, int *d1) {
    int n = docs_in_step(s);
    if (s == 2 && world == 3) {
        *d0 = rank < 2 ? rank * 2 : n;
        *d1 = rank < 2 ? rank * 2 + 2 : n;
        return;
    }
    *d0 = n * rank / world;
    *d1 = n * (rank + 1) / world;
}

static int dump_moments(tr_trainer *tr, shared *sh, tr_err *err) {
    size_t n = tr->shard_end - tr->shard_begin;
    sh->shard_floats[tr->shard] = n;
    return tr_dev_download_sync(tr->model->be, sh->m + tr->shard_begin, tr->adam_m, n * sizeof(float), "test", err) ||
           tr_dev_download_sync(tr->model->be, sh->v + tr->shard_begin, tr->adam_v, n * sizeof(float), "test", err);
}

// As a worker's save op: rank 0 writes the weights, then every rank its optimizer state.
static int save(tr_model *m, tr_trainer *tr, tr_comm *c, const char *dir, tr_err *err) {
    tr_ckpt_save_opts so = {.dtype = TR_ST_F32};
    if (tr->shard == 0 && tr_model_save(m, dir, &so, err)) return -1;
    if (c && tr_comm_barrier(c, err)) return -1;
    return tr_train_state_save(tr, dir, err);
}

static int rank_main(const job *jb, int rank, int fds[2], shared *sh) {
    int world = jb->world;
    tr_backend be;
    et_backend(&be, 1);
    tr_err err = {0};
    tr_model_config cfg;
    tr_model m;
    tr_trainer tr;
    tr_comm *c = NULL;
    if (tr_config_parse(CONFIG, sizeof CONFIG - 1, "config", &cfg, &err) ||
        tr_model_init(&m, &cfg, &be, &(tr_model_opts){.max_tokens = 64, .training = true}, &err) ||
        tr_model_init_weights(&m, 7, 0.3f, &err) || tr_trainer_init_sharded(&tr, &m, &OPT, 5, world, rank, &err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err.msg);
        return 1;
    }
    if (world > 1) {
        char id[TR_COMM_ID_MAX] = "";
        tr_comm_opts o = {.be = &be, .rank = rank, .world = world, .name = "dp"};
        int rc = 0;
        if (rank == 0) {
            rc = tr_comm_create(&c, &o, id, sizeof id, &err);
            for (int k = 1; k < world && !rc; k++) rc = write(fds[1], id, sizeof id) != (ssize_t)sizeof id;
        } else {
            rc = read(fds[0], id, sizeof id) != (ssize_t)sizeof id || tr_comm_open(&c, &o, id, &err);
        }
        if (rc || tr_comm_join(c, &err) || tr_comm_wait(c, 30000, &err) || tr_trainer_set_comm(&tr, c, &err)) {
            fprintf(stderr, "rank %d: comm: %s\n", rank, err.msg);
            return 1;
        }
    }
    if (jb->load_dir) {
        if (tr_model_load_weights(&m, jb->load_dir, false, &err) || tr_train_state_load(&tr, jb->load_dir, &err) ||
            dump_moments(&tr, sh, &err)) {
            fprintf(stderr, "rank %d: load: %s\n", rank, err.msg);
            return 1;
        }
        sh->step_loaded = tr.step;
    }
    static packed_batch pb[NDOCS];
    tr_micro_batch mbs[NDOCS];
    for (int s = jb->from; s < jb->to; s++) {
        int d0, d1;
        share(s, world, rank, &d0, &d1);
        for (int d = d0; d < d1; d++) {
            int32_t ids[64], len = doc_len(s, d);
            for (int t = 0; t < len; t++) ids[t] = doc_id(s, d, t);
            pack_batch(&pb[d - d0], ids, &len, 1);
            mbs[d - d0] = (tr_micro_batch){.ids = pb[d - d0].ids, .docs = pb[d - d0].docs, .targets = pb[d - d0].targets};
        }
        tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
        tr_step_result res;
        if (tr_train_step(&tr, mbs, d1 - d0, &args, &res, &err)) {
            fprintf(stderr, "rank %d step %d: %s\n", rank, s, err.msg);
            return 1;
        }
        sh->loss[rank][s] = res.loss;
        sh->norm[rank][s] = res.grad_norm;
    }
    if (jb->save_dir && save(&m, &tr, c, jb->save_dir, &err)) {
        fprintf(stderr, "rank %d: save: %s\n", rank, err.msg);
        return 1;
    }
    if (!jb->load_dir && dump_moments(&tr, sh, &err)) return 1;
    sh->n_params = m.layout.total;
    if (m.layout.total > MAXP || tr_model_read_params(&m, sh->params[rank], &err)) return 1;
    sh->ok[rank] = 1;
    tr_trainer_free(&tr);
    tr_comm_free(c);
    tr_model_free(&m);
    tr_backend_free(&be);
    return 0;
}

static int run_job(const job *jb, shared *sh) {
    int world = jb->world;
    memset(sh, 0, sizeof *sh);
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pids[MAXW];
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(jb, r, fds, sh));
    }
    close(fds[0]);
    close(fds[1]);
    int bad = 0;
    for (int r = 0; r < world; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0 || !sh->ok[r];
    }
    return bad;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

static int run(int world, shared *sh) {
    job jb = {.world = world, .from = 0, .to = STEPS};
    return run_job(&jb, sh);
}

// Saves after 3 steps with `from` ranks, loads into `to` ranks: the moments land where they
// were, and the last 2 steps end where the uninterrupted run (ref) ended.
static void test_reshard(const char *tmp, int from, int to, const shared *ref, shared *sh, shared *saved) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/ckpt-%d-%d", tmp, from, to);
    job a = {.world = from, .from = 0, .to = 3, .save_dir = dir};
    CHECKF(run_job(&a, sh) == 0, "save with dp %d", from);
    memcpy(saved, sh, sizeof *saved);
    size_t n = sh->n_params, held = 0;
    for (int r = 0; r < from; r++) held += sh->shard_floats[r];
    CHECKF(held == n, "dp %d: the shards hold %zu moments of %zu", from, held, n);
    if (from > 1) CHECK(sh->shard_floats[0] < n);
    char path[700];
    snprintf(path, sizeof path, "%s/optim_shards.json", dir);
    CHECK(tr_file_exists(path) == (from > 1));
    job b = {.world = to, .from = 3, .to = STEPS, .load_dir = dir};
    CHECKF(run_job(&b, sh) == 0, "load dp %d's checkpoint with dp %d", from, to);
    CHECK(sh->step_loaded == 3);
    CHECKF(memcmp(sh->m, saved->m, n * sizeof(float)) == 0 && memcmp(sh->v, saved->v, n * sizeof(float)) == 0,
           "dp %d -> %d: the loaded moments differ from the saved ones", from, to);
    double e = tr_test_rel_err(sh->params[0], ref->params[0], n);
    printf("saved by dp %d, resumed with dp %d: parameters after %d steps %.3g relative to dp 1\n", from, to, STEPS, e);
    CHECKF(e <= 1e-6, "dp %d -> %d: %.3g", from, to, e);
}

int main(void) {
    shared *sh = mmap(NULL, sizeof(shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    shared *ref = malloc(sizeof *ref), *first = malloc(sizeof *first);
    if (sh == MAP_FAILED || !ref || !first) return 1;
    CHECK(run(1, sh) == 0);
    memcpy(ref, sh, sizeof *ref);
    size_t n = ref->n_params;
    for (int world = 2; world <= 3; world++) {
        for (int pass = 0; pass < 2; pass++) {
            CHECKF(run(world, sh) == 0, "dp %d: a rank failed", world);
            for (int r = 1; r < world; r++)
                CHECKF(memcmp(sh->params[r], sh->params[0], n * sizeof(float)) == 0, "dp %d: rank %d's parameters "
                       "differ from rank 0's", world, r);
            double e = tr_test_rel_err(sh->params[0], ref->params[0], n);
            CHECKF(e <= 1e-6, "dp %d: parameters after %d steps differ from one rank's by %.3g relative", world, STEPS,
                   e);
            bool same_bits = memcmp(sh->params[0], ref->params[0], n * sizeof(float)) == 0;
            if (pass == 0)
                printf("dp %d vs 1 after %d steps: parameters %.3g relative (%s)\n", world, STEPS, e,
                       same_bits ? "same bits" : "not the same bits");
            for (int s = 0; s < STEPS; s++) {
                CHECK_NEAR(sh->loss[0][s], ref->loss[0][s], 1e-6 * ref->loss[0][s]);
                CHECK_NEAR(sh->norm[0][s], ref->norm[0][s], 1e-5 * ref->norm[0][s]);
                for (int r = 1; r < world; r++) CHECK(sh->loss[r][s] == sh->loss[0][s] && sh->norm[r][s] == sh->norm[0][s]);
            }
            if (pass == 1)
                CHECKF(memcmp(sh->params[0], first->params[0], n * sizeof(float)) == 0,
                       "dp %d: two runs give different parameters", world);
            memcpy(first, sh, sizeof *first);
        }
    }
    const char *tmp = tr_test_tmpdir();
    test_reshard(tmp, 2, 3, ref, sh, first);
    test_reshard(tmp, 2, 1, ref, sh, first);
    test_reshard(tmp, 1, 2, ref, sh, first);
    test_reshard(tmp, 3, 2, ref, sh, first);
    if (!tr_test_failures) nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(ref);
    free(first);
    printf("%d checks, %d failures\n", tr_test_checks, tr_test_failures);
    return tr_test_failures || !tr_test_checks;
}
