// config.json parsing against what transformers resolves from the same files (defaults per
// model type, heads, biases, token ids, RoPE parameters and inv_freq, recorded by
// tools/make_io_fixtures.py), the parameter layout against HF tensor lists (every bias set),
// bad configs (each must name the file and key), save -> parse round trips, Qwen3's defaults,
// the architectures and attention windows refused by name, and the released configurations
// (Qwen3, Qwen2.5, Llama 3.x, Mistral) resolved as transformers resolves them.
#include "engine/config.h"
#include "engine/file.h"
#include "engine/json.h"
#include "engine/params.h"
#include "engine/safetensors.h"
#include "tests/test.h"

static tr_json_doc load_json(const char *rel) {
    tr_json_doc doc = {0};
    char *text;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(tr_test_src(rel), &text, &len, &err) ||
        tr_json_parse(&doc, text, len, rel, &err)) {
        fprintf(stderr, "cannot load %s: %s\n", rel, err.msg);
        exit(1);
    }
    free(text);
    return doc;
}

static const char *rope_name(enum tr_rope_type t) {
    return t == TR_ROPE_LLAMA3 ? "llama3" : t == TR_ROPE_LINEAR ? "linear" : "default";
}

static int config_equal(const tr_model_config *a, const tr_model_config *b) {
    int same = a->arch == b->arch && a->head == b->head && strcmp(a->model_type, b->model_type) == 0 &&
               strcmp(a->architecture, b->architecture) == 0 && a->vocab_size == b->vocab_size &&
               a->hidden_size == b->hidden_size && a->intermediate_size == b->intermediate_size &&
               a->n_layers == b->n_layers && a->n_heads == b->n_heads &&
               a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim &&
               a->max_position_embeddings == b->max_position_embeddings &&
               a->rms_norm_eps == b->rms_norm_eps && a->attention_bias == b->attention_bias &&
               a->o_proj_bias == b->o_proj_bias && a->qk_norm == b->qk_norm &&
               a->tie_word_embeddings == b->tie_word_embeddings && a->rope_theta == b->rope_theta &&
               a->rope_type == b->rope_type && a->rope_factor == b->rope_factor &&
               a->rope_low_freq_factor == b->rope_low_freq_factor &&
               a->rope_high_freq_factor == b->rope_high_freq_factor &&
               a->rope_original_max_pos == b->rope_original_max_pos &&
               a->bos_token_id == b->bos_token_id && a->pad_token_id == b->pad_token_id &&
               a->n_eos == b->n_eos && strcmp(a->torch_dtype, b->torch_dtype) == 0;
    if (a->head != TR_HEAD_LM) same = same && a->num_labels == b->num_labels;
    for (int32_t i = 0; same && i < a->n_eos; i++) same = a->eos_token_ids[i] == b->eos_token_ids[i];
    return same;
}

static void expect_int(const tr_json *e, const char *key, int64_t got) {
    int64_t want = tr_json_get(e, key)->inum;
    CHECKF(got == want, "%s: %s = %lld, transformers %lld", e->key, key, (long long)got,
           (long long)want);
}

