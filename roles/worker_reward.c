// The reward role: one score per sequence from a built-in rule (roles/reward_rule.h), an
// external service (roles/reward_service.h, whose failure policy decides between an error
// and zero scores counted as failures), or a score-head model over prompt + response.
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "engine/heads.h"
#include "roles/worker_impl.h"

int tr_worker_reward_init(tr_role_ctx *role, const tr_msg_map *m, tr_err *err) {
    static const char *const keys[] = {"kind", "function", "pattern", "endpoint", "timeout_ms", "attempts",
                                       "max_items", "on_failure", NULL};
    char kind[16], function[32] = "", endpoint[256] = "", on_failure[16];
    char *pattern = NULL;
    int64_t timeout, attempts, max_items;
    if (tr_msg_check_keys(m, keys, err) || tr_msg_get_str_buf(m, "kind", kind, sizeof kind, err) ||
        (tr_msg_has(m, "function") && tr_msg_get_str_buf(m, "function", function, sizeof function, err)) ||
        (tr_msg_has(m, "endpoint") && tr_msg_get_str_buf(m, "endpoint", endpoint, sizeof endpoint, err)) ||
        tr_msg_get_int(m, "timeout_ms", &timeout, err) || tr_msg_get_int(m, "attempts", &attempts, err) ||
        tr_msg_get_int(m, "max_items", &max_items, err) ||
        tr_msg_get_str_buf(m, "on_failure", on_failure, sizeof on_failure, err))
        return tr_err_wrap(err, "init: reward");
    if (timeout < 0 || timeout > INT32_MAX || attempts < 0 || attempts > 1000 || max_items < 0 ||
        max_items > INT32_MAX)
        return tr_errf(err, TR_EINVAL, "init: reward timeout_ms, attempts or max_items out of range");
    if (strcmp(kind, "model") == 0) {
        role->reward_kind = TR_REWARD_KIND_MODEL;
        return 0;
    }
    if (strcmp(kind, "rule") == 0) {
        role->reward_kind = TR_REWARD_KIND_RULE;
        tr_msg_str ps = {0};
        if (tr_msg_has(m, "pattern") && tr_msg_get_str(m, "pattern", &ps, err)) return -1;
        if (ps.len && !(pattern = strndup(ps.ptr, ps.len))) return tr_errf(err, TR_ENOMEM, "init: out of memory");
        tr_reward_rule_opts o = {.kind = tr_reward_rule_kind_from_name(function), .pattern = pattern};
        int rc = o.kind < 0 ? tr_errf(err, TR_EINVAL, "init: reward function '%s' is not exact_match, "
                                      "numeric_match or regex", function)
                            : tr_reward_rule_init(&role->rule, &o, err);
        free(pattern);
        return rc;
    }
    if (strcmp(kind, "service") == 0) {
        role->reward_kind = TR_REWARD_KIND_SERVICE;
        int policy = tr_reward_service_policy_from_name(on_failure);
        if (policy < 0) return tr_errf(err, TR_EINVAL, "init: reward on_failure '%s' is not fail or zero", on_failure);
        if (!endpoint[0]) return tr_errf(err, TR_EINVAL, "init: a service reward needs an endpoint");
        tr_reward_service_opts o = {.endpoint = endpoint, .timeout_ms = (int)timeout, .attempts = (int)attempts,
                                    .max_items = (int)max_items, .policy = policy};
        return tr_reward_service_init(&role->service, &o, err);
    }
    return tr_errf(err, TR_EINVAL, "init: reward kind '%s' is not rule, service or model", kind);
}

// Texts of sequence i: the rollouts' own, else the response decoded (when a tokenizer is set).
// Messages number sequence i as first + i, its index in what the controller scores as a whole.
static int response_of(tr_role_ctx *role, const tr_rollouts *r, int32_t i, int64_t first, char **owned,
                       const char **text, tr_err *err) {
    *owned = NULL;
    *text = r->response_text[i];
    if (*text) return 0;
    if (!role->tok)
        return tr_errf(err, TR_EINVAL, "score: sequence %" PRId64 " has no response text and the reward has no tokenizer",
                       first + i);
    size_t len;
    const int32_t *resp = r->tokens + r->offset[i] + r->prompt_len[i];
    if (tr_tokenizer_decode(role->tok, resp, (size_t)r->response_len[i], owned, &len, err))
        return tr_err_wrap(err, "score: sequence %" PRId64, first + i);
    *text = *owned;
    return 0;
}

