// Saving and restoring the trainer beside a checkpoint: Adam moments through the safetensors
// module (downloaded to and uploaded from pinned host staging), scalars as JSON. Loading
// reads everything into staging first, so a bad file leaves the trainer as it was.
#include "engine/train_state.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "engine/file.h"
#include "engine/json.h"
#include "engine/safetensors.h"
#include "engine/train_shards.h"

#define STATE_FORMAT "troupe.trainer_state"
#define STATE_VERSION 1

static void join(char *out, size_t cap, const char *dir, const char *name) {
    snprintf(out, cap, "%s/%s", dir, name);
}

static int save_moments(const tr_trainer *tr, const tr_param_layout *lay, const char *path,
                        const float *buf, tr_err *err) {
    tr_st_entry *e = calloc((size_t)lay->n_tensors, sizeof *e);
    if (!e) return tr_errf(err, TR_ENOMEM, "%s: out of memory", path);
    for (int32_t i = 0; i < lay->n_tensors; i++) {
        const tr_tensor_desc *d = &lay->tensors[i];
        e[i].name = d->name;
        e[i].ndim = d->ndim;
        e[i].shape[0] = d->shape[0];
        e[i].shape[1] = d->shape[1];
        e[i].data = buf + d->offset;
    }
    char step[32];
    snprintf(step, sizeof step, "%" PRId64, tr->step);
    const char *meta[] = {"format", "pt", "step", step};
    int rc = tr_st_save(path, e, lay->n_tensors, TR_ST_F32, meta, 2, err);
    free(e);
    return rc;
}

// One moment buffer through host staging into its file.
static int save_moment(const tr_trainer *tr, const char *dir, const char *name,
                       const float *dev, tr_err *err) {
    tr_backend *be = tr->model->be;
    size_t bytes = tr->model->layout.total * sizeof(float);
    float *buf = tr_dev_alloc_host(be, bytes, "training state staging", err);
    if (!buf) return -1;
    char path[4096];
    join(path, sizeof path, dir, name);
    int rc = tr_dev_download_sync(be, buf, dev, bytes, "saving Adam moments", err);
    if (!rc) rc = save_moments(tr, &tr->model->layout, path, buf, err);
    tr_dev_free_host(be, buf);
    return rc;
}

// A tensor-parallel trainer's moment as whole tensors: each data-parallel rank's shard is
// gathered into the local layout (in the gradient buffer, free between steps), the first
// data-parallel rank's tensor-parallel group gathers the slices into whole HF tensors, and
// its first rank writes them, so the state resumes at any tensor-parallel size.
static int save_moment_tp(const tr_trainer *tr, const char *dir, const char *name,
                          const float *moment, const tr_param_layout *whole, float *full,
                          tr_err *err) {
    tr_model *m = tr->model;
    m->be->ops->copy(m->be, m->grads + tr->shard_begin, moment,
                     (tr->shard_end - tr->shard_begin) * sizeof(float));
    if (tr->comm && tr_comm_all_gather(tr->comm, m->grads, tr->shard_counts, TR_COMM_F32, err))
        return -1;
    if (tr->shard != 0) return 0;
    if (tr_model_gather_full(m, true, full, err)) return -1;
    if (!full) return 0;
    char path[4096];
    join(path, sizeof path, dir, name);
    return save_moments(tr, whole, path, full, err);
}

static int save_tp(const tr_trainer *tr, const char *dir, tr_err *err) {
    tr_model *m = tr->model;
    tr_param_layout whole;
    if (tr_param_layout_init(&whole, &m->cfg, err)) return -1;
    float *full = NULL;
    int rc = 0;
    if (tr->shard == 0 && m->tp.rank == 0 &&
        !(full = tr_dev_alloc_host(m->be, whole.total * sizeof(float), "training state staging", err)))
        rc = -1;
    if (!rc) rc = save_moment_tp(tr, dir, TR_TRAIN_STATE_EXP_AVG, tr->adam_m, &whole, full, err);
    if (!rc) rc = save_moment_tp(tr, dir, TR_TRAIN_STATE_EXP_AVG_SQ, tr->adam_v, &whole, full, err);
    tr_model_zero_grad(m);
    tr_dev_free_host(m->be, full);
    tr_param_layout_free(&whole);
    if (rc) {
        if (tr->comm) tr_comm_abort(tr->comm, err->msg);
        if (m->tp_comm) tr_comm_abort(m->tp_comm, err->msg);
    }
    return rc;
}