static void test_against_transformers(void) {
    tr_json_doc exp = load_json("tests/fixtures/io/configs_expected.json");
    char rel[256], tmp[512];
    const char *dir = tr_test_tmpdir();
    int exact = 0, total = 0;
    double worst = 0;
    for (const tr_json *e = exp.root->child; e; e = e->next) {
        snprintf(rel, sizeof rel, "tests/fixtures/io/configs/%s.json", e->key);
        tr_model_config c;
        tr_err err = {0};
        CHECKF(tr_config_load(tr_test_src(rel), &c, &err) == 0, "%s: %s", e->key, err.msg);
        if (err.msg[0]) continue;
        expect_int(e, "n_kv_heads", c.n_kv_heads);
        expect_int(e, "head_dim", c.head_dim);
        expect_int(e, "max_position_embeddings", c.max_position_embeddings);
        expect_int(e, "bos_token_id", c.bos_token_id);
        expect_int(e, "pad_token_id", c.pad_token_id);
        if (c.head != TR_HEAD_LM) expect_int(e, "num_labels", c.num_labels);
        CHECKF(c.attention_bias == tr_json_get(e, "attention_bias")->boolean, "%s: attention_bias",
               e->key);
        CHECKF(c.o_proj_bias == tr_json_get(e, "o_proj_bias")->boolean, "%s: o_proj_bias",
               e->key);
        CHECKF(c.tie_word_embeddings == tr_json_get(e, "tie_word_embeddings")->boolean,
               "%s: tie_word_embeddings", e->key);
        CHECKF(c.rms_norm_eps == (float)tr_json_get(e, "rms_norm_eps")->num, "%s: eps", e->key);
        CHECKF(c.rope_theta == tr_json_get(e, "rope_theta")->num, "%s: rope_theta", e->key);
        CHECKF(strcmp(rope_name(c.rope_type), tr_json_get(e, "rope_type")->str) == 0,
               "%s: rope type %s", e->key, rope_name(c.rope_type));
        const tr_json *eos = tr_json_get(e, "eos_token_ids");
        CHECKF(c.n_eos == eos->count, "%s: %d eos ids", e->key, c.n_eos);
        for (int32_t i = 0; i < c.n_eos && i < eos->count; i++)
            CHECK(c.eos_token_ids[i] == tr_json_at(eos, i)->inum);

        // inv_freq: transformers computes it with fp32 tensor ops; ours repeats them in fp32,
        // so the only differences left come from torch's vectorized pow against libm powf
        // (each within 1 ulp), i.e. a few ulp of fp32 after the llama3 blend.
        const tr_json *inv = tr_json_get(e, "inv_freq"), *inv64 = tr_json_get(e, "inv_freq_f64");
        CHECK(inv->count == c.head_dim / 2);
        double *ours = malloc((size_t)c.head_dim / 2 * sizeof *ours);
        tr_config_rope_inv_freq(&c, ours);
        int32_t i = 0;
        for (const tr_json *v = inv->child; v; v = v->next, i++) {
            double rel_err = fabs(ours[i] - v->num) / v->num;
            CHECKF(rel_err <= 4 * 0x1p-24, "%s: inv_freq[%d] = %.9g, transformers %.9g", e->key, i,
                   ours[i], v->num);
            // And the published formula in float64, to fp32 accuracy of the exponent.
            double ref = tr_json_at(inv64, i)->num;
            CHECKF(fabs(ours[i] - ref) / ref <= 2e-6, "%s: inv_freq[%d] = %.9g, formula %.9g",
                   e->key, i, ours[i], ref);
            exact += ours[i] == v->num;
            total++;
            if (rel_err > worst) worst = rel_err;
        }
        free(ours);

        // Save, parse again: the same config.
        snprintf(tmp, sizeof tmp, "%s/%s.json", dir, e->key);
        CHECKF(tr_config_save(tmp, &c, &err) == 0, "%s", err.msg);
        tr_model_config c2;
        CHECKF(tr_config_load(tmp, &c2, &err) == 0, "%s: reload: %s", e->key, err.msg);
        CHECKF(config_equal(&c, &c2), "%s: config changed in a save/load round trip", e->key);
    }
    printf("inv_freq: %d of %d values bit-identical to transformers, worst relative diff %.3g\n",
           exact, total, worst);
    tr_json_free(&exp);
}

static void test_heads(void) {
    tr_model_config c;
    tr_err err = {0};
    CHECK(tr_config_load(tr_test_src("tests/fixtures/io/configs/llama3_classic.json"), &c, &err) == 0);
    CHECK(c.arch == TR_ARCH_LLAMA && c.head == TR_HEAD_LM && strcmp(c.architecture, "LlamaForCausalLM") == 0);
    CHECK(c.rope_type == TR_ROPE_LLAMA3 && c.rope_factor == 32.0 && c.rope_low_freq_factor == 1.0 &&
          c.rope_high_freq_factor == 4.0 && c.rope_original_max_pos == 8192);
    CHECK(strcmp(c.torch_dtype, "bfloat16") == 0);
    CHECK(c.vocab_size == 128256 && c.hidden_size == 64 && c.n_layers == 1);
    CHECK(tr_config_load(tr_test_src("tests/fixtures/io/configs/qwen2_v5.json"), &c, &err) == 0);
    CHECK(c.arch == TR_ARCH_QWEN2 && c.head == TR_HEAD_SCORE && c.num_labels == 1);
    CHECK(tr_config_load(tr_test_src("tests/fixtures/io/configs/mistral_valuehead.json"), &c, &err) == 0);
    CHECK(c.arch == TR_ARCH_MISTRAL && c.head == TR_HEAD_VALUE && c.num_labels == 1);
    CHECK(tr_config_load(tr_test_src("tests/fixtures/io/configs/llama_minimal.json"), &c, &err) == 0);
    CHECK(c.head == TR_HEAD_LM && strcmp(c.architecture, "LlamaForCausalLM") == 0);
}

