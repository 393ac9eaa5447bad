// The generator role and the weight sync, with `troupe worker` processes driven through the
// client calls (this test acts as the controller): a training policy and two generator ranks.
//   - a generator refuses to generate before the policy's weights reached it, and a sync
//     before the sync communicator exists is an error;
//   - after a sync in many small buckets every generator rank's weights have the checksum of
//     the policy's, which is the checksum of the checkpoint computed here (bit for bit);
//   - the generator's two replicas sample exactly what the policy samples itself (tokens and
//     logprobs, bit for bit), stamped with the policy's step;
//   - the trainer takes rollouts of its current weights (weight_lag 0), refuses them once it
//     has stepped past them, takes them as the previous weights (weight_lag 1), and after the
//     next sync the generator samples with the new step again equal to the policy;
//   - a generator rank stopped (SIGSTOP) while a sync is under way fails the sync within the
//     heartbeat timeout, naming it.
// usage: test_generator TROUPE
#include <signal.h>
#include <stdint.h>

#include "engine/model.h"
#include "engine/resync.h"
#include "kernels/backend.h"
#include "roles/client.h"
#include "tests/roles/proc_util.h"
#include "tests/test.h"

#define HB_INTERVAL_MS 250
#define HB_TIMEOUT_MS 4000

static const char *troupe, *tmp, *model_dir;
static int n_logs;

typedef struct proc {
    pid_t pid;
    char log[512];
} proc;

static proc spawn_worker(const char *role, const char *endpoint, int rank, int world) {
    proc p;
    char r[16], w[16];
    snprintf(r, sizeof r, "%d", rank);
    snprintf(w, sizeof w, "%d", world);
    snprintf(p.log, sizeof p.log, "%s/worker-%d.log", tmp, n_logs++);
    char *argv[] = {(char *)troupe, "worker", "--role", (char *)role, "--connect", (char *)endpoint,
                    "--rank", r, "--world", w, NULL};
    p.pid = tp_spawn(argv, p.log);
    return p;
}

static tr_init_args model_args(bool train) {
    tr_init_args a = {.model = model_dir, .backend = "cpu", .threads = 1, .max_tokens = 256, .seed = 3, .train = train};
    if (train) {
        a.optim = (tr_role_optim){.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .grad_clip = 1.0,
                                  .schedule = "constant"};
        a.loss = (tr_role_loss){.clip_low = 0.2, .clip_high = 0.28, .ratio = "token", .agg = "token-mean",
                                .kl_estimator = "k3", .ppo_epochs = 1, .mini_batches = 1, .max_len = 12};
    }
    return a;
}

// Prompts of random ids (fixed seed) in [3, 300): lengths 3..6.
static void make_prompts(int32_t n, int32_t *ids, int64_t *off) {
    uint32_t s = 12345;
    off[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t len = 3 + i % 4;
        for (int32_t j = 0; j < len; j++) {
            s = s * 1664525u + 1013904223u;
            ids[off[i] + j] = 3 + (int32_t)((s >> 8) % 297);
        }
        off[i + 1] = off[i] + len;
    }
}

static bool same_rollouts(const tr_rollouts *a, const tr_rollouts *b) {
    if (a->n != b->n || a->n_tokens != b->n_tokens) return false;
    for (int32_t i = 0; i < a->n; i++)
        if (a->prompt_len[i] != b->prompt_len[i] || a->response_len[i] != b->response_len[i] ||
            a->group[i] != b->group[i] || a->sample[i] != b->sample[i])
            return false;
    return memcmp(a->tokens, b->tokens, (size_t)a->n_tokens * sizeof(int32_t)) == 0 &&
           memcmp(a->gen_logprobs, b->gen_logprobs, (size_t)a->n_tokens * sizeof(float)) == 0;
}

static bool all_versions(const tr_rollouts *r, int64_t v) {
    for (int32_t i = 0; i < r->n; i++)
        if (r->version[i] != v) return false;
    return r->n > 0;
}

