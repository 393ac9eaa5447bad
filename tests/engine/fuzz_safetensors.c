// Fuzz target (libFuzzer's LLVMFuzzerTestOneInput) for the parsers that read untrusted
// bytes: safetensors headers, JSON, config.json. Besides "no crash", it checks the promises
// a successful parse makes: every tensor lies inside the input and converts without error.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config.h"
#include "engine/json.h"
#include "engine/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_tensors(const tr_st_file *f, const uint8_t *data, size_t size) {
    for (int32_t i = 0; i < f->n_tensors; i++) {
        const tr_st_tensor *t = &f->tensors[i];
        size_t bytes = (size_t)(t->end - t->begin);
        if (t->data < data + 8 || t->data > data + size || bytes > (size_t)(data + size - t->data))
            abort();  // a validated tensor points outside the input
        if (bytes != t->numel * tr_st_dtype_size(t->dtype)) abort();
        if (tr_st_find(f, t->name) != t) abort();
        tr_err err = {0};
        void *out = malloc(t->numel ? t->numel * 8 : 1);
        if (!out) continue;
        int rc_f = tr_st_read_f32(f, t, out, &err);
        int rc_i = tr_st_read_i64(f, t, out, &err);
        if (rc_f == 0 && rc_i == 0 && t->numel) abort();  // one dtype, one reading
        free(out);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tr_err err = {0};
    tr_st_file f;
    if (tr_st_parse(&f, data, size, "fuzz.safetensors", &err) == 0) {
        check_tensors(&f, data, size);
        tr_st_close(&f);
    } else if (err.msg[0] == '\0' || !strstr(err.msg, "fuzz.safetensors")) {
        abort();  // every failure names the file
    }
    tr_json_doc doc;
    if (tr_json_parse(&doc, (const char *)data, size, "fuzz.json", &err) == 0) tr_json_free(&doc);
    tr_model_config cfg;
    if (tr_config_parse((const char *)data, size, "fuzz/config.json", &cfg, &err) == 0) {
        if (cfg.head_dim <= 0 || cfg.n_heads % cfg.n_kv_heads != 0 || cfg.head_dim % 2) abort();
    } else if (!strstr(err.msg, "fuzz/config.json")) {
        abort();
    }
    return 0;
}
