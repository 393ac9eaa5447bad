// The shared-memory communicator for CPU processes of one machine: one POSIX shared-memory
// segment per communicator holds a header (abort word and message), one record per rank
// (barrier counter, heartbeat, the collective it is in), a staging slot per rank and a
// result area. Collectives move backend memory through the slots with the backend's own
// download/upload, in chunks; each rank reduces its part of a chunk in rank order (rank 0 +
// rank 1 + ... in the dtype's precision), so every rank gets the same bits whichever rank
// computed them. Waiting is atomics with yields and short sleeps; a heartbeat thread per rank
// lets the others declare it dead when it stops, and any rank can abort the whole group.
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "engine/comm_impl.h"

#define SHM_MAGIC 0x74727368u   // "trsh"
#define SHM_VERSION 1u
#define SHM_PAGE 4096u
#define SHM_SEGMENT_TARGET ((size_t)32 << 20)   // slots + result, whatever the world
#define SHM_SLOT_MAX ((size_t)4 << 20)
#define SHM_SLOT_MIN ((size_t)64 << 10)
#define BEAT_MS 100

typedef struct shm_rank {
    _Alignas(64) _Atomic uint64_t arrive;   // barriers this rank has reached
    _Atomic int64_t beat_ms;                // CLOCK_MONOTONIC time of its last heartbeat
    _Atomic uint32_t joined;
    int32_t pid;
    // The collective this rank is in; every rank's must agree.
    uint64_t call;
    uint32_t op, dtype;
    uint64_t n, counts_hash;
    int32_t root;
} shm_rank;

typedef struct shm_header {
    _Atomic uint32_t magic;          // written last by the creator
    uint32_t version;
    int32_t world;
    int32_t creator_pid;
    uint64_t slot_bytes;
    uint64_t ranks_off, slots_off, result_off, total_bytes;
    _Atomic uint32_t abort_state;    // 0 running, 1 message being written, 2 aborted
    char abort_msg[512];
} shm_header;

typedef struct shm_comm {
    tr_comm base;
    char shm_name[64];
    bool owner, unlinked;
    uint8_t *map;
    size_t map_len;
    shm_header *h;
    shm_rank *ranks;
    uint8_t *slots, *result;
    uint64_t barriers;     // barriers this rank has passed
    uint64_t calls;        // collectives this rank has started
    pthread_t beat;
    bool beat_started;
    _Atomic int beat_quit;
} shm_comm;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000L};
    nanosleep(&ts, NULL);
}

static size_t round_up(size_t x, size_t a) {
    return (x + a - 1) / a * a;
}

static size_t slot_bytes_for(int32_t world) {
    size_t s = SHM_SEGMENT_TARGET / (size_t)(world + 1);
    if (s > SHM_SLOT_MAX) s = SHM_SLOT_MAX;
    if (s < SHM_SLOT_MIN) s = SHM_SLOT_MIN;
    return s / SHM_PAGE * SHM_PAGE;
}

static void layout(shm_header *h, int32_t world) {
    h->world = world;
    h->slot_bytes = slot_bytes_for(world);
    h->ranks_off = round_up(sizeof(shm_header), SHM_PAGE);
    h->slots_off = round_up(h->ranks_off + (size_t)world * sizeof(shm_rank), SHM_PAGE);
    h->result_off = h->slots_off + (size_t)world * h->slot_bytes;
    h->total_bytes = h->result_off + h->slot_bytes;
}

static void bind_views(shm_comm *s) {
    s->h = (shm_header *)s->map;
    s->ranks = (shm_rank *)(s->map + s->h->ranks_off);
    s->slots = s->map + s->h->slots_off;
    s->result = s->map + s->h->result_off;
}

// ---- abort and liveness ----

