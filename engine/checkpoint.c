// Hugging Face checkpoint directories: strict loading of single-file or sharded safetensors
// into the flat parameter buffer, and crash-safe saving (build DIR.tmp.<pid>, then swap it
// in with one rename, so a reader never sees a half-written checkpoint).
#include "engine/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/file.h"
#include "engine/json.h"

const char *const tr_ckpt_tokenizer_files[] = {
    "tokenizer.json",   "tokenizer_config.json", "special_tokens_map.json",
    "generation_config.json", "chat_template.jinja", "vocab.json", "merges.txt",
    "added_tokens.json", NULL,
};

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct shard {
    char name[256];
    tr_st_file st;
    bool open;
} shard;

typedef struct loader {
    const char *dir;
    const tr_model_config *cfg;
    const tr_param_layout *layout;
    float *buf;
    tr_ckpt_sink sink;           // instead of buf: each tensor's data as the file holds it
    void *sink_ctx;
    bool backbone_only;
    char index_path[4096];
    tr_json_doc index;
    const tr_json *weight_map;   // NULL for a single-file checkpoint
    shard *shards;
    int32_t n_shards;
    tr_err *err;
} loader;

int tr_checkpoint_load_config(const char *dir, tr_model_config *cfg, tr_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path)
        return tr_errf(err, TR_EINVAL, "%s: path too long", dir);
    return tr_config_load(path, cfg, err);
}

int tr_checkpoint_load_lm_config(const char *dir, const char *what, tr_model_config *cfg,
                                 tr_err *err) {
    if (tr_checkpoint_load_config(dir, cfg, err)) return -1;
    if (cfg->head != TR_HEAD_LM)
        return tr_errf(err, TR_EINVAL, "%s is a %s; %s needs a causal LM", dir, cfg->architecture,
                       what);
    return 0;
}

static bool is_head(const char *name) {
    return strncmp(name, "lm_head.", 8) == 0 || strncmp(name, "score.", 6) == 0;
}

// Non-persistent buffers that older transformers versions wrote into checkpoints.
static bool is_harmless(const char *name) {
    static const char suffix[] = ".rotary_emb.inv_freq";
    size_t n = strlen(name), m = sizeof suffix - 1;
    return strncmp(name, "model.", 6) == 0 && n > m && strcmp(name + n - m, suffix) == 0;
}

static void shape_text(int32_t ndim, const int64_t *shape, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int32_t d = 0; d < ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (used < n) snprintf(buf + used, n - used, "]");
}

// A shard name from the index must be a plain file name in the checkpoint directory.
static bool plain_file_name(const char *s, size_t len) {
    return len > 0 && len < 256 && strlen(s) == len && !strchr(s, '/') && s[0] != '.';
}

