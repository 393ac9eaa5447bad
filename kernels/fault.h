// Fault injection for tests: TROUPE_DEVICE_FAULT=KIND:WHERE[:N] makes a backend fail as a
// broken or full device would, so that a test can show what a device failure does to a run
// (the error the user reads, the checkpoints left) on a machine whose device works.
// KIND error: the Nth sync point whose name contains WHERE finds a device failure; KIND oom:
// the Nth allocation whose purpose contains WHERE finds no memory. N defaults to 1.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum tr_fault_kind { TR_FAULT_NONE = 0, TR_FAULT_ERROR, TR_FAULT_OOM } tr_fault_kind;

// Parsed once when a backend starts and kept in it (tr_backend.fault), counting as it goes;
// a zeroed struct injects nothing.
typedef struct tr_fault {
    tr_fault_kind kind;
    int32_t n;          // the matching occurrence that fails, from 1
    int32_t seen;       // matching occurrences so far
    char where[96];
    char spec[128];     // the variable as given, for messages
    // Set by the engine's allocation wrappers (engine/device.c), which know what an
    // allocation is for; the backend's next alloc or alloc_host takes it and fails: the CPU
    // backend simulates the shortage, CUDA asks cudaMalloc for more than the device holds.
    bool fail_alloc;
} tr_fault;

#ifdef __cplusplus
extern "C" {   // the CUDA backend's sync counts through these too
#endif

// spec: the variable's value (NULL or empty: no fault). Returns 0, or -1 with msg saying what
// is wrong with it, f then zeroed.
int tr_fault_parse(tr_fault *f, const char *spec, char *msg, size_t cap);
// Counts one occurrence of kind named `name`; true exactly once, at the Nth one whose name
// contains the fault's WHERE.
bool tr_fault_hit(tr_fault *f, tr_fault_kind kind, const char *name);
// In a backend's alloc: whether this allocation must fail (clears the request).
static inline bool tr_fault_take_alloc(tr_fault *f) {
    bool take = f->fail_alloc;
    f->fail_alloc = false;
    return take;
}

#ifdef __cplusplus
}
#endif
