// Sequence copies between rollout batches and the group-wise take of dynamic sampling.
#include <stddef.h>

#include "rl/rollout_select.h"

int tr_rollouts_copy_seq(tr_rollouts *dst, const tr_rollouts *src, int32_t i, int32_t group,
                         tr_err *err) {
    if (i < 0 || i >= src->n) return tr_errf(err, TR_ERANGE, "rollouts: sequence %d of %d", i, src->n);
    int64_t o = src->offset[i];
    int32_t pl = src->prompt_len[i];
    if (tr_rollouts_append(dst, group, src->sample[i], src->tokens + o, pl, src->tokens + o + pl,
                           src->gen_logprobs + o + pl, src->response_len[i],
                           (enum tr_finish)src->finish[i],
                           src->prompt_text ? src->prompt_text[i] : NULL,
                           src->response_text ? src->response_text[i] : NULL,
                           src->meta ? src->meta[i] : NULL, err))
        return -1;
    dst->version[dst->n - 1] = src->version[i];
    return 0;
}

int tr_rollouts_take_groups(tr_rollouts *dst, int32_t *n_groups, int32_t max_groups,
                            float *dst_reward, float *dst_score, const tr_rollouts *src,
                            const float *reward, const float *score, const uint8_t *keep,
                            tr_err *err) {
    int32_t cur_src = -1, cur_dst = -1;
    for (int32_t i = 0; i < src->n; i++) {
        if (!keep[i]) continue;
        if (src->group[i] != cur_src) {
            cur_src = src->group[i];
            cur_dst = *n_groups < max_groups ? (*n_groups)++ : -1;
        }
        if (cur_dst < 0) continue;
        int32_t k = dst->n;
        if (tr_rollouts_copy_seq(dst, src, i, cur_dst, err)) return -1;
        if (dst_reward && reward) dst_reward[k] = reward[i];
        if (dst_score && score) dst_score[k] = score[i];
    }
    return 0;
}
