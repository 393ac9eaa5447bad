// The CPU backend's memory half: "device" memory is host memory, copies are memcpy and sync
// has nothing to wait for (it fails only where TROUPE_DEVICE_FAULT injects a failure). In
// guarded mode (TROUPE_CPU_GUARD=1) every allocation is its own mapping, kept PROT_NONE
// except while an op runs (kernels/cpu/guard.c), so any host code that reads or writes engine
// memory outside a backend call faults at once, as it would be wrong on a GPU; the ops also
// check that every pointer they get is such memory.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/cpu.h"

#define MEM_ALIGN 256

// Guarded regions are whole 2 MiB huge pages where the kernel gives them (transparent huge
// pages on madvise): mprotect then changes one entry per 2 MiB instead of 512, which is
// what keeps toggling the protection around every op affordable.
#define GUARD_HUGE ((size_t)2 << 20)

static size_t huge_round(size_t bytes) { return (bytes + GUARD_HUGE - 1) / GUARD_HUGE * GUARD_HUGE; }

// The region table of guarded mode; its own memory is plain host memory.
int tr_cpu_region_add(tr_cpu_ctx *ctx, void *p, size_t bytes) {
    if (ctx->n_regions == ctx->cap_regions) {
        int32_t cap = ctx->cap_regions ? 2 * ctx->cap_regions : 64;
        tr_cpu_region *r = realloc(ctx->regions, (size_t)cap * sizeof *r);
        if (!r) return -1;
        ctx->regions = r;
        ctx->cap_regions = cap;
    }
    ctx->regions[ctx->n_regions++] = (tr_cpu_region){.base = p, .bytes = bytes};
    return 0;
}

void *tr_cpu_alloc(tr_backend *be, size_t bytes) {
    tr_cpu_ctx *ctx = be->ctx;
    // TROUPE_DEVICE_FAULT=oom: a simulated shortage (asking the C library for an impossible
    // size instead would be an error of its own under AddressSanitizer).
    if (tr_fault_take_alloc(&be->fault)) return NULL;
    if (!ctx->guard) {
        size_t n = (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
        return aligned_alloc(MEM_ALIGN, n ? n : MEM_ALIGN);
    }
    // Over-map by one huge page, keep the aligned part, return the rest.
    size_t n = huge_round(bytes ? bytes : 1);
    char *raw = mmap(NULL, n + GUARD_HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *p = (char *)(((uintptr_t)raw + GUARD_HUGE - 1) / GUARD_HUGE * GUARD_HUGE);
    if (p > raw) munmap(raw, (size_t)(p - raw));
    if (raw + GUARD_HUGE > p) munmap(p + n, (size_t)(raw + GUARD_HUGE - p));
    madvise(p, n, MADV_HUGEPAGE);   // a hint; without huge pages guarding is only slower
    if (ctx->guard_open > 0 && mprotect(p, n, PROT_READ | PROT_WRITE) != 0) {
        munmap(p, n);
        return NULL;
    }
    if (tr_cpu_region_add(ctx, p, n) != 0) {
        munmap(p, n);
        return NULL;
    }
    return p;
}

void tr_cpu_region_remove(tr_cpu_ctx *ctx, void *p) {
    for (int32_t i = 0; i < ctx->n_regions; i++)
        if (ctx->regions[i].base == p) {
            ctx->regions[i] = ctx->regions[--ctx->n_regions];
            return;
        }
}

void tr_cpu_free(tr_backend *be, void *p) {
    tr_cpu_ctx *ctx = be->ctx;
    if (!p) return;
    if (!ctx->guard) {
        free(p);
        return;
    }
    for (int32_t i = 0; i < ctx->n_regions; i++)
        if (ctx->regions[i].base == p) {
            munmap(p, ctx->regions[i].bytes);
            ctx->regions[i] = ctx->regions[--ctx->n_regions];
            return;
        }
    tr_cpu_guard_fail("free", "a pointer the backend did not allocate", p);
}

void *tr_cpu_alloc_host(tr_backend *be, size_t bytes) {
    if (tr_fault_take_alloc(&be->fault)) return NULL;   // as in tr_cpu_alloc
    size_t n = (bytes + MEM_ALIGN - 1) / MEM_ALIGN * MEM_ALIGN;
    return aligned_alloc(MEM_ALIGN, n ? n : MEM_ALIGN);
}

void tr_cpu_free_host(tr_backend *be, void *p) {
    (void)be;
    free(p);
}

void tr_cpu_upload(tr_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
}

void tr_cpu_copy_2d(tr_backend *be, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                    size_t row_bytes, size_t rows) {
    (void)be;
    for (size_t r = 0; r < rows && row_bytes; r++)
        memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

int tr_cpu_sync(tr_backend *be, const char *where, char *msg, size_t cap) {
    tr_cpu_ctx *ctx = be->ctx;
    if (!ctx->failed && tr_fault_hit(&be->fault, TR_FAULT_ERROR, where)) {
        ctx->failed = true;
        snprintf(ctx->msg, sizeof ctx->msg, "simulated device failure, injected by "
                 "TROUPE_DEVICE_FAULT=%s", be->fault.spec);
    }
    if (!ctx->failed) {
        if (cap) msg[0] = '\0';
        return 0;
    }
    if (cap) snprintf(msg, cap, "cpu backend, failure before the sync point '%s': %s", where, ctx->msg);
    return -1;
}

void tr_cpu_mem_info(tr_backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES);
    long total = sysconf(_SC_PHYS_PAGES);
    *free_bytes = avail > 0 && page > 0 ? (size_t)avail * (size_t)page : 0;
    *total_bytes = total > 0 && page > 0 ? (size_t)total * (size_t)page : 0;
}

void tr_cpu_memory_free(tr_cpu_ctx *ctx) {
    tr_cpu_share_free_all(ctx);   // its segments are in the region table too
    for (int32_t i = 0; i < ctx->n_regions; i++)
        munmap(ctx->regions[i].base, ctx->regions[i].bytes);
    free(ctx->regions);
    ctx->regions = NULL;
    ctx->n_regions = ctx->cap_regions = 0;
}
