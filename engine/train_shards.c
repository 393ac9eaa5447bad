// The Adam moments of a ZeRO-1 trainer beside a checkpoint: each data-parallel rank writes
// optim_shard_<r>.safetensors with the slices of the tensors its shard covers
// ("<name>.exp_avg", "<name>.exp_avg_sq", 1-D), and rank 0 then writes optim_shards.json, the
// manifest naming every shard's file and the element range of each tensor in it. A rank of
// any data-parallel size (one included) assembles its own shard from whichever files hold it,
// so a run resumes on a different DP size.
#include "engine/train_shards.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "engine/file.h"
#include "engine/json.h"
#include "engine/safetensors.h"
#include "engine/train_state.h"

#define SHARDS_FORMAT "troupe.optim_shards"
#define SHARDS_VERSION 1

static void shard_file(char *out, size_t cap, int32_t shard) {
    snprintf(out, cap, "optim_shard_%d.safetensors", shard);
}

// The part [*lo, *hi) of tensor d inside parameters [b, e) of the flat layout, in the
// tensor's own element numbering; false when they do not meet.
static bool tensor_part(const tr_tensor_desc *d, size_t b, size_t e, size_t *lo, size_t *hi) {
    size_t s = d->offset > b ? d->offset : b, t = d->offset + d->numel < e ? d->offset + d->numel : e;
    if (s >= t) return false;
    *lo = s - d->offset;
    *hi = t - d->offset;
    return true;
}

// This rank's shard file from the moments staged in m and v (its shard's floats).
static int write_shard(const tr_trainer *tr, const char *dir, const float *m, const float *v, tr_err *err) {
    const tr_param_layout *lay = &tr->model->layout;
    tr_st_entry *e = calloc((size_t)lay->n_tensors * 2 + 1, sizeof *e);
    char(*names)[TR_NAME_MAX + 16] = calloc((size_t)lay->n_tensors * 2 + 1, sizeof *names);
    if (!e || !names) {
        free(e);
        free(names);
        return tr_errf(err, TR_ENOMEM, "optimizer shard %d: out of memory", tr->shard);
    }
    int32_t n = 0;
    for (int32_t i = 0; i < lay->n_tensors; i++) {
        const tr_tensor_desc *d = &lay->tensors[i];
        size_t lo, hi;
        if (!tensor_part(d, tr->shard_begin, tr->shard_end, &lo, &hi)) continue;
        for (int k = 0; k < 2; k++, n++) {
            snprintf(names[n], sizeof names[n], "%s.%s", d->name, k ? "exp_avg_sq" : "exp_avg");
            e[n] = (tr_st_entry){.name = names[n], .ndim = 1, .shape = {(int64_t)(hi - lo)},
                                 .data = (k ? v : m) + (d->offset + lo - tr->shard_begin)};
        }
    }
    char step[32], shard[16], shards[16], file[64], path[4200];
    snprintf(step, sizeof step, "%" PRId64, tr->step);
    snprintf(shard, sizeof shard, "%d", tr->shard);
    snprintf(shards, sizeof shards, "%d", tr->shards);
    const char *meta[] = {"format", "pt", "step", step, "shard", shard, "shards", shards};
    shard_file(file, sizeof file, tr->shard);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    int rc = tr_st_save(path, e, n, TR_ST_F32, meta, 4, err);
    free(e);
    free(names);
    return rc;
}

// The manifest: every shard's file and tensor ranges, from the shard sizes all ranks share.
static int write_manifest(const tr_trainer *tr, const char *dir, tr_err *err) {
    const tr_param_layout *lay = &tr->model->layout;
    tr_json_writer w;
    tr_json_writer_init(&w, 1);
    tr_json_begin_object(&w);
    tr_json_key(&w, "format");
    tr_json_string(&w, SHARDS_FORMAT);
    tr_json_key(&w, "version");
    tr_json_int(&w, SHARDS_VERSION);
    tr_json_key(&w, "step");
    tr_json_int(&w, tr->step);
    tr_json_key(&w, "shards");
    tr_json_begin_array(&w);
    size_t b = 0;
    for (int32_t r = 0; r < tr->shards; r++) {
        size_t e = b + tr->shard_counts[r];
        char file[64];
        shard_file(file, sizeof file, r);
        tr_json_begin_object(&w);
        tr_json_key(&w, "file");
        tr_json_string(&w, file);
        tr_json_key(&w, "tensors");
        tr_json_begin_array(&w);
        for (int32_t i = 0; i < lay->n_tensors; i++) {
            size_t lo, hi;
            if (!tensor_part(&lay->tensors[i], b, e, &lo, &hi)) continue;
            tr_json_begin_object(&w);
            tr_json_key(&w, "name");
            tr_json_string(&w, lay->tensors[i].name);
            tr_json_key(&w, "begin");
            tr_json_int(&w, (int64_t)lo);
            tr_json_key(&w, "end");
            tr_json_int(&w, (int64_t)hi);
            tr_json_end_object(&w);
        }
        tr_json_end_array(&w);
        tr_json_end_object(&w);
        b = e;
    }
    tr_json_end_array(&w);
    tr_json_end_object(&w);
    tr_json_raw(&w, "\n", 1);
    const char *text;
    size_t len;
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, TR_TRAIN_STATE_SHARDS);
    int rc = tr_json_writer_finish(&w, &text, &len, err);
    if (!rc) rc = tr_file_write_atomic(path, text, len, err);
    tr_json_writer_free(&w);
    return rc;
}

