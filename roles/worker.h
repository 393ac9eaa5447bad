// A worker process's body: hosts one role (policy, reference, critic, reward, generator) or
// several colocated roles sharing one backend, thread pool and activation arena
// (engine/arena.h), connects one DEALER per hosted role to the controller and serves the ops
// of docs/protocol.md until told to stop.
#pragma once
#include <signal.h>
#include <stdint.h>

#include "engine/err.h"
#include "roles/transport.h"

#define TR_WORKER_MAX_ROLES 4

typedef struct tr_worker_opts {
    const char *roles[TR_WORKER_MAX_ROLES];  // "policy", "reference", "critic", "reward", "generator"
    int n_roles;
    const char *endpoint;              // the controller's ROUTER
    int32_t rank, world;               // this rank of every hosted role's group
    tr_curve_opts curve;               // required for endpoints that are not loopback
    int connect_timeout_ms;            // keep saying hello this long (0 = 60000): a worker
                                       // started by hand may come up before its controller
    const volatile sig_atomic_t *stop; // set by the caller's SIGTERM handler; may be NULL
    // Log lines (no newline), already prefixed with "[role/rank] "; NULL = silent.
    void (*log)(void *ctx, const char *line);
    void *log_ctx;
} tr_worker_opts;

// Serves until a shutdown op or *stop (returns 0), or fails: the controller silent past its
// heartbeat timeout (TR_EPEER), or no hello reply within connect_timeout_ms (TR_ETIMEOUT).
// Errors of single ops go back to the controller as error replies and do not end the loop.
int tr_worker_run(const tr_worker_opts *o, tr_err *err);