static int open_shard(loader *L, const char *name, shard **out) {
    for (int32_t i = 0; i < L->n_shards; i++)
        if (strcmp(L->shards[i].name, name) == 0) {
            *out = &L->shards[i];
            return 0;
        }
    shard *ns = realloc(L->shards, (size_t)(L->n_shards + 1) * sizeof *ns);
    if (!ns) return tr_errf(L->err, TR_ENOMEM, "%s: out of memory", L->dir);
    L->shards = ns;
    shard *s = &L->shards[L->n_shards++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", L->dir, name);
    if (tr_st_open(&s->st, path, L->err)) return -1;
    s->open = true;
    *out = s;
    return 0;
}

// Like transformers, a model.safetensors wins over an index when a directory has both.
static int open_files(loader *L) {
    snprintf(L->index_path, sizeof L->index_path, "%s/%s", L->dir, INDEX_NAME);
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", L->dir, SINGLE_NAME);
    shard *s;
    if (tr_file_exists(path)) return open_shard(L, SINGLE_NAME, &s);
    if (!tr_file_exists(L->index_path)) {
        snprintf(path, sizeof path, "%s/pytorch_model.bin", L->dir);
        return tr_errf(L->err, TR_EIO, "%s: no %s or %s%s", L->dir, SINGLE_NAME, INDEX_NAME,
                       tr_file_exists(path) ? " (pytorch_model.bin is not supported; convert to "
                                              "safetensors)" : "");
    }
    if (tr_json_parse_file(&L->index, L->index_path, NULL, L->err)) return -1;
    const tr_json *wm = tr_json_get(L->index.root, "weight_map");
    if (!wm || wm->type != TR_JSON_OBJECT)
        return tr_errf(L->err, TR_EFORMAT, "%s: 'weight_map' must be an object of tensor name "
                       "to file name", L->index_path);
    for (const tr_json *m = wm->child; m; m = m->next) {
        if (m->type != TR_JSON_STRING || !plain_file_name(m->str, m->len))
            return tr_errf(L->err, TR_EFORMAT, "%s:%d:%d: weight_map['%s'] must name a file in "
                           "the checkpoint directory", L->index_path, m->line, m->col, m->key);
        if (open_shard(L, m->str, &s)) return -1;
    }
    L->weight_map = wm;
    return 0;
}

// The shard that should hold `name`: the one weight_map names, or the single file.
static int shard_for(loader *L, const char *name, shard **out) {
    if (!L->weight_map) {
        *out = &L->shards[0];
        return 0;
    }
    const tr_json *m = tr_json_get(L->weight_map, name);
    if (!m) return tr_errf(L->err, TR_EFORMAT, "%s: tensor '%s' is missing from weight_map",
                           L->index_path, name);
    return open_shard(L, m->str, out);
}

static int load_tensor(loader *L, const tr_tensor_desc *d, size_t next_offset) {
    shard *s;
    if (shard_for(L, d->name, &s)) return -1;
    const tr_st_tensor *t = tr_st_find(&s->st, d->name);
    if (!t)
        return tr_errf(L->err, TR_EFORMAT, "%s: tensor '%s' is missing%s", s->st.path, d->name,
                       L->weight_map ? " (the index maps it to this file)" : "");
    bool same = t->ndim == d->ndim;
    for (int32_t k = 0; same && k < d->ndim; k++) same = t->shape[k] == d->full[k];
    if (!same) {
        char got[160], want[160];
        shape_text(t->ndim, t->shape, got, sizeof got);
        shape_text(d->ndim, d->full, want, sizeof want);
        return tr_errf(L->err, TR_EFORMAT, "%s: tensor '%s' has shape %s, config.json implies %s",
                       s->st.path, d->name, got, want);
    }
    if (t->dtype != TR_ST_F32 && t->dtype != TR_ST_BF16 && t->dtype != TR_ST_F16 &&
        t->dtype != TR_ST_F64)
        return tr_errf(L->err, TR_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (F32, BF16, F16 or "
                       "F64 expected)", s->st.path, d->name, tr_st_dtype_name(t->dtype));
    if (L->sink) {
        if (t->dtype != TR_ST_F64) return L->sink(L->sink_ctx, d, t->data, t->dtype, L->err);
        // No backend converts from F64: the host narrows it first.
        float *tmp = malloc((d->full_numel ? d->full_numel : 1) * sizeof *tmp);
        if (!tmp) return tr_errf(L->err, TR_ENOMEM, "%s: out of memory for '%s'", s->st.path, d->name);
        int rc = tr_st_read_f32(&s->st, t, tmp, L->err);
        if (!rc) rc = L->sink(L->sink_ctx, d, tmp, TR_ST_F32, L->err);
        free(tmp);
        return rc;
    }
    if (!L->buf) return 0;
    for (size_t i = d->offset + d->numel; i < next_offset; i++) L->buf[i] = 0.0f;
    if (d->split == TR_SPLIT_NONE) return tr_st_read_f32(&s->st, t, L->buf + d->offset, L->err);
    // A tensor-parallel rank's slice: the whole tensor, then its part.
    float *tmp = malloc(d->full_numel * sizeof *tmp);
    if (!tmp) return tr_errf(L->err, TR_ENOMEM, "%s: out of memory for '%s'", s->st.path, d->name);
    int rc = tr_st_read_f32(&s->st, t, tmp, L->err);
    if (!rc) tr_tensor_slice(d, tmp, sizeof(float), L->buf + d->offset);
    free(tmp);
    return rc;
}

// Reads tensor d (present and checked by load_tensor) as fp32 into out.
static int read_tensor(loader *L, const tr_tensor_desc *d, float *out) {
    shard *s;
    if (shard_for(L, d->name, &s)) return -1;
    const tr_st_tensor *t = tr_st_find(&s->st, d->name);
    if (!t) return tr_errf(L->err, TR_EFORMAT, "%s: tensor '%s' is missing", s->st.path, d->name);
    return tr_st_read_f32(&s->st, t, out, L->err);
}

// A tied model's file may still carry lm_head.weight; accept it only when it is the embedding.
static int check_tied_lm_head(loader *L, const shard *s, const tr_st_tensor *t) {
    const tr_tensor_desc *e = &L->layout->tensors[0];
    char where[4400];
    snprintf(where, sizeof where, "%s: tensor 'lm_head.weight'", s->st.path);
    if (t->ndim != 2 || t->shape[0] != e->full[0] || t->shape[1] != e->full[1])
        return tr_errf(L->err, TR_EFORMAT, "%s: present in a model with tie_word_embeddings, but "
                       "its shape differs from the embedding", where);
    if (!L->buf && !L->sink) return 0;
    float *tmp = malloc(2 * e->full_numel * sizeof *tmp);
    if (!tmp) return tr_errf(L->err, TR_ENOMEM, "%s: out of memory", where);
    // The whole embedding, read again (buf may hold only a tensor-parallel rank's rows).
    int rc = tr_st_read_f32(&s->st, t, tmp, L->err);
    if (!rc) rc = read_tensor(L, e, tmp + e->full_numel);
    if (!rc && memcmp(tmp, tmp + e->full_numel, e->full_numel * sizeof *tmp) != 0)
        rc = tr_errf(L->err, TR_EFORMAT, "%s: present in a model with tie_word_embeddings but "
                     "differs from model.embed_tokens.weight", where);
    free(tmp);
    return rc;
}

static int check_extra(loader *L) {
    const char *arch = L->cfg->architecture[0] ? L->cfg->architecture : L->cfg->model_type;
    for (int32_t i = 0; i < L->n_shards; i++) {
        shard *s = &L->shards[i];
        for (int32_t j = 0; j < s->st.n_tensors; j++) {
            const tr_st_tensor *t = &s->st.tensors[j];
            if (L->weight_map) {
                const tr_json *m = tr_json_get(L->weight_map, t->name);
                if (!m || strcmp(m->str, s->name) != 0)
                    return tr_errf(L->err, TR_EFORMAT, "%s: holds tensor '%s' but %s %s%s%s",
                                   s->st.path, t->name, INDEX_NAME,
                                   m ? "maps it to " : "does not list it", m ? m->str : "", "");
            }
            if (tr_param_layout_find(L->layout, t->name)) continue;
            if (is_harmless(t->name)) continue;
            if (L->backbone_only && is_head(t->name)) continue;
            if (L->cfg->head == TR_HEAD_LM && L->cfg->tie_word_embeddings &&
                strcmp(t->name, "lm_head.weight") == 0) {
                if (check_tied_lm_head(L, s, t)) return -1;
                continue;
            }
            return tr_errf(L->err, TR_EFORMAT, "%s: unexpected tensor '%s' (a %s with this "
                           "config.json has no such tensor)", s->st.path, t->name, arch);
        }
    }
    // Every index entry must be found in the shard it names.
    for (const tr_json *m = L->weight_map ? L->weight_map->child : NULL; m; m = m->next) {
        shard *s;
        if (open_shard(L, m->str, &s)) return -1;
        if (!tr_st_find(&s->st, m->key))
            return tr_errf(L->err, TR_EFORMAT, "%s: maps tensor '%s' to %s, which does not hold it",
                           L->index_path, m->key, m->str);
    }
    return 0;
}

static int load_impl(const char *dir, const tr_model_config *cfg, const tr_param_layout *layout,
                     float *buf, tr_ckpt_sink sink, void *sink_ctx, bool backbone_only,
                     tr_err *err) {
    loader L = {.dir = dir, .cfg = cfg, .layout = layout, .buf = buf, .sink = sink,
                .sink_ctx = sink_ctx, .backbone_only = backbone_only, .err = err};
    int rc = open_files(&L);
    for (int32_t i = 0; i < layout->n_tensors && !rc; i++) {
        const tr_tensor_desc *d = &layout->tensors[i];
        if (backbone_only && is_head(d->name)) continue;
        size_t next = i + 1 < layout->n_tensors ? layout->tensors[i + 1].offset : layout->total;
        rc = load_tensor(&L, d, next);
    }
    if (!rc) rc = check_extra(&L);
    for (int32_t i = 0; i < L.n_shards; i++)
        if (L.shards[i].open) tr_st_close(&L.shards[i].st);
    free(L.shards);
    tr_json_free(&L.index);
    return rc;
}

int tr_checkpoint_load(const char *dir, const tr_model_config *cfg,
                       const tr_param_layout *layout, float *buf, tr_err *err) {
    return load_impl(dir, cfg, layout, buf, NULL, NULL, false, err);
}

int tr_checkpoint_load_backbone(const char *dir, const tr_model_config *cfg,
                                const tr_param_layout *layout, float *buf, tr_err *err) {
    return load_impl(dir, cfg, layout, buf, NULL, NULL, true, err);
}

int tr_checkpoint_load_to(const char *dir, const tr_model_config *cfg,
                          const tr_param_layout *layout, bool backbone_only, tr_ckpt_sink sink,
                          void *ctx, tr_err *err) {
    return load_impl(dir, cfg, layout, NULL, sink, ctx, backbone_only, err);
}

// ---------------------------------------------------------------------------------------
// Saving

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

// Removes a directory tree we created or replaced (never follows symlinks out of it).
static void remove_tree(const char *path) {
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);  // best effort: some filesystems refuse fsync on directories
        close(fd);
    }
}

