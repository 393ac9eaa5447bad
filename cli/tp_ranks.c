// Local tensor-parallel ranks of a command: fork, the communicator's bootstrap through a pipe,
// and an end that joins every rank's result into the command's exit status.
#include "cli/tp_ranks.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"

int tr_tp_ranks_fork(tr_tp_ranks *t, int32_t size, tr_err *err) {
    memset(t, 0, sizeof *t);
    t->size = size;
    t->fds[0] = t->fds[1] = -1;
    if (size < 2) return 0;
    if (size > TR_COMM_MAX_RANKS)
        return tr_errf(err, TR_EINVAL, "--tp %d: at most %d ranks", size, TR_COMM_MAX_RANKS);
    if (pipe(t->fds) != 0) return tr_errf(err, TR_EIO, "tensor-parallel ranks: pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    for (int32_t r = 1; r < size; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            tr_errf(err, TR_EIO, "tensor-parallel rank %d: fork: %s", r, strerror(errno));
            close(t->fds[0]);   // ranks already started read the end of the pipe and stop
            close(t->fds[1]);
            for (int32_t k = 1; k < r; k++) waitpid(t->pids[k], NULL, 0);
            return -1;
        }
        if (pid == 0) {
            t->rank = r;
            close(t->fds[1]);
            t->fds[1] = -1;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);   // rank 0 is already gone
            return 0;
        }
        t->pids[r] = pid;
    }
    close(t->fds[0]);
    t->fds[0] = -1;
    return 0;
}

int tr_tp_ranks_comm(tr_tp_ranks *t, tr_backend *be, tr_err *err) {
    if (t->size < 2) return 0;
    char id[TR_COMM_ID_MAX] = "";
    tr_comm_opts o = {.be = be, .rank = t->rank, .world = t->size, .name = "tp"};
    if (t->rank == 0) {
        if (tr_comm_create(&t->comm, &o, id, sizeof id, err)) return -1;
        for (int32_t r = 1; r < t->size; r++)
            if (write(t->fds[1], id, sizeof id) != (ssize_t)sizeof id)
                return tr_errf(err, TR_EIO, "tensor-parallel ranks: sending the communicator's id: %s",
                               strerror(errno));
    } else {
        ssize_t got = read(t->fds[0], id, sizeof id);
        if (got != (ssize_t)sizeof id)
            return tr_errf(err, TR_EIO, "tensor-parallel rank %d: rank 0 stopped before sending the "
                           "communicator's id", t->rank);
        if (tr_comm_open(&t->comm, &o, id, err)) return -1;
    }
    return tr_comm_join(t->comm, err) || tr_comm_wait(t->comm, 60000, err);
}

int tr_tp_ranks_min(tr_tp_ranks *t, int64_t *v, int32_t n, tr_err *err) {
    if (t->size < 2) return 0;
    return tr_comm_min_i64(t->comm, v, n, err);
}

int tr_tp_ranks_end(tr_tp_ranks *t, const char *cmd, int rc, tr_err *err) {
    if (t->size < 2) return rc;
    if (rc && t->comm) tr_comm_abort(t->comm, err->msg);
    if (t->rank != 0) {
        if (rc) {
            fprintf(stderr, "troupe %s: tensor-parallel rank %d: error: %s\n", cmd, t->rank, err->msg);
            fflush(stderr);
        }
        tr_comm_free(t->comm);
        _exit(rc ? 1 : 0);
    }
    // Every rank lets go of the communicator at the same time (NCCL's teardown waits for the
    // peers), then ranks still waiting for the id read the pipe's end and stop.
    tr_comm_free(t->comm);
    t->comm = NULL;
    if (t->fds[1] >= 0) close(t->fds[1]);
    t->fds[1] = -1;
    int32_t failed = -1;
    for (int32_t r = 1; r < t->size; r++) {
        int st = 0;
        while (waitpid(t->pids[r], &st, 0) < 0 && errno == EINTR) {}
        if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && failed < 0) failed = r;
    }
    if (!rc && failed > 0) {
        tr_errf(err, TR_EPEER, "tensor-parallel rank %d failed (its error is above)", failed);
        return 1;
    }
    return rc;
}
