// Weight resync across forked processes over the shared-memory communicator: one sender and
// two receivers whose weights start different; after a resync in many small buckets, and
// again in one default bucket, every receiver holds the sender's weights bit for bit, the
// checksums of all three agree, and the version is the sender's. A receiver of another model
// shape fails before any bucket moves, and its failure aborts the sender and the other
// receiver with a message naming it.
#include <stdio.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/resync.h"
#include "tests/backend_test.h"
#include "tests/test.h"

#define WORLD 3
#define MAXP 8192

static const char CONFIG[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": %d, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"float32\"}";

typedef struct shared {
    float params[WORLD][MAXP];
    size_t n_params[WORLD];
    uint64_t checksum[WORLD];
    int64_t version[WORLD];
    int32_t buckets[WORLD];
    size_t bytes[WORLD];
    int ok[WORLD];
    char msg[WORLD][600];
} shared;

typedef struct job {
    size_t bucket_bytes;     // the sender's (0: the default)
    int odd_rank;            // this receiver has another shape (-1: none)
    const char *precision;   // the ranks' backends ("bf16": the working copy travels in bf16)
} job;

static int rank_main(const job *jb, int rank, int fds[2], shared *sh) {
    tr_backend be;
    et_backend_in(&be, 1, jb->precision ? jb->precision : "fp32");
    tr_err err = {0};
    char text[sizeof CONFIG + 16];
    int n = snprintf(text, sizeof text, CONFIG, rank == jb->odd_rank ? 32 : 24);
    tr_model_config cfg;
    tr_model m;
    tr_comm *c = NULL;
    // Every rank draws its own weights: the receivers' must be overwritten, not already equal.
    if (tr_config_parse(text, (size_t)n, "config", &cfg, &err) ||
        tr_model_init(&m, &cfg, &be, &(tr_model_opts){.max_tokens = 16}, &err) ||
        tr_model_init_weights(&m, 7 + (uint64_t)rank, 0.3f, &err)) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "setup: %.500s", err.msg);
        return 1;
    }
    char id[TR_COMM_ID_MAX] = "";
    tr_comm_opts o = {.be = &be, .rank = rank, .world = WORLD, .name = "sync"};
    int rc = 0;
    if (rank == 0) {
        rc = tr_comm_create(&c, &o, id, sizeof id, &err);
        for (int k = 1; k < WORLD && !rc; k++) rc = write(fds[1], id, sizeof id) != (ssize_t)sizeof id;
    } else {
        rc = read(fds[0], id, sizeof id) != (ssize_t)sizeof id || tr_comm_open(&c, &o, id, &err);
    }
    if (rc || tr_comm_join(c, &err) || tr_comm_wait(c, 30000, &err)) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "comm: %.500s", err.msg);
        return 1;
    }
    tr_resync_stats st;
    rc = rank == 0 ? tr_resync_send(c, 0, &m, 42, jb->bucket_bytes, &st, &err) : tr_resync_recv(c, 0, &m, &st, &err);
    if (!rc) rc = tr_resync_checksum(&m, &sh->checksum[rank], &err);
    if (rc) {
        snprintf(sh->msg[rank], sizeof sh->msg[rank], "%.590s", err.msg);
    } else {
        sh->version[rank] = st.version;
        sh->buckets[rank] = st.buckets;
        sh->bytes[rank] = st.bytes;
        sh->n_params[rank] = m.layout.total;
        sh->ok[rank] = m.layout.total <= MAXP && tr_model_read_params(&m, sh->params[rank], &err) == 0;
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
    pid_t pids[WORLD];
    for (int r = 0; r < WORLD; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(jb, r, fds, sh));
    }
    close(fds[0]);
    close(fds[1]);
    for (int r = 0; r < WORLD; r++) waitpid(pids[r], NULL, 0);
}

static void check_copied(const shared *sh, size_t bucket_bytes, size_t es) {
    for (int r = 0; r < WORLD; r++) CHECKF(sh->ok[r], "rank %d: %s", r, sh->msg[r]);
    if (!sh->ok[0] || !sh->ok[1] || !sh->ok[2]) return;
    size_t n = sh->n_params[0];
    size_t per = bucket_bytes ? bucket_bytes / es : n;
    for (int r = 1; r < WORLD; r++) {
        CHECK(sh->n_params[r] == n);
        CHECKF(memcmp(sh->params[r], sh->params[0], n * sizeof(float)) == 0, "rank %d's weights differ", r);
        CHECK(sh->checksum[r] == sh->checksum[0]);
    }
    for (int r = 0; r < WORLD; r++) {
        CHECK(sh->version[r] == 42);
        CHECK(sh->bytes[r] == n * es);
        CHECKF(sh->buckets[r] == (int32_t)((n + per - 1) / per), "rank %d: %d buckets for %zu floats of %zu", r,
               sh->buckets[r], n, per);
    }
}

int main(void) {
    shared *sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    if (sh == MAP_FAILED) return tr_test_summary("test_resync");

    // Many buckets of 1000 bytes (250 floats), then one default bucket.
    job small = {.bucket_bytes = 1000, .odd_rank = -1};
    run(&small, sh);
    check_copied(sh, 1000, 4);
    printf("%zu floats in %d buckets, checksum %016llx\n", sh->n_params[0], sh->buckets[0],
           (unsigned long long)sh->checksum[0]);
    job whole = {.bucket_bytes = 0, .odd_rank = -1};
    run(&whole, sh);
    check_copied(sh, 0, 4);
    // In bf16 the working copy is what generation reads, and what travels: half the bytes.
    job bf16 = {.bucket_bytes = 1000, .odd_rank = -1, .precision = "bf16"};
    run(&bf16, sh);
    check_copied(sh, 1000, 2);
    printf("bf16: %zu values in %d buckets of 1000 bytes\n", sh->n_params[0], sh->buckets[0]);

    // Rank 2 has a larger MLP: it refuses the header, and everyone fails naming it.
    job odd = {.bucket_bytes = 1000, .odd_rank = 2};
    run(&odd, sh);
    for (int r = 0; r < WORLD; r++) CHECKF(!sh->ok[r], "rank %d succeeded with a mismatched receiver", r);
    CHECKF(strstr(sh->msg[2], "not the same model") != NULL, "rank 2: %s", sh->msg[2]);
    for (int r = 0; r < 2; r++)
        CHECKF(strstr(sh->msg[r], "aborted by rank 2") != NULL, "rank %d: %s", r, sh->msg[r]);
    printf("mismatch: %s\n", sh->msg[0]);
    munmap(sh, sizeof *sh);
    return tr_test_summary("test_resync");
}
