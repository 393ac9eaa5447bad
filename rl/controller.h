// The controller's process management: it binds the ROUTER, starts the recipe's role workers
// (fork/exec of this same binary as `troupe worker`, one process per rank or per colocated
// set, stderr captured to run_dir/logs/) or waits for workers started elsewhere to attach,
// sends each role group its init, finds dead or hung workers (exit status, heartbeats), and
// shuts every worker down on success, error or Ctrl-C. The workflows talk to the groups
// through roles/client.h.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/err.h"
#include "rl/recipe.h"
#include "roles/client.h"

typedef struct tr_controller tr_controller;

typedef struct tr_controller_opts {
    const char *exe;               // the troupe binary workers run; NULL = /proc/self/exe
    int heartbeat_interval_ms;     // 0 = 500
    int heartbeat_timeout_ms;      // 0 = 5000: a dead or hung worker is reported within this
    int start_timeout_ms;          // every worker's hello; 0 = 60000 (attach: 600000)
    int call_timeout_ms;           // per group call; 0 = none (heartbeats still find the dead)
    int grace_ms;                  // stop: wait this long after the shutdown op, then after
                                   // SIGTERM, before SIGKILL; 0 = 5000
    bool keep_signals;             // do not install the SIGINT/SIGTERM handlers
    tr_curve_opts curve;           // non-loopback endpoints: key_file (own pair) and
                                   // authorized_file (worker public keys); empty: generated
                                   // once under run_dir/keys/
    tr_curve_opts worker_curve;    // with curve: key_file and server_key_file handed to the
                                   // workers this controller forks
    int log_tail_lines;            // lines of a dead worker's log in the error; 0 = 12
} tr_controller_opts;

// Starts (or attaches) the workers of r and initializes every group. On error nothing is
// left running and *out is NULL. Call it from a thread that lives for the whole run: the
// forked workers' PR_SET_PDEATHSIG follows the thread that forked them. Unless keep_signals, SIGINT and SIGTERM only set a flag
// from now until tr_controller_stop: the next group call (or check) fails with
// TR_ECANCELED, and the caller stops the controller.
int tr_controller_start(tr_controller **out, const tr_recipe *r, tr_err *err);
int tr_controller_start_opts(tr_controller **out, const tr_recipe *r, const tr_controller_opts *o,
                             tr_err *err);

// The group of a role, NULL when the recipe has none.
tr_group *tr_controller_group(tr_controller *c, enum tr_recipe_role role);
// The same by name ("policy", "reference", "critic", "reward", "generator").
tr_group *tr_controller_group_named(tr_controller *c, const char *role);
// What a role's init reported (its rank 0), NULL when the recipe has no such role.
const tr_role_info *tr_controller_role_info(const tr_controller *c, enum tr_recipe_role role);

// Fails (and keeps failing) once a worker exited, was killed, or went silent past the
// heartbeat timeout: the error names role and rank, pid, what happened and the last lines of
// its log. Also fails with TR_ECANCELED after SIGINT/SIGTERM. Group calls run this check
// while they wait.
int tr_controller_check(tr_controller *c, tr_err *err);

// Shutdown op to every worker, then SIGTERM and after the grace period SIGKILL to any that
// remain, and waitpid for all; restores the signal handlers and frees c. Fails only when a
// worker of an otherwise healthy run had to be killed.
int tr_controller_stop(tr_controller *c, tr_err *err);

const char *tr_controller_endpoint(const tr_controller *c);
// Worker processes started by this controller (none when attached): their pids and the
// "<role>[+<role>...]/<rank>" each hosts. Returns the count (at most max filled).
int tr_controller_workers(const tr_controller *c, int64_t *pids, const char **names, int max);
// Whether SIGINT or SIGTERM arrived while the handlers were installed.
bool tr_controller_interrupted(void);