int tr_train_shards_save(const tr_trainer *tr, const char *dir, tr_err *err) {
    if (!tr->comm)
        return tr_errf(err, TR_EINVAL, "optimizer shard %d of %d: no communicator to save with", tr->shard, tr->shards);
    tr_backend *be = tr->model->be;
    size_t n = tr->shard_end - tr->shard_begin, bytes = (n ? n : 1) * sizeof(float);
    float *m = tr_dev_alloc_host(be, bytes, "training state staging", err);
    float *v = m ? tr_dev_alloc_host(be, bytes, "training state staging", err) : NULL;
    int rc = v ? 0 : -1;
    if (!rc) {
        be->ops->download(be, m, tr->adam_m, n * sizeof(float));
        be->ops->download(be, v, tr->adam_v, n * sizeof(float));
        rc = tr_dev_sync(be, "saving Adam moments", err);
    }
    if (!rc) rc = write_shard(tr, dir, m, v, err);
    tr_dev_free_host(be, m);
    tr_dev_free_host(be, v);
    // The manifest goes last, once every shard is on disk; a rank that failed has aborted
    // the communicator, so the barrier fails on every rank instead of waiting for it.
    if (rc) tr_comm_abort(tr->comm, err->msg);
    if (!rc) rc = tr_comm_barrier(tr->comm, err);
    if (!rc && tr->shard == 0) rc = write_manifest(tr, dir, err);
    return rc ? tr_err_wrap(err, "optimizer shard %d of %d", tr->shard, tr->shards) : 0;
}

// ---- loading ----

typedef struct manifest {
    tr_json_doc doc;
    const tr_json *shards;     // the array
    tr_st_file *files;         // opened on first use
    bool *open;
    int32_t n;
} manifest;

static int read_manifest(manifest *mf, const char *path, int64_t step, tr_err *err) {
    if (tr_json_parse_file(&mf->doc, path, NULL, err)) return -1;
    const tr_json *root = mf->doc.root, *f = tr_json_get(root, "format"), *v = tr_json_get(root, "version");
    const tr_json *s = tr_json_get(root, "step");
    mf->shards = tr_json_get(root, "shards");
    if (!f || f->type != TR_JSON_STRING || strcmp(f->str, SHARDS_FORMAT) != 0 || !v || !v->is_int ||
        v->inum != SHARDS_VERSION || !mf->shards || mf->shards->type != TR_JSON_ARRAY || mf->shards->count < 1)
        return tr_errf(err, TR_EFORMAT, "%s: not a troupe optimizer shard manifest of version %d", path,
                       SHARDS_VERSION);
    if (!s || !s->is_int || s->inum != step)
        return tr_errf(err, TR_EFORMAT, "%s: written at step %lld, %s says step %lld", path,
                       s && s->is_int ? (long long)s->inum : -1LL, TR_TRAIN_STATE_JSON, (long long)step);
    mf->n = mf->shards->count;
    mf->files = calloc((size_t)mf->n, sizeof *mf->files);
    mf->open = calloc((size_t)mf->n, sizeof *mf->open);
    if (!mf->files || !mf->open) return tr_errf(err, TR_ENOMEM, "%s: out of memory", path);
    return 0;
}

static void free_manifest(manifest *mf) {
    for (int32_t i = 0; mf->open && i < mf->n; i++)
        if (mf->open[i]) tr_st_close(&mf->files[i]);
    free(mf->files);
    free(mf->open);
    tr_json_free(&mf->doc);
}

// Shard i's file, opened once and checked against the step.
static tr_st_file *shard_at(manifest *mf, const tr_json *sh, int32_t i, const char *dir, int64_t step, tr_err *err) {
    if (mf->open[i]) return &mf->files[i];
    const tr_json *file = tr_json_get(sh, "file");
    if (!file || file->type != TR_JSON_STRING || strchr(file->str, '/')) {
        tr_errf(err, TR_EFORMAT, "%s: shard %d has no plain file name", TR_TRAIN_STATE_SHARDS, i);
        return NULL;
    }
    char path[4200], want[32];
    snprintf(path, sizeof path, "%s/%s", dir, file->str);
    if (tr_st_open(&mf->files[i], path, err)) return NULL;
    mf->open[i] = true;
    const char *s = tr_st_metadata(&mf->files[i], "step");
    snprintf(want, sizeof want, "%" PRId64, step);
    if (!s || strcmp(s, want) != 0) {
        tr_errf(err, TR_EFORMAT, "%s: written at step %s, %s says step %s", path, s ? s : "(none)",
                TR_TRAIN_STATE_JSON, want);
        return NULL;
    }
    return &mf->files[i];
}

