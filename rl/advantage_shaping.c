// Overlong punishment and the dynamic-sampling group filter (DAPO, Yu et al. 2025, §3.2, §3.4).
#include "rl/advantage_shaping.h"

#include <stdlib.h>

float tr_overlong_penalty(int32_t len, int32_t max_len, int32_t buffer, float factor) {
    if (buffer <= 0) return 0.0f;
    int32_t start = max_len - buffer;
    if (len <= start) return 0.0f;
    if (len >= max_len) return -factor;
    return -factor * (float)((double)(len - start) / (double)buffer);
}

int tr_dynamic_sampling_filter(const float *rewards, const int32_t *group, int32_t n,
                               int32_t n_groups, uint8_t *keep, int32_t *n_kept_groups,
                               tr_err *err) {
    if (n < 0 || n_groups < 0) return tr_errf(err, TR_EINVAL, "dynamic sampling: negative batch size");
    for (int32_t i = 0; i < n; i++)
        if (group[i] < 0 || group[i] >= n_groups)
            return tr_errf(err, TR_ERANGE, "dynamic sampling: response %d has group id %d, outside [0, %d)",
                           (int)i, (int)group[i], (int)n_groups);
    // Per group: the first reward seen, and whether another one differs from it.
    int32_t *first = malloc(((size_t)n_groups + 1) * sizeof *first);
    uint8_t *mixed = calloc((size_t)n_groups + 1, 1);
    if (!first || !mixed) {
        free(first);
        free(mixed);
        return tr_errf(err, TR_ENOMEM, "dynamic sampling: out of memory for %d groups", (int)n_groups);
    }
    for (int32_t g = 0; g < n_groups; g++) first[g] = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t g = group[i];
        if (first[g] < 0)
            first[g] = i;
        else if (rewards[i] != rewards[first[g]])
            mixed[g] = 1;
    }
    int32_t kept = 0;
    for (int32_t g = 0; g < n_groups; g++) kept += mixed[g];
    for (int32_t i = 0; i < n; i++) keep[i] = mixed[group[i]];
    if (n_kept_groups) *n_kept_groups = kept;
    free(first);
    free(mixed);
    return 0;
}
