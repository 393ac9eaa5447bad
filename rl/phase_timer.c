// Phase timings of a step: one slot per phase name, found by comparing the names (a step
// has a handful), so the loop says only where a phase starts and stops.
#include "rl/phase_timer.h"

#include <stdio.h>
#include <string.h>

void tr_phase_init(tr_phase_timer *t) {
    memset(t, 0, sizeof *t);
    t->open = -1;
}

// The slot of name, added when new; the last slot is shared when the table is full (more
// phases than TR_PHASES_MAX is a programming error that only merges timings).
static int32_t slot(tr_phase_timer *t, const char *name) {
    for (int32_t i = 0; i < t->n; i++)
        if (strcmp(t->name[i], name) == 0) return i;
    if (t->n == TR_PHASES_MAX) return TR_PHASES_MAX - 1;
    t->name[t->n] = name;
    t->seconds[t->n] = 0;
    return t->n++;
}

void tr_phase_start(tr_phase_timer *t, const char *name) {
    tr_phase_stop(t);
    t->open = slot(t, name);
    t->t0 = tr_metrics_now();
}

void tr_phase_stop(tr_phase_timer *t) {
    if (t->open < 0) return;
    t->seconds[t->open] += tr_metrics_now() - t->t0;
    t->open = -1;
}

void tr_phase_add(tr_phase_timer *t, const char *name, double seconds) {
    t->seconds[slot(t, name)] += seconds;
}

double tr_phase_seconds(const tr_phase_timer *t, const char *name) {
    for (int32_t i = 0; i < t->n; i++)
        if (strcmp(t->name[i], name) == 0) return t->seconds[i];
    return 0;
}

int tr_phase_log(const tr_phase_timer *t, tr_metrics *m, tr_err *err) {
    char key[TR_METRICS_KEY_MAX];
    for (int32_t i = 0; i < t->n; i++) {
        snprintf(key, sizeof key, "time/%s", t->name[i]);
        if (tr_metrics_set(m, key, t->seconds[i], err)) return -1;
    }
    return 0;
}