static int score_rule(tr_role_ctx *role, const tr_rollouts *r, int64_t first, float *scores, tr_err *err) {
    for (int32_t i = 0; i < r->n; i++) {
        char *owned;
        const char *text;
        if (response_of(role, r, i, first, &owned, &text, err)) return -1;
        int rc = tr_reward_rule_score(role->rule, text, strlen(text), r->meta[i], &scores[i], err);
        free(owned);
        if (rc) return tr_err_wrap(err, "score: sequence %" PRId64, first + i);
    }
    return 0;
}

static int score_service(tr_role_ctx *role, const tr_rollouts *r, int64_t first, float *scores, int64_t *failures,
                         tr_err *err) {
    tr_reward_item *items = calloc((size_t)(r->n ? r->n : 1), sizeof *items);
    char **owned = calloc((size_t)(r->n ? r->n : 1), sizeof *owned);
    int rc = 0;
    if (!items || !owned) rc = tr_errf(err, TR_ENOMEM, "score: out of memory");
    for (int32_t i = 0; i < r->n && !rc; i++) {
        items[i].prompt = r->prompt_text[i] ? r->prompt_text[i] : "";
        items[i].meta_json = r->meta[i];
        rc = response_of(role, r, i, first, &owned[i], &items[i].response, err);
    }
    tr_reward_service_stats before, after;
    tr_reward_service_get_stats(role->service, &before);
    if (!rc && r->n > 0) rc = tr_reward_service_score(role->service, items, r->n, first, scores, err);
    tr_reward_service_get_stats(role->service, &after);
    *failures = (int64_t)(after.items_failed - before.items_failed);
    if (*failures > 0)
        tr_worker_logf(role, "score: the service failed for %lld of %d items, scored 0 (timeouts %llu, garbage %llu)",
                       (long long)*failures, r->n, (unsigned long long)(after.timeouts - before.timeouts),
                       (unsigned long long)(after.garbage - before.garbage));
    for (int32_t i = 0; owned && i < r->n; i++) free(owned[i]);
    free(owned);
    free(items);
    return rc;
}

static int score_model(tr_role_ctx *role, const tr_rollouts *r, int64_t first, float *scores, tr_err *err) {
    tr_model *m = &role->model;
    for (int32_t s = 0; s < r->n;) {
        int32_t k = tr_mb_fill(role, r, s, r->n, err);
        if (k < 0) return -1;
        const tr_pack *pk = &role->mb.pack;
        if (tr_model_forward(m, pk->ids, &pk->docs, err) || tr_score_head_forward(m, role->mb.out, err))
            return tr_err_wrap(err, "score: sequences %" PRId64 "..%" PRId64, first + s, first + s + k - 1);
        memcpy(scores + s, role->mb.out, (size_t)k * sizeof(float));
        s += k;
    }
    return 0;
}

int tr_worker_op_score(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"rollouts", "first", NULL};
    if (tr_msg_check_keys(&req->args, keys, err)) return -1;
    tr_rollouts r;
    tr_rollouts_init(&r);
    float *scores = NULL;
    int64_t failures = 0, first = 0;
    int rc = tr_msg_get_int_opt(&req->args, "first", &first, err) ||
             tr_worker_get_rollouts(role, &req->args, &r, err);
    if (!rc && !(scores = calloc((size_t)(r.n ? r.n : 1), sizeof *scores)))
        rc = tr_errf(err, TR_ENOMEM, "score: out of memory");
    if (!rc) {
        switch (role->reward_kind) {
        case TR_REWARD_KIND_RULE: rc = score_rule(role, &r, first, scores, err); break;
        case TR_REWARD_KIND_SERVICE: rc = score_service(role, &r, first, scores, &failures, err); break;
        case TR_REWARD_KIND_MODEL: rc = score_model(role, &r, first, scores, err); break;
        }
    }
    if (!rc && role->tp_rank != 0) {
        tr_msg_begin_reply(rep, req->id, 0);   // its tensor-parallel group's rank 0 answers
    } else if (!rc) {
        int64_t n = r.n;
        tr_msg_begin_reply(rep, req->id, 2);
        tr_msg_put_tensor(rep, "scores", TR_DTYPE_F32, 1, &n, scores);
        tr_msg_put_int(rep, "failures", failures);
    }
    free(scores);
    tr_rollouts_free(&r);
    return rc;
}
