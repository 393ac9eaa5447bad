// The policy's own ops: generate (continuous batching over the trainer's weights, so a
// colocated policy never needs a weight copy; its KV blocks share the arena with training; the
// generator role serves the same op on the weights the policy synced to it), and save/load of
// Hugging Face checkpoints with the training state beside them (policy and critic; with
// data-parallel ranks every rank saves its optimizer shard).
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/file.h"
#include "engine/rng.h"
#include "engine/train_state.h"
#include "roles/rollout_wire.h"
#include "roles/worker_impl.h"

typedef struct gen_args {
    int64_t index0;
    int32_t k;                 // prompts
    int32_t *plen, *group, *ids;
    int64_t *off;              // [k + 1]
    tr_msg_array text, meta;
    bool has_text, has_meta;
    int32_t n, max_new, min_new;
    tr_sample_params sp;
    uint64_t seed;
    int32_t *stop;             // stop_ids (or the role's default), then extra_stop_ids
    int32_t n_stop;
} gen_args;

static void gen_args_free(gen_args *g) {
    free(g->plen);
    free(g->group);
    free(g->ids);
    free(g->off);
    free(g->stop);
}

static int get_i32_vec(const tr_msg_map *m, const char *key, int32_t **out, int64_t *n, tr_err *err) {
    tr_tensor_view t;
    if (tr_msg_get_tensor(m, key, &t, err)) return -1;
    if (t.ndim != 1) return tr_errf(err, TR_EINVAL, "%s: args.%s: expected a vector", m->op, key);
    *n = t.numel;
    *out = malloc((size_t)(t.numel ? t.numel : 1) * sizeof(int32_t));
    if (!*out) return tr_errf(err, TR_ENOMEM, "%s: out of memory for args.%s", m->op, key);
    return tr_tensor_view_copy(&t, TR_DTYPE_I32, *out, (size_t)t.numel * sizeof(int32_t), key, err);
}