static void shm_abort(tr_comm *c, const char *why) {
    shm_comm *s = (shm_comm *)c;
    if (!s->h) return;
    uint32_t expect = 0;
    if (atomic_compare_exchange_strong(&s->h->abort_state, &expect, 1)) {
        snprintf(s->h->abort_msg, sizeof s->h->abort_msg, "rank %d (pid %d): %s", c->rank, (int)getpid(), why);
        atomic_store_explicit(&s->h->abort_state, 2, memory_order_release);
    }
}

static bool shm_dead(tr_comm *c) {
    shm_comm *s = (shm_comm *)c;
    return s->h && atomic_load_explicit(&s->h->abort_state, memory_order_acquire) != 0;
}

// -1 with the abort message when some rank aborted.
static int check_abort(shm_comm *s, tr_err *err) {
    uint32_t st = atomic_load_explicit(&s->h->abort_state, memory_order_acquire);
    if (st == 0) return 0;
    for (int i = 0; st == 1 && i < 1000; i++) {
        sleep_us(100);
        st = atomic_load_explicit(&s->h->abort_state, memory_order_acquire);
    }
    char msg[sizeof s->h->abort_msg];
    memcpy(msg, s->h->abort_msg, sizeof msg);
    msg[sizeof msg - 1] = '\0';
    return tr_errf(err, TR_EPEER, "aborted by %s", st == 2 ? msg : "a rank");
}

// Fails (aborting everyone) when a stop was requested or rank i, whose turn it is, has
// stopped beating.
static int check_peer(shm_comm *s, int32_t i, int64_t now, tr_err *err) {
    tr_comm *c = &s->base;
    if (c->stop && *c->stop) {
        shm_abort(c, "stopped by a signal");
        return tr_errf(err, TR_ECANCELED, "stopped by a signal");
    }
    if (i < 0 || !atomic_load_explicit(&s->ranks[i].joined, memory_order_acquire)) return 0;
    int64_t age = now - atomic_load_explicit(&s->ranks[i].beat_ms, memory_order_acquire);
    if (age <= c->peer_timeout_ms) return 0;
    char why[160];
    snprintf(why, sizeof why, "rank %d (pid %d) stopped responding: its heartbeat is %" PRId64
             " ms old (killed, stopped or hung)", i, s->ranks[i].pid, age);
    shm_abort(c, why);
    return tr_errf(err, TR_EPEER, "%s", why);
}

static void *beat_main(void *arg) {
    shm_comm *s = arg;
    shm_rank *me = &s->ranks[s->base.rank];
    while (!atomic_load(&s->beat_quit)) {
        atomic_store_explicit(&me->beat_ms, now_ms(), memory_order_release);
        for (int k = 0; k < BEAT_MS / 20 && !atomic_load(&s->beat_quit); k++) sleep_us(20000);
    }
    return NULL;
}

// ---- waiting ----

// The first rank whose barrier counter is below k, or -1 when all reached it.
static int32_t first_behind(shm_comm *s, uint64_t k) {
    for (int32_t i = 0; i < s->base.world; i++)
        if (atomic_load_explicit(&s->ranks[i].arrive, memory_order_acquire) < k) return i;
    return -1;
}

// Spins briefly, then yields, then sleeps in growing steps (at most 200 us): ranks are
// processes that may share few cores, so a waiter must give its core away soon.
static void backoff(int64_t iter) {
    if (iter < 64) return;
    if (iter < 512) {
        sched_yield();
        return;
    }
    long us = 10 + (iter - 512) / 4;
    sleep_us(us < 200 ? us : 200);
}

static int barrier(shm_comm *s, tr_err *err) {
    uint64_t k = ++s->barriers;
    atomic_store_explicit(&s->ranks[s->base.rank].arrive, k, memory_order_release);
    for (int64_t iter = 0;; iter++) {
        int32_t behind = first_behind(s, k);
        if (behind < 0) return 0;
        if (check_abort(s, err)) return -1;
        if (iter % 16 == 0) {
            int64_t now = now_ms();
            for (int32_t i = behind; i < s->base.world; i++)
                if (atomic_load_explicit(&s->ranks[i].arrive, memory_order_acquire) < k &&
                    check_peer(s, i, now, err))
                    return -1;
        }
        backoff(iter);
    }
}