static int copy_file(const char *src, const char *dst, tr_err *err) {
    char *data;
    size_t len;
    if (tr_file_read(src, &data, &len, err)) return -1;
    int rc = tr_file_write_atomic(dst, data, len, err);
    free(data);
    return rc;
}

static int write_index(const char *path, const tr_param_layout *layout, const int32_t *shard_of,
                       int32_t n_shards, uint64_t total_bytes, tr_err *err) {
    tr_json_writer w;
    tr_json_writer_init(&w, 2);
    tr_json_begin_object(&w);
    tr_json_key(&w, "metadata");
    tr_json_begin_object(&w);
    tr_json_key(&w, "total_size");
    tr_json_uint(&w, total_bytes);
    tr_json_end_object(&w);
    tr_json_key(&w, "weight_map");
    tr_json_begin_object(&w);
    char file[64];
    for (int32_t i = 0; i < layout->n_tensors; i++) {
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", shard_of[i] + 1, n_shards);
        tr_json_key(&w, layout->tensors[i].name);
        tr_json_string(&w, file);
    }
    tr_json_end_object(&w);
    tr_json_end_object(&w);
    tr_json_raw(&w, "\n", 1);
    const char *text;
    size_t len;
    int rc = tr_json_writer_finish(&w, &text, &len, err);
    if (!rc) rc = tr_file_write_atomic(path, text, len, err);
    tr_json_writer_free(&w);
    return rc;
}

