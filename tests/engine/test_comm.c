// The communicator with 2 and 3 forked processes: every collective on odd sizes spanning
// several staging chunks, against sums the test adds up itself in rank order, with bitwise
// equal results on every rank and across two runs; hundreds of small collectives of mixed
// kinds back to back; a mismatched collective, a rank killed
// while the others wait in a collective (they fail within 10 s), an explicit abort, a rank
// that never joins, and no shared-memory segment left behind.
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>

#include "engine/comm.h"
#include "tests/backend_test.h"
#include "tests/test.h"

#define MAXW 3
#define NF32 1500007   // f32 elements: more than one 4 MiB chunk
#define NF64 777781    // f64 elements: more than one chunk too
#define NI64 5

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

// Rank r's input element i: values of mixed sign and magnitude, so that sums round.
static float in_f32(int r, size_t i) {
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    return ((float)(h & 0xffffff) / 16777216.0f - 0.5f) * (float)(1 << (h >> 28));
}

static double in_f64(int r, size_t i) {
    return (double)in_f32(r, i) * 1.000000123456789 + (double)in_f32(r + 7, i) * 1e-9;
}

// What the children leave for the parent: per rank, the buffers after each collective.
typedef struct results {
    float ar[MAXW][NF32];
    double ar64[MAXW][NF64];
    int64_t ari[MAXW][NI64];
    float rs[MAXW][NF32];
    float ag[MAXW][NF32];
    double bc[MAXW][NF64];
    int status[MAXW];
    long long fail_ms[MAXW];      // abort tests: how long after the trigger the call failed
    int code[MAXW];
    char msg[MAXW][1100];
} results;

typedef void (*rank_fn)(int rank, int world, tr_backend *be, tr_comm *c, results *res);

typedef struct spec {
    int world;
    rank_fn fn;
    int no_join_rank;             // this rank never joins (-1: none)
    int join_timeout_ms;
    int peer_timeout_ms;          // 0: the communicator's default
} spec;

static void fail_child(results *res, int rank, const char *what, const tr_err *e) {
    snprintf(res->msg[rank], sizeof res->msg[rank], "%.20s: %.1000s", what, e->msg);
    res->code[rank] = e->code;
    fprintf(stderr, "rank %d: %s: %s\n", rank, what, e->msg);
}

// The body of child `rank`: backend, communicator (rank 0 makes it and pipes the id to the
// others), join, wait, then the test's function.
static int child(const spec *sp, int rank, int fds[2], results *res) {
    tr_backend be;
    et_backend(&be, 1);
    tr_comm_opts o = {.be = &be, .rank = rank, .world = sp->world, .name = "test", .peer_timeout_ms = sp->peer_timeout_ms};
    tr_comm *c = NULL;
    tr_err e = {0};
    char id[TR_COMM_ID_MAX] = "";
    if (rank == 0) {
        if (tr_comm_create(&c, &o, id, sizeof id, &e)) {
            fail_child(res, rank, "create", &e);
            return 1;
        }
        for (int k = 1; k < sp->world; k++)
            if (write(fds[1], id, sizeof id) != (ssize_t)sizeof id) return 1;
    } else {
        if (read(fds[0], id, sizeof id) != (ssize_t)sizeof id) return 1;
        if (tr_comm_open(&c, &o, id, &e)) {
            fail_child(res, rank, "open", &e);
            return 1;
        }
    }
    if (rank == sp->no_join_rank) {
        sleep_ms(sp->join_timeout_ms + 1500);
        tr_comm_free(c);
        return 0;
    }
    if (tr_comm_join(c, &e) || tr_comm_wait(c, sp->join_timeout_ms, &e)) {
        fail_child(res, rank, "join", &e);
        res->status[rank] = -1;
        tr_comm_free(c);
        return 0;
    }
    sp->fn(rank, sp->world, &be, c, res);
    tr_comm_free(c);
    tr_backend_free(&be);
    return 0;
}

// Runs sp's children to completion (they are killed after 60 s); returns 0 when all exited 0.
// Every rank this test forked, for shm_left: other tests running at the same time make
// communicators of their own, which must not count here.
static pid_t forked[256];
static int n_forked;

