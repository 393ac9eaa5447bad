// Weight resync across forked processes over the shared-memory communicator: a trainer's
// tensor-parallel group of a ranks, loaded from a checkpoint, sends to d generator replicas of
// tp b, whose weights start different. After a resync every receiving rank holds exactly what
// that checkpoint loaded directly at tp b holds, bit for bit (in place where the layouts match: tp 1
// to two replicas of tp 1, in many small buckets and in one default bucket, fp32 and bf16;
// resharded where they differ: 1 -> 2, 2 -> 1 on two replicas, 2 -> 2 on two replicas in
// bf16); the layout-free checksums of the senders and of each replica's ranks add up to the
// same value, and every rank reports the senders' version, bytes and bucket count. A receiver
// of another model shape fails before any bucket moves, and its failure aborts the senders
// and the other receivers with a message naming it.
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/device.h"
#include "engine/model.h"
#include "engine/resync.h"
#include "tests/backend_test.h"
#include "tests/test.h"

#define MAXW 6

static char tmp[256], ckpt[300];   // the trainer's weights: a checkpoint every layout loads

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": %d, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"float32\"}";

typedef struct shared {
    size_t n[MAXW];          // elements of each rank's layout
    uint64_t checksum[MAXW];
    int64_t version[MAXW];
    int32_t buckets[MAXW], senders[MAXW];
    size_t bytes[MAXW];
    int ok[MAXW];
    int same[MAXW];          // a receiver holds what a model of its layout drawn from SEED holds
    char msg[MAXW][600];
} shared;

typedef struct job {
    int32_t a, b, d;         // the senders' tp, the receivers' tp and replicas
    size_t bucket_bytes;     // the senders' (0: the default)
    int odd_rank;            // this receiver has another shape (-1: none)
    const char *precision;   // the ranks' backends ("bf16": the working copy travels in bf16)
} job;

static int world(const job *jb) { return jb->a + jb->b * jb->d; }

// Rank r's model: a sender is tp rank r of a, receiver r the tp rank (r - a) % b of b, loaded
// from the checkpoint, or (load false) drawn from its own seed.
static int make_model(const job *jb, int rank, tr_backend *be, bool load, tr_model *m, tr_err *err) {
    char text[sizeof CONFIG + 16];
    int n = snprintf(text, sizeof text, CONFIG, rank == jb->odd_rank ? 32 : 24);
    bool send = rank < jb->a;
    tr_model_opts mo = {.max_tokens = 16, .tp_size = send ? jb->a : jb->b,
                        .tp_rank = send ? rank : (rank - jb->a) % jb->b};
    if (load) return tr_model_load(m, ckpt, be, &mo, err);
    tr_model_config cfg;
    if (tr_config_parse(text, (size_t)n, "config", &cfg, err) || tr_model_init(m, &cfg, be, &mo, err)) return -1;
    if (!tr_model_init_weights(m, 100 + (uint64_t)rank, 0.3f, err)) return 0;
    tr_model_free(m);
    return -1;
}

// Whether m's working weights are bit for bit those of the checkpoint loaded directly in
// m's layout.
static int same_as_loaded(const job *jb, int rank, tr_backend *be, tr_model *m, int *same, tr_err *err) {
    tr_model ref;
    if (make_model(jb, rank, be, true, &ref, err)) return -1;
    tr_resync_view a = tr_resync_weights(m), b = tr_resync_weights(&ref);
    size_t bytes = a.n * tr_comm_dtype_size(a.dtype);
    uint8_t *ha = malloc(bytes), *hb = malloc(bytes);
    int rc = !ha || !hb || a.n != b.n || tr_dev_download_sync(be, ha, a.buf, bytes, "test", err) ||
             tr_dev_download_sync(be, hb, b.buf, bytes, "test", err);
    *same = !rc && memcmp(ha, hb, bytes) == 0;
    free(ha), free(hb);
    tr_model_free(&ref);
    return rc ? -1 : 0;
}