// ---- create, open, join, wait ----

static const tr_comm_vt shm_vt;

static int map_segment(shm_comm *s, int fd, size_t bytes, tr_err *err) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return tr_errf(err, TR_EIO, "mmap of shared memory %s (%zu bytes): %s", s->shm_name, bytes,
                       strerror(errno));
    s->map = p;
    s->map_len = bytes;
    return 0;
}

static void shm_free(tr_comm *c) {
    shm_comm *s = (shm_comm *)c;
    if (s->beat_started) {
        atomic_store(&s->beat_quit, 1);
        pthread_join(s->beat, NULL);
    }
    if (s->owner && !s->unlinked) shm_unlink(s->shm_name);
    if (s->map) munmap(s->map, s->map_len);
    free(s);
}

static shm_comm *shm_new(const tr_comm_opts *o, tr_err *err) {
    shm_comm *s = calloc(1, sizeof *s);
    if (!s) {
        tr_errf(err, TR_ENOMEM, "communicator: out of memory");
        return NULL;
    }
    tr_comm_base_init(&s->base, &shm_vt, o);
    return s;
}

int tr_comm_shm_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err) {
    _Atomic uint64_t probe = 0;
    if (!atomic_is_lock_free(&probe))
        return tr_errf(err, TR_EUNSUPPORTED, "communicator: 64-bit atomics are not lock-free here, so they "
                       "cannot be shared between processes");
    shm_comm *s = shm_new(o, err);
    if (!s) return -1;
    uint64_t r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r) r = (uint64_t)now_ms() ^ ((uint64_t)getpid() << 32);
    snprintf(s->shm_name, sizeof s->shm_name, "/troupe-comm-%d-%016" PRIx64, (int)getpid(), r);
    shm_header hdr;
    memset(&hdr, 0, sizeof hdr);
    layout(&hdr, o->world);
    int fd = shm_open(s->shm_name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        tr_errf(err, TR_EIO, "communicator %s: shm_open %s: %s", s->base.name, s->shm_name, strerror(errno));
        free(s);
        return -1;
    }
    s->owner = true;
    // Reserve the pages now: on a full /dev/shm a later first touch would be SIGBUS.
    int rc = ftruncate(fd, (off_t)hdr.total_bytes) != 0 ? errno : posix_fallocate(fd, 0, (off_t)hdr.total_bytes);
    if (rc) {
        tr_errf(err, TR_EIO, "communicator %s: %s: cannot reserve %" PRIu64 " bytes of shared memory: %s",
                s->base.name, s->shm_name, hdr.total_bytes, strerror(rc));
        close(fd);
        shm_free(&s->base);
        return -1;
    }
    rc = map_segment(s, fd, hdr.total_bytes, err);
    close(fd);
    if (rc) {
        shm_free(&s->base);
        return -1;
    }
    // The pages start zeroed: every rank record is empty and no one has aborted.
    shm_header *h = (shm_header *)s->map;
    layout(h, o->world);
    h->version = SHM_VERSION;
    h->creator_pid = (int32_t)getpid();
    bind_views(s);
    atomic_store_explicit(&h->magic, SHM_MAGIC, memory_order_release);
    int n = snprintf(id, cap, "shm:%s", s->shm_name);
    if (n < 0 || (size_t)n >= cap) {
        shm_free(&s->base);
        return tr_errf(err, TR_ERANGE, "communicator: id buffer of %zu bytes is too small", cap);
    }
    *out = &s->base;
    return 0;
}

