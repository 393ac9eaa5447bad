// Hugging Face config.json for Llama, Qwen2, Qwen3 (dense) and Mistral: parsing with
// transformers' defaults and strict validation (errors name file:line:column and the key),
// the RoPE inverse frequencies as transformers computes them, and writing a config.json
// transformers loads.
#include "engine/config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/file.h"
#include "engine/json.h"

typedef struct ctx {
    const char *name;
    const tr_json *root;
    const char *scope;  // enclosing key for nested dicts ("rope_scaling"), else NULL
    tr_err *err;
} ctx;

// What transformers 5.x uses when a key is absent, per model type.
typedef struct arch_info {
    const char *model_type;
    const char *class_prefix;
    enum tr_arch arch;
    int32_t default_n_kv_heads;   // 0: same as num_attention_heads
    int32_t default_head_dim;     // 0: hidden_size / num_attention_heads
    int32_t default_max_pos;
    int32_t default_bos, default_eos;  // -1: none
} arch_info;

static const arch_info archs[] = {
    {"llama", "Llama", TR_ARCH_LLAMA, 0, 0, 2048, 1, 2},
    {"qwen2", "Qwen2", TR_ARCH_QWEN2, 32, 0, 32768, -1, -1},
    {"qwen3", "Qwen3", TR_ARCH_QWEN3, 32, 128, 32768, -1, -1},
    {"mistral", "Mistral", TR_ARCH_MISTRAL, 8, 0, 4096 * 32, 1, 2},
};
#define N_ARCHS (sizeof archs / sizeof archs[0])