int tr_train_state_save(const tr_trainer *tr, const char *dir, tr_err *err) {
    char path[4096];
    if (tr->model->tp.size > 1) {
        if (save_tp(tr, dir, err)) return tr_err_wrap(err, "saving training state");
        if (tr->shard != 0 || tr->model->tp.rank != 0) return 0;
    } else if (tr->shards > 1) {
        // ZeRO-1: one file per rank's shard and a manifest; rank 0 writes the state itself.
        if (tr_train_shards_save(tr, dir, err)) return tr_err_wrap(err, "saving training state");
        if (tr->shard != 0) return 0;
    } else if (save_moment(tr, dir, TR_TRAIN_STATE_EXP_AVG, tr->adam_m, err) != 0 ||
               save_moment(tr, dir, TR_TRAIN_STATE_EXP_AVG_SQ, tr->adam_v, err) != 0) {
        return tr_err_wrap(err, "saving training state");
    }

    const tr_optim_cfg *o = &tr->opt;
    char seed[32];
    snprintf(seed, sizeof seed, "%" PRIu64, tr->rng.seed);
    tr_json_writer w;
    tr_json_writer_init(&w, 2);
    tr_json_begin_object(&w);
    tr_json_key(&w, "format");
    tr_json_string(&w, STATE_FORMAT);
    tr_json_key(&w, "version");
    tr_json_int(&w, STATE_VERSION);
    tr_json_key(&w, "step");
    tr_json_int(&w, tr->step);
    tr_json_key(&w, "next_lr");
    tr_json_double(&w, tr_lr_at(&o->schedule, o->lr, tr->step));
    tr_json_key(&w, "rng");
    tr_json_begin_object(&w);
    tr_json_key(&w, "seed");  // a string: JSON readers lose integers above 2^53
    tr_json_string(&w, seed);
    tr_json_key(&w, "counter");
    tr_json_int(&w, (int64_t)tr->rng.counter);
    tr_json_key(&w, "used");
    tr_json_int(&w, tr->rng.used);
    tr_json_end_object(&w);
    tr_json_key(&w, "optimizer");
    tr_json_begin_object(&w);
    tr_json_key(&w, "lr");
    tr_json_double(&w, o->lr);
    tr_json_key(&w, "betas");
    tr_json_begin_array(&w);
    tr_json_float(&w, o->beta1);
    tr_json_float(&w, o->beta2);
    tr_json_end_array(&w);
    tr_json_key(&w, "eps");
    tr_json_float(&w, o->eps);
    tr_json_key(&w, "weight_decay");
    tr_json_float(&w, o->weight_decay);
    tr_json_key(&w, "decay_all");
    tr_json_bool(&w, o->decay_all);
    tr_json_key(&w, "max_grad_norm");
    tr_json_float(&w, o->max_grad_norm);
    tr_json_end_object(&w);
    tr_json_key(&w, "schedule");
    tr_json_begin_object(&w);
    tr_json_key(&w, "kind");
    tr_json_string(&w, tr_lr_kind_name(o->schedule.kind));
    tr_json_key(&w, "warmup_steps");
    tr_json_int(&w, o->schedule.warmup_steps);
    tr_json_key(&w, "total_steps");
    tr_json_int(&w, o->schedule.total_steps);
    tr_json_key(&w, "min_lr_ratio");
    tr_json_double(&w, o->schedule.min_lr_ratio);
    tr_json_end_object(&w);
    tr_json_end_object(&w);
    tr_json_raw(&w, "\n", 1);
    const char *text;
    size_t len;
    join(path, sizeof path, dir, TR_TRAIN_STATE_JSON);
    int rc = tr_json_writer_finish(&w, &text, &len, err);
    if (rc == 0) rc = tr_file_write_atomic(path, text, len, err);
    tr_json_writer_free(&w);
    return rc == 0 ? 0 : tr_err_wrap(err, "saving training state to %s", path);
}