int tr_comm_shm_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err) {
    const char *name = id + 4;
    if (name[0] != '/' || strlen(name) >= sizeof ((shm_comm *)0)->shm_name || strchr(name + 1, '/'))
        return tr_errf(err, TR_EINVAL, "communicator: '%.80s' is not a shared-memory id", id);
    shm_comm *s = shm_new(o, err);
    if (!s) return -1;
    snprintf(s->shm_name, sizeof s->shm_name, "%s", name);
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        int e = errno;
        tr_errf(err, e == ENOENT ? TR_EINVAL : TR_EIO, "communicator %s rank %d: shared memory %s: %s%s",
                s->base.name, o->rank, name, strerror(e),
                e == ENOENT ? " (cpu ranks of one group must run on one machine, and rank 0 must be alive)" : "");
        free(s);
        return -1;
    }
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? tr_errf(err, TR_EIO, "communicator: fstat %s: %s", name, strerror(errno)) : 0;
    if (!rc && (size_t)st.st_size < sizeof(shm_header))
        rc = tr_errf(err, TR_EFORMAT, "communicator: %s is %lld bytes, not a communicator", name,
                     (long long)st.st_size);
    if (!rc) rc = map_segment(s, fd, (size_t)st.st_size, err);
    close(fd);
    shm_header *h = rc ? NULL : (shm_header *)s->map;
    if (!rc && (atomic_load_explicit(&h->magic, memory_order_acquire) != SHM_MAGIC || h->version != SHM_VERSION ||
                h->total_bytes != (uint64_t)st.st_size))
        rc = tr_errf(err, TR_EFORMAT, "communicator: %s is not a troupe communicator of version %u", name,
                     SHM_VERSION);
    if (!rc && h->world != o->world)
        rc = tr_errf(err, TR_EINVAL, "communicator %s: %s has %d ranks, rank %d expects %d", s->base.name, name,
                     h->world, o->rank, o->world);
    if (rc) {
        shm_free(&s->base);
        return -1;
    }
    bind_views(s);
    *out = &s->base;
    return 0;
}

static int shm_join(tr_comm *c, tr_err *err) {
    shm_comm *s = (shm_comm *)c;
    shm_rank *me = &s->ranks[c->rank];
    if (check_abort(s, err)) return -1;
    if (atomic_load(&me->joined))
        return tr_errf(err, TR_EINVAL, "rank %d already joined (pid %d): two processes claim it", c->rank, me->pid);
    me->pid = (int32_t)getpid();
    atomic_store_explicit(&me->beat_ms, now_ms(), memory_order_release);
    atomic_store(&s->beat_quit, 0);
    int e = pthread_create(&s->beat, NULL, beat_main, s);
    if (e) return tr_errf(err, TR_EIO, "cannot start the heartbeat thread: %s", strerror(e));
    s->beat_started = true;
    atomic_store_explicit(&me->joined, 1, memory_order_release);
    return 0;
}

static int shm_wait(tr_comm *c, int timeout_ms, tr_err *err) {
    shm_comm *s = (shm_comm *)c;
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 60000);
    for (int64_t iter = 0;; iter++) {
        int32_t missing = -1;
        for (int32_t i = 0; i < c->world && missing < 0; i++)
            if (!atomic_load_explicit(&s->ranks[i].joined, memory_order_acquire)) missing = i;
        if (missing < 0) break;
        if (check_abort(s, err)) return -1;
        int64_t now = now_ms();
        for (int32_t i = 0; i < c->world && iter % 16 == 0; i++)
            if (check_peer(s, i, now, err)) return -1;
        if (now >= deadline)
            return tr_errf(err, TR_ETIMEOUT, "rank %d of %d did not join within %d ms", missing, c->world,
                           timeout_ms);
        backoff(iter + 512);
    }
    // Every rank has the segment mapped: its name is no longer needed, and unlinking it now
    // means no crash can leave it behind in /dev/shm.
    if (s->owner && !s->unlinked) {
        shm_unlink(s->shm_name);
        s->unlinked = true;
    }
    return 0;
}

// ---- collectives ----

static uint64_t counts_hash(const size_t *counts, int32_t world) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t r = 0; counts && r < world; r++) h = (h ^ (uint64_t)counts[r]) * 1099511628211ull;
    return h;
}