static void test_layout(void) {
    // Tensor list of the fixture checkpoints, as transformers saved them.
    const char *models[] = {"tiny-llama", "tiny-qwen2-sharded", "tiny-mistral-rm"};
    for (int m = 0; m < 3; m++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/io/%s/config.json", models[m]);
        tr_model_config c;
        tr_err err = {0};
        CHECK(tr_config_load(tr_test_src(rel), &c, &err) == 0);
        tr_param_layout L;
        CHECK(tr_param_layout_init(&L, &c, &err) == 0);
        snprintf(rel, sizeof rel, "tests/fixtures/io/%s.expected.json", models[m]);
        tr_json_doc exp = load_json(rel);
        const tr_json *tensors = tr_json_get(exp.root, "tensors");
        CHECKF(L.n_tensors == tensors->count, "%s: %d tensors, transformers saved %d", models[m],
               L.n_tensors, tensors->count);
        size_t sum = 0;
        for (int32_t i = 0; i < L.n_tensors; i++) {
            const tr_tensor_desc *d = &L.tensors[i];
            const tr_json *t = tr_json_get(tensors, d->name);
            CHECKF(t != NULL, "%s: %s not in the HF checkpoint", models[m], d->name);
            if (!t) continue;
            const tr_json *shape = tr_json_get(t, "shape");
            CHECK(shape->count == d->ndim);
            for (int32_t k = 0; k < d->ndim; k++) CHECK(tr_json_at(shape, k)->inum == d->shape[k]);
            // A tensor starts 16-element aligned, or right after its fused group's previous
            // member (k and v after q, up after gate).
            bool member = strstr(d->name, "k_proj") || strstr(d->name, "v_proj") ||
                          strstr(d->name, "up_proj");
            CHECK(member ? d->offset == L.tensors[i - 1].offset + L.tensors[i - 1].numel
                         : d->offset % 16 == 0);
            CHECK(i == 0 || d->offset >= L.tensors[i - 1].offset + L.tensors[i - 1].numel);
            CHECK(tr_param_layout_find(&L, d->name) == d);
            sum += d->numel;
        }
        CHECK((int64_t)sum == tr_json_get(exp.root, "n_params")->inum);
        CHECK(L.total % 16 == 0 && L.total >= sum && L.total < sum + 16 * (size_t)L.n_tensors);
        CHECK(tr_param_layout_find(&L, "nope") == NULL);
        // Views point where the layout says.
        float *buf = calloc(L.total, sizeof *buf);
        tr_params p;
        CHECK(tr_params_views(&p, &L, &c, buf, sizeof *buf, &err) == 0);
        CHECK(p.embed == buf + tr_param_layout_find(&L, "model.embed_tokens.weight")->offset);
        CHECK(p.layers[c.n_layers - 1].w_down ==
              buf + L.tensors[L.n_tensors - (c.head == TR_HEAD_LM && c.tie_word_embeddings ? 2 :
                                               c.head == TR_HEAD_VALUE ? 4 : 3)].offset);
        CHECK((p.layers[0].bqkv != NULL) == c.attention_bias);
        if (c.attention_bias)
            CHECK(p.layers[0].bqkv == buf + tr_param_layout_find(&L, "model.layers.0.self_attn.q_proj.bias")->offset);
        if (c.head == TR_HEAD_LM)
            CHECK(c.tie_word_embeddings ? p.lm_head == p.embed : p.lm_head != p.embed);
        else
            CHECK(p.lm_head == NULL && p.score_w != NULL && (p.score_b != NULL) == (c.head == TR_HEAD_VALUE));
        tr_params_free_views(&p);
        free(buf);
        tr_param_layout_free(&L);
        tr_json_free(&exp);
    }
}