static int write_weights(const char *tmp, const tr_param_layout *layout, const float *buf,
                         const tr_ckpt_save_opts *opts, tr_err *err) {
    static const char *const meta[] = {"format", "pt"};
    int32_t n = layout->n_tensors;
    tr_st_entry *entries = calloc((size_t)(n ? n : 1), sizeof *entries);
    int32_t *shard_of = calloc((size_t)(n ? n : 1), sizeof *shard_of);
    if (!entries || !shard_of) {
        free(entries);
        free(shard_of);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory", tmp);
    }
    uint64_t total = 0, cur = 0;
    int32_t n_shards = 1;
    for (int32_t i = 0; i < n; i++) {
        const tr_tensor_desc *d = &layout->tensors[i];
        entries[i].name = d->name;
        entries[i].ndim = d->ndim;
        entries[i].shape[0] = d->shape[0];
        entries[i].shape[1] = d->shape[1];
        entries[i].data = buf + d->offset;
        uint64_t bytes = tr_st_entry_bytes(&entries[i], opts->dtype);
        if (opts->max_shard_bytes && cur > 0 && cur + bytes > opts->max_shard_bytes) {
            n_shards++;
            cur = 0;
        }
        shard_of[i] = n_shards - 1;
        cur += bytes;
        total += bytes;
    }
    char path[4400];
    int rc = 0;
    if (n_shards == 1) {
        snprintf(path, sizeof path, "%s/%s", tmp, SINGLE_NAME);
        rc = tr_st_save(path, entries, n, opts->dtype, meta, 1, err);
    } else {
        for (int32_t s = 0, first = 0; s < n_shards && !rc; s++) {
            int32_t last = first;
            while (last < n && shard_of[last] == s) last++;
            snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", tmp, s + 1, n_shards);
            rc = tr_st_save(path, entries + first, last - first, opts->dtype, meta, 1, err);
            first = last;
        }
        if (!rc) {
            snprintf(path, sizeof path, "%s/%s", tmp, INDEX_NAME);
            rc = write_index(path, layout, shard_of, n_shards, total, err);
        }
    }
    free(entries);
    free(shard_of);
    return rc;
}

