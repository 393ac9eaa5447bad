// The CPU backend's shared memory: POSIX shared-memory segments that a trainer and a
// generator process on one machine both map, the CPU's stand-in for CUDA IPC. A segment is
// backend memory like any other: guarded mode protects it outside ops and checks pointers
// into it. Its name is unlinked by the one process that opens it (the mapping outlives the
// name), and by its maker when it is released, so none is left behind by a run that ends.
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

static size_t page_round(size_t bytes) {
    long pg = sysconf(_SC_PAGESIZE);
    size_t p = pg > 0 ? (size_t)pg : 4096;
    return (bytes ? bytes + p - 1 : p) / p * p;
}

static void *fail(char *msg, size_t cap, const char *what, const char *name) {
    if (cap) snprintf(msg, cap, "shared memory %s: %s: %s", name, what, strerror(errno));
    return NULL;
}

// Maps fd's first n bytes and records the mapping (and, guarded, its region).
static void *map(tr_backend *be, int fd, size_t n, const char *name, bool owner, char *msg, size_t cap) {
    tr_cpu_ctx *ctx = be->ctx;
    int prot = !ctx->guard || ctx->guard_open > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *p = mmap(NULL, n, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return fail(msg, cap, "mmap", name);
    if (ctx->n_shared == ctx->cap_shared) {
        int32_t c = ctx->cap_shared ? 2 * ctx->cap_shared : 8;
        tr_cpu_shared *s = realloc(ctx->shared, (size_t)c * sizeof *s);
        if (!s) {
            munmap(p, n);
            errno = ENOMEM;
            return fail(msg, cap, "recording the mapping", name);
        }
        ctx->shared = s;
        ctx->cap_shared = c;
    }
    if (ctx->guard && tr_cpu_region_add(ctx, p, n) != 0) {
        munmap(p, n);
        errno = ENOMEM;
        return fail(msg, cap, "recording the guarded region", name);
    }
    tr_cpu_shared *s = &ctx->shared[ctx->n_shared++];
    *s = (tr_cpu_shared){.base = p, .bytes = n, .owner = owner};
    snprintf(s->name, sizeof s->name, "%s", name);
    return p;
}

void *tr_cpu_share_alloc(tr_backend *be, size_t bytes, char *name, size_t cap, char *msg, size_t msg_cap) {
    static _Atomic unsigned seq;
    size_t n = page_round(bytes);
    snprintf(name, cap, "/troupe-w-%ld-%u", (long)getpid(), atomic_fetch_add(&seq, 1));
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return fail(msg, msg_cap, "shm_open", name);
    // ftruncate zero-fills: the segment starts as zeros, as tr_dev_zalloc's memory does.
    void *p = ftruncate(fd, (off_t)n) == 0 ? map(be, fd, n, name, true, msg, msg_cap)
                                           : fail(msg, msg_cap, "ftruncate", name);
    close(fd);
    if (!p) shm_unlink(name);
    return p;
}

void *tr_cpu_share_open(tr_backend *be, const char *name, size_t bytes, char *msg, size_t msg_cap) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return fail(msg, msg_cap, "shm_open (opening another process's)", name);
    struct stat st;
    void *p = NULL;
    size_t n = page_round(bytes);
    if (fstat(fd, &st) != 0) {
        fail(msg, msg_cap, "fstat", name);
    } else if ((size_t)st.st_size < n) {
        if (msg_cap) snprintf(msg, msg_cap, "shared memory %s holds %lld bytes, not the %zu expected", name,
                              (long long)st.st_size, bytes);
    } else {
        p = map(be, fd, n, name, false, msg, msg_cap);
    }
    close(fd);
    if (p) shm_unlink(name);   // mapped: the name has served its one opener
    return p;
}

static void release(tr_cpu_ctx *ctx, int32_t i) {
    tr_cpu_shared s = ctx->shared[i];
    if (ctx->guard) tr_cpu_region_remove(ctx, s.base);
    munmap(s.base, s.bytes);
    if (s.owner) shm_unlink(s.name);   // gone already when it was opened
    ctx->shared[i] = ctx->shared[--ctx->n_shared];
}

int tr_cpu_share_release(tr_backend *be, void *p, char *msg, size_t msg_cap) {
    tr_cpu_ctx *ctx = be->ctx;
    if (!p) return 0;
    for (int32_t i = 0; i < ctx->n_shared; i++)
        if (ctx->shared[i].base == p) {
            release(ctx, i);
            return 0;
        }
    if (msg_cap) snprintf(msg, msg_cap, "shared memory: %p is no segment of this backend", p);
    return -1;
}

void tr_cpu_share_free_all(tr_cpu_ctx *ctx) {
    while (ctx->n_shared > 0) release(ctx, ctx->n_shared - 1);
    free(ctx->shared);
    ctx->shared = NULL;
    ctx->cap_shared = 0;
}
