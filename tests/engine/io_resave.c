// Helper of test_hf_roundtrip.sh: loads the HF checkpoint SRC through troupe and saves it to
// OUT (F32 or BF16, optionally sharded), optionally as a value head on the same trunk, so
// transformers can check what troupe writes.
// usage: io_resave SRC OUT f32|bf16 MAX_SHARD_BYTES [value]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: io_resave SRC OUT f32|bf16 MAX_SHARD_BYTES [value]\n");
        return 2;
    }
    tr_model_config c;
    tr_param_layout L;
    tr_err err = {0};
    bool value = argc > 5 && strcmp(argv[5], "value") == 0;
    if (tr_checkpoint_load_config(argv[1], &c, &err)) goto fail;
    if (value) {
        c.head = TR_HEAD_VALUE;
        c.num_labels = 1;
    }
    if (tr_param_layout_init(&L, &c, &err)) goto fail;
    float *buf = calloc(L.total, sizeof *buf);
    if (!buf) return 1;
    if (value) {
        if (tr_checkpoint_load_backbone(argv[1], &c, &L, buf, &err)) goto fail;
        const tr_tensor_desc *w = tr_param_layout_find(&L, "score.weight");
        const tr_tensor_desc *b = tr_param_layout_find(&L, "score.bias");
        for (size_t i = 0; i < w->numel; i++) buf[w->offset + i] = 0.01f * (float)i - 0.05f;
        buf[b->offset] = 0.5f;
    } else if (tr_checkpoint_load(argv[1], &c, &L, buf, &err)) {
        goto fail;
    }
    tr_ckpt_save_opts o = {.dtype = strcmp(argv[3], "bf16") == 0 ? TR_ST_BF16 : TR_ST_F32,
                           .max_shard_bytes = strtoull(argv[4], NULL, 10)};
    if (tr_checkpoint_save(argv[2], &c, &L, buf, &o, &err)) goto fail;
    free(buf);
    tr_param_layout_free(&L);
    return 0;
fail:
    fprintf(stderr, "io_resave: %s\n", err.msg);
    return 1;
}