static int json_int(const tr_json *obj, const char *key, const char *path, int64_t lo,
                    int64_t hi, int64_t *out, tr_err *err) {
    const tr_json *v = tr_json_get(obj, key);
    if (!v) return tr_errf(err, TR_EFORMAT, "%s: missing key '%s'", path, key);
    if (v->type != TR_JSON_NUMBER || !v->is_int || v->inum < lo || v->inum > hi)
        return tr_errf(err, TR_EFORMAT, "%s:%d:%d: '%s' must be an integer in [%" PRId64
                       ", %" PRId64 "]", path, v->line, v->col, key, lo, hi);
    *out = v->inum;
    return 0;
}

static int parse_state(const char *path, int64_t *step, tr_rng *rng, tr_err *err) {
    tr_json_doc doc;
    if (tr_json_parse_file(&doc, path, NULL, err) != 0) return -1;
    int rc = -1;
    const tr_json *root = doc.root, *fmt = tr_json_get(root, "format");
    const tr_json *r = tr_json_get(root, "rng"), *seed = r ? tr_json_get(r, "seed") : NULL;
    int64_t version = 0, counter = 0, used = 0;   // set by json_int before any use
    if (root->type != TR_JSON_OBJECT || !fmt || fmt->type != TR_JSON_STRING ||
        strcmp(fmt->str, STATE_FORMAT) != 0) {
        tr_errf(err, TR_EFORMAT, "%s: not a troupe trainer state (\"format\": \"%s\" expected)",
                path, STATE_FORMAT);
        goto done;
    }
    if (json_int(root, "version", path, STATE_VERSION, STATE_VERSION, &version, err) != 0 ||
        json_int(root, "step", path, 0, INT32_MAX, step, err) != 0)
        goto done;
    if (!r || r->type != TR_JSON_OBJECT) {
        tr_errf(err, TR_EFORMAT, "%s: missing object 'rng'", path);
        goto done;
    }
    char *end = NULL;
    if (!seed || seed->type != TR_JSON_STRING || !seed->len ||
        (rng->seed = strtoull(seed->str, &end, 10), *end != '\0')) {
        tr_errf(err, TR_EFORMAT, "%s: rng.seed must be a decimal string", path);
        goto done;
    }
    if (json_int(r, "counter", path, 0, INT64_MAX, &counter, err) != 0 ||
        json_int(r, "used", path, 0, 4, &used, err) != 0)
        goto done;
    if (used < 4 && counter == 0) {
        tr_errf(err, TR_EFORMAT, "%s: rng.used %" PRId64 " with counter 0", path, used);
        goto done;
    }
    rng->counter = (uint64_t)counter;
    rng->used = (int32_t)used;
    // The block being consumed is a pure function of (seed, counter - 1).
    if (rng->used < 4) tr_philox4x32(rng->counter - 1, 0, rng->seed, rng->buf);
    rc = 0;
done:
    tr_json_free(&doc);
    return rc;
}