// An existing target may be replaced only when it looks like a checkpoint (or is empty), so
// a mistyped path never swaps away an unrelated directory.
static int check_target(const char *dir, bool *exists, tr_err *err) {
    struct stat st;
    *exists = false;
    if (lstat(dir, &st) != 0) {
        if (errno == ENOENT) return 0;
        return tr_errf(err, TR_EIO, "%s: cannot stat: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return tr_errf(err, TR_EIO, "%s: exists and is not a directory", dir);
    *exists = true;
    char path[4400];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (tr_file_exists(path)) return 0;
    DIR *d = opendir(dir);
    if (!d) return tr_errf(err, TR_EIO, "%s: cannot open: %s", dir, strerror(errno));
    struct dirent *e;
    bool empty = true;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) empty = false;
    closedir(d);
    if (!empty)
        return tr_errf(err, TR_EIO, "%s: exists, is not empty and holds no config.json; refusing "
                       "to replace it with a checkpoint", dir);
    return 0;
}

static int swap_into_place(const char *tmp, const char *dir, bool exists, tr_err *err) {
    if (!exists) {
        if (rename(tmp, dir) != 0)
            return tr_errf(err, TR_EIO, "%s: rename from %s failed: %s", dir, tmp, strerror(errno));
        return 0;
    }
    // Exchange atomically where the filesystem allows, so DIR is always a whole checkpoint;
    // the old one ends up under the temporary name and is removed.
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
        remove_tree(tmp);
        return 0;
    }
    char old[4200];
    snprintf(old, sizeof old, "%s.old.%ld", dir, (long)getpid());
    if (rename(dir, old) != 0)
        return tr_errf(err, TR_EIO, "%s: cannot move the old checkpoint aside: %s", dir,
                       strerror(errno));
    if (rename(tmp, dir) != 0) {
        int e = errno;
        rename(old, dir);
        return tr_errf(err, TR_EIO, "%s: rename from %s failed: %s", dir, tmp, strerror(e));
    }
    remove_tree(old);
    return 0;
}

int tr_checkpoint_save(const char *dir_in, const tr_model_config *cfg,
                       const tr_param_layout *layout, const float *buf,
                       const tr_ckpt_save_opts *opts, tr_err *err) {
    if (layout->tp.size > 1)
        return tr_errf(err, TR_EINVAL, "%s: a checkpoint is saved from the whole model's layout, "
                       "not tensor-parallel rank %d's", dir_in, layout->tp.rank);
    if (opts->dtype != TR_ST_F32 && opts->dtype != TR_ST_BF16)
        return tr_errf(err, TR_EUNSUPPORTED, "%s: checkpoints are written in F32 or BF16, not %s",
                       dir_in, tr_st_dtype_name(opts->dtype));
    char dir[4096], tmp[4200], path[4400], src[4400];
    size_t n = strlen(dir_in);
    while (n > 1 && dir_in[n - 1] == '/') n--;
    if (n == 0 || n >= sizeof dir) return tr_errf(err, TR_EINVAL, "bad checkpoint path '%s'", dir_in);
    memcpy(dir, dir_in, n);
    dir[n] = '\0';
    bool exists;
    if (check_target(dir, &exists, err)) return -1;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    remove_tree(tmp);  // a leftover of an earlier crash with the same pid
    if (tr_mkdirs(tmp, err)) return tr_err_wrap(err, "saving checkpoint %s", dir);

    tr_model_config c = *cfg;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "%s",
             opts->dtype == TR_ST_BF16 ? "bfloat16" : "float32");
    snprintf(path, sizeof path, "%s/config.json", tmp);
    int rc = tr_config_save(path, &c, err);
    if (!rc) rc = write_weights(tmp, layout, buf, opts, err);
    for (int32_t i = 0; !rc && opts->tokenizer_dir && tr_ckpt_tokenizer_files[i]; i++) {
        snprintf(src, sizeof src, "%s/%s", opts->tokenizer_dir, tr_ckpt_tokenizer_files[i]);
        if (!tr_file_exists(src)) continue;
        snprintf(path, sizeof path, "%s/%s", tmp, tr_ckpt_tokenizer_files[i]);
        rc = copy_file(src, path, err);
    }
    if (!rc) {
        fsync_path(tmp);
        rc = swap_into_place(tmp, dir, exists, err);
    }
    if (rc) {
        remove_tree(tmp);
        return tr_err_wrap(err, "saving checkpoint %s", dir);
    }
    // Make the rename itself durable.
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash == parent)
        parent[1] = '\0';
    else if (slash)
        *slash = '\0';
    else
        snprintf(parent, sizeof parent, ".");
    fsync_path(parent);
    return 0;
}