static int join(const job *jb, int rank, int fds[2], tr_backend *be, tr_comm **c, tr_err *err) {
    char id[TR_COMM_ID_MAX] = "";
    tr_comm_opts o = {.be = be, .rank = rank, .world = world(jb), .name = "sync"};
    int rc = 0;
    if (rank == 0) {
        rc = tr_comm_create(c, &o, id, sizeof id, err);
        for (int k = 1; k < world(jb) && !rc; k++) rc = write(fds[1], id, sizeof id) != (ssize_t)sizeof id;
    } else {
        rc = read(fds[0], id, sizeof id) != (ssize_t)sizeof id || tr_comm_open(c, &o, id, err);
    }
    return rc || tr_comm_join(*c, err) || tr_comm_wait(*c, 30000, err) ? -1 : 0;
}

static int rank_main(const job *jb, int rank, int fds[2], shared *sh) {
    tr_backend be;
    et_backend_in(&be, 1, jb->precision ? jb->precision : "fp32");
    tr_err err = {0};
    tr_model m;
    tr_comm *c = NULL;
    // The senders hold the trainer's weights; every receiver draws its own, which must be
    // overwritten, not already equal.
    bool send = rank < jb->a;
    if (make_model(jb, rank, &be, send, &m, &err)) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "setup: %.500s", err.msg);
        return 1;
    }
    if (join(jb, rank, fds, &be, &c, &err)) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "comm: %.500s", err.msg);
        return 1;
    }
    tr_resync_stats st;
    int rc = send ? tr_resync_send(c, &m, 42, jb->bucket_bytes, &st, &err) : tr_resync_recv(c, &m, &st, &err);
    if (!rc) rc = tr_resync_checksum(&m, &sh->checksum[rank], &err);
    sh->same[rank] = send;
    if (!rc && !send) rc = same_as_loaded(jb, rank, &be, &m, &sh->same[rank], &err);
    if (rc) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "%.590s", err.msg);
    } else {
        sh->version[rank] = st.version;
        sh->buckets[rank] = st.buckets;
        sh->senders[rank] = st.senders;
        sh->bytes[rank] = st.bytes;
        sh->n[rank] = m.layout.total;
        sh->ok[rank] = 1;
    }
    tr_comm_free(c);
    tr_model_free(&m);
    tr_backend_free(&be);
    return rc ? 1 : 0;
}

static void run(const job *jb, shared *sh) {
    memset(sh, 0, sizeof *sh);
    int fds[2];
    if (pipe(fds)) return;
    pid_t pids[MAXW];
    for (int r = 0; r < world(jb); r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(jb, r, fds, sh));
    }
    close(fds[0]);
    close(fds[1]);
    for (int r = 0; r < world(jb); r++) waitpid(pids[r], NULL, 0);
}

static void check_copied(const job *jb, const shared *sh) {
    int W = world(jb), all = 1;
    size_t es = jb->precision ? 2 : 4;
    for (int r = 0; r < W; r++) {
        CHECKF(sh->ok[r], "%d -> %d x %d: rank %d: %s", jb->a, jb->b, jb->d, r, sh->msg[r]);
        all &= sh->ok[r];
    }
    if (!all) return;
    // Every sender's layout goes out in buckets of the bucket length (the whole when 0).
    size_t bytes = 0;
    int32_t buckets = 0;
    uint64_t sent = 0;
    for (int k = 0; k < jb->a; k++) {
        size_t per = jb->bucket_bytes ? jb->bucket_bytes / es : sh->n[k];
        bytes += sh->n[k] * es;
        buckets += (int32_t)((sh->n[k] + per - 1) / per);
        sent += sh->checksum[k];
    }
    for (int r = 0; r < W; r++) {
        CHECKF(sh->version[r] == 42 && sh->senders[r] == jb->a && sh->bytes[r] == bytes && sh->buckets[r] == buckets,
               "%d -> %d x %d: rank %d: version %lld, %d senders, %zu bytes in %d buckets (want %zu in %d)", jb->a,
               jb->b, jb->d, r, (long long)sh->version[r], sh->senders[r], sh->bytes[r], sh->buckets[r], bytes,
               buckets);
        CHECKF(sh->same[r], "%d -> %d x %d: rank %d's weights differ from the checkpoint loaded in its layout",
               jb->a, jb->b, jb->d, r);
    }
    for (int d = 0; d < jb->d; d++) {
        uint64_t got = 0;
        for (int j = 0; j < jb->b; j++) got += sh->checksum[jb->a + d * jb->b + j];
        CHECKF(got == sent, "%d -> %d x %d: replica %d's checksum %016llx, the senders' %016llx", jb->a, jb->b, jb->d,
               d, (unsigned long long)got, (unsigned long long)sent);
    }
}

