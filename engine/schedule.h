// Learning-rate schedules: constant, linear decay and cosine decay, each after a linear
// warmup from 0, with a floor of min_lr_ratio * lr. The formulas are those of transformers'
// get_{constant,linear,cosine_with_min_lr}_schedule_with_warmup, except that past
// total_steps the rate stays at the floor (transformers' cosine would rise again).
#pragma once
#include <stdint.h>

enum tr_lr_kind { TR_LR_CONSTANT, TR_LR_LINEAR, TR_LR_COSINE };

typedef struct tr_lr_schedule {
    enum tr_lr_kind kind;
    int64_t warmup_steps;    // lr grows as lr * step / warmup_steps for step < warmup_steps
    int64_t total_steps;     // linear/cosine: decay ends here (ignored by constant)
    double min_lr_ratio;     // linear/cosine: floor as a fraction of lr, in [0, 1]
} tr_lr_schedule;

// Learning rate for the update that follows `step` completed updates (step 0 is the first
// update; with warmup it runs at lr 0, as transformers' schedulers do).
double tr_lr_at(const tr_lr_schedule *s, double lr, int64_t step);
// "constant", "linear", "cosine" -> kind; returns -1 for anything else.
int tr_lr_kind_parse(const char *name, enum tr_lr_kind *kind);
const char *tr_lr_kind_name(enum tr_lr_kind kind);
