// Learning-rate schedules: constant, linear decay and cosine decay, each after a linear
// warmup from 0, with a floor of min_lr_ratio * lr. The formulas are those of transformers'
// get_{constant,linear,cosine_with_min_lr}_schedule_with_warmup, except that past
// total_steps the rate stays at the floor (transformers' cosine would rise again), and a
// warmup longer than total_steps is cut to total_steps: a short run (a smoke test of a long
// recipe) ramps the rate over all of its updates instead of stopping part way up the ramp.
#pragma once
#include <stdint.h>

enum tr_lr_kind { TR_LR_CONSTANT, TR_LR_LINEAR, TR_LR_COSINE };

typedef struct tr_lr_schedule {
    enum tr_lr_kind kind;
    int64_t warmup_steps;    // lr grows as lr * step / warmup for step < warmup (see tr_lr_warmup)
    int64_t total_steps;     // updates in the run (0: unknown, constant only); linear/cosine
                             // decay ends here
    double min_lr_ratio;     // linear/cosine: floor as a fraction of lr, in [0, 1]
} tr_lr_schedule;

// Learning rate for the update that follows `step` completed updates (step 0 is the first
// update; with warmup it runs at lr 0, as transformers' schedulers do).
double tr_lr_at(const tr_lr_schedule *s, double lr, int64_t step);
// The warmup in effect: warmup_steps, cut to total_steps when that is known (> 0). With
// warmup >= total_steps the whole run is warmup; linear and cosine never start to decay.
int64_t tr_lr_warmup(const tr_lr_schedule *s);
// "constant", "linear", "cosine" -> kind; returns -1 for anything else.
int tr_lr_kind_parse(const char *name, enum tr_lr_kind *kind);
const char *tr_lr_kind_name(enum tr_lr_kind kind);
