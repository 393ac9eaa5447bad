// Removal of registered temporaries on fatal signals; see cleanup.h. The table is process
// state by nature (signal dispositions are per process), written only outside the handler,
// each slot's path filled before its flag is set so the handler never reads half a path.
#include "cli/cleanup.h"

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#define MAX_PATHS 8

static char paths[MAX_PATHS][4200];
static volatile sig_atomic_t used[MAX_PATHS];
static bool installed;

static void on_signal(int sig) {
    for (int i = 0; i < MAX_PATHS; i++)
        if (used[i]) unlink(paths[i]);
    // SA_RESETHAND restored the default action; the signal is blocked until we return, then
    // ends the process with the status the shell expects (130 for Ctrl-C, 143 for kill).
    raise(sig);
}

static void install(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa;
        // A signal the caller ignores (nohup's SIGHUP) stays ignored.
        if (sigaction(sigs[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN) continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESETHAND;
        sigaction(sigs[i], &sa, NULL);
    }
    installed = true;
}

void tr_cleanup_add(const char *path) {
    if (!path[0] || strlen(path) >= sizeof paths[0]) return;
    for (int i = 0; i < MAX_PATHS; i++) {
        if (used[i]) continue;
        strcpy(paths[i], path);
        used[i] = 1;
        if (!installed) install();
        return;
    }
}

void tr_cleanup_remove(const char *path) {
    for (int i = 0; i < MAX_PATHS; i++)
        if (used[i] && strcmp(paths[i], path) == 0) used[i] = 0;
}
