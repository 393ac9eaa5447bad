// HF checkpoint directories: the fixture checkpoints saved by transformers (single F32 file,
// BF16 shards with index and tied embeddings, a score head) load to the values torch reads
// from them; save -> load round trips are bit-exact in F32 and correctly rounded in BF16;
// broken directories fail naming the file and tensor; a failed save leaves nothing behind.
#include <dirent.h>
#include <sys/stat.h>

#include "engine/checkpoint.h"
#include "engine/file.h"
#include "engine/json.h"
#include "tests/test.h"

static char tmpdir[256];
static char fixdir[1024];  // tests/fixtures/io in the source tree

static tr_json_doc load_json(const char *path) {
    tr_json_doc doc = {0};
    char *text;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(path, &text, &len, &err) || tr_json_parse(&doc, text, len, path, &err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err.msg);
        exit(1);
    }
    free(text);
    return doc;
}

static uint32_t bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

typedef struct model {
    tr_model_config cfg;
    tr_param_layout layout;
    float *buf;
} model;

static int model_load(model *m, const char *dir, tr_err *err) {
    memset(m, 0, sizeof *m);
    if (tr_checkpoint_load_config(dir, &m->cfg, err)) return -1;
    if (tr_param_layout_init(&m->layout, &m->cfg, err)) return -1;
    m->buf = malloc(m->layout.total * sizeof *m->buf);
    for (size_t i = 0; i < m->layout.total; i++) m->buf[i] = NAN;  // padding must get zeroed
    return tr_checkpoint_load(dir, &m->cfg, &m->layout, m->buf, err);
}

static void model_free(model *m) {
    tr_param_layout_free(&m->layout);
    free(m->buf);
}

static void check_against_torch(const char *name) {
    char dir[4096], exp_path[4096];
    snprintf(exp_path, sizeof exp_path, "%s/%s.expected.json", fixdir, name);
    snprintf(dir, sizeof dir, "%s/%s", fixdir, name);
    tr_json_doc exp = load_json(exp_path);
    model m;
    tr_err err = {0};
    CHECKF(model_load(&m, dir, &err) == 0, "%s: %s", name, err.msg);
    const tr_json *tensors = tr_json_get(exp.root, "tensors");
    for (int32_t i = 0; i < m.layout.n_tensors; i++) {
        const tr_tensor_desc *d = &m.layout.tensors[i];
        const tr_json *t = tr_json_get(tensors, d->name);
        if (!t) {
            CHECKF(0, "%s: %s missing from the expectations", name, d->name);
            continue;
        }
        const float *x = m.buf + d->offset;
        double sum = 0, sumsq = 0;
        for (size_t k = 0; k < d->numel; k++) {
            sum += x[k];
            sumsq += (double)x[k] * x[k];
        }
        // float64 sums of the same fp32 values; only the summation order differs.
        double want_sq = tr_json_get(t, "sumsq")->num;
        CHECKF(fabs(sum - tr_json_get(t, "sum")->num) <= 1e-12 * (want_sq + 1) * (double)d->numel,
               "%s: %s sum %.17g vs %.17g", name, d->name, sum, tr_json_get(t, "sum")->num);
        CHECKF(fabs(sumsq - want_sq) <= 1e-12 * want_sq * (double)d->numel, "%s: %s sumsq", name,
               d->name);
        int32_t k = 0;
        for (const tr_json *b = tr_json_get(t, "head_bits")->child; b; b = b->next, k++)
            CHECKF(bits(x[k]) == (uint32_t)b->inum, "%s: %s[%d] bits %08x vs %08x", name, d->name, k,
                   bits(x[k]), (uint32_t)b->inum);
        size_t next = i + 1 < m.layout.n_tensors ? m.layout.tensors[i + 1].offset : m.layout.total;
        for (size_t p = d->offset + d->numel; p < next; p++) CHECK(bits(m.buf[p]) == 0);
    }
    // Validation without a buffer.
    CHECKF(tr_checkpoint_load(dir, &m.cfg, &m.layout, NULL, &err) == 0, "%s", err.msg);
    model_free(&m);
    tr_json_free(&exp);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    if (d) closedir(d);
    return n;
}

