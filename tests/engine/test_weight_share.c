// Shared working weights (engine/weight_share.h) between a trainer process and a generator
// process, forked, over the CPU backend's shared memory (fp32, and bf16 where the working
// copy is narrower than the masters). The trainer publishes its buffer with a version and the
// generator maps it: its weights and logprobs are then the trainer's, bit for bit. With two
// buffers the trainer takes optimizer steps while the generator reads the published buffer:
// that buffer does not change under the reader (no write while read), the trainer's writes go
// to the other buffer, and the next publish names that one, flipping back and forth. With one
// buffer the same steps land in what the reader reads, which is why the one-step-off pipeline
// needs two. A handle of another size or a changed handle is refused.
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/heads.h"
#include "engine/resync.h"
#include "engine/train.h"
#include "engine/weight_share.h"
#include "tests/backend_test.h"
#include "tests/engine/model_util.h"
#include "tests/test.h"

#define ROUNDS 3

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000.0, \"tie_word_embeddings\": true}";

static const tr_optim_cfg OPT = {.lr = 1e-2, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-3f,
                                 .schedule = {.kind = TR_LR_CONSTANT}};

// What a sync tells the generator: the buffer, its handle and the version it holds.
typedef struct sync_msg {
    int32_t index;
    int64_t version;
    tr_share_handle handle;
    size_t bytes;
} sync_msg;

typedef struct shared {
    int32_t index[ROUNDS];                 // the buffer each publish named
    uint64_t trainer_sum[ROUNDS];          // the trainer's weights at each publish
    float trainer_lp[ROUNDS][16];          // and its logprobs of the probe
    uint64_t read_sum[ROUNDS];             // the generator's, right after mapping
    float read_lp[ROUNDS][16];
    uint64_t after_sum[ROUNDS];            // the generator's once the trainer stepped again
    float after_lp[ROUNDS][16];
    int ok[2];
    char msg[2][600];
} shared;

static packed_batch probe;   // one document the two sides score

static int model_init(tr_backend *be, bool train, tr_model *m, tr_err *err) {
    tr_model_config cfg;
    tr_model_opts mo = {.max_tokens = 32, .training = train, .external_work = true};
    return tr_config_parse(CONFIG, strlen(CONFIG), "config", &cfg, err) || tr_model_init(m, &cfg, be, &mo, err);
}

static int score(tr_model *m, uint64_t *sum, float *lp, tr_err *err) {
    return tr_resync_checksum(m, sum, err) || tr_model_forward(m, probe.ids, &probe.docs, err) ||
           tr_lm_head_forward(m, probe.targets, lp, NULL, err);
}

static int step(tr_trainer *tr, int s, tr_err *err) {
    packed_batch b;
    int32_t ids[12], len = 12;
    for (int t = 0; t < len; t++) ids[t] = (s * 7 + t * t + 3 * t) % 31;
    pack_batch(&b, ids, &len, 1);
    tr_micro_batch mb = {.ids = b.ids, .docs = b.docs, .targets = b.targets};
    tr_step_args args = {.loss = TR_LOSS_CROSS_ENTROPY, .norm = TR_NORM_TOKEN_MEAN};
    tr_step_result res;
    return tr_train_step(tr, &mb, 1, &args, &res, err);
}

static bool wr(int fd, const void *p, size_t n) { return write(fd, p, n) == (ssize_t)n; }
static bool rd(int fd, void *p, size_t n) { return read(fd, p, n) == (ssize_t)n; }

// The trainer: publish, let the generator map and score, step while it reads, repeat.
static int trainer(int nbuf, const char *prec, int to_gen, int from_gen, shared *sh) {
    tr_backend be;
    et_backend_in(&be, 1, prec);
    tr_err err = {0};
    tr_model m;
    tr_wshare ws;
    tr_trainer tr;
    int rc = model_init(&be, true, &m, &err) || tr_wshare_init(&ws, &m, nbuf, &err) ||
             tr_model_init_weights(&m, 5, 0.3f, &err) || tr_trainer_init(&tr, &m, &OPT, 1, &err);
    char ack;
    for (int r = 0; r < ROUNDS && !rc; r++) {
        sync_msg s = {.index = tr_wshare_publish(&ws, r), .version = r, .bytes = ws.bytes};
        s.handle = ws.handle[s.index];
        sh->index[r] = s.index;
        rc = score(&m, &sh->trainer_sum[r], sh->trainer_lp[r], &err) || !wr(to_gen, &s, sizeof s) ||
             !rd(from_gen, &ack, 1);
        // The generator has mapped and scored the published weights and now "generates" on
        // them while this step runs, as the one-step-off pipeline does.
        if (!rc) rc = tr_wshare_begin_write(&ws, &m, &err) || step(&tr, r, &err);
        if (!rc && nbuf == 2 && ws.cur == ws.published) rc = tr_errf(&err, TR_EINVAL, "step %d wrote the published buffer", r);
        if (!rc) rc = !wr(to_gen, "s", 1) || !rd(from_gen, &ack, 1);
    }
    sync_msg bad = {.index = 0, .version = 99, .bytes = ws.bytes + 2, .handle = ws.handle[0]};
    if (!rc) rc = !wr(to_gen, &bad, sizeof bad) || !rd(from_gen, &ack, 1);
    if (rc) snprintf(sh->msg[0], sizeof sh->msg[0], "trainer: %.580s", err.msg);
    sh->ok[0] = !rc;
    tr_trainer_free(&tr);
    tr_model_free(&m);
    tr_wshare_free(&ws);
    tr_backend_free(&be);
    return rc;
}