static int run(const spec *sp, results *res, pid_t *pids) {
    int fds[2];
    if (pipe(fds)) return -1;
    for (int r = 0; r < sp->world; r++) {
        pids[r] = fork();
        if (pids[r] > 0 && n_forked < (int)(sizeof forked / sizeof forked[0])) forked[n_forked++] = pids[r];
        if (pids[r] == 0) {
            close(fds[r == 0 ? 0 : 1]);
            _exit(child(sp, r, fds, res));
        }
    }
    close(fds[0]);
    close(fds[1]);
    return 0;
}

static int reap(const spec *sp, pid_t *pids, int skip) {
    int bad = 0;
    for (int r = 0; r < sp->world; r++) {
        if (r == skip) continue;
        int st;
        long long end = now_ms() + 60000;
        while (waitpid(pids[r], &st, WNOHANG) == 0) {
            if (now_ms() > end) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &st, 0);
                fprintf(stderr, "rank %d hung\n", r);
                bad = 1;
                break;
            }
            sleep_ms(10);
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad = 1;
    }
    return bad;
}

// ---- every collective ----

static void every_collective(int rank, int world, tr_backend *be, tr_comm *c, results *res) {
    tr_err e = {0};
    float *hf = malloc(NF32 * sizeof(float));
    double *hd = malloc(NF64 * sizeof(double));
    int64_t hi[NI64];
    float *df = et_dev(be, NULL, NF32 * sizeof(float));
    double *dd = et_dev(be, NULL, NF64 * sizeof(double));
    int64_t *di = et_dev(be, NULL, sizeof hi);
    for (size_t i = 0; i < NF32; i++) hf[i] = in_f32(rank, i);
    for (size_t i = 0; i < NF64; i++) hd[i] = in_f64(rank, i);
    for (int i = 0; i < NI64; i++) hi[i] = (int64_t)(rank + 1) * 1000000007LL * (i + 1);
    et_put(be, df, hf, NF32 * sizeof(float));
    et_put(be, dd, hd, NF64 * sizeof(double));
    et_put(be, di, hi, sizeof hi);
    int rc = tr_comm_all_reduce(c, df, NF32, TR_COMM_F32, &e) || tr_comm_all_reduce(c, dd, NF64, TR_COMM_F64, &e) ||
             tr_comm_all_reduce(c, di, NI64, TR_COMM_I64, &e) || tr_comm_all_reduce(c, df, 0, TR_COMM_F32, &e);
    if (!rc) {
        et_get(be, res->ar[rank], df, NF32 * sizeof(float));
        et_get(be, res->ar64[rank], dd, NF64 * sizeof(double));
        et_get(be, res->ari[rank], di, sizeof hi);
    }
    // Uneven segments, the first one larger than a chunk.
    size_t counts[MAXW] = {0};
    counts[0] = NF32 / world + 1001;
    for (int r = 1; r < world; r++) counts[r] = (NF32 - counts[0]) / (size_t)(world - 1);
    counts[world - 1] = NF32 - counts[0] - (world > 2 ? counts[1] : 0);
    et_put(be, df, hf, NF32 * sizeof(float));
    if (!rc) rc = tr_comm_reduce_scatter(c, df, counts, TR_COMM_F32, &e);
    if (!rc) et_get(be, res->rs[rank], df, NF32 * sizeof(float));
    // Gather: only the rank's own segment is meaningful before.
    size_t b = 0;
    for (int r = 0; r < rank; r++) b += counts[r];
    for (size_t i = 0; i < NF32; i++) hf[i] = i >= b && i < b + counts[rank] ? in_f32(9, i) : (float)-rank;
    et_put(be, df, hf, NF32 * sizeof(float));
    if (!rc) rc = tr_comm_all_gather(c, df, counts, TR_COMM_F32, &e);
    if (!rc) et_get(be, res->ag[rank], df, NF32 * sizeof(float));
    et_put(be, dd, hd, NF64 * sizeof(double));
    if (!rc) rc = tr_comm_broadcast(c, dd, NF64, TR_COMM_F64, world - 1, &e) || tr_comm_barrier(c, &e);
    if (!rc) et_get(be, res->bc[rank], dd, NF64 * sizeof(double));
    if (rc) fail_child(res, rank, "collective", &e);
    res->status[rank] = rc ? -1 : 1;
    free(hf);
    free(hd);
}

