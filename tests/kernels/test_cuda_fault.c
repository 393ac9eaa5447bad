// A device fault must reach the caller as an error, never as silent garbage: an op handed a
// pointer that is not device memory faults on the GPU; the next sync reports it, naming that
// sync point, and with TROUPE_SYNC_EACH_OP=1 the failing op itself. A fault spoils the CUDA
// context of its process, so each case runs in a child of its own. Skipped without a GPU.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "tests/test.h"

// In the child: fault on purpose, write sync's message to fd, exit 0 if sync failed (77
// without a device). The parent never touches CUDA: a child cannot use a CUDA runtime that
// was initialised before the fork.
static int fault_child(int fd, int each_op) {
    if (tr_backend_cuda_devices() < 1) return 77;
    if (each_op) setenv("TROUPE_SYNC_EACH_OP", "1", 1);
    tr_backend be;
    char msg[512];
    tr_backend_opts o = {.kind = "cuda", .device = 0};
    if (tr_backend_init(&be, &o, msg, sizeof msg) != 0) return 2;
    float *ok = be.ops->alloc(&be, 1024 * sizeof(float));
    be.ops->fill(&be, ok, 1.0f, 1024);
    int first = be.ops->sync(&be, "before the fault", msg, sizeof msg);
    // An address no allocation has: the kernel faults when it writes there.
    be.ops->fill(&be, (float *)(uintptr_t)0x1000, 2.0f, 1 << 20);
    int rc = be.ops->sync(&be, "after the fault", msg, sizeof msg);
    if (write(fd, msg, strlen(msg)) < 0) return 3;
    return first == 0 && rc != 0 ? 0 : 1;
}

// Returns 77 when the child found no device.
static int run_case(int each_op, const char *want_where, const char *want_op) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        _exit(fault_child(fds[1], each_op));
    }
    close(fds[1]);
    char buf[1024] = {0};
    ssize_t n, got = 0;
    while ((n = read(fds[0], buf + got, sizeof buf - 1 - (size_t)got)) > 0) got += n;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) return 77;
    printf("%s: %s\n", each_op ? "sync after every op" : "default", buf);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the fault was not reported (child status %d)", st);
    CHECKF(strstr(buf, want_where) != NULL, "message does not name '%s': %s", want_where, buf);
    if (want_op) CHECKF(strstr(buf, want_op) != NULL, "message does not name '%s': %s", want_op, buf);
    return 0;
}

int main(void) {
    if (run_case(0, "before the sync point 'after the fault'", NULL) == 77) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    run_case(1, "failing op:", "launch fill");
    return tr_test_summary("test_cuda_fault");
}
