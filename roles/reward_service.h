// Client for external reward services (docs/protocol.md, "Reward services"): troupe
// connects a REQ socket to the service's REP socket and sends msgpack
// {"op": "score", "items": [{"prompt", "response", "meta"}]}; the service answers
// {"scores": [float, ...]}, one per item. Batches are split at max_items; a request that
// times out is retried on a fresh socket after an exponential backoff; replies with the
// wrong count, wrong types, NaN/inf or non-msgpack bytes are garbage and retried likewise.
// When every attempt fails the policy decides: fail (an error naming the endpoint and what
// happened) or zero (score 0 for that batch's items, counted in the stats).
#pragma once
#include <stdint.h>

#include "engine/err.h"
#include "roles/transport.h"

enum tr_reward_fail_policy { TR_REWARD_POLICY_FAIL, TR_REWARD_POLICY_ZERO };

typedef struct tr_reward_service_opts {
    const char *endpoint;       // the service's REP endpoint, e.g. tcp://127.0.0.1:5555
    int timeout_ms;             // per request; 0 = 5000
    int attempts;               // tries per batch, the first included; 0 = 3
    int backoff_ms;             // wait before the first retry, doubled each retry; 0 = 100
    int backoff_max_ms;         // 0 = 5000
    int max_items;              // items per request; 0 = 64
    int policy;                 // enum tr_reward_fail_policy
    uint64_t max_reply_bytes;   // 0 = 16 MiB; a larger reply is an error naming its size (over
                                // twice this, ZeroMQ drops it unread: a timeout)
    tr_curve_opts curve;        // optional: key_file + server_key_file
} tr_reward_service_opts;

typedef struct tr_reward_item {
    const char *prompt;     // UTF-8; invalid sequences are sent as U+FFFD
    const char *response;
    const char *meta_json;  // the prompt record's other fields, a JSON object; NULL = {}
} tr_reward_item;

typedef struct tr_reward_service_stats {
    uint64_t requests;        // request messages sent (attempts)
    uint64_t retries;
    uint64_t timeouts;
    uint64_t garbage;         // replies that failed validation
    uint64_t service_errors;  // replies of the form {"error": "..."}
    uint64_t reconnects;
    uint64_t items_scored;    // scores that came from the service
    uint64_t items_failed;    // scores set to 0 by the zero policy
} tr_reward_service_stats;

// One client serves one thread at a time (it owns a ZeroMQ socket).
typedef struct tr_reward_service tr_reward_service;

int tr_reward_service_policy_from_name(const char *name);  // "fail", "zero"; -1 when unknown
int tr_reward_service_init(tr_reward_service **out, const tr_reward_service_opts *o, tr_err *err);
void tr_reward_service_free(tr_reward_service *s);
// Scores n items into scores[n]. Fails on bad meta JSON (a data error) whatever the policy,
// and on service failures under the fail policy. Messages number the items from base (the
// index of items[0] in what the caller scores as a whole).
int tr_reward_service_score(tr_reward_service *s, const tr_reward_item *items, int n, int64_t base,
                            float *scores, tr_err *err);
void tr_reward_service_get_stats(const tr_reward_service *s, tr_reward_service_stats *out);