__attribute__((format(printf, 3, 4))) static int fail_v(const ctx *c, const tr_json *v,
                                                        const char *fmt, ...) {
    char msg[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (v) return tr_errf(c->err, TR_EINVAL, "%s:%d:%d: %s", c->name, v->line, v->col, msg);
    return tr_errf(c->err, TR_EINVAL, "%s: %s", c->name, msg);
}

// "rope_scaling.factor" for keys inside a nested dict, so the message names the full path.
static const char *qual(const ctx *c, const char *key, char *buf, size_t n) {
    if (!c->scope) return key;
    snprintf(buf, n, "%s.%s", c->scope, key);
    return buf;
}

// A key counts as absent when it is missing or null (transformers writes null defaults).
static const tr_json *get(const tr_json *obj, const char *key) {
    const tr_json *v = tr_json_get(obj, key);
    return v && v->type != TR_JSON_NULL ? v : NULL;
}

static int get_i32(const ctx *c, const tr_json *obj, const char *key, bool required, int32_t def,
                   int32_t *out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    const tr_json *v = get(obj, key);
    if (!v) {
        if (required) return fail_v(c, c->scope ? obj : NULL, "missing required key '%s'", kn);
        *out = def;
        return 0;
    }
    if (v->type != TR_JSON_NUMBER || !v->is_int)
        return fail_v(c, v, "key '%s' must be an integer, got %s", kn,
                      v->type == TR_JSON_NUMBER ? "a fraction" : tr_json_type_name(v->type));
    if (v->inum < INT32_MIN || v->inum > INT32_MAX)
        return fail_v(c, v, "key '%s' = %lld is out of range", kn, (long long)v->inum);
    *out = (int32_t)v->inum;
    return 0;
}

static int get_pos_i32(const ctx *c, const tr_json *obj, const char *key, bool required,
                       int32_t def, int32_t *out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    if (get_i32(c, obj, key, required, def, out)) return -1;
    if (*out <= 0) return fail_v(c, get(obj, key), "key '%s' must be positive, got %d", kn, *out);
    return 0;
}

static int get_num(const ctx *c, const tr_json *obj, const char *key, bool required, double def,
                   double *out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    const tr_json *v = get(obj, key);
    if (!v) {
        if (required) return fail_v(c, obj, "missing required key '%s'", kn);
        *out = def;
        return 0;
    }
    if (v->type != TR_JSON_NUMBER)
        return fail_v(c, v, "key '%s' must be a number, got %s", kn, tr_json_type_name(v->type));
    *out = v->num;
    return 0;
}

static int get_pos_num(const ctx *c, const tr_json *obj, const char *key, bool required,
                       double def, double *out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    if (get_num(c, obj, key, required, def, out)) return -1;
    if (!(*out > 0) || !isfinite(*out))
        return fail_v(c, get(obj, key), "key '%s' must be positive, got %g", kn, *out);
    return 0;
}

static int get_bool(const ctx *c, const tr_json *obj, const char *key, bool def, bool *out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    const tr_json *v = get(obj, key);
    if (!v) {
        *out = def;
        return 0;
    }
    if (v->type != TR_JSON_BOOL)
        return fail_v(c, v, "key '%s' must be true or false, got %s", kn,
                      tr_json_type_name(v->type));
    *out = v->boolean;
    return 0;
}

// Optional string key; NULL when absent.
static int get_str(const ctx *c, const tr_json *obj, const char *key, const char **out) {
    char kb[128];
    const char *kn = qual(c, key, kb, sizeof kb);
    const tr_json *v = get(obj, key);
    *out = NULL;
    if (!v) return 0;
    if (v->type != TR_JSON_STRING)
        return fail_v(c, v, "key '%s' must be a string, got %s", kn, tr_json_type_name(v->type));
    *out = v->str;
    return 0;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int parse_head(const ctx *c, const arch_info *ai, tr_model_config *cfg) {
    const tr_json *a = get(c->root, "architectures");
    const char *name;
    const tr_json *at = a;
    char def[64];
    if (!a) {
        snprintf(def, sizeof def, "%sForCausalLM", ai->class_prefix);
        name = def;
    } else {
        if (a->type != TR_JSON_ARRAY || a->count < 1 || a->child->type != TR_JSON_STRING)
            return fail_v(c, a, "key 'architectures' must be a non-empty list of class names");
        if (a->count > 1)
            return fail_v(c, a, "key 'architectures' lists %d classes; one is supported", a->count);
        at = a->child;
        name = at->str;
    }
    static const struct {
        const char *suffix;
        enum tr_head head;
    } heads[] = {
        {"ForCausalLM", TR_HEAD_LM},
        {"ForSequenceClassification", TR_HEAD_SCORE},
        {"ForTokenClassification", TR_HEAD_VALUE},
    };
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        if (!ends_with(name, heads[i].suffix)) continue;
        size_t plen = strlen(name) - strlen(heads[i].suffix);
        if (plen != strlen(ai->class_prefix) || strncmp(name, ai->class_prefix, plen) != 0)
            return fail_v(c, at, "architecture '%s' does not match model_type '%s' (expected %s%s)",
                          name, ai->model_type, ai->class_prefix, heads[i].suffix);
        if (strlen(name) >= sizeof cfg->architecture)
            return fail_v(c, at, "architecture name '%s' is too long", name);
        snprintf(cfg->architecture, sizeof cfg->architecture, "%s", name);
        cfg->head = heads[i].head;
        return 0;
    }
    return fail_v(c, at, "architecture '%s' is not supported (%sForCausalLM, "
                  "%sForSequenceClassification or %sForTokenClassification)", name,
                  ai->class_prefix, ai->class_prefix, ai->class_prefix);
}

// Labels of a classification head: id2label's size when given, else num_labels, else 2
// (transformers' default).
static int parse_labels(const ctx *c, tr_model_config *cfg) {
    const tr_json *id2label = get(c->root, "id2label");
    if (id2label) {
        if (id2label->type != TR_JSON_OBJECT || id2label->count < 1)
            return fail_v(c, id2label, "key 'id2label' must be a non-empty object");
        cfg->num_labels = id2label->count;
    } else if (get_pos_i32(c, c->root, "num_labels", false, 2, &cfg->num_labels)) {
        return -1;
    }
    if (cfg->head == TR_HEAD_VALUE && cfg->num_labels != 1)
        return fail_v(c, id2label ? id2label : get(c->root, "num_labels"),
                      "a %s value head needs exactly one label (id2label/num_labels), got %d",
                      cfg->architecture, cfg->num_labels);
    return 0;
}

static int parse_token_id(const ctx *c, const tr_json *v, const char *key, int32_t *out) {
    if (v->type != TR_JSON_NUMBER || !v->is_int || v->inum < 0 || v->inum > INT32_MAX)
        return fail_v(c, v, "key '%s' must hold non-negative integer token ids", key);
    *out = (int32_t)v->inum;
    return 0;
}

static int parse_tokens(const ctx *c, const arch_info *ai, tr_model_config *cfg) {
    const tr_json *bos = tr_json_get(c->root, "bos_token_id");
    const tr_json *pad = tr_json_get(c->root, "pad_token_id");
    const tr_json *eos = tr_json_get(c->root, "eos_token_id");
    cfg->bos_token_id = bos ? -1 : ai->default_bos;
    cfg->pad_token_id = -1;
    cfg->n_eos = 0;
    if (bos && bos->type != TR_JSON_NULL && parse_token_id(c, bos, "bos_token_id", &cfg->bos_token_id))
        return -1;
    if (pad && pad->type != TR_JSON_NULL && parse_token_id(c, pad, "pad_token_id", &cfg->pad_token_id))
        return -1;
    if (!eos) {
        if (ai->default_eos >= 0) cfg->eos_token_ids[cfg->n_eos++] = ai->default_eos;
    } else if (eos->type == TR_JSON_ARRAY) {
        if (eos->count > TR_MAX_EOS)
            return fail_v(c, eos, "key 'eos_token_id' lists %d ids; at most %d are supported",
                          eos->count, TR_MAX_EOS);
        for (const tr_json *e = eos->child; e; e = e->next)
            if (parse_token_id(c, e, "eos_token_id", &cfg->eos_token_ids[cfg->n_eos++])) return -1;
    } else if (eos->type != TR_JSON_NULL) {
        if (parse_token_id(c, eos, "eos_token_id", &cfg->eos_token_ids[cfg->n_eos++])) return -1;
    }
    return 0;
}

// RoPE, following transformers 5.x: a non-null legacy "rope_scaling" wins over
// "rope_parameters"; rope_theta comes from the dict, else the top level, else 10000.
static int parse_rope(const ctx *c, tr_model_config *cfg) {
    const tr_json *rs = get(c->root, "rope_scaling"), *rp = get(c->root, "rope_parameters");
    const tr_json *d = rs ? rs : rp;
    const char *dkey = rs ? "rope_scaling" : "rope_parameters";
    if (d && d->type != TR_JSON_OBJECT)
        return fail_v(c, d, "key '%s' must be an object, got %s", dkey, tr_json_type_name(d->type));
    for (const tr_json *m = d ? d->child : NULL; m; m = m->next)
        if (m->type == TR_JSON_OBJECT)
            return fail_v(c, m, "per-layer-type '%s' (key '%s') is not supported", dkey, m->key);
    ctx sub = *c;
    sub.scope = dkey;
    double top_theta;
    if (get_pos_num(c, c->root, "rope_theta", false, 10000.0, &top_theta)) return -1;
    if (get_pos_num(&sub, d, "rope_theta", false, top_theta, &cfg->rope_theta)) return -1;
    const char *type = NULL;
    if (get_str(&sub, d, "rope_type", &type)) return -1;
    if (!type && get_str(&sub, d, "type", &type)) return -1;
    if (!type) type = "default";
    double prf = 1.0;
    if (get_num(c, c->root, "partial_rotary_factor", false, 1.0, &prf)) return -1;
    if (get_num(&sub, d, "partial_rotary_factor", false, prf, &prf)) return -1;
    if (prf != 1.0)
        return fail_v(c, NULL, "partial_rotary_factor %g is not supported (only 1)", prf);
    cfg->rope_factor = 1.0;
    cfg->rope_low_freq_factor = 0.0;
    cfg->rope_high_freq_factor = 0.0;
    cfg->rope_original_max_pos = 0;
    const tr_json *tv = get(d, "rope_type") ? get(d, "rope_type") : get(d, "type");
    if (strcmp(type, "default") == 0) {
        cfg->rope_type = TR_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        cfg->rope_type = TR_ROPE_LINEAR;
        if (get_pos_num(&sub, d, "factor", true, 0, &cfg->rope_factor)) return -1;
    } else if (strcmp(type, "llama3") == 0) {
        cfg->rope_type = TR_ROPE_LLAMA3;
        if (get_pos_num(&sub, d, "factor", true, 0, &cfg->rope_factor) ||
            get_pos_num(&sub, d, "low_freq_factor", true, 0, &cfg->rope_low_freq_factor) ||
            get_pos_num(&sub, d, "high_freq_factor", true, 0, &cfg->rope_high_freq_factor) ||
            get_pos_i32(&sub, d, "original_max_position_embeddings", false,
                        cfg->max_position_embeddings, &cfg->rope_original_max_pos))
            return -1;
        if (cfg->rope_high_freq_factor <= cfg->rope_low_freq_factor)
            return fail_v(c, d, "%s: high_freq_factor (%g) must be greater than low_freq_factor (%g)",
                          dkey, cfg->rope_high_freq_factor, cfg->rope_low_freq_factor);
    } else {
        return fail_v(c, tv, "%s: rope type '%s' is not supported (default, linear, llama3)", dkey,
                      type);
    }
    return 0;
}

// Architectures troupe does not run, refused by name: their checkpoints would otherwise fail
// later on tensors the dense layout lacks, or, worse, load as some other model.
static const struct {
    const char *model_type, *class_prefix, *why;
} refused_types[] = {
    {"qwen3_moe", "Qwen3Moe", "a mixture-of-experts model"},
    {"qwen2_moe", "Qwen2Moe", "a mixture-of-experts model"},
    {"mixtral", "Mixtral", "a mixture-of-experts model"},
    {"deepseek_v2", "DeepseekV2", "a mixture-of-experts model with latent attention"},
    {"deepseek_v3", "DeepseekV3", "a mixture-of-experts model with latent attention"},
};

static int refuse_unsupported(const ctx *c, const tr_json *mt) {
    const tr_json *a = get(c->root, "architectures");
    const char *arch = a && a->type == TR_JSON_ARRAY && a->child && a->child->type == TR_JSON_STRING
                           ? a->child->str : NULL;
    for (size_t i = 0; i < sizeof refused_types / sizeof refused_types[0]; i++) {
        if (strcmp(mt->str, refused_types[i].model_type) != 0) continue;
        if (arch)
            return fail_v(c, mt, "%s (model_type '%s') is %s, which is not supported (dense "
                          "llama, qwen2, qwen3 and mistral models are)", arch, mt->str,
                          refused_types[i].why);
        return fail_v(c, mt, "%sForCausalLM (model_type '%s') is %s, which is not supported "
                      "(dense llama, qwen2, qwen3 and mistral models are)",
                      refused_types[i].class_prefix, mt->str, refused_types[i].why);
    }
    return fail_v(c, mt, "model_type '%s' is not supported (llama, qwen2, qwen3, mistral)",
                  mt->str);
}

static int parse_model_type(const ctx *c, const arch_info **ai) {
    const tr_json *v = get(c->root, "model_type");
    *ai = NULL;
    if (!v) return fail_v(c, NULL, "missing required key 'model_type'");
    if (v->type != TR_JSON_STRING)
        return fail_v(c, v, "key 'model_type' must be a string, got %s", tr_json_type_name(v->type));
    for (size_t i = 0; i < N_ARCHS; i++)
        if (strcmp(v->str, archs[i].model_type) == 0) *ai = &archs[i];
    return *ai ? 0 : refuse_unsupported(c, v);
}

// Sizes and heads. Sizes have no defaults here even where transformers has one (a config.json
// without hidden_size is broken, not a request for some reference model's width).
static int parse_sizes(const ctx *c, const arch_info *ai, tr_model_config *cfg) {
    const tr_json *root = c->root;
    if (get_pos_i32(c, root, "vocab_size", true, 0, &cfg->vocab_size) ||
        get_pos_i32(c, root, "hidden_size", true, 0, &cfg->hidden_size) ||
        get_pos_i32(c, root, "intermediate_size", true, 0, &cfg->intermediate_size) ||
        get_pos_i32(c, root, "num_hidden_layers", true, 0, &cfg->n_layers) ||
        get_pos_i32(c, root, "num_attention_heads", true, 0, &cfg->n_heads) ||
        get_pos_i32(c, root, "max_position_embeddings", false, ai->default_max_pos,
                    &cfg->max_position_embeddings))
        return -1;
    // Absent: the class default; an explicit null: as many as query heads (what the config
    // classes' post-init does with None).
    const tr_json *kv = tr_json_get(root, "num_key_value_heads");
    bool kv_defaulted = kv == NULL;
    int32_t kv_def = kv || !ai->default_n_kv_heads ? cfg->n_heads : ai->default_n_kv_heads;
    if (get_pos_i32(c, root, "num_key_value_heads", false, kv_def, &cfg->n_kv_heads)) return -1;
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return fail_v(c, get(root, "num_key_value_heads"),
                      "num_attention_heads (%d) is not a multiple of num_key_value_heads (%d%s)",
                      cfg->n_heads, cfg->n_kv_heads,
                      kv_defaulted ? ", the transformers default for this model_type" : "");
    if (get(root, "head_dim")) {
        if (get_pos_i32(c, root, "head_dim", false, 0, &cfg->head_dim)) return -1;
    } else if (ai->default_head_dim) {
        cfg->head_dim = ai->default_head_dim;  // Qwen3Config: 128 whatever hidden / heads is
    } else {
        if (cfg->hidden_size % cfg->n_heads != 0)
            return fail_v(c, get(root, "hidden_size"),
                          "hidden_size (%d) is not divisible by num_attention_heads (%d) and no "
                          "head_dim is given", cfg->hidden_size, cfg->n_heads);
        cfg->head_dim = cfg->hidden_size / cfg->n_heads;
    }
    if (cfg->head_dim % 2 != 0)
        return fail_v(c, get(root, "head_dim"), "head_dim (%d) must be even for rotary embeddings",
                      cfg->head_dim);
    double eps;
    if (get_pos_num(c, root, "rms_norm_eps", false, 1e-6, &eps)) return -1;
    cfg->rms_norm_eps = (float)eps;
    const char *s;
    if (get_str(c, root, "hidden_act", &s)) return -1;
    if (s && strcmp(s, "silu") != 0)
        return fail_v(c, get(root, "hidden_act"), "hidden_act '%s' is not supported (silu)", s);
    return 0;
}

// Qwen2 and Qwen3 switch sliding-window attention on with use_sliding_window (their
// sliding_window key is ignored otherwise) or per layer in layer_types; every layer attending
// to the whole context is all troupe runs.
static int check_full_attention(const ctx *c, const char *model_type) {
    bool flag = false;   // get_bool sets it on success
    if (get_bool(c, c->root, "use_sliding_window", false, &flag)) return -1;
    if (flag)
        return fail_v(c, get(c->root, "use_sliding_window"),
                      "use_sliding_window true is not supported yet (%s sliding-window attention; "
                      "only full attention over the context is)", model_type);
    const tr_json *v = get(c->root, "layer_types");
    if (!v) return 0;
    if (v->type != TR_JSON_ARRAY) return fail_v(c, v, "key 'layer_types' must be a list");
    for (const tr_json *e = v->child; e; e = e->next)
        if (e->type != TR_JSON_STRING || strcmp(e->str, "full_attention") != 0)
            return fail_v(c, e, "layer_types: only full_attention layers are supported yet");
    return 0;
}

// Mistral applies sliding_window whenever it is set, and MistralConfig sets 4096 when the key
// is absent (null turns it off): a window shorter than the context changes which keys a query
// sees, so such a model is refused rather than run as another one.
static int check_mistral_window(const ctx *c, const tr_model_config *cfg) {
    const tr_json *raw = tr_json_get(c->root, "sliding_window");
    if (raw && raw->type == TR_JSON_NULL) return 0;
    int32_t window;
    if (get_pos_i32(c, c->root, "sliding_window", false, 4096, &window)) return -1;
    if (window < cfg->max_position_embeddings)
        return fail_v(c, raw, "sliding_window %d%s is shorter than the context "
                      "(max_position_embeddings %d): sliding-window attention is not supported "
                      "yet", window, raw ? "" : " (the transformers default for mistral)",
                      cfg->max_position_embeddings);
    return 0;
}

// Which projections carry biases, QK-norm, and the attention pattern, per architecture.
static int parse_attention(const ctx *c, const arch_info *ai, tr_model_config *cfg) {
    bool flag = false;   // get_bool sets it on success
    switch (ai->arch) {
    case TR_ARCH_LLAMA:
        if (get_bool(c, c->root, "attention_bias", false, &cfg->attention_bias)) return -1;
        cfg->o_proj_bias = cfg->attention_bias;  // LlamaAttention gives o_proj the same bias flag
        if (get_bool(c, c->root, "mlp_bias", false, &flag)) return -1;
        if (flag) return fail_v(c, get(c->root, "mlp_bias"), "mlp_bias true is not supported");
        return 0;
    case TR_ARCH_QWEN2:
        cfg->attention_bias = true;  // Qwen2 attention always has q/k/v biases
        cfg->o_proj_bias = false;    // and never one on o_proj
        return check_full_attention(c, "qwen2");
    case TR_ARCH_QWEN3:
        // Qwen3Attention: attention_bias (default false) on all four projections, and a
        // per-head RMSNorm on q and k always.
        if (get_bool(c, c->root, "attention_bias", false, &cfg->attention_bias)) return -1;
        cfg->o_proj_bias = cfg->attention_bias;
        cfg->qk_norm = true;
        return check_full_attention(c, "qwen3");
    case TR_ARCH_MISTRAL:
        cfg->attention_bias = false;  // MistralAttention has no bias switch
        cfg->o_proj_bias = false;
        return check_mistral_window(c, cfg);
    }
    return fail_v(c, NULL, "unknown architecture");
}

static int parse_dtype(const ctx *c, tr_model_config *cfg) {
    const char *s;
    if (get_str(c, c->root, "dtype", &s)) return -1;
    if (!s && get_str(c, c->root, "torch_dtype", &s)) return -1;
    if (!s) return 0;
    if (strlen(s) >= sizeof cfg->torch_dtype)
        return fail_v(c, get(c->root, "dtype") ? get(c->root, "dtype") : get(c->root, "torch_dtype"),
                      "dtype '%s' is not a known dtype", s);
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s", s);
    return 0;
}

int tr_config_parse(const char *json, size_t len, const char *name, tr_model_config *cfg,
                    tr_err *err) {
    memset(cfg, 0, sizeof *cfg);
    tr_json_doc doc;
    if (tr_json_parse(&doc, json, len, name, err)) return -1;
    ctx c = {.name = name, .root = doc.root, .err = err};
    int rc = -1;
    const arch_info *ai = NULL;
    if (doc.root->type != TR_JSON_OBJECT) {
        fail_v(&c, doc.root, "expected a JSON object, got %s", tr_json_type_name(doc.root->type));
        goto done;
    }
    if (parse_model_type(&c, &ai)) goto done;
    cfg->arch = ai->arch;
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", ai->model_type);
    if (parse_head(&c, ai, cfg) || parse_sizes(&c, ai, cfg) || parse_attention(&c, ai, cfg))
        goto done;
    if (get_bool(&c, doc.root, "tie_word_embeddings", false, &cfg->tie_word_embeddings)) goto done;
    if (parse_labels(&c, cfg) || parse_rope(&c, cfg) || parse_tokens(&c, ai, cfg) ||
        parse_dtype(&c, cfg))
        goto done;
    rc = 0;
done:
    tr_json_free(&doc);
    return rc;
}

int tr_config_load(const char *path, tr_model_config *cfg, tr_err *err) {
    char *text;
    size_t len;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = tr_config_parse(text, len, path, cfg, err);
    free(text);
    return rc;
}

// transformers computes the frequencies in fp32 tensor ops; each step below is the same fp32
// operation in the same order (x / t is reciprocal(t) * x there, scalars round to fp32), so
// the values agree with transformers' to the accuracy of powf.
void tr_config_rope_inv_freq(const tr_model_config *cfg, double *inv_freq) {
    int32_t dim = cfg->head_dim;
    float base = (float)cfg->rope_theta;
    float factor = (float)cfg->rope_factor;
    for (int32_t i = 0; i < dim / 2; i++) {
        float expo = (float)(2 * i) / (float)dim;
        float inv = 1.0f / powf(base, expo);
        if (cfg->rope_type == TR_ROPE_LINEAR) {
            inv = inv / factor;
        } else if (cfg->rope_type == TR_ROPE_LLAMA3) {
            double old_ctx = (double)cfg->rope_original_max_pos;
            float low_wavelen = (float)(old_ctx / cfg->rope_low_freq_factor);
            float high_wavelen = (float)(old_ctx / cfg->rope_high_freq_factor);
            float wavelen = (1.0f / inv) * (float)(2.0 * M_PI);
            // Long wavelengths (low frequencies) are slowed by factor, short ones kept, and
            // the band between blends the two linearly in old_ctx / wavelen.
            float scaled = wavelen > low_wavelen ? inv / factor : inv;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                float smooth = ((1.0f / wavelen) * (float)old_ctx - (float)cfg->rope_low_freq_factor) /
                               (float)(cfg->rope_high_freq_factor - cfg->rope_low_freq_factor);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            inv = scaled;
        }
        inv_freq[i] = inv;
    }
}

// One key and its value: config.json is mostly these.
static void put_int(tr_json_writer *w, const char *key, int64_t v) {
    tr_json_key(w, key);
    tr_json_int(w, v);
}

static void put_str(tr_json_writer *w, const char *key, const char *v) {
    tr_json_key(w, key);
    tr_json_string(w, v);
}

static void put_double(tr_json_writer *w, const char *key, double v) {
    tr_json_key(w, key);
    tr_json_double(w, v);
}

static void put_bool(tr_json_writer *w, const char *key, bool v) {
    tr_json_key(w, key);
    tr_json_bool(w, v);
}

static void write_rope_fields(tr_json_writer *w, const tr_model_config *cfg) {
    static const char *names[] = {"default", "llama3", "linear"};
    put_str(w, "rope_type", names[cfg->rope_type]);
    put_double(w, "rope_theta", cfg->rope_theta);
    if (cfg->rope_type == TR_ROPE_DEFAULT) return;
    put_double(w, "factor", cfg->rope_factor);
    if (cfg->rope_type != TR_ROPE_LLAMA3) return;
    put_double(w, "low_freq_factor", cfg->rope_low_freq_factor);
    put_double(w, "high_freq_factor", cfg->rope_high_freq_factor);
    put_int(w, "original_max_position_embeddings", cfg->rope_original_max_pos);
}

static void write_token(tr_json_writer *w, const char *key, int32_t id) {
    tr_json_key(w, key);
    if (id >= 0)
        tr_json_int(w, id);
    else
        tr_json_null(w);
}

static const char *arch_prefix(enum tr_arch a) {
    return a == TR_ARCH_QWEN2 ? "Qwen2" : a == TR_ARCH_QWEN3 ? "Qwen3"
           : a == TR_ARCH_MISTRAL ? "Mistral" : "Llama";
}

static const char *arch_model_type(enum tr_arch a) {
    return a == TR_ARCH_QWEN2 ? "qwen2" : a == TR_ARCH_QWEN3 ? "qwen3"
           : a == TR_ARCH_MISTRAL ? "mistral" : "llama";
}

// config.json has one switch per architecture, so only the bias sets (and the QK-norm)
// transformers builds can be written: a config that saved otherwise would load as a
// different model.
static int check_savable(const char *path, const tr_model_config *cfg, tr_err *err) {
    if (cfg->qk_norm != (cfg->arch == TR_ARCH_QWEN3))
        return tr_errf(err, TR_EINVAL, "%s: %s %s QK-norm", path, arch_model_type(cfg->arch),
                       cfg->arch == TR_ARCH_QWEN3 ? "always has" : "has no");
    if (cfg->arch == TR_ARCH_MISTRAL && (cfg->attention_bias || cfg->o_proj_bias))
        return tr_errf(err, TR_EINVAL, "%s: mistral has no attention bias", path);
    if (cfg->arch == TR_ARCH_QWEN2 && (!cfg->attention_bias || cfg->o_proj_bias))
        return tr_errf(err, TR_EINVAL, "%s: qwen2 has q/k/v biases and no o_proj bias", path);
    if ((cfg->arch == TR_ARCH_LLAMA || cfg->arch == TR_ARCH_QWEN3) &&
        cfg->attention_bias != cfg->o_proj_bias)
        return tr_errf(err, TR_EINVAL, "%s: %s's attention_bias covers q/k/v and o_proj "
                       "together (q/k/v bias %s, o_proj bias %s)", path,
                       arch_model_type(cfg->arch), cfg->attention_bias ? "on" : "off",
                       cfg->o_proj_bias ? "on" : "off");
    return 0;
}

// The class transformers instantiates, and the sizes that shape the model.
static void write_shape(tr_json_writer *w, const tr_model_config *cfg) {
    const char *suffix = cfg->head == TR_HEAD_SCORE   ? "ForSequenceClassification"
                         : cfg->head == TR_HEAD_VALUE ? "ForTokenClassification"
                                                      : "ForCausalLM";
    char arch[96];
    snprintf(arch, sizeof arch, "%s%s", arch_prefix(cfg->arch), suffix);
    tr_json_key(w, "architectures");
    tr_json_begin_array(w);
    tr_json_string(w, arch);
    tr_json_end_array(w);
    put_str(w, "model_type", arch_model_type(cfg->arch));
    put_int(w, "vocab_size", cfg->vocab_size);
    put_int(w, "hidden_size", cfg->hidden_size);
    put_int(w, "intermediate_size", cfg->intermediate_size);
    put_int(w, "num_hidden_layers", cfg->n_layers);
    put_int(w, "num_attention_heads", cfg->n_heads);
    put_int(w, "num_key_value_heads", cfg->n_kv_heads);
    put_int(w, "head_dim", cfg->head_dim);
    put_str(w, "hidden_act", "silu");
    put_int(w, "max_position_embeddings", cfg->max_position_embeddings);
    tr_json_key(w, "rms_norm_eps");
    tr_json_float(w, cfg->rms_norm_eps);
}

// The switches each architecture's config class has, set to what troupe's model computes.
static void write_arch_switches(tr_json_writer *w, const tr_model_config *cfg) {
    if (cfg->arch == TR_ARCH_LLAMA || cfg->arch == TR_ARCH_QWEN3)
        put_bool(w, "attention_bias", cfg->attention_bias);
    if (cfg->arch == TR_ARCH_LLAMA) put_bool(w, "mlp_bias", false);
    if (cfg->arch == TR_ARCH_QWEN2 || cfg->arch == TR_ARCH_QWEN3)
        put_bool(w, "use_sliding_window", false);
    if (cfg->arch == TR_ARCH_MISTRAL) {
        // Absent, MistralConfig would give the model a 4096-token window.
        tr_json_key(w, "sliding_window");
        tr_json_null(w);
    }
}

// transformers 5.x reads rope_parameters; rope_theta at the top level keeps older readers
// (transformers 4.x, conversion scripts) on the right base frequency.
static void write_rope(tr_json_writer *w, const tr_model_config *cfg) {
    put_double(w, "rope_theta", cfg->rope_theta);
    tr_json_key(w, "rope_parameters");
    tr_json_begin_object(w);
    write_rope_fields(w, cfg);
    tr_json_end_object(w);
}

// num_labels is derived from id2label by transformers; write both maps.
static void write_labels(tr_json_writer *w, int32_t num_labels) {
    char k[24], l[32];
    tr_json_key(w, "id2label");
    tr_json_begin_object(w);
    for (int32_t i = 0; i < num_labels; i++) {
        snprintf(k, sizeof k, "%d", i);
        snprintf(l, sizeof l, "LABEL_%d", i);
        put_str(w, k, l);
    }
    tr_json_end_object(w);
    tr_json_key(w, "label2id");
    tr_json_begin_object(w);
    for (int32_t i = 0; i < num_labels; i++) {
        snprintf(l, sizeof l, "LABEL_%d", i);
        put_int(w, l, i);
    }
    tr_json_end_object(w);
}

// bos, pad and eos ids: null when absent, eos a list when there are several.
static void write_special_tokens(tr_json_writer *w, const tr_model_config *cfg) {
    write_token(w, "bos_token_id", cfg->bos_token_id);
    write_token(w, "pad_token_id", cfg->pad_token_id);
    tr_json_key(w, "eos_token_id");
    if (cfg->n_eos == 0)
        tr_json_null(w);
    else if (cfg->n_eos == 1)
        tr_json_int(w, cfg->eos_token_ids[0]);
    else {
        tr_json_begin_array(w);
        for (int32_t i = 0; i < cfg->n_eos; i++) tr_json_int(w, cfg->eos_token_ids[i]);
        tr_json_end_array(w);
    }
}

int tr_config_save(const char *path, const tr_model_config *cfg, tr_err *err) {
    if (check_savable(path, cfg, err)) return -1;
    tr_json_writer w;
    tr_json_writer_init(&w, 2);
    tr_json_begin_object(&w);
    write_shape(&w, cfg);
    write_arch_switches(&w, cfg);
    put_bool(&w, "tie_word_embeddings", cfg->tie_word_embeddings);
    write_rope(&w, cfg);
    if (cfg->head != TR_HEAD_LM) write_labels(&w, cfg->num_labels);
    write_special_tokens(&w, cfg);
    if (cfg->torch_dtype[0]) {
        // transformers 5.x reads "dtype"; 4.x and other readers (vLLM) read "torch_dtype".
        put_str(&w, "dtype", cfg->torch_dtype);
        put_str(&w, "torch_dtype", cfg->torch_dtype);
    }
    tr_json_end_object(&w);
    tr_json_raw(&w, "\n", 1);
    const char *text;
    size_t len;
    int rc = tr_json_writer_finish(&w, &text, &len, err);
    if (rc)
        tr_err_wrap(err, "%s", path);
    else
        rc = tr_file_write_atomic(path, text, len, err);
    tr_json_writer_free(&w);
    return rc;
}