static void check_every(const results *res, int world, const char *label) {
    size_t counts[MAXW] = {0}, b[MAXW + 1] = {0};
    counts[0] = NF32 / world + 1001;
    for (int r = 1; r < world; r++) counts[r] = (NF32 - counts[0]) / (size_t)(world - 1);
    counts[world - 1] = NF32 - counts[0] - (world > 2 ? counts[1] : 0);
    for (int r = 0; r < world; r++) b[r + 1] = b[r] + counts[r];
    long bad_ar = 0, bad_ar64 = 0, bad_rs = 0, bad_ag = 0, bad_bc = 0, bad_i = 0;
    for (int r = 0; r < world; r++) {
        CHECKF(res->status[r] == 1, "%s: rank %d: %s", label, r, res->msg[r]);
        for (size_t i = 0; i < NF32; i++) {
            float want = in_f32(0, i);
            for (int k = 1; k < world; k++) want = want + in_f32(k, i);
            bad_ar += memcmp(&res->ar[r][i], &want, 4) != 0;
            if (i >= b[r] && i < b[r + 1]) bad_rs += memcmp(&res->rs[r][i], &want, 4) != 0;
            float g = in_f32(9, i);
            bad_ag += memcmp(&res->ag[r][i], &g, 4) != 0;
        }
        for (size_t i = 0; i < NF64; i++) {
            double want = in_f64(0, i);
            for (int k = 1; k < world; k++) want = want + in_f64(k, i);
            bad_ar64 += memcmp(&res->ar64[r][i], &want, 8) != 0;
            double root = in_f64(world - 1, i);
            bad_bc += memcmp(&res->bc[r][i], &root, 8) != 0;
        }
        for (int i = 0; i < NI64; i++)
            bad_i += res->ari[r][i] != (int64_t)(world * (world + 1) / 2) * 1000000007LL * (i + 1);
    }
    CHECKF(bad_ar == 0, "%s: all_reduce f32: %ld elements differ from the rank-order float sum", label, bad_ar);
    CHECKF(bad_ar64 == 0, "%s: all_reduce f64: %ld elements differ", label, bad_ar64);
    CHECKF(bad_i == 0, "%s: all_reduce i64: %ld elements differ", label, bad_i);
    CHECKF(bad_rs == 0, "%s: reduce_scatter: %ld elements of own segments differ", label, bad_rs);
    CHECKF(bad_ag == 0, "%s: all_gather: %ld elements differ", label, bad_ag);
    CHECKF(bad_bc == 0, "%s: broadcast: %ld elements differ from the root's", label, bad_bc);
    // The float sums really round: adding in another order gives other bits somewhere.
    long reordered = 0;
    for (size_t i = 0; i < NF32 && world > 2; i++) {
        float other = in_f32(2, i) + in_f32(1, i);
        other = other + in_f32(0, i);
        reordered += memcmp(&other, &res->ar[0][i], 4) != 0;
    }
    if (world > 2) CHECKF(reordered > 0, "%s: the inputs never round differently in another order", label);
}

static uint64_t results_hash(const results *res) {
    return hash_bytes(res->ar, sizeof res->ar) ^ hash_bytes(res->rs, sizeof res->rs) * 3 ^
           hash_bytes(res->ar64, sizeof res->ar64) * 5 ^ hash_bytes(res->ag, sizeof res->ag) * 7;
}

static void test_every_collective(results *res) {
    uint64_t prev = 0;
    for (int world = 2; world <= 3; world++) {
        for (int pass = 0; pass < 2; pass++) {
            spec sp = {.world = world, .fn = every_collective, .no_join_rank = -1, .join_timeout_ms = 30000};
            pid_t pids[MAXW];
            memset(res, 0, sizeof *res);
            run(&sp, res, pids);
            CHECKF(reap(&sp, pids, -1) == 0, "world %d: a rank failed", world);
            char label[32];
            snprintf(label, sizeof label, "world %d pass %d", world, pass);
            check_every(res, world, label);
            if (pass == 1) CHECKF(prev == results_hash(res), "world %d: two runs differ", world);
            prev = results_hash(res);
        }
    }
}