static void write_text(const char *path, const char *text) {
    tr_err err = {0};
    if (tr_file_write_atomic(path, text, strlen(text), &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
}

static int files_equal(const char *a, const char *b) {
    char *x, *y;
    size_t nx, ny;
    tr_err err = {0};
    if (tr_file_read(a, &x, &nx, &err) || tr_file_read(b, &y, &ny, &err)) return 0;
    int same = nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return same;
}

static void test_round_trip(void) {
    const char *names[] = {"tiny-llama", "tiny-qwen2-sharded", "tiny-mistral-rm"};
    char src[4096], out[4096], tok[4096], path[8400], path2[8400], badtok[4096];
    tr_err err = {0};
    snprintf(tok, sizeof tok, "%s/tok", tmpdir);
    CHECK(tr_mkdirs(tok, &err) == 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", tok);
    write_text(path, "{\"model\": {\"type\": \"BPE\"}}\n");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tok);
    write_text(path, "{\"eos_token\": \"<|im_end|>\"}\n");
    for (int n = 0; n < 3; n++) {
        snprintf(src, sizeof src, "%s/%s", fixdir, names[n]);
        model m;
        CHECKF(model_load(&m, src, &err) == 0, "%s", err.msg);
        for (int bf = 0; bf < 2; bf++) {
            snprintf(out, sizeof out, "%s/out-%s-%d", tmpdir, names[n], bf);
            // BF16 saves are sharded at 2 KB so every model gets several shards.
            tr_ckpt_save_opts o = {.dtype = bf ? TR_ST_BF16 : TR_ST_F32,
                                   .max_shard_bytes = bf ? 2048 : 0, .tokenizer_dir = tok};
            CHECKF(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &o, &err) == 0, "%s", err.msg);
            snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
            CHECK(tr_file_exists(path) == bf);
            CHECK(count_entries(out, "model-") == (bf ? count_entries(out, "model-0") : 0));
            if (bf) CHECK(count_entries(out, "model-") > 1);
            snprintf(path, sizeof path, "%s/tokenizer.json", out);
            snprintf(path2, sizeof path2, "%s/tokenizer.json", tok);
            CHECK(files_equal(path, path2));
            snprintf(path, sizeof path, "%s/tokenizer_config.json", out);
            snprintf(path2, sizeof path2, "%s/tokenizer_config.json", tok);
            CHECK(files_equal(path, path2));
            snprintf(path, sizeof path, "%s/special_tokens_map.json", out);
            CHECK(!tr_file_exists(path));  // absent in the source, so not invented
            model r;
            CHECKF(model_load(&r, out, &err) == 0, "%s: %s", out, err.msg);
            CHECK(r.layout.total == m.layout.total);
            CHECK(strcmp(r.cfg.torch_dtype, bf ? "bfloat16" : "float32") == 0);
            size_t diff = 0;
            for (size_t i = 0; i < m.layout.total && r.layout.total == m.layout.total; i++) {
                float want = bf ? tr_bf16_to_f32(tr_f32_to_bf16(m.buf[i])) : m.buf[i];
                diff += bits(r.buf[i]) != bits(want);
            }
            CHECKF(diff == 0, "%s (%s): %zu values differ after the round trip", names[n],
                   bf ? "bf16" : "f32", diff);
            model_free(&r);
        }
        model_free(&m);
    }
    // The index lists every tensor and its total_size is the sum of tensor bytes (HF's rule).
    snprintf(path, sizeof path, "%s/out-tiny-llama-1/model.safetensors.index.json", tmpdir);
    tr_json_doc idx = load_json(path);
    model m;
    snprintf(src, sizeof src, "%s/tiny-llama", fixdir);
    CHECK(model_load(&m, src, &err) == 0);
    size_t numel = 0;
    for (int32_t i = 0; i < m.layout.n_tensors; i++) numel += m.layout.tensors[i].numel;
    CHECK(tr_json_get(tr_json_get(idx.root, "metadata"), "total_size")->inum == (int64_t)numel * 2);
    CHECK(tr_json_get(idx.root, "weight_map")->count == m.layout.n_tensors);
    tr_json_free(&idx);

    // Saving over an existing checkpoint replaces it whole and leaves no temporaries.
    snprintf(out, sizeof out, "%s/out-tiny-llama-1", tmpdir);
    tr_ckpt_save_opts o = {.dtype = TR_ST_F32};
    CHECKF(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &o, &err) == 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    CHECK(!tr_file_exists(path) && count_entries(out, "model-") == 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", out);
    CHECK(!tr_file_exists(path));
    CHECK(count_entries(tmpdir, "out-tiny-llama-1.") == 0);
    model r;
    CHECK(model_load(&r, out, &err) == 0 && memcmp(r.buf, m.buf, m.layout.total * 4) == 0);
    model_free(&r);

    // Refuses to replace a directory that is not a checkpoint.
    snprintf(out, sizeof out, "%s/precious", tmpdir);
    CHECK(tr_mkdirs(out, &err) == 0);
    snprintf(path, sizeof path, "%s/notes.txt", out);
    write_text(path, "keep me");
    CHECK(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &o, &err) == -1);
    CHECK(strstr(err.msg, "precious") && tr_file_exists(path));
    CHECK(count_entries(tmpdir, "precious.") == 0);

    // A save that fails late (a tokenizer file cannot be read) leaves the old checkpoint
    // as it was and no temporary directory.
    snprintf(out, sizeof out, "%s/out-tiny-llama-0", tmpdir);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    char *before;
    size_t before_len;
    CHECK(tr_file_read(path, &before, &before_len, &err) == 0);
    snprintf(badtok, sizeof badtok, "%s/badtok", tmpdir);
    snprintf(path2, sizeof path2, "%s/badtok/tokenizer.json", tmpdir);
    CHECK(tr_mkdirs(path2, &err) == 0);  // a directory where a file should be
    tr_ckpt_save_opts ob = {.dtype = TR_ST_BF16, .tokenizer_dir = badtok};
    CHECK(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &ob, &err) == -1);
    CHECKF(strstr(err.msg, "tokenizer.json") != NULL, "%s", err.msg);
    char *after;
    size_t after_len;
    CHECK(tr_file_read(path, &after, &after_len, &err) == 0);
    CHECK(after_len == before_len && memcmp(before, after, after_len) == 0);
    free(before);
    free(after);
    CHECK(count_entries(tmpdir, "out-tiny-llama-0.") == 0);
    snprintf(out, sizeof out, "%s/fresh", tmpdir);
    CHECK(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &ob, &err) == -1);
    CHECK(!tr_file_exists(out) && count_entries(tmpdir, "fresh") == 0);
    snprintf(out, sizeof out, "%s/no/such/parent/ckpt", tmpdir);
    o.dtype = TR_ST_F32;
    CHECK(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &o, &err) == 0);  // parents made
    o.dtype = TR_ST_F16;
    CHECK(tr_checkpoint_save(out, &m.cfg, &m.layout, m.buf, &o, &err) == -1);
    model_free(&m);
}