// Every rank's record must describe the same collective as this rank's.
static int check_calls(shm_comm *s, tr_err *err) {
    const shm_rank *me = &s->ranks[s->base.rank];
    for (int32_t i = 0; i < s->base.world; i++) {
        const shm_rank *o = &s->ranks[i];
        if (o->call == me->call && o->op == me->op && o->dtype == me->dtype && o->n == me->n &&
            o->counts_hash == me->counts_hash && o->root == me->root)
            continue;
        char why[256];
        snprintf(why, sizeof why, "collective %" PRIu64 ": rank %d called %s of %" PRIu64 " %s, rank %d called %s "
                 "of %" PRIu64 " %s (collective %" PRIu64 ")", me->call, s->base.rank, tr_comm_op_name(me->op),
                 me->n, tr_comm_dtype_name(me->dtype), i, o->op <= TR_COMM_OP_BARRIER ? tr_comm_op_name(o->op) : "?",
                 o->n, o->dtype <= TR_COMM_BF16 ? tr_comm_dtype_name(o->dtype) : "?", o->call);
        shm_abort(&s->base, why);
        return tr_errf(err, TR_EINVAL, "%s", why);
    }
    return 0;
}

static int copy_sync(shm_comm *s, tr_err *err) {
    tr_backend *be = s->base.be;
    char msg[512];
    if (be->ops->sync(be, "communicator copy", msg, sizeof msg) != 0) return tr_errf(err, TR_EDEVICE, "%s", msg);
    return 0;
}

static int to_host(shm_comm *s, void *dst, const void *src, size_t bytes, tr_err *err) {
    if (!bytes) return 0;
    s->base.be->ops->download(s->base.be, dst, src, bytes);
    return copy_sync(s, err);
}

static int to_dev(shm_comm *s, void *dst, const void *src, size_t bytes, tr_err *err) {
    if (!bytes) return 0;
    s->base.be->ops->upload(s->base.be, dst, src, bytes);
    return copy_sync(s, err);
}

#define REDUCE_BLOCK 1024

// result[a, b) = slot 0 + slot 1 + ... + slot world-1 over elements [a, b), each element
// summed in rank order in its own precision.
#define REDUCE_AS(T)                                                                    \
    do {                                                                                \
        T *dst = (T *)s->result;                                                        \
        for (size_t j0 = a; j0 < b; j0 += REDUCE_BLOCK) {                               \
            size_t j1 = j0 + REDUCE_BLOCK < b ? j0 + REDUCE_BLOCK : b;                  \
            const T *src = (const T *)s->slots;                                         \
            for (size_t j = j0; j < j1; j++) dst[j] = src[j];                           \
            for (int32_t r = 1; r < world; r++) {                                       \
                src = (const T *)(s->slots + (size_t)r * s->h->slot_bytes);             \
                for (size_t j = j0; j < j1; j++) dst[j] = dst[j] + src[j];              \
            }                                                                           \
        }                                                                               \
    } while (0)

static void reduce_part(shm_comm *s, enum tr_comm_dtype t, size_t len) {
    int32_t world = s->base.world, rank = s->base.rank;
    size_t a = len * (size_t)rank / (size_t)world, b = len * (size_t)(rank + 1) / (size_t)world;
    switch (t) {
    case TR_COMM_F32: REDUCE_AS(float); break;
    case TR_COMM_F64: REDUCE_AS(double); break;
    case TR_COMM_I64: REDUCE_AS(int64_t); break;
    case TR_COMM_BF16: break;   // refused before a call starts (comm.c)
    }
}

// Rank r's segment under counts, clipped to the chunk [off, off + len).
static void chunk_segment(const size_t *counts, int32_t r, size_t off, size_t len, size_t *b, size_t *e) {
    size_t sb = 0;
    for (int32_t i = 0; i < r; i++) sb += counts[i];
    size_t se = sb + counts[r];
    *b = sb < off ? off : sb > off + len ? off + len : sb;
    *e = se < *b ? *b : se > off + len ? off + len : se;
}