// Many small collectives of every kind back to back, each rank checking every result: a
// rank that runs ahead into the next collective must never overwrite what a slower one has
// still to read.
static void back_to_back(int rank, int world, tr_backend *be, tr_comm *c, results *res) {
    enum { N = 37, ITERS = 400 };
    tr_err e = {0};
    float h[N], got[N];
    float *d = et_dev(be, NULL, N * sizeof(float));
    size_t counts[MAXW] = {0};
    for (int r = 0; r < world; r++) counts[r] = (size_t)(N / world + (r == 0 ? N % world : 0));
    long bad = 0;
    int rc = 0;
    for (int it = 0; it < ITERS && !rc; it++) {
        int kind = it % 4;
        for (int i = 0; i < N; i++) h[i] = in_f32(rank + world * it, (size_t)i);
        et_put(be, d, h, sizeof h);
        if (kind == 0) rc = tr_comm_all_reduce(c, d, N, TR_COMM_F32, &e);
        else if (kind == 1) rc = tr_comm_all_gather(c, d, counts, TR_COMM_F32, &e);
        else if (kind == 2) rc = tr_comm_broadcast(c, d, N, TR_COMM_F32, it % world, &e);
        else rc = tr_comm_reduce_scatter(c, d, counts, TR_COMM_F32, &e);
        if (rc) break;
        et_get(be, got, d, sizeof got);
        size_t b = 0;
        for (int r = 0; r < rank; r++) b += counts[r];
        for (int i = 0; i < N; i++) {
            float want = in_f32(0 + world * it, (size_t)i);
            for (int k = 1; k < world; k++) want = want + in_f32(k + world * it, (size_t)i);
            if (kind == 1) {
                int owner = 0;
                for (size_t acc = counts[0]; (size_t)i >= acc; acc += counts[++owner]) {
                }
                want = in_f32(owner + world * it, (size_t)i);
            } else if (kind == 2) {
                want = in_f32(it % world + world * it, (size_t)i);
            } else if (kind == 3 && ((size_t)i < b || (size_t)i >= b + counts[rank])) {
                continue;
            }
            bad += memcmp(&got[i], &want, 4) != 0;
        }
    }
    if (rc) fail_child(res, rank, "back to back", &e);
    res->fail_ms[rank] = bad;
    res->status[rank] = rc ? -1 : 1;
}

static void test_back_to_back(results *res) {
    for (int world = 2; world <= 3; world++) {
        spec sp = {.world = world, .fn = back_to_back, .no_join_rank = -1, .join_timeout_ms = 30000};
        pid_t pids[MAXW];
        memset(res, 0, sizeof *res);
        run(&sp, res, pids);
        CHECKF(reap(&sp, pids, -1) == 0, "back to back, world %d: a rank failed", world);
        for (int r = 0; r < world; r++)
            CHECKF(res->status[r] == 1 && res->fail_ms[r] == 0, "back to back, world %d: rank %d: %lld wrong elements "
                   "%s", world, r, res->fail_ms[r], res->msg[r]);
    }
}

// ---- failures ----

static void mismatch(int rank, int world, tr_backend *be, tr_comm *c, results *res) {
    (void)world;
    tr_err e = {0};
    float *d = et_dev(be, NULL, 64 * sizeof(float));
    int rc = tr_comm_all_reduce(c, d, rank == 0 ? 10 : 11, TR_COMM_F32, &e);
    if (rc) fail_child(res, rank, "all_reduce", &e);
    res->status[rank] = rc ? -1 : 1;
    // Dead for good: the next call fails at once.
    res->fail_ms[rank] = tr_comm_dead(c) && tr_comm_barrier(c, &e) != 0;
}

// Rank world-1 sleeps (and is killed by the parent) while the others wait in a collective.
static void killed(int rank, int world, tr_backend *be, tr_comm *c, results *res) {
    tr_err e = {0};
    float *d = et_dev(be, NULL, 1000 * sizeof(float));
    if (rank == world - 1) {
        res->status[rank] = 2;   // the parent may kill now
        sleep_ms(60000);
        return;
    }
    int rc = tr_comm_all_reduce(c, d, 1000, TR_COMM_F32, &e);
    res->fail_ms[rank] = now_ms();
    if (rc) fail_child(res, rank, "all_reduce", &e);
    res->status[rank] = rc ? -1 : 1;
}

// Rank 1 aborts instead of taking part; rank 0 is blocked in a barrier.
static void aborted(int rank, int world, tr_backend *be, tr_comm *c, results *res) {
    (void)world;
    (void)be;
    tr_err e = {0};
    if (rank == 1) {
        sleep_ms(300);
        res->fail_ms[rank] = now_ms();
        tr_comm_abort(c, "the test gave up");
        res->status[rank] = 1;
        return;
    }
    int rc = tr_comm_barrier(c, &e);
    res->fail_ms[rank] = now_ms();
    if (rc) fail_child(res, rank, "barrier", &e);
    res->status[rank] = rc ? -1 : 1;
}