// The layout against the tensors transformers saved for the model fixtures, which cover
// every bias set: none (llama3), q/k/v (qwen2) and q/k/v/o (llama_bias, attention_bias), and
// Qwen3's q_norm/k_norm.
static void test_layout_biases(void) {
    const char *models[] = {"llama3", "qwen2", "llama_bias", "score_qwen2", "value_llama3",
                            "qwen3"};
    for (int m = 0; m < 6; m++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/models/%s/config.json", models[m]);
        tr_model_config c;
        tr_err err = {0};
        CHECKF(tr_config_load(tr_test_src(rel), &c, &err) == 0, "%s", err.msg);
        tr_param_layout L;
        CHECKF(tr_param_layout_init(&L, &c, &err) == 0, "%s", err.msg);
        snprintf(rel, sizeof rel, "tests/fixtures/models/%s/model.safetensors", models[m]);
        tr_st_file f;
        CHECKF(tr_st_open(&f, tr_test_src(rel), &err) == 0, "%s", err.msg);
        CHECKF(L.n_tensors == f.n_tensors, "%s: %d tensors, transformers saved %d", models[m],
               L.n_tensors, f.n_tensors);
        for (int32_t i = 0; i < f.n_tensors; i++) {
            const tr_st_tensor *t = &f.tensors[i];
            const tr_tensor_desc *d = tr_param_layout_find(&L, t->name);
            CHECKF(d != NULL, "%s: layout lacks %s", models[m], t->name);
            if (!d) continue;
            CHECK(d->ndim == t->ndim && d->shape[0] == t->shape[0] &&
                  (d->ndim == 1 || d->shape[1] == t->shape[1]));
        }
        int llama_bias = strcmp(models[m], "llama_bias") == 0;
        CHECKF(c.o_proj_bias == llama_bias, "%s: o_proj_bias %d", models[m], c.o_proj_bias);
        CHECK(c.attention_bias == (llama_bias || c.arch == TR_ARCH_QWEN2));
        float *buf = calloc(L.total, sizeof *buf);
        tr_params p;
        CHECK(buf && tr_params_views(&p, &L, &c, buf, sizeof *buf, &err) == 0);
        for (int32_t l = 0; l < c.n_layers; l++) {
            snprintf(rel, sizeof rel, "model.layers.%d.self_attn.o_proj.bias", l);
            const tr_tensor_desc *d = tr_param_layout_find(&L, rel);
            CHECKF(d ? p.layers[l].bo == buf + d->offset && d->numel == (size_t)c.hidden_size
                     : p.layers[l].bo == NULL, "%s: layer %d o_proj bias view", models[m], l);
            snprintf(rel, sizeof rel, "model.layers.%d.self_attn.o_proj.weight", l);
            CHECK(p.layers[l].wo == buf + tr_param_layout_find(&L, rel)->offset);
            // Qwen3's per-head norms: head_dim weights each, views where the layout says.
            snprintf(rel, sizeof rel, "model.layers.%d.self_attn.q_norm.weight", l);
            d = tr_param_layout_find(&L, rel);
            CHECKF(d ? p.layers[l].q_norm == buf + d->offset && d->numel == (size_t)c.head_dim
                     : p.layers[l].q_norm == NULL && !c.qk_norm, "%s: layer %d q_norm", models[m], l);
            snprintf(rel, sizeof rel, "model.layers.%d.self_attn.k_norm.weight", l);
            d = tr_param_layout_find(&L, rel);
            CHECKF(d ? p.layers[l].k_norm == buf + d->offset && d->numel == (size_t)c.head_dim
                     : p.layers[l].k_norm == NULL && !c.qk_norm, "%s: layer %d k_norm", models[m], l);
            CHECK(c.qk_norm == (c.arch == TR_ARCH_QWEN3));
            // The fused groups: q, k, v rows (and biases) and gate, up rows follow each other
            // with no gap, so each group is one matrix; its view is its first member.
            const char *groups[][3] = {{"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                        "self_attn.v_proj.weight"},
                                       {"self_attn.q_proj.bias", "self_attn.k_proj.bias",
                                        "self_attn.v_proj.bias"},
                                       {"mlp.gate_proj.weight", "mlp.up_proj.weight", NULL}};
            void *views[] = {p.layers[l].wqkv, p.layers[l].bqkv, p.layers[l].w_gu};
            for (int gi = 0; gi < 3; gi++) {
                const tr_tensor_desc *prev = NULL;
                for (int j = 0; j < 3 && groups[gi][j]; j++) {
                    snprintf(rel, sizeof rel, "model.layers.%d.%s", l, groups[gi][j]);
                    d = tr_param_layout_find(&L, rel);
                    if (!d) {
                        CHECKF(gi == 1 && !c.attention_bias, "%s: %s missing", models[m], rel);
                        break;
                    }
                    if (!prev) CHECKF(views[gi] == buf + d->offset, "%s: %s view", models[m], rel);
                    else CHECKF(d->offset == prev->offset + prev->numel, "%s: %s not right after "
                                "%s", models[m], rel, prev->name);
                    prev = d;
                }
            }
            snprintf(rel, sizeof rel, "model.layers.%d.post_attention_layernorm.weight", l);
            CHECK(p.layers[l].mlp_norm == buf + tr_param_layout_find(&L, rel)->offset);
        }
        tr_params_free_views(&p);
        free(buf);
        tr_st_close(&f);
        tr_param_layout_free(&L);
    }
}

// config.json has one bias switch per architecture, so a config whose q/k/v and o_proj
// biases transformers could not build is refused on save rather than written as another model.
static void test_bias_save(void) {
    const char *dir = tr_test_tmpdir();
    char path[512];
    snprintf(path, sizeof path, "%s/bias.json", dir);
    tr_model_config c, c2;
    tr_err err = {0};
    CHECK(tr_config_load(tr_test_src("tests/fixtures/models/llama_bias/config.json"), &c, &err) == 0);
    CHECK(c.attention_bias && c.o_proj_bias);
    CHECKF(tr_config_save(path, &c, &err) == 0, "%s", err.msg);
    CHECK(tr_config_load(path, &c2, &err) == 0 && config_equal(&c, &c2) && c2.o_proj_bias);
    c.o_proj_bias = false;  // q/k/v only is Qwen2's set, not Llama's
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "o_proj"));
    c.attention_bias = false;
    c.o_proj_bias = true;
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "o_proj"));
    CHECK(tr_config_load(tr_test_src("tests/fixtures/models/qwen2/config.json"), &c, &err) == 0);
    CHECK(c.attention_bias && !c.o_proj_bias);
    c.o_proj_bias = true;
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "o_proj"));
    CHECK(tr_config_load(tr_test_src("tests/fixtures/io/configs/mistral_bias_key.json"), &c, &err) == 0);
    CHECK(!c.attention_bias && !c.o_proj_bias);
    c.o_proj_bias = true;
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "mistral"));
    // The file of the last good save is still the llama_bias config.
    CHECK(tr_config_load(path, &c2, &err) == 0 && c2.o_proj_bias && c2.attention_bias);
}