// One chunk [off, off + len) of a collective; es = element size, first = chunk 0. Each rank
// writes only its own slot before the first barrier and reads the others' between the two;
// the result area is written only between them (reductions) and read after the second, so
// no rank can overwrite what a slower one has still to read, in this collective or the next.
static int run_chunk(shm_comm *s, const tr_comm_call *call, size_t off, size_t len, bool first, tr_err *err) {
    const size_t es = tr_comm_dtype_size(call->dtype), sb_bytes = s->h->slot_bytes;
    const int32_t rank = s->base.rank, world = s->base.world;
    uint8_t *buf = call->buf;
    uint8_t *mine = s->slots + (size_t)rank * sb_bytes;
    size_t sb = 0, se = 0;   // this rank's segment (scatter, gather), clipped to the chunk
    if (call->counts) chunk_segment(call->counts, rank, off, len, &sb, &se);
    int rc = 0;
    switch (call->op) {
    case TR_COMM_OP_ALL_REDUCE:
    case TR_COMM_OP_REDUCE_SCATTER: rc = to_host(s, mine, buf + off * es, len * es, err); break;
    case TR_COMM_OP_ALL_GATHER: rc = to_host(s, mine + (sb - off) * es, buf + sb * es, (se - sb) * es, err); break;
    case TR_COMM_OP_BROADCAST:
        if (rank == call->root) rc = to_host(s, mine, buf + off * es, len * es, err);
        break;
    case TR_COMM_OP_BARRIER: break;
    }
    if (rc || barrier(s, err) || (first && check_calls(s, err))) return -1;
    switch (call->op) {
    case TR_COMM_OP_ALL_REDUCE:
    case TR_COMM_OP_REDUCE_SCATTER: reduce_part(s, call->dtype, len); break;
    case TR_COMM_OP_ALL_GATHER:
        for (int32_t q = 0; q < world && !rc; q++) {
            size_t qb, qe;
            chunk_segment(call->counts, q, off, len, &qb, &qe);
            if (q != rank) rc = to_dev(s, buf + qb * es, s->slots + (size_t)q * sb_bytes + (qb - off) * es, (qe - qb) * es, err);
        }
        break;
    case TR_COMM_OP_BROADCAST:
        if (rank != call->root) rc = to_dev(s, buf + off * es, s->slots + (size_t)call->root * sb_bytes, len * es, err);
        break;
    case TR_COMM_OP_BARRIER: break;
    }
    if (rc || barrier(s, err)) return -1;
    if (call->op == TR_COMM_OP_ALL_REDUCE) return to_dev(s, buf + off * es, s->result, len * es, err);
    if (call->op == TR_COMM_OP_REDUCE_SCATTER)
        return to_dev(s, buf + sb * es, s->result + (sb - off) * es, (se - sb) * es, err);
    return 0;
}

static int shm_run(tr_comm *c, const tr_comm_call *call, tr_err *err) {
    shm_comm *s = (shm_comm *)c;
    if (check_abort(s, err)) return -1;
    shm_rank *me = &s->ranks[c->rank];
    me->call = ++s->calls;
    me->op = (uint32_t)call->op;
    me->dtype = (uint32_t)call->dtype;
    me->n = call->n;
    me->counts_hash = counts_hash(call->counts, c->world);
    me->root = call->root;
    const size_t per = s->h->slot_bytes / tr_comm_dtype_size(call->dtype);
    if (call->n == 0) return run_chunk(s, call, 0, 0, true, err);
    for (size_t off = 0; off < call->n; off += per) {
        size_t len = call->n - off < per ? call->n - off : per;
        if (run_chunk(s, call, off, len, off == 0, err)) return -1;
    }
    return 0;
}

static const tr_comm_vt shm_vt = {
    .kind = "shm",
    .join = shm_join,
    .wait = shm_wait,
    .run = shm_run,
    .abort = shm_abort,
    .dead = shm_dead,
    .free = shm_free,
};