// Copies elements [lo, hi) of the slice [sb, se) that tensor `name` has in file f into out.
static int copy_slice(const tr_st_file *f, const char *name, const char *moment, size_t sb, size_t se, size_t lo,
                      size_t hi, float *out, tr_err *err) {
    char key[TR_NAME_MAX + 16];
    snprintf(key, sizeof key, "%s.%s", name, moment);
    const tr_st_tensor *t = tr_st_find(f, key);
    if (!t || t->ndim != 1 || t->numel != se - sb)
        return tr_errf(err, TR_EFORMAT, "%s: '%s' is missing or does not hold %zu values", f->path, key, se - sb);
    float *tmp = malloc((se - sb) * sizeof(float));
    if (!tmp) return tr_errf(err, TR_ENOMEM, "%s: out of memory", f->path);
    int rc = tr_st_read_f32(f, t, tmp, err);
    if (!rc) memcpy(out, tmp + (lo - sb), (hi - lo) * sizeof(float));
    free(tmp);
    return rc;
}

// Elements [lo, hi) of tensor d into m and v (indexed from the trainer's shard_begin), from
// every shard that holds some of them; all of them must be found.
static int load_tensor(const tr_trainer *tr, manifest *mf, const char *dir, int64_t step, const tr_tensor_desc *d,
                       size_t lo, size_t hi, float *m, float *v, tr_err *err) {
    size_t found = 0;
    for (int32_t i = 0; i < mf->n; i++) {
        const tr_json *sh = tr_json_at(mf->shards, i), *ts = sh ? tr_json_get(sh, "tensors") : NULL;
        if (!ts || ts->type != TR_JSON_ARRAY)
            return tr_errf(err, TR_EFORMAT, "%s: shard %d has no tensor list", TR_TRAIN_STATE_SHARDS, i);
        for (const tr_json *t = ts->child; t; t = t->next) {
            const tr_json *nm = tr_json_get(t, "name"), *b = tr_json_get(t, "begin"), *e = tr_json_get(t, "end");
            if (!nm || nm->type != TR_JSON_STRING)
                return tr_errf(err, TR_EFORMAT, "%s: shard %d: a tensor entry has no name", TR_TRAIN_STATE_SHARDS, i);
            if (strcmp(nm->str, d->name) != 0) continue;
            if (!b || !b->is_int || !e || !e->is_int || b->inum < 0 || e->inum <= b->inum ||
                (uint64_t)e->inum > d->numel)
                return tr_errf(err, TR_EFORMAT, "%s: shard %d: '%s' covers elements outside [0, %zu)",
                               TR_TRAIN_STATE_SHARDS, i, d->name, d->numel);
            size_t sb = (size_t)b->inum, se = (size_t)e->inum;
            size_t a = sb > lo ? sb : lo, z = se < hi ? se : hi;
            if (a >= z) continue;
            tr_st_file *f = shard_at(mf, sh, i, dir, step, err);
            size_t at = d->offset + a - tr->shard_begin;
            if (!f || copy_slice(f, d->name, "exp_avg", sb, se, a, z, m + at, err) ||
                copy_slice(f, d->name, "exp_avg_sq", sb, se, a, z, v + at, err))
                return -1;
            found += z - a;
        }
    }
    if (found != hi - lo)
        return tr_errf(err, TR_EFORMAT, "%s: the shards hold %zu of the %zu values of '%s' this rank needs (or hold "
                       "some twice)", TR_TRAIN_STATE_SHARDS, found, hi - lo, d->name);
    return 0;
}

int tr_train_shards_load(const tr_trainer *tr, const char *dir, int64_t step, float *m, float *v, tr_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, TR_TRAIN_STATE_SHARDS);
    manifest mf;
    memset(&mf, 0, sizeof mf);
    int rc = read_manifest(&mf, path, step, err);
    const tr_param_layout *lay = &tr->model->layout;
    for (int32_t i = 0; i < lay->n_tensors && !rc; i++) {
        size_t lo, hi;
        if (tensor_part(&lay->tensors[i], tr->shard_begin, tr->shard_end, &lo, &hi))
            rc = load_tensor(tr, &mf, dir, step, &lay->tensors[i], lo, hi, m, v, err);
    }
    free_manifest(&mf);
    return rc ? tr_err_wrap(err, "%s", path) : 0;
}