// Each bad config must fail with the file name and every needle in the message.
static void bad(const char *json, const char *needle1, const char *needle2) {
    tr_model_config c;
    tr_err err = {0};
    int rc = tr_config_parse(json, strlen(json), "bad/config.json", &c, &err);
    CHECKF(rc == -1, "accepted: %s", json);
    if (rc) {
        CHECKF(strstr(err.msg, "bad/config.json") != NULL, "no file name: %s", err.msg);
        CHECKF(strstr(err.msg, needle1) != NULL, "'%s' not in: %s", needle1, err.msg);
        CHECKF(!needle2 || strstr(err.msg, needle2) != NULL, "'%s' not in: %s", needle2, err.msg);
    }
}

#define BASE "\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,\"num_hidden_layers\":2,"

static void test_bad_configs(void) {
    const char *ok = "{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4}";
    tr_model_config c;
    tr_err err = {0};
    CHECK(tr_config_parse(ok, strlen(ok), "ok.json", &c, &err) == 0);

    bad("{\"model_type\":\"llama\",\"vocab_size\":64,\"intermediate_size\":48,\"num_hidden_layers\":2,"
        "\"num_attention_heads\":4}", "missing required key 'hidden_size'", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"max_position_embeddings\":64}", "num_attention_heads", NULL);
    bad("{\"vocab_size\":3}", "model_type", NULL);
    bad("{\"model_type\":\"gpt2\"}", "model_type 'gpt2' is not supported", NULL);
    bad("{\"model_type\":7}", "model_type", NULL);
    bad("{\"model_type\":\"llama\",\"vocab_size\":\"64\",\"hidden_size\":32}", "vocab_size", "1:36");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"hidden_size\":0}", "duplicate", NULL);
    bad("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":0,\"intermediate_size\":48,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4}", "hidden_size", "positive");
    bad("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
        "\"num_hidden_layers\":1.5,\"num_attention_heads\":4}", "num_hidden_layers", "integer");
    bad("{\"model_type\":\"llama\",\"vocab_size\":64,\"hidden_size\":30,\"intermediate_size\":48,"
        "\"num_hidden_layers\":2,\"num_attention_heads\":4}", "hidden_size", "head_dim");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":3}",
        "num_key_value_heads", NULL);
    bad("{\"model_type\":\"qwen2\"," BASE "\"num_attention_heads\":4}", "num_key_value_heads",
        "default");  // qwen2's default of 32 kv heads does not divide 4
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"head_dim\":-8}", "head_dim", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"head_dim\":7}", "head_dim", "even");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rms_norm_eps\":-1}", "rms_norm_eps", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"hidden_act\":\"gelu\"}", "hidden_act", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"mlp_bias\":true}", "mlp_bias", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"attention_bias\":1}", "attention_bias", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"tie_word_embeddings\":\"yes\"}",
        "tie_word_embeddings", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"yarn\","
        "\"factor\":4}}", "rope_scaling", "'yarn' is not supported");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_parameters\":{\"rope_type\":"
        "\"dynamic\",\"factor\":4}}", "rope_parameters", "dynamic");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_scaling\":{\"rope_type\":\"llama3\","
        "\"factor\":8,\"high_freq_factor\":4}}", "rope_scaling.low_freq_factor", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_scaling\":{\"type\":\"llama3\","
        "\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":1}}", "high_freq_factor", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_scaling\":{\"type\":\"linear\"}}",
        "rope_scaling.factor", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_scaling\":{\"type\":\"linear\","
        "\"factor\":\"2\"}}", "rope_scaling.factor", "number");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_parameters\":{\"full_attention\":"
        "{\"rope_type\":\"default\"}}}", "full_attention", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"partial_rotary_factor\":0.5}",
        "partial_rotary_factor", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"rope_theta\":0}", "rope_theta", NULL);
    bad("{\"model_type\":\"qwen2\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"use_sliding_window\":true}", "use_sliding_window", "not supported yet");
    bad("{\"model_type\":\"qwen2\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"layer_types\":[\"full_attention\",\"sliding_attention\"]}", "layer_types", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"architectures\":[\"Qwen2ForCausalLM\"]}",
        "Qwen2ForCausalLM", "model_type 'llama'");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"architectures\":[\"LlamaModel\"]}",
        "LlamaModel", "not supported");
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"architectures\":[]}", "architectures", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"architectures\":"
        "[\"LlamaForTokenClassification\"]}", "label", NULL);  // value head, 2 default labels
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"eos_token_id\":[1,\"2\"]}",
        "eos_token_id", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"eos_token_id\":[1,2,3,4,5,6,7,8,9]}",
        "eos_token_id", NULL);
    bad("{\"model_type\":\"llama\"," BASE "\"num_attention_heads\":4,\"bos_token_id\":-3}", "bos_token_id", NULL);
    bad("[1]", "object", NULL);
    bad("{\"model_type\":\"llama\",", "bad/config.json:1:", NULL);
    bad("", "bad/config.json:1:1", NULL);

    CHECK(tr_config_load("/nonexistent/config.json", &c, &err) == -1);
    CHECK(err.code == TR_EIO && strstr(err.msg, "/nonexistent/config.json"));
}