// Segments ("troupe-comm-<creator pid>-...") that ranks of this test created and left.
static int shm_left(void) {
    int n = 0;
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = 0;
        if (sscanf(e->d_name, "troupe-comm-%d-", &pid) != 1) continue;
        for (int i = 0; i < n_forked; i++) n += forked[i] == pid;
    }
    if (d) closedir(d);
    return n;
}

static void test_failures(results *res) {
    pid_t pids[MAXW];
    int before = shm_left();

    spec sp = {.world = 2, .fn = mismatch, .no_join_rank = -1, .join_timeout_ms = 30000};
    memset(res, 0, sizeof *res);
    run(&sp, res, pids);
    reap(&sp, pids, -1);
    for (int r = 0; r < 2; r++) {
        CHECKF(res->status[r] == -1 && res->code[r] == TR_EINVAL && strstr(res->msg[r], "called all_reduce of 11"),
               "mismatch: rank %d: %s", r, res->msg[r]);
        CHECKF(res->fail_ms[r] == 1, "mismatch: rank %d: the communicator stays usable", r);
    }

    // A 2 s peer timeout here keeps the test short; tests/rl/test_dp_fail.sh checks the default
    // (5 s) end to end.
    sp = (spec){.world = 3, .fn = killed, .no_join_rank = -1, .join_timeout_ms = 30000, .peer_timeout_ms = 2000};
    memset(res, 0, sizeof *res);
    run(&sp, res, pids);
    long long t_kill = 0;
    for (int i = 0; i < 3000 && !t_kill; i++) {
        if (res->status[2] == 2) {
            sleep_ms(200);   // the others are inside all_reduce by now
            kill(pids[2], SIGKILL);
            t_kill = now_ms();
        }
        sleep_ms(10);
    }
    int st;
    waitpid(pids[2], &st, 0);
    reap(&sp, pids, 2);
    for (int r = 0; r < 2; r++) {
        long long dt = res->fail_ms[r] - t_kill;
        CHECKF(res->status[r] == -1 && res->code[r] == TR_EPEER && strstr(res->msg[r], "rank 2"),
               "killed: rank %d: %s", r, res->msg[r]);
        CHECKF(t_kill > 0 && dt >= 1500 && dt < 4000, "killed: rank %d failed %lld ms after the kill (peer timeout "
               "2000 ms)", r, dt);
        printf("killed rank 2: rank %d failed %lld ms after the kill\n", r, dt);
    }

    sp = (spec){.world = 2, .fn = aborted, .no_join_rank = -1, .join_timeout_ms = 30000};
    memset(res, 0, sizeof *res);
    run(&sp, res, pids);
    reap(&sp, pids, -1);
    long long dt = res->fail_ms[0] - res->fail_ms[1];
    CHECKF(res->status[0] == -1 && strstr(res->msg[0], "aborted by rank 1") && strstr(res->msg[0], "gave up"),
           "abort: rank 0: %s", res->msg[0]);
    CHECKF(dt >= 0 && dt < 1000, "abort: rank 0 failed %lld ms after rank 1 aborted", dt);

    sp = (spec){.world = 3, .fn = aborted, .no_join_rank = 2, .join_timeout_ms = 500};
    memset(res, 0, sizeof *res);
    run(&sp, res, pids);
    reap(&sp, pids, -1);
    for (int r = 0; r < 2; r++)
        CHECKF(res->status[r] == -1 && strstr(res->msg[r], "rank 2 of 3 did not join within 500 ms"),
               "join timeout: rank %d: %s", r, res->msg[r]);

    CHECKF(shm_left() == before, "%d shared-memory segments left behind", shm_left() - before);
}

static void test_shards(void) {
    size_t n = 1003, end = 0;
    for (int w = 1; w <= 5; w++) {
        for (int r = 0; r < w; r++) {
            size_t b = tr_comm_shard_begin(n, w, r, 16), e = tr_comm_shard_begin(n, w, r + 1, 16);
            CHECK(b % 16 == 0 && b <= e && (r > 0 || b == 0));
            end = e;
        }
        CHECK(end == n);
    }
    CHECK(tr_comm_shard_begin(10, 4, 3, 16) == 10);
}

int main(void) {
    results *res = mmap(NULL, sizeof(results), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED) return 1;
    test_shards();
    test_every_collective(res);
    test_back_to_back(res);
    test_failures(res);
    printf("%d checks, %d failures\n", tr_test_checks, tr_test_failures);
    return tr_test_failures || !tr_test_checks;
}