// The checksum of the fixture checkpoint's weights as a model here holds them.
static uint64_t local_checksum(void) {
    tr_backend be;
    char why[256];
    tr_backend_opts bo = {.kind = "cpu", .threads = 1};
    uint64_t sum = 0;
    if (tr_backend_init(&be, &bo, why, sizeof why)) return 0;
    tr_model m;
    tr_err err = {0};
    tr_model_opts mo = {.max_tokens = 16};
    if (tr_model_load(&m, model_dir, &be, &mo, &err) == 0) {
        if (tr_resync_checksum(&m, &sum, &err)) sum = 0;
        tr_model_free(&m);
    }
    tr_backend_free(&be);
    return sum;
}

static void test_generator(void) {
    tr_router *router = NULL;
    tr_err err = {0};
    tr_router_opts ro = {.endpoint = "tcp://127.0.0.1:*", .heartbeat_interval_ms = HB_INTERVAL_MS,
                         .heartbeat_timeout_ms = HB_TIMEOUT_MS};
    CHECKF(tr_router_init(&router, &ro, &err) == 0, "%s", err.msg);
    if (!router) return;
    const char *ep = tr_router_endpoint(router);
    proc pol = spawn_worker("policy", ep, 0, 1), g0 = spawn_worker("generator", ep, 0, 2),
         g1 = spawn_worker("generator", ep, 1, 2);
    CHECKF(tr_router_wait_peers(router, NULL, 3, 30000, &err) == 0, "%s", err.msg);
    tr_inflight_set inflight = {0};
    tr_group gp, gg;
    tr_group_init(&gp, router, "policy", 1);
    tr_group_init(&gg, router, "generator", 2);
    gp.timeout_ms = gg.timeout_ms = 60000;
    gp.inflight = gg.inflight = &inflight;
    tr_init_args pa = model_args(true), ga = model_args(false);
    tr_role_info info;
    CHECKF(tr_role_init(&gp, &pa, &info, &err) == 0, "%s", err.msg);
    CHECKF(tr_role_init(&gg, &ga, &info, &err) == 0, "%s", err.msg);

    int32_t ids[64];
    int64_t off[9];
    make_prompts(8, ids, off);
    tr_prompt_batch pb = {.n = 8, .ids = ids, .offset = off};
    tr_sampling smp = {.n = 3, .max_new_tokens = 6, .temperature = 1.0f, .top_p = 1.0f, .seed = 11};
    tr_rollouts rp, rg;
    tr_rollouts_init(&rp);
    tr_rollouts_init(&rg);

    // No weights, no communicator yet.
    CHECK(tr_policy_generate(&gg, &pb, &smp, &rg, &err) == -1 && strstr(err.msg, "has no weights yet"));
    printf("before a sync: %s\n", err.msg);
    tr_sync_stats st;
    CHECK(tr_weights_sync(&gp, &gg, 0, true, &st, &err) == -1 && strstr(err.msg, "no sync communicator"));
    CHECKF(tr_groups_sync_comm_init(&gp, &gg, 30000, &err) == 0, "%s", err.msg);

    // The first sync, in 4 KiB buckets, checksums taken.
    CHECKF(tr_weights_sync(&gp, &gg, 4096, true, &st, &err) == 0, "%s", err.msg);
    CHECK(st.version == 0 && st.verified && st.bytes > 0 && st.buckets == (int32_t)((st.bytes + 4095) / 4096));
    CHECKF(st.checksum == local_checksum(), "policy's checksum %016llx, the checkpoint's %016llx",
           (unsigned long long)st.checksum, (unsigned long long)local_checksum());
    printf("sync: %lld bytes in %d buckets, %.4f s, checksum %016llx on the policy and both generator ranks\n",
           (long long)st.bytes, st.buckets, st.seconds, (unsigned long long)st.checksum);

    // The two replicas sample what the policy samples.
    CHECKF(tr_policy_generate(&gp, &pb, &smp, &rp, &err) == 0, "%s", err.msg);
    CHECKF(tr_policy_generate(&gg, &pb, &smp, &rg, &err) == 0, "%s", err.msg);
    CHECK(same_rollouts(&rp, &rg) && all_versions(&rp, 0) && all_versions(&rg, 0));
    CHECK(tp_file_has(g1.log, "[generator/1] generate: 4 prompts x 3 samples"));

    // The trainer's version check.
    int64_t nt = rg.n_tokens;
    float *adv = malloc((size_t)nt * sizeof(float));
    for (int64_t t = 0; t < nt; t++) adv[t] = t % 3 == 0 ? 1.0f : -0.5f;
    tr_train_batch b = {.r = &rg, .advantages = adv, .old_logprobs = rg.gen_logprobs, .weight_lag = 0};
    tr_train_metrics tm;
    CHECKF(tr_policy_train(&gp, &b, &tm, &err) == 0 && tm.step == 1, "%s", err.msg);
    CHECK(tr_policy_train(&gp, &b, &tm, &err) == -1 &&
          strstr(err.msg, "sampled with the weights of step 0; with weight_lag 0 policy/0 expects step 1"));
    printf("stale rollouts: %s\n", err.msg);
    b.weight_lag = 1;
    CHECKF(tr_policy_train(&gp, &b, &tm, &err) == 0 && tm.step == 2, "%s", err.msg);

    // A plain (one-bucket) sync of the new weights; they sample alike again, stamped step 2.
    CHECKF(tr_weights_sync(&gp, &gg, 0, false, &st, &err) == 0, "%s", err.msg);
    CHECK(st.version == 2 && st.buckets == 1 && !st.verified);
    tr_rollouts_clear(&rp);
    tr_rollouts_clear(&rg);
    CHECKF(tr_policy_generate(&gp, &pb, &smp, &rp, &err) == 0, "%s", err.msg);
    // Left in flight while another call runs, then collected.
    tr_generate_call *call = NULL;
    CHECKF(tr_generate_start(&gg, &pb, &smp, &rg, &call, &err) == 0, "%s", err.msg);
    tr_rollouts rp2;
    tr_rollouts_init(&rp2);
    CHECKF(tr_policy_generate(&gp, &pb, &smp, &rp2, &err) == 0, "%s", err.msg);
    CHECKF(call && tr_generate_finish(call, &err) == 0, "%s", err.msg);
    CHECK(same_rollouts(&rp, &rg) && same_rollouts(&rp, &rp2) && all_versions(&rg, 2));

    // A generator rank that stops during a sync.
    kill(g1.pid, SIGSTOP);
    long long t0 = tp_now_ms();
    int rc = tr_weights_sync(&gp, &gg, 4096, false, &st, &err);
    long long dt = tp_now_ms() - t0;
    CHECK(rc == -1 && strstr(err.msg, "generator/1"));
    CHECKF(dt < HB_TIMEOUT_MS + 3000, "the sync failed after %lld ms", dt);
    printf("stopped generator rank: failed after %lld ms: %.200s\n", dt, err.msg);
    // Stopped past the communicator's 5 s peer timeout, so the ranks waiting for it in the
    // broadcast give up on their own too.
    tp_sleep_ms(2500);
    kill(g1.pid, SIGCONT);

    free(adv);
    tr_rollouts_free(&rp);
    tr_rollouts_free(&rp2);
    tr_rollouts_free(&rg);
    tr_group_shutdown(&gp, &err);
    tr_group_shutdown(&gg, &err);
    proc *ps[] = {&pol, &g0, &g1};
    for (int i = 0; i < 3; i++) {
        int status;
        if (!tp_wait(ps[i]->pid, 10000, &status)) tp_reap(ps[i]->pid);
    }
    // The policy and generator/0 were waiting for the stopped rank in the broadcast: each
    // gave up on its own once its heartbeat stopped.
    CHECK(tp_file_has(pol.log, "stopped responding"));
    tr_router_free(router);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_generator TROUPE\n");
        return 2;
    }
    troupe = argv[1];
    static char dir[256];
    snprintf(dir, sizeof dir, "%s", tr_test_tmpdir());
    tmp = dir;
    static char md[1024];
    const char *m = tp_model_dir(getenv("TROUPE_SOURCE_ROOT") ? getenv("TROUPE_SOURCE_ROOT") : ".", tmp, "qwen2");
    CHECK(m != NULL);
    if (!m) return tr_test_summary("test_generator");
    snprintf(md, sizeof md, "%s", m);
    model_dir = md;
    test_generator();
    if (tr_test_failures == 0) tp_rmtree(tmp);
    return tr_test_summary("test_generator");
}
