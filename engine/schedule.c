// Learning-rate schedules (see schedule.h): a warmup ramp, then a decay factor f in [0, 1]
// mapped onto [min_lr_ratio, 1].
#include "engine/schedule.h"

#include <math.h>
#include <string.h>

int64_t tr_lr_warmup(const tr_lr_schedule *s) {
    int64_t w = s->warmup_steps > 0 ? s->warmup_steps : 0;
    return s->total_steps > 0 && w > s->total_steps ? s->total_steps : w;
}

double tr_lr_at(const tr_lr_schedule *s, double lr, int64_t step) {
    if (step < 0) step = 0;
    int64_t warmup = tr_lr_warmup(s);
    if (step < warmup) return lr * (double)step / (double)warmup;
    if (s->kind == TR_LR_CONSTANT) return lr;
    // No decay left after a warmup that fills the run: past it the rate is at the floor.
    int64_t span = s->total_steps - warmup;
    double progress = span > 0 ? (double)(step - warmup) / (double)span : 1.0;
    if (progress > 1.0) progress = 1.0;
    double f = s->kind == TR_LR_LINEAR ? 1.0 - progress : 0.5 * (1.0 + cos(M_PI * progress));
    return lr * (s->min_lr_ratio + (1.0 - s->min_lr_ratio) * f);
}

int tr_lr_kind_parse(const char *name, enum tr_lr_kind *kind) {
    if (strcmp(name, "constant") == 0) *kind = TR_LR_CONSTANT;
    else if (strcmp(name, "linear") == 0) *kind = TR_LR_LINEAR;
    else if (strcmp(name, "cosine") == 0) *kind = TR_LR_COSINE;
    else return -1;
    return 0;
}

const char *tr_lr_kind_name(enum tr_lr_kind kind) {
    switch (kind) {
    case TR_LR_CONSTANT: return "constant";
    case TR_LR_LINEAR: return "linear";
    case TR_LR_COSINE: return "cosine";
    }
    return "?";
}
