// Progress lines on stderr; see progress.h. The ETA assumes the remaining units cost what the
// finished ones did on average.
#include "cli/progress.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void tr_progress_init(tr_progress *p, const char *cmd, const char *unit, bool force, bool quiet) {
    p->cmd = cmd;
    p->unit = unit;
    p->tty = isatty(2) != 0;
    p->on = !quiet && (force || p->tty);
    p->drawn = false;
    p->start = now_s();
    p->last = p->start;
}

bool tr_progress_due(const tr_progress *p) {
    return p->on && now_s() - p->last >= (p->tty ? 0.25 : 10.0);
}

void tr_progress_show(tr_progress *p, int64_t done, int64_t total, int64_t tokens, bool final) {
    if (!p->on || (!final && !tr_progress_due(p))) return;
    double t = now_s(), el = t - p->start;
    p->last = t;
    double pct = total > 0 ? 100.0 * (double)done / (double)total : 100.0;
    double rate = el > 0 ? (double)tokens / el : 0.0;
    char tail[64];
    if (final)
        snprintf(tail, sizeof tail, "in %.1f s", el);
    else if (done > 0)
        snprintf(tail, sizeof tail, "ETA %.0f s", el / (double)done * (double)(total - done));
    else
        snprintf(tail, sizeof tail, "ETA ?");
    fprintf(stderr, "%stroupe %s: %" PRId64 "/%" PRId64 " %s (%.1f%%), %" PRId64
            " tokens, %.0f tokens/s, %s%s", p->tty ? "\r" : "", p->cmd, done, total, p->unit,
            pct, tokens, rate, tail, p->tty && !final ? "   " : "\n");
    fflush(stderr);
    p->drawn = p->tty && !final;
}

void tr_progress_end(tr_progress *p) {
    if (p->drawn) fputc('\n', stderr);
    p->drawn = false;
}