// The generator: map what each sync names, score it, and score it again once the trainer
// has stepped (still reading the same buffer).
static int generator(const char *prec, int from_tr, int to_tr, shared *sh) {
    tr_backend be;
    et_backend_in(&be, 1, prec);
    tr_err err = {0};
    tr_model m;
    tr_wshare_reader rd_ = {0};
    int rc = model_init(&be, false, &m, &err);
    if (!rc) tr_wshare_reader_init(&rd_, &m);
    char ack;
    for (int r = 0; r < ROUNDS && !rc; r++) {
        sync_msg s;
        rc = !rd(from_tr, &s, sizeof s) || tr_wshare_read(&rd_, &m, s.index, &s.handle, s.bytes, &err) ||
             score(&m, &sh->read_sum[r], sh->read_lp[r], &err) || !wr(to_tr, "r", 1) || !rd(from_tr, &ack, 1) ||
             score(&m, &sh->after_sum[r], sh->after_lp[r], &err) || !wr(to_tr, "a", 1);
    }
    sync_msg bad;
    if (!rc) rc = !rd(from_tr, &bad, sizeof bad);
    if (!rc && tr_wshare_read(&rd_, &m, bad.index, &bad.handle, bad.bytes, &err) == 0)
        rc = tr_errf(&err, TR_EINVAL, "a buffer of another size was taken");
    else if (!rc && !strstr(err.msg, "not the same model"))
        rc = -1;
    if (!rc) rc = !wr(to_tr, "b", 1);
    if (rc) snprintf(sh->msg[1], sizeof sh->msg[1], "generator: %.580s", err.msg);
    sh->ok[1] = !rc;
    tr_wshare_reader_free(&rd_);
    tr_model_free(&m);
    tr_backend_free(&be);
    return rc;
}

static void run(int nbuf, const char *prec, shared *sh) {
    memset(sh, 0, sizeof *sh);
    int a[2], b[2];
    if (pipe(a) || pipe(b)) return;
    // Each side keeps only its own ends, so one that fails ends the other's reads.
    pid_t t = fork();
    if (t == 0) {
        close(a[0]), close(b[1]);
        _exit(trainer(nbuf, prec, a[1], b[0], sh) ? 1 : 0);
    }
    pid_t g = fork();
    if (g == 0) {
        close(a[1]), close(b[0]);
        _exit(generator(prec, a[0], b[1], sh) ? 1 : 0);
    }
    close(a[0]), close(a[1]), close(b[0]), close(b[1]);
    waitpid(t, NULL, 0);
    waitpid(g, NULL, 0);
}

static bool same_lp(const float *x, const float *y) { return memcmp(x, y, 16 * sizeof(float)) == 0; }

static void check(int nbuf, const char *prec, const shared *sh) {
    CHECKF(sh->ok[0] && sh->ok[1], "%d buffers, %s: %s %s", nbuf, prec, sh->msg[0], sh->msg[1]);
    if (!sh->ok[0] || !sh->ok[1]) return;
    for (int r = 0; r < ROUNDS; r++) {
        // Mapped: the trainer's weights and logprobs, bit for bit.
        CHECKF(sh->read_sum[r] == sh->trainer_sum[r] && same_lp(sh->read_lp[r], sh->trainer_lp[r]),
               "%d buffers, %s, round %d: the generator does not read the published weights", nbuf, prec, r);
        if (r > 0) CHECKF(sh->trainer_sum[r] != sh->trainer_sum[r - 1], "round %d: the step changed nothing", r);
        bool kept = sh->after_sum[r] == sh->read_sum[r] && same_lp(sh->after_lp[r], sh->read_lp[r]);
        if (nbuf == 2) {
            CHECKF(kept, "%s, round %d: a step wrote the buffer being read", prec, r);
            CHECKF(sh->index[r] == r % 2, "%s, round %d: published buffer %d, not %d", prec, r, sh->index[r], r % 2);
        } else {
            CHECKF(!kept && sh->index[r] == 0, "one buffer, %s, round %d: the step did not land in what is read",
                   prec, r);
        }
    }
}

int main(void) {
    int32_t ids[16], len = 16;
    for (int t = 0; t < len; t++) ids[t] = (t * 11 + 5) % 31;
    pack_batch(&probe, ids, &len, 1);
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return tr_test_summary("test_weight_share");
    static const char *const precs[] = {"fp32", "bf16"};
    for (int p = 0; p < 2; p++)
        for (int nbuf = 2; nbuf >= 1; nbuf--) {
            run(nbuf, precs[p], sh);
            check(nbuf, precs[p], sh);
        }
    munmap(sh, sizeof *sh);
    return tr_test_summary("test_weight_share");
}