// The moments of the trainer's shard from a file of whole tensors (out is indexed from
// shard_begin), whatever shard of whatever number of ranks it is.
static int load_moments(const tr_trainer *tr, const char *path, int64_t step, float *out,
                        tr_err *err) {
    const tr_param_layout *lay = &tr->model->layout;
    tr_st_file f;
    if (tr_st_open(&f, path, err) != 0) return -1;
    int rc = -1;
    const char *s = tr_st_metadata(&f, "step");
    char want[32];
    snprintf(want, sizeof want, "%" PRId64, step);
    if (!s || strcmp(s, want) != 0) {
        tr_errf(err, TR_EFORMAT, "%s: written at step %s but %s says step %s", path,
                s ? s : "(none)", TR_TRAIN_STATE_JSON, want);
        goto done;
    }
    if (f.n_tensors != lay->n_tensors) {
        tr_errf(err, TR_EFORMAT, "%s: %d tensors, the model has %d", path, f.n_tensors,
                lay->n_tensors);
        goto done;
    }
    for (int32_t i = 0; i < lay->n_tensors; i++) {
        const tr_tensor_desc *d = &lay->tensors[i];
        const tr_st_tensor *t = tr_st_find(&f, d->name);
        if (!t) {
            tr_errf(err, TR_EFORMAT, "%s: tensor '%s' is missing", path, d->name);
            goto done;
        }
        bool same = t->ndim == d->ndim && t->shape[0] == d->full[0] &&
                    (d->ndim == 1 || t->shape[1] == d->full[1]);
        if (!same || t->numel != d->full_numel) {
            tr_errf(err, TR_EFORMAT, "%s: tensor '%s' has %" PRIu64 " values in %d dims, the "
                    "model's has %zu", path, d->name, t->numel, t->ndim, d->full_numel);
            goto done;
        }
        size_t lo = d->offset > tr->shard_begin ? d->offset : tr->shard_begin;
        size_t hi = d->offset + d->numel < tr->shard_end ? d->offset + d->numel : tr->shard_end;
        if (lo >= hi) continue;
        if (lo == d->offset && hi == d->offset + d->numel && d->split == TR_SPLIT_NONE) {
            if (tr_st_read_f32(&f, t, out + (d->offset - tr->shard_begin), err) != 0) goto done;
            continue;
        }
        // Part of the tensor: a data-parallel shard's range of a tensor-parallel rank's slice.
        float *tmp = malloc((d->full_numel + d->numel) * sizeof(float));
        if (!tmp) {
            tr_errf(err, TR_ENOMEM, "%s: out of memory for '%s'", path, d->name);
            goto done;
        }
        float *part = tmp + d->full_numel;
        int r = tr_st_read_f32(&f, t, tmp, err);
        if (!r) tr_tensor_slice(d, tmp, sizeof(float), part);
        if (!r) memcpy(out + (lo - tr->shard_begin), part + (lo - d->offset), (hi - lo) * sizeof(float));
        free(tmp);
        if (r) goto done;
    }
    rc = 0;
done:
    tr_st_close(&f);
    return rc;
}

int tr_train_state_load(tr_trainer *tr, const char *dir, tr_err *err) {
    char path[4096];
    int64_t step = 0;
    tr_rng rng = tr->rng;
    join(path, sizeof path, dir, TR_TRAIN_STATE_JSON);
    if (parse_state(path, &step, &rng, err) != 0) return tr_err_wrap(err, "loading training state");
    tr_backend *be = tr->model->be;
    size_t bytes = (tr->shard_end - tr->shard_begin) * sizeof(float);
    float *m = tr_dev_alloc_host(be, bytes ? bytes : 4, "training state staging", err);
    float *v = m ? tr_dev_alloc_host(be, bytes ? bytes : 4, "training state staging", err) : NULL;
    char path_v[4096];
    join(path, sizeof path, dir, TR_TRAIN_STATE_EXP_AVG);
    join(path_v, sizeof path_v, dir, TR_TRAIN_STATE_EXP_AVG_SQ);
    int rc = v ? 0 : -1;
    // The padding between tensors is in no file; zero, as the buffers started.
    if (!rc) {
        memset(m, 0, bytes);
        memset(v, 0, bytes);
    }
    // A checkpoint of several shards (any number) has a manifest, one of whole tensors has not.
    char manifest[4096];
    join(manifest, sizeof manifest, dir, TR_TRAIN_STATE_SHARDS);
    bool sharded = tr_file_exists(manifest);
    if (!rc && sharded && tr->model->tp.size > 1)
        rc = tr_errf(err, TR_EUNSUPPORTED, "%s: Adam moments saved in data-parallel shards (a "
                     "tp 1, dp > 1 run) load only at tp 1", manifest);
    if (!rc && sharded) rc = tr_train_shards_load(tr, dir, step, m, v, err);
    if (!rc && !sharded) rc = load_moments(tr, path, step, m, err);
    if (!rc && !sharded) rc = load_moments(tr, path_v, step, v, err);
    if (!rc) {
        be->ops->upload(be, tr->adam_m, m, bytes);
        be->ops->upload(be, tr->adam_v, v, bytes);
        rc = tr_dev_sync(be, "loading Adam moments", err);
    }
    tr_dev_free_host(be, m);
    tr_dev_free_host(be, v);
    if (rc) return tr_err_wrap(err, "loading training state");
    tr->step = step;
    tr->rng = rng;
    return 0;
}