// The released configurations (tests/fixtures/configs) against what transformers built from
// them (expected.json, tools/make_config_fixtures.py): every resolved field and the
// parameter count of the layout.
static void test_released(void) {
    tr_json_doc exp = load_json("tests/fixtures/configs/expected.json");
    int n = 0;
    for (const tr_json *e = exp.root->child; e; e = e->next, n++) {
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/configs/%s/config.json", e->key);
        tr_model_config c;
        tr_param_layout L;
        tr_err err = {0};
        CHECKF(tr_config_load(tr_test_src(rel), &c, &err) == 0, "%s: %s", e->key, err.msg);
        if (err.msg[0]) continue;
        CHECKF(strcmp(c.architecture, tr_json_get(e, "architecture")->str) == 0, "%s: %s",
               e->key, c.architecture);
        expect_int(e, "n_layers", c.n_layers);
        expect_int(e, "n_heads", c.n_heads);
        expect_int(e, "n_kv_heads", c.n_kv_heads);
        expect_int(e, "head_dim", c.head_dim);
        expect_int(e, "max_position_embeddings", c.max_position_embeddings);
        expect_int(e, "bos_token_id", c.bos_token_id);
        CHECKF(c.attention_bias == tr_json_get(e, "attention_bias")->boolean &&
                   c.o_proj_bias == tr_json_get(e, "o_proj_bias")->boolean &&
                   c.qk_norm == tr_json_get(e, "qk_norm")->boolean &&
                   c.tie_word_embeddings == tr_json_get(e, "tie_word_embeddings")->boolean,
               "%s: biases, QK-norm or tying", e->key);
        CHECKF(c.rms_norm_eps == (float)tr_json_get(e, "rms_norm_eps")->num &&
                   c.rope_theta == tr_json_get(e, "rope_theta")->num &&
                   strcmp(rope_name(c.rope_type), tr_json_get(e, "rope_type")->str) == 0 &&
                   c.rope_factor == tr_json_get(e, "rope_factor")->num,
               "%s: eps or RoPE", e->key);
        const tr_json *eos = tr_json_get(e, "eos_token_ids");
        CHECKF(c.n_eos == eos->count && (c.n_eos == 0 || c.eos_token_ids[0] == eos->child->inum),
               "%s: eos", e->key);
        CHECKF(tr_param_layout_init(&L, &c, &err) == 0, "%s: %s", e->key, err.msg);
        size_t sum = 0;
        for (int32_t i = 0; i < L.n_tensors; i++) sum += L.tensors[i].numel;
        expect_int(e, "n_params", (int64_t)sum);
        tr_param_layout_free(&L);
    }
    CHECK(n == 11);
    tr_json_free(&exp);
}