// The trainer's weights: a whole model drawn once and saved (fp32) for every rank to load.
static int save_trainer(tr_err *err) {
    snprintf(tmp, sizeof tmp, "%s", tr_test_tmpdir());
    snprintf(ckpt, sizeof ckpt, "%s/m", tmp);
    tr_backend be;
    et_backend_in(&be, 1, "fp32");
    char text[sizeof CONFIG + 16];
    int n = snprintf(text, sizeof text, CONFIG, 24);
    tr_model_config cfg;
    tr_model m;
    tr_ckpt_save_opts so = {.dtype = TR_ST_F32};
    int rc = tr_config_parse(text, (size_t)n, "config", &cfg, err) ||
             tr_model_init(&m, &cfg, &be, &(tr_model_opts){.max_tokens = 16}, err);
    if (!rc) {
        rc = tr_model_init_weights(&m, 7, 0.3f, err) || tr_model_save(&m, ckpt, &so, err);
        tr_model_free(&m);
    }
    tr_backend_free(&be);
    return rc;
}

int main(void) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return tr_test_summary("test_resync");
    tr_err err = {0};
    int saved = save_trainer(&err);
    CHECKF(saved == 0, "saving the trainer's checkpoint: %s", err.msg);
    if (saved) return tr_test_summary("test_resync");

    // The same layout: many buckets of 1000 bytes (250 floats), then one default bucket, then
    // bf16, where the working copy is what generation reads and what travels: half the bytes.
    static const job same[] = {{1, 1, 2, 1000, -1, NULL}, {1, 1, 2, 0, -1, NULL}, {1, 1, 2, 1000, -1, "bf16"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++) {
        run(&same[i], sh);
        check_copied(&same[i], sh);
    }
    printf("%zu values in %d buckets of 1000 bytes, checksum %016llx\n", sh->n[0], sh->buckets[0],
           (unsigned long long)sh->checksum[0]);
    // Another layout: each receiver keeps its part of every sender's buckets.
    static const job other[] = {{1, 2, 1, 1000, -1, NULL}, {2, 1, 2, 1000, -1, NULL}, {2, 2, 2, 600, -1, "bf16"}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        run(&other[i], sh);
        check_copied(&other[i], sh);
    }

    // Rank 2 has a larger MLP: it refuses the header, and everyone fails naming it.
    job odd = {1, 1, 2, 1000, 2, NULL};
    run(&odd, sh);
    for (int r = 0; r < 3; r++) CHECKF(!sh->ok[r], "rank %d succeeded with a mismatched receiver", r);
    CHECKF(strstr(sh->msg[2], "not the same model") != NULL, "rank 2: %s", sh->msg[2]);
    for (int r = 0; r < 2; r++)
        CHECKF(strstr(sh->msg[r], "aborted by rank 2") != NULL, "rank %d: %s", r, sh->msg[r]);
    printf("mismatch: %s\n", sh->msg[0]);
    munmap(sh, sizeof *sh);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (tr_test_failures == 0 && system(cmd) != 0) printf("could not remove %s\n", tmp);
    return tr_test_summary("test_resync");
}
