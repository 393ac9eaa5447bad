// Internal to the communicators: the handle every implementation starts with, and the table
// of functions comm.c dispatches to after checking arguments. comm_shm.c and comm_nccl.c
// each fill one table.
#pragma once
#include "engine/comm.h"

enum tr_comm_op { TR_COMM_OP_ALL_REDUCE, TR_COMM_OP_REDUCE_SCATTER, TR_COMM_OP_ALL_GATHER,
                  TR_COMM_OP_BROADCAST, TR_COMM_OP_BARRIER };

// One collective's arguments: n elements in buf; counts[] for the scatter and gather (n is
// then their sum), root for broadcast.
typedef struct tr_comm_call {
    enum tr_comm_op op;
    void *buf;
    size_t n;
    const size_t *counts;
    enum tr_comm_dtype dtype;
    int32_t root;
} tr_comm_call;

typedef struct tr_comm_vt {
    const char *kind;
    int (*join)(tr_comm *c, tr_err *err);
    int (*wait)(tr_comm *c, int timeout_ms, tr_err *err);
    int (*run)(tr_comm *c, const tr_comm_call *call, tr_err *err);
    void (*abort)(tr_comm *c, const char *why);
    bool (*dead)(tr_comm *c);
    void (*free)(tr_comm *c);
} tr_comm_vt;

struct tr_comm {
    const tr_comm_vt *vt;
    tr_backend *be;
    int32_t rank, world;
    char name[64];
    int peer_timeout_ms, op_timeout_ms;
    const volatile sig_atomic_t *stop;
    bool joined, ready;
};

// Fills the common part from o (checked by the caller).
void tr_comm_base_init(tr_comm *c, const tr_comm_vt *vt, const tr_comm_opts *o);
const char *tr_comm_op_name(enum tr_comm_op op);

int tr_comm_shm_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err);
int tr_comm_shm_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err);
// Built only with CUDA (TR_HAVE_CUDA); comm.c refuses NCCL ids otherwise.
int tr_comm_nccl_create(tr_comm **out, const tr_comm_opts *o, char *id, size_t cap, tr_err *err);
int tr_comm_nccl_open(tr_comm **out, const tr_comm_opts *o, const char *id, tr_err *err);