static int parse_generate(tr_role_ctx *role, const tr_msg_map *a, gen_args *g, tr_err *err) {
    static const char *const keys[] = {"index0", "prompt_len", "prompts", "group", "text", "meta", "sampling", NULL};
    static const char *const skeys[] = {"n", "max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k",
                                        "seed", "stop_ids", "extra_stop_ids", NULL};
    int64_t k, nt, ng;
    if (tr_msg_check_keys(a, keys, err) || tr_msg_get_int(a, "index0", &g->index0, err) ||
        get_i32_vec(a, "prompt_len", &g->plen, &k, err) || get_i32_vec(a, "prompts", &g->ids, &nt, err) ||
        get_i32_vec(a, "group", &g->group, &ng, err))
        return -1;
    if (k > INT32_MAX / 2 || ng != k || g->index0 < 0)
        return tr_errf(err, TR_EINVAL, "generate: %lld prompt lengths, %lld groups, index0 %lld", (long long)k,
                       (long long)ng, (long long)g->index0);
    g->k = (int32_t)k;
    if (!(g->off = malloc((size_t)(k + 1) * sizeof(int64_t)))) return tr_errf(err, TR_ENOMEM, "generate: out of memory");
    g->off[0] = 0;
    for (int32_t i = 0; i < g->k; i++) {
        if (g->plen[i] < 1) return tr_errf(err, TR_EINVAL, "generate: prompt %d is empty", i);
        g->off[i + 1] = g->off[i] + g->plen[i];
    }
    if (g->off[k] != nt)
        return tr_errf(err, TR_EINVAL, "generate: prompt lengths add up to %lld, %lld ids sent",
                       (long long)g->off[k], (long long)nt);
    g->has_text = tr_msg_has(a, "text");
    g->has_meta = tr_msg_has(a, "meta");
    if ((g->has_text && tr_msg_get_array(a, "text", &g->text, err)) ||
        (g->has_meta && tr_msg_get_array(a, "meta", &g->meta, err)))
        return -1;
    if ((g->has_text && g->text.n != (uint32_t)k) || (g->has_meta && g->meta.n != (uint32_t)k))
        return tr_errf(err, TR_EINVAL, "generate: text and meta need one entry per prompt (%lld)", (long long)k);
    tr_msg_map s;
    int64_t n, mnt, min_new = 0, top_k;
    double temp, top_p;
    int32_t *stop = NULL, *extra = NULL;
    int64_t n_stop = 0, n_extra = 0;
    if (tr_msg_get_map(a, "sampling", &s, err) || tr_msg_check_keys(&s, skeys, err) ||
        tr_msg_get_int(&s, "n", &n, err) || tr_msg_get_int(&s, "max_new_tokens", &mnt, err) ||
        tr_msg_get_int_opt(&s, "min_new_tokens", &min_new, err) ||
        tr_msg_get_float(&s, "temperature", &temp, err) || tr_msg_get_float(&s, "top_p", &top_p, err) ||
        tr_msg_get_int(&s, "top_k", &top_k, err) || tr_msg_get_uint(&s, "seed", &g->seed, err) ||
        get_i32_vec(&s, "stop_ids", &stop, &n_stop, err) ||
        (tr_msg_has(&s, "extra_stop_ids") && get_i32_vec(&s, "extra_stop_ids", &extra, &n_extra, err))) {
        free(stop);
        free(extra);
        return -1;
    }
    // Stop lists of any length up to the vocabulary (the generator checks each id against it
    // and searches a sorted copy).
    const int64_t V = role->has_model ? role->model.cfg.vocab_size : 0;
    if (n < 1 || n > 65536 || mnt < 1 || min_new < 0 || min_new > mnt || top_k < 0 || top_k > INT32_MAX ||
        n_stop > V || n_extra > V) {
        free(stop);
        free(extra);
        return tr_errf(err, TR_EINVAL, "generate: sampling n %lld, max_new_tokens %lld, min_new_tokens %lld, top_k "
                       "%lld, %lld stop ids or %lld extra stop ids out of range", (long long)n, (long long)mnt,
                       (long long)min_new, (long long)top_k, (long long)n_stop, (long long)n_extra);
    }
    int32_t longest = 0;
    for (int32_t i = 0; i < g->k; i++)
        if (g->plen[i] > longest) longest = g->plen[i];
    if ((int64_t)longest + mnt > role->model.max_tokens) {
        free(stop);
        return tr_errf(err, TR_EINVAL, "generate: a %d-token prompt plus %lld new tokens would not fit the %d "
                       "tokens this policy trains on per forward", longest, (long long)mnt, role->model.max_tokens);
    }
    g->n = (int32_t)n;
    g->max_new = (int32_t)mnt;
    g->min_new = (int32_t)min_new;
    g->sp = (tr_sample_params){.temperature = (float)temp, .top_k = (int32_t)top_k, .top_p = (float)top_p};
    // The call's stop ids, else the role's default; the extra ids after them.
    const int32_t *base = n_stop > 0 ? stop : role->stop_ids;
    int64_t n_base = n_stop > 0 ? n_stop : role->n_stop;
    g->stop = malloc((size_t)(n_base + n_extra > 0 ? n_base + n_extra : 1) * sizeof(int32_t));
    if (g->stop) {
        if (n_base > 0) memcpy(g->stop, base, (size_t)n_base * sizeof(int32_t));
        if (n_extra > 0) memcpy(g->stop + n_base, extra, (size_t)n_extra * sizeof(int32_t));
        g->n_stop = (int32_t)(n_base + n_extra);
    }
    free(stop);
    free(extra);
    if (!g->stop) return tr_errf(err, TR_ENOMEM, "generate: out of memory for %lld stop ids", (long long)(n_base + n_extra));
    return tr_sample_params_check(&g->sp, err);
}

static int text_of(const tr_msg_array *a, uint32_t i, char **out, tr_err *err) {
    *out = NULL;
    if (a->obj->via.array.ptr[i].type == MSGPACK_OBJECT_NIL) return 0;
    tr_msg_str s;
    if (tr_msg_array_str(a, i, &s, err)) return -1;
    if (!(*out = strndup(s.ptr, s.len))) return tr_errf(err, TR_ENOMEM, "generate: out of memory");
    return 0;
}

// The response as text for rewards and logs, without the stop token that ended it.
static int response_text(tr_role_ctx *role, const tr_gen_output *o, char **text, tr_err *err) {
    *text = NULL;
    if (!role->tok) return 0;
    int32_t n = o->n_tokens;
    if (o->finish == TR_GEN_STOP && n > 0) n--;
    size_t len;
    return tr_tokenizer_decode(role->tok, o->tokens, (size_t)n, text, &len, err);
}

