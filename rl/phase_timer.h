// Seconds per named phase of a step (generate, reward, reference, critic, train), summed
// over every span of the phase, and logged as time/<name> for the phases the step ran: a
// phase a step never entered (no reference without KL) has no metric.
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "rl/metrics.h"

#define TR_PHASES_MAX 8

typedef struct tr_phase_timer {
    const char *name[TR_PHASES_MAX];   // string literals, in the order first seen
    double seconds[TR_PHASES_MAX];
    int32_t n;
    int32_t open;                      // the running phase, -1 when none
    double t0;
} tr_phase_timer;

void tr_phase_init(tr_phase_timer *t);
// Starts timing `name` (a literal that outlives the timer); stops the running phase first.
void tr_phase_start(tr_phase_timer *t, const char *name);
void tr_phase_stop(tr_phase_timer *t);
// Adds seconds measured elsewhere (the wait for generation) to `name`.
void tr_phase_add(tr_phase_timer *t, const char *name, double seconds);
// Seconds of `name` so far (0 when the step never entered it).
double tr_phase_seconds(const tr_phase_timer *t, const char *name);
// time/<name> for every phase seen, in the order first seen.
int tr_phase_log(const tr_phase_timer *t, tr_metrics *m, tr_err *err);