// Builds DIR with config.json and one model.safetensors holding the layout's tensors, with
// `drop` left out, `reshape` given a wrong shape and `extra` (if any) added.
static void make_ckpt(const char *dir, const model *m, const char *drop, const char *reshape,
                      const tr_st_entry *extra) {
    tr_err err = {0};
    char path[8400];
    if (tr_mkdirs(dir, &err)) exit(1);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (tr_config_save(path, &m->cfg, &err)) exit(1);
    tr_st_entry *e = calloc((size_t)m->layout.n_tensors + 1, sizeof *e);
    int32_t n = 0;
    for (int32_t i = 0; i < m->layout.n_tensors; i++) {
        const tr_tensor_desc *d = &m->layout.tensors[i];
        if (drop && strcmp(drop, d->name) == 0) continue;
        e[n].name = d->name;
        e[n].ndim = d->ndim;
        e[n].shape[0] = d->shape[0];
        e[n].shape[1] = d->shape[1];
        if (reshape && strcmp(reshape, d->name) == 0) {  // transposed: same size, wrong shape
            e[n].shape[0] = d->shape[1];
            e[n].shape[1] = d->shape[0];
        }
        e[n].data = m->buf + d->offset;
        n++;
    }
    if (extra) e[n++] = *extra;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (tr_st_save(path, e, n, TR_ST_F32, NULL, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    free(e);
}

static void expect_fail(const model *m, const char *dir, const char *n1, const char *n2) {
    tr_err err = {0};
    float *buf = malloc(m->layout.total * sizeof *buf);
    int rc = tr_checkpoint_load(dir, &m->cfg, &m->layout, buf, &err);
    CHECKF(rc == -1, "%s loaded", dir);
    if (rc) {
        CHECKF(strstr(err.msg, n1) != NULL, "'%s' not in: %s", n1, err.msg);
        CHECKF(!n2 || strstr(err.msg, n2) != NULL, "'%s' not in: %s", n2, err.msg);
    }
    free(buf);
}

static void test_broken(void) {
    model m;
    tr_err err = {0};
    char src[4096], dir[4096], path[8400];
    snprintf(src, sizeof src, "%s/tiny-llama", fixdir);
    CHECK(model_load(&m, src, &err) == 0);

    snprintf(dir, sizeof dir, "%s/b-missing", tmpdir);
    make_ckpt(dir, &m, "model.layers.1.mlp.up_proj.weight", NULL, NULL);
    expect_fail(&m, dir, "b-missing/model.safetensors", "'model.layers.1.mlp.up_proj.weight' is missing");

    snprintf(dir, sizeof dir, "%s/b-shape", tmpdir);
    make_ckpt(dir, &m, NULL, "model.layers.0.self_attn.k_proj.weight", NULL);
    expect_fail(&m, dir, "b-shape/model.safetensors", "'model.layers.0.self_attn.k_proj.weight' has shape [16, 8]");

    float junk[4] = {1, 2, 3, 4};
    tr_st_entry extra = {.name = "model.layers.0.mlp.extra.weight", .ndim = 1, .shape = {4}, .data = junk};
    snprintf(dir, sizeof dir, "%s/b-extra", tmpdir);
    make_ckpt(dir, &m, NULL, NULL, &extra);
    expect_fail(&m, dir, "b-extra/model.safetensors", "unexpected tensor 'model.layers.0.mlp.extra.weight'");

    extra.name = "model.layers.0.self_attn.rotary_emb.inv_freq";
    snprintf(dir, sizeof dir, "%s/b-rotary", tmpdir);
    make_ckpt(dir, &m, NULL, NULL, &extra);
    float *buf = malloc(m.layout.total * sizeof *buf);
    CHECKF(tr_checkpoint_load(dir, &m.cfg, &m.layout, buf, &err) == 0, "%s", err.msg);

    snprintf(dir, sizeof dir, "%s/b-none", tmpdir);
    CHECK(tr_mkdirs(dir, &err) == 0);
    expect_fail(&m, dir, "b-none", "model.safetensors");
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    write_text(path, "x");
    expect_fail(&m, dir, "b-none", "pytorch_model.bin is not supported");
    CHECK(tr_checkpoint_load_config(dir, &m.cfg, &err) == -1 && strstr(err.msg, "b-none/config.json"));

    // A truncated weights file.
    snprintf(dir, sizeof dir, "%s/b-trunc", tmpdir);
    make_ckpt(dir, &m, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(truncate(path, 4000) == 0);
    expect_fail(&m, dir, "b-trunc/model.safetensors", NULL);

    // Integer weights.
    snprintf(dir, sizeof dir, "%s/b-int", tmpdir);
    make_ckpt(dir, &m, NULL, NULL, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    {
        char *data;
        size_t len;
        CHECK(tr_file_read(path, &data, &len, &err) == 0);
        char *p = strstr(data + 8, "\"model.norm.weight\":{\"dtype\":\"F32\"");
        CHECK(p != NULL);
        if (p) memcpy(strstr(p, "F32"), "I32", 3);
        CHECK(tr_file_write_atomic(path, data, len, &err) == 0);
        free(data);
    }
    expect_fail(&m, dir, "b-int/model.safetensors", "'model.norm.weight' has dtype I32");

    // Tied model: a stored lm_head equal to the embedding is fine, a different one is not.
    model t = m;
    t.cfg.tie_word_embeddings = true;
    CHECK(tr_param_layout_init(&t.layout, &t.cfg, &err) == 0);
    CHECK(t.layout.n_tensors == m.layout.n_tensors - 1);
    const tr_tensor_desc *emb = &m.layout.tensors[0];
    tr_st_entry lm = {.name = "lm_head.weight", .ndim = 2, .shape = {emb->shape[0], emb->shape[1]},
                      .data = m.buf + emb->offset};
    snprintf(dir, sizeof dir, "%s/b-tied-ok", tmpdir);
    make_ckpt(dir, &t, NULL, NULL, &lm);
    CHECKF(tr_checkpoint_load(dir, &t.cfg, &t.layout, buf, &err) == 0, "%s", err.msg);
    lm.data = m.buf + tr_param_layout_find(&m.layout, "lm_head.weight")->offset;
    snprintf(dir, sizeof dir, "%s/b-tied-diff", tmpdir);
    make_ckpt(dir, &t, NULL, NULL, &lm);
    expect_fail(&t, dir, "b-tied-diff/model.safetensors", "'lm_head.weight'");
    tr_param_layout_free(&t.layout);

    // Backbone only: an LM checkpoint into a value-head model leaves the head untouched.
    model v = m;
    v.cfg.head = TR_HEAD_VALUE;
    v.cfg.num_labels = 1;
    CHECK(tr_param_layout_init(&v.layout, &v.cfg, &err) == 0);
    float *vb = malloc(v.layout.total * sizeof *vb);
    const tr_tensor_desc *sb = tr_param_layout_find(&v.layout, "score.bias");
    vb[sb->offset] = 42.0f;
    CHECK(tr_checkpoint_load(src, &v.cfg, &v.layout, vb, &err) == -1);  // strict: heads differ
    CHECK(strstr(err.msg, "score.weight") || strstr(err.msg, "lm_head.weight"));
    vb[sb->offset] = 42.0f;
    CHECKF(tr_checkpoint_load_backbone(src, &v.cfg, &v.layout, vb, &err) == 0, "%s", err.msg);
    CHECK(vb[sb->offset] == 42.0f);
    CHECK(memcmp(vb, m.buf, tr_param_layout_find(&m.layout, "model.norm.weight")->offset * 4) == 0);
    free(vb);
    tr_param_layout_free(&v.layout);
    free(buf);
    model_free(&m);
}

static void test_broken_index(void) {
    model m;
    tr_err err = {0};
    char src[4096], dir[4096], path[8400], cmd[40000];
    snprintf(src, sizeof src, "%s/tiny-qwen2-sharded", fixdir);
    CHECK(model_load(&m, src, &err) == 0);
    const char *cases[][3] = {
        // sed expression on the index, expected message parts
        {"/model.layers.0.input_layernorm.weight/d", "model.safetensors.index.json",
         "'model.layers.0.input_layernorm.weight' is missing from weight_map"},
        {"s|\"model.norm.weight\": \"model-00004-of-00004.safetensors\"|\"model.norm.weight\": \"model-00001-of-00004.safetensors\"|",
         "model-00001-of-00004.safetensors", "'model.norm.weight' is missing"},
        {"s|model-00004-of-00004.safetensors|../model-00004-of-00004.safetensors|",
         "model.safetensors.index.json", "weight_map['"},
        {"s|model-00004-of-00004.safetensors|model-00009-of-00009.safetensors|",
         "model-00009-of-00009.safetensors", "cannot open"},
        {"s|\"weight_map\"|\"weights\"|", "model.safetensors.index.json", "weight_map"},
    };
    for (int c = 0; c < 5; c++) {
        snprintf(dir, sizeof dir, "%s/idx-%d", tmpdir, c);
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s' && sed -i '%s' '%s/model.safetensors.index.json'",
                 dir, src, dir, cases[c][0], dir);
        CHECK(system(cmd) == 0);
        expect_fail(&m, dir, cases[c][1], cases[c][2]);
    }
    // A shard holding a tensor that the index maps to another shard.
    snprintf(dir, sizeof dir, "%s/idx-extra", tmpdir);
    tr_ckpt_save_opts o = {.dtype = TR_ST_F32, .max_shard_bytes = 1024};
    CHECK(tr_checkpoint_save(dir, &m.cfg, &m.layout, m.buf, &o, &err) == 0);
    CHECK(tr_checkpoint_load(dir, &m.cfg, &m.layout, NULL, &err) == 0);
    snprintf(path, sizeof path, "%s/model-00001-of-%05d.safetensors", dir, count_entries(dir, "model-"));
    tr_st_file f;
    CHECK(tr_st_open(&f, path, &err) == 0);
    tr_st_entry e[16];
    float *data[16];
    int32_t n = 0;
    for (int32_t i = 0; i < f.n_tensors && n < 15; i++, n++) {
        const tr_st_tensor *t = &f.tensors[i];
        e[n] = (tr_st_entry){.name = strdup(t->name), .ndim = t->ndim, .shape = {t->shape[0], t->shape[1]}};
        data[n] = malloc(t->numel * sizeof(float));
        CHECK(tr_st_read_f32(&f, t, data[n], &err) == 0);
        e[n].data = data[n];
    }
    tr_st_close(&f);
    const tr_tensor_desc *norm = tr_param_layout_find(&m.layout, "model.norm.weight");
    e[n] = (tr_st_entry){.name = norm->name, .ndim = 1, .shape = {norm->shape[0]}, .data = m.buf + norm->offset};
    CHECK(tr_st_save(path, e, n + 1, TR_ST_F32, NULL, 0, &err) == 0);
    expect_fail(&m, dir, "model-00001-of-", "holds tensor 'model.norm.weight' but");
    for (int32_t i = 0; i < n; i++) {
        free((char *)e[i].name);
        free(data[i]);
    }
    model_free(&m);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", tr_test_tmpdir());
    const char *fx = tr_test_src("tests/fixtures/io");
    if (strlen(fx) >= sizeof fixdir) return 1;
    memcpy(fixdir, fx, strlen(fx) + 1);
    check_against_torch("tiny-llama");
    check_against_torch("tiny-qwen2-sharded");
    check_against_torch("tiny-mistral-rm");
    test_round_trip();
    test_broken();
    test_broken_index();
    int rc = tr_test_summary("test_checkpoint");
    if (rc == 0) {
        char cmd[8400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    }
    return rc;
}