int tr_worker_op_generate(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    if (!role->has_gen)
        return tr_errf(err, TR_EINVAL, "generate: %s was initialized with generate: false (a generator samples for "
                       "it)", role->id);
    int64_t version = tr_worker_weight_version(role);
    if (role->kind == TR_ROLE_GENERATOR && version < 0)
        return tr_errf(err, TR_EINVAL, "generate: %s has no weights yet: the policy's sync_weights sends them",
                       role->id);
    gen_args g;
    memset(&g, 0, sizeof g);
    if (parse_generate(role, &req->args, &g, err)) {
        gen_args_free(&g);
        return -1;
    }
    int64_t n_out = (int64_t)g.k * g.n;
    tr_gen_request *reqs = calloc((size_t)(g.k ? g.k : 1), sizeof *reqs);
    tr_gen_output *outs = calloc((size_t)(n_out ? n_out : 1), sizeof *outs);
    tr_rollouts r;
    tr_rollouts_init(&r);
    int rc = 0;
    if (!reqs || !outs) rc = tr_errf(err, TR_ENOMEM, "generate: out of memory for %lld samples", (long long)n_out);
    for (int32_t i = 0; i < g.k && !rc; i++)
        reqs[i] = (tr_gen_request){.prompt = g.ids + g.off[i], .n_prompt = g.plen[i], .n_samples = g.n,
                                   .sampling = g.sp, .seed = tr_rng_derive(g.seed, (uint64_t)(g.index0 + i)),
                                   .stop_ids = g.stop, .n_stop = g.n_stop, .max_new_tokens = g.max_new,
                                   .min_new_tokens = g.min_new};
    bool have_outs = false;
    if (!rc && g.k > 0) {
        rc = tr_generate(&role->gen, reqs, g.k, outs, err);
        have_outs = rc == 0;
    }
    int64_t new_tokens = 0;
    // Every rank of a tensor-parallel group drew the same tokens; its rank 0 answers.
    for (int64_t j = 0; j < n_out && !rc && role->tp_rank == 0; j++) {
        const tr_gen_output *o = &outs[j];
        int32_t i = o->request;
        char *pt = NULL, *mt = NULL, *rt = NULL;
        rc = (g.has_text && text_of(&g.text, (uint32_t)i, &pt, err)) ||
             (g.has_meta && text_of(&g.meta, (uint32_t)i, &mt, err)) || response_text(role, o, &rt, err);
        if (!rc)
            rc = tr_rollouts_append(&r, g.group[i], o->sample, g.ids + g.off[i], g.plen[i], o->tokens, o->logprobs,
                                    o->n_tokens, o->finish == TR_GEN_LENGTH ? TR_FINISH_LENGTH : TR_FINISH_STOP,
                                    pt, rt, mt, err);
        if (!rc) r.version[r.n - 1] = version;
        new_tokens += o->n_tokens;
        free(pt);
        free(mt);
        free(rt);
    }
    if (!rc && role->tp_rank != 0) {
        tr_msg_begin_reply(rep, req->id, 0);
    } else if (!rc) {
        const tr_gen_stats *st = &role->gen.stats;
        tr_msg_begin_reply(rep, req->id, 2);
        tr_rollouts_put(rep, "rollouts", &r, 0, r.n, TR_RO_ALL);
        tr_msg_put_map(rep, "stats", 14);
        tr_msg_put_int(rep, "prefill_tokens", st->prefill_tokens);
        tr_msg_put_int(rep, "decode_tokens", st->decode_tokens);
        tr_msg_put_int(rep, "decode_steps", st->decode_steps);
        tr_msg_put_int(rep, "waits", st->waits);
        tr_msg_put_int(rep, "peak_seqs", st->peak_seqs);
        tr_msg_put_int(rep, "peak_blocks", st->peak_blocks);
        tr_msg_put_float(rep, "decode_bytes", st->decode_bytes);
        tr_msg_put_float(rep, "decode_seconds", st->decode_seconds);
        tr_msg_put_float(rep, "host_seconds", st->host_seconds);
        tr_msg_put_int(rep, "graph_steps", st->graph_steps);
        tr_msg_put_int(rep, "padded_rows", st->padded_rows);
        tr_msg_put_int(rep, "table_entries", st->table_entries);
        tr_msg_put_int(rep, "table_rewrites", st->table_rewrites);
        tr_msg_put_int(rep, "rows_sent", st->rows_sent);
        tr_worker_logf(role, "generate: %d prompts x %d samples, %lld new tokens, weights of step %lld", g.k, g.n,
                       (long long)new_tokens, (long long)version);
    }
    if (have_outs) tr_gen_outputs_free(outs, n_out);
    free(outs);
    free(reqs);
    tr_rollouts_free(&r);
    gen_args_free(&g);
    return rc ? -1 : 0;
}

