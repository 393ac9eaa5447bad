// Resharding (engine/reshard.h) in one process: a whole model's tensors are cut into the
// buffers of tp a ranks and of tp b ranks with tr_tensor_slice (the loader's own slicing);
// moving every sender's buffer in buckets of several sizes (1 element, a few, rows cut in two,
// all at once) through tr_reshard_range must give each receiver its buffer bit for bit, every
// byte of padding between tensors untouched. Models with split and replicated key/value
// heads, q/k/v biases (1-D tensors split by rows), an o_proj bias, QK-norm, an untied LM head
// and a vocabulary no tp divides; 4- and 2-byte elements. The fingerprint is the same at every
// tp and differs for another model.
#include <stdint.h>

#include "engine/config.h"
#include "engine/reshard.h"
#include "tests/backend_test.h"
#include "tests/test.h"

static tr_backend be;

static const char *const CONFIGS[] = {
    // q/k/v biases; 2 key/value heads: split at tp 2, replicated at tp 4; tied embeddings
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"vocab_size\": 31,"
    " \"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": true}",
    // QK-norm and one key/value head (replicated at every tp); an untied LM head
    "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", \"vocab_size\": 37,"
    " \"hidden_size\": 24, \"intermediate_size\": 32, \"num_hidden_layers\": 1, \"head_dim\": 8,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"tie_word_embeddings\": false}",
    // every projection biased, o_proj's bias whole on every rank
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"vocab_size\": 29,"
    " \"hidden_size\": 16, \"intermediate_size\": 16, \"num_hidden_layers\": 1,"
    " \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"max_position_embeddings\": 64,"
    " \"rms_norm_eps\": 1e-6, \"attention_bias\": true, \"tie_word_embeddings\": false}",
};

static int layout_at(tr_param_layout *l, const tr_model_config *cfg, int32_t tp, int32_t rank) {
    tr_tp t;
    tr_err err = {0};
    if (tr_tp_init(&t, cfg, tp, rank, &err) || tr_param_layout_init_tp(l, cfg, &t, &err)) {
        fprintf(stderr, "layout tp %d rank %d: %s\n", tp, rank, err.msg);
        return -1;
    }
    return 0;
}

// The buffer of layout l cut from the whole model's tensors (full, laid out as whole); the
// gaps between tensors hold `pad`.
static uint8_t *cut(const tr_param_layout *l, const tr_param_layout *whole, const uint8_t *full, size_t es,
                    uint8_t pad) {
    uint8_t *b = malloc(l->total * es);
    memset(b, pad, l->total * es);
    for (int32_t i = 0; i < l->n_tensors; i++)
        tr_tensor_slice(&l->tensors[i], full + whole->tensors[i].offset * es, es, b + l->tensors[i].offset * es);
    return b;
}

// Every sender's buffer in buckets of `per` elements into every receiver of tp b.
static void check_pair(const tr_model_config *cfg, int32_t a, int32_t b, size_t per, size_t es) {
    tr_param_layout whole, src[4], dst[4];
    if (tr_param_layout_init(&whole, cfg, &(tr_err){0})) return;
    for (int32_t k = 0; k < a; k++)
        if (layout_at(&src[k], cfg, a, k)) return;
    for (int32_t j = 0; j < b; j++)
        if (layout_at(&dst[j], cfg, b, j)) return;
    uint8_t *full = malloc(whole.total * es);
    for (size_t i = 0; i < whole.total * es; i++) full[i] = (uint8_t)(i * 2654435761u >> 13);
    int ok = 1;
    for (int32_t j = 0; j < b; j++) {
        uint8_t *want = cut(&dst[j], &whole, full, es, 0xA5), *got = malloc(dst[j].total * es);
        uint8_t *d = et_dev(&be, NULL, dst[j].total * es + 4);
        uint8_t *pad = malloc(dst[j].total * es);
        memset(pad, 0xA5, dst[j].total * es);
        et_put(&be, d, pad, dst[j].total * es);
        uint8_t *stage = et_dev(&be, NULL, per * es + 4);
        for (int32_t k = 0; k < a; k++) {
            uint8_t *s = cut(&src[k], &whole, full, es, 0x5A);
            for (size_t off = 0; off < src[k].total; off += per) {
                size_t n = src[k].total - off < per ? src[k].total - off : per;
                et_put(&be, stage, s + off * es, n * es);
                tr_reshard_range(&be, &src[k], stage, off, n, &dst[j], d, es);
            }
            free(s);
        }
        et_get(&be, got, d, dst[j].total * es);
        ok &= memcmp(got, want, dst[j].total * es) == 0;
        be.ops->free(&be, stage);
        be.ops->free(&be, d);
        free(want), free(got), free(pad);
    }
    CHECKF(ok, "%s: tp %d -> tp %d in buckets of %zu elements of %zu bytes", cfg->architecture, a, b, per, es);
    free(full);
    tr_param_layout_free(&whole);
    for (int32_t k = 0; k < a; k++) tr_param_layout_free(&src[k]);
    for (int32_t j = 0; j < b; j++) tr_param_layout_free(&dst[j]);
}

static void check_fingerprints(const tr_model_config *cfgs, int n) {
    uint64_t seen[3];
    for (int c = 0; c < n; c++) {
        tr_param_layout l;
        if (layout_at(&l, &cfgs[c], 1, 0)) return;
        seen[c] = tr_reshard_fingerprint(&l);
        tr_param_layout_free(&l);
        for (int32_t tp = 2; tp <= 4; tp *= 2)
            for (int32_t r = 0; r < tp; r++) {
                if (layout_at(&l, &cfgs[c], tp, r)) return;
                CHECKF(tr_reshard_fingerprint(&l) == seen[c], "%s: tp %d rank %d has another fingerprint",
                       cfgs[c].architecture, tp, r);
                tr_param_layout_free(&l);
            }
        for (int p = 0; p < c; p++) CHECKF(seen[p] != seen[c], "models %d and %d share a fingerprint", p, c);
    }
}

int main(void) {
    et_backend(&be, 1);
    tr_model_config cfgs[3];
    for (int c = 0; c < 3; c++) {
        tr_err err = {0};
        if (tr_config_parse(CONFIGS[c], strlen(CONFIGS[c]), "config", &cfgs[c], &err)) {
            fprintf(stderr, "config %d: %s\n", c, err.msg);
            return 1;
        }
    }
    check_fingerprints(cfgs, 3);
    static const int32_t pairs[][2] = {{1, 2}, {2, 1}, {2, 2}, {1, 4}, {4, 1}, {2, 4}, {4, 2}, {4, 4}};
    static const size_t pers[] = {1, 7, 250, 1 << 20};
    for (int c = 0; c < 3; c++)
        for (size_t p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
            for (size_t s = 0; s < sizeof pers / sizeof pers[0]; s++) {
                check_pair(&cfgs[c], pairs[p][0], pairs[p][1], pers[s], 4);
                if (s == 2) check_pair(&cfgs[c], pairs[p][0], pairs[p][1], pers[s], 2);
            }
    tr_backend_free(&be);
    return tr_test_summary("test_reshard");
}