static void parse_ok(const char *json, tr_model_config *c) {
    tr_err err = {0};
    CHECKF(tr_config_parse(json, strlen(json), "ok/config.json", c, &err) == 0, "%s: %s", json,
           err.msg);
}

// Qwen3 with transformers' Qwen3Config defaults, its bias switch and QK-norm through a save;
// MoE architectures and windows shorter than the context refused by name.
static void test_qwen3_and_refusals(void) {
    tr_model_config c, c2;
    tr_err err = {0};
    // Defaults: 32 kv heads, head_dim 128 whatever hidden / heads is, 32768 positions, eps
    // 1e-6, no biases, untied, no bos/eos.
    parse_ok("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":64}", &c);
    CHECK(c.arch == TR_ARCH_QWEN3 && c.qk_norm && c.n_kv_heads == 32 && c.head_dim == 128 &&
          c.max_position_embeddings == 32768 && c.rms_norm_eps == 1e-6f && !c.attention_bias &&
          !c.o_proj_bias && !c.tie_word_embeddings && c.bos_token_id == -1 && c.n_eos == 0 &&
          c.rope_theta == 10000.0 && strcmp(c.architecture, "Qwen3ForCausalLM") == 0);
    // An explicit null means as many kv heads as query heads (the classes' post-init).
    parse_ok("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":4,"
             "\"num_key_value_heads\":null}", &c);
    CHECK(c.n_kv_heads == 4);
    parse_ok("{\"model_type\":\"qwen2\"," BASE "\"num_attention_heads\":4,"
             "\"num_key_value_heads\":null}", &c);
    CHECK(c.n_kv_heads == 4 && c.head_dim == 8);
    // attention_bias covers all four projections, as in Llama; save writes it back.
    parse_ok("{\"model_type\":\"qwen3\",\"architectures\":[\"Qwen3ForTokenClassification\"],"
             "\"num_labels\":1," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
             "\"head_dim\":16,\"attention_bias\":true,\"use_sliding_window\":false,"
             "\"sliding_window\":4096}", &c);
    CHECK(c.head == TR_HEAD_VALUE && c.attention_bias && c.o_proj_bias && c.head_dim == 16);
    char path[512];
    snprintf(path, sizeof path, "%s/qwen3.json", tr_test_tmpdir());
    CHECKF(tr_config_save(path, &c, &err) == 0, "%s", err.msg);
    CHECK(tr_config_load(path, &c2, &err) == 0 && config_equal(&c, &c2) && c2.qk_norm);
    c.o_proj_bias = false;
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "o_proj"));
    c.o_proj_bias = true;
    c.qk_norm = false;
    CHECK(tr_config_save(path, &c, &err) == -1 && strstr(err.msg, "QK-norm"));
    // A window no shorter than the context changes nothing (tiny-mistral-rm: 4096 over 64).
    parse_ok("{\"model_type\":\"mistral\"," BASE "\"num_attention_heads\":8,"
             "\"sliding_window\":4096,\"max_position_embeddings\":4096}", &c);
    parse_ok("{\"model_type\":\"mistral\"," BASE "\"num_attention_heads\":8,"
             "\"sliding_window\":null}", &c);
    CHECK(c.max_position_embeddings == 131072);

    // Mistral-7B-v0.1: a 4096-token window over a 32768-token context.
    bad("{\"model_type\":\"mistral\",\"architectures\":[\"MistralForCausalLM\"]," BASE
        "\"num_attention_heads\":8,\"num_key_value_heads\":8,\"max_position_embeddings\":32768,"
        "\"sliding_window\":4096}", "sliding_window", "32768");
    // Absent, MistralConfig's window is 4096 against 131072 positions.
    bad("{\"model_type\":\"mistral\"," BASE "\"num_attention_heads\":8}", "sliding_window",
        "default");
    bad("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"use_sliding_window\":true,\"sliding_window\":4096}", "use_sliding_window", "qwen3");
    bad("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"layer_types\":[\"full_attention\",\"sliding_attention\"]}", "layer_types", NULL);
    bad("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"architectures\":[\"Qwen2ForCausalLM\"]}", "Qwen2ForCausalLM", "model_type 'qwen3'");
    bad("{\"model_type\":\"qwen3\"," BASE "\"num_attention_heads\":4,\"num_key_value_heads\":2,"
        "\"head_dim\":6,\"attention_bias\":\"no\"}", "attention_bias", NULL);
    // Mixture-of-experts models, by the class their config names (or their model_type's).
    static const char *const moe[][2] = {
        {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"mixtral", "MixtralForCausalLM"},
        {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"deepseek_v2", "DeepseekV2ForCausalLM"},
        {"deepseek_v3", "DeepseekV3ForCausalLM"}};
    char json[512];
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        snprintf(json, sizeof json, "{\"model_type\":\"%s\",\"architectures\":[\"%s\"]," BASE
                 "\"num_attention_heads\":4}", moe[i][0], moe[i][1]);
        bad(json, moe[i][1], "mixture-of-experts");
        snprintf(json, sizeof json, "{\"model_type\":\"%s\"," BASE "\"num_attention_heads\":4}",
                 moe[i][0]);
        bad(json, moe[i][1], "not supported");
    }
}

int main(void) {
    test_against_transformers();
    test_heads();
    test_layout();
    test_layout_biases();
    test_bias_save();
    test_bad_configs();
    test_qwen3_and_refusals();
    test_released();
    return tr_test_summary("test_config");
}