// ---- save, load ----

int tr_worker_op_save(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"dir", NULL};
    char dir[1024];
    if (tr_msg_check_keys(&req->args, keys, err) || tr_msg_get_str_buf(&req->args, "dir", dir, sizeof dir, err))
        return -1;
    // The weights are the same on every data-parallel rank: rank 0 writes them (making dir;
    // the ranks of its tensor-parallel group gather their shards to it), then every rank its
    // shard of the optimizer state (gathered into whole tensors under tensor parallelism).
    tr_comm *comm = role->has_trainer ? role->trainer.comm : NULL;
    if (role->dp > 1 && role->has_trainer && !comm)
        return tr_errf(err, TR_EINVAL, "save: %s is one of %d data-parallel ranks but has no communicator", role->id,
                       role->dp);
    tr_ckpt_save_opts so = {.dtype = role->save_bf16 ? TR_ST_BF16 : TR_ST_F32,
                            .tokenizer_dir = role->tokenizer_dir[0] ? role->tokenizer_dir : NULL};
    int rc = role->dp_rank == 0 ? tr_model_save(&role->model, dir, &so, err) : 0;
    if (rc && role->tp_comm) tr_comm_abort(role->tp_comm, err->msg);
    if (rc && comm) tr_comm_abort(comm, err->msg);
    if (!rc && comm) rc = tr_comm_barrier(comm, err);
    if (!rc && role->has_trainer) rc = tr_train_state_save(&role->trainer, dir, err);
    if (rc) return tr_err_wrap(err, "%s", dir);   // the op's name comes before it
    tr_worker_logf(role, "saved %s", dir);
    tr_msg_begin_reply(rep, req->id, 2);
    tr_msg_put_str(rep, "dir", dir);
    tr_msg_put_int(rep, "step", role->has_trainer ? role->trainer.step : 0);
    return 0;
}

int tr_worker_op_load(tr_role_ctx *role, const tr_msg *req, tr_msg_writer *rep, tr_err *err) {
    static const char *const keys[] = {"dir", NULL};
    char dir[1024], path[1100];
    if (tr_msg_check_keys(&req->args, keys, err) || tr_msg_get_str_buf(&req->args, "dir", dir, sizeof dir, err))
        return -1;
    tr_model_config cfg;
    const tr_model_config *c = &role->model.cfg;
    if (tr_checkpoint_load_config(dir, &cfg, err)) return -1;
    if (cfg.head != c->head || cfg.vocab_size != c->vocab_size || cfg.hidden_size != c->hidden_size ||
        cfg.n_layers != c->n_layers || cfg.n_heads != c->n_heads || cfg.n_kv_heads != c->n_kv_heads ||
        cfg.intermediate_size != c->intermediate_size)
        return tr_errf(err, TR_EINVAL, "load: %s (%s) is not the shape of the running %s model", dir,
                       cfg.architecture, c->architecture);
    if (tr_worker_begin_write(role, err) || tr_model_load_weights(&role->model, dir, false, err)) return -1;
    role->prev_train_step = -1;  // the weights before the loaded ones are not known
    bool state = false;
    snprintf(path, sizeof path, "%s/%s", dir, TR_TRAIN_STATE_JSON);
    if (role->has_trainer && tr_file_exists(path)) {
        if (tr_train_state_load(&role->trainer, dir, err)) return -1;
        state = true;
    }
    tr_worker_logf(role, "loaded %s%s", dir, state ? " with its training state" : "");
    tr_msg_begin_reply(rep, req->id, 2);
    tr_msg_put_bool(rep, "state_loaded", state);
    tr_msg_put_int(rep, "step", role->has_trainer ? role->trainer.step : 0);
    return 0;
}
