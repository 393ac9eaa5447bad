// Helpers of the multi-process worker and controller tests: starting processes with their
// stderr in a log file, waiting for exits with a bound, and a model directory made of a
// fixture model plus a fixture tokenizer (the fixture models ship without one).
#pragma once
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline long long tp_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void tp_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

// Starts argv (NULL-terminated) with stdout and stderr appended to log (NULL: inherited).
static inline pid_t tp_spawn(char *const *argv, const char *log) {
    pid_t pid = fork();
    if (pid != 0) return pid;
    if (log) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
    }
    execv(argv[0], argv);
    _exit(127);
}

// Waits up to timeout_ms for pid to exit; returns 1 (and *status) when it did, else 0.
static inline int tp_wait(pid_t pid, int timeout_ms, int *status) {
    long long end = tp_now_ms() + timeout_ms;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) return 1;
        if (r < 0 && errno != EINTR) return 0;
        if (tp_now_ms() >= end) return 0;
        tp_sleep_ms(20);
    }
}

// Kills and reaps a process a failed test may have left behind.
static inline void tp_reap(pid_t pid) {
    int st;
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
}

// True when no process pid exists any more (zombies count as gone).
static inline int tp_gone(pid_t pid) {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z';
}

// Whether file holds text.
static inline int tp_file_has(const char *path, const char *text) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

// DIR/model: config.json and model.safetensors of tests/fixtures/models/NAME and
// tokenizer.json from tests/fixtures/tokenizer/gpt2.json (450 ids; every id of the 300-id
// fixture models decodes). Returns the directory (static buffer).
static inline const char *tp_model_dir(const char *src_root, const char *dir, const char *name) {
    static char out[1024];
    char a[2048], b[2048];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    mkdir(out, 0755);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(a, sizeof a, "%s/tests/fixtures/models/%s/%s", src_root, name, files[i]);
        snprintf(b, sizeof b, "%s/%s", out, files[i]);
        if (symlink(a, b) != 0 && errno != EEXIST) return NULL;
    }
    snprintf(a, sizeof a, "%s/tests/fixtures/tokenizer/gpt2.json", src_root);
    snprintf(b, sizeof b, "%s/tokenizer.json", out);
    if (symlink(a, b) != 0 && errno != EEXIST) return NULL;
    return out;
}

static inline int tp_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

// Removes a test's temporary directory (kept for inspection when a check failed).
static inline void tp_rmtree(const char *dir) {
    nftw(dir, tp_rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
