// `troupe info --model DIR [--tokens N]`: what a Hugging Face checkpoint directory holds
// (architecture, head, sizes, RoPE, token ids), its parameter count, a check of its weight
// files without reading the data, and the memory training it in fp32 on the CPU takes.
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/checkpoint.h"
#include "engine/err.h"
#include "engine/file.h"
#include "engine/model.h"

static const char *CMD = "info";

static const char *arch_name(enum tr_arch a) {
    return a == TR_ARCH_QWEN2 ? "qwen2" : a == TR_ARCH_MISTRAL ? "mistral" : "llama";
}

static const char *head_name(enum tr_head h) {
    return h == TR_HEAD_SCORE ? "score (reward model)" : h == TR_HEAD_VALUE ? "value (critic)" : "lm";
}

static void print_bytes(const char *what, double bytes, const char *note) {
    const char *unit = "KiB";
    double v = bytes / 1024.0;
    if (bytes >= 1024.0 * 1024.0 * 1024.0) {
        unit = "GiB";
        v = bytes / (1024.0 * 1024.0 * 1024.0);
    } else if (bytes >= 1024.0 * 1024.0) {
        unit = "MiB";
        v = bytes / (1024.0 * 1024.0);
    }
    printf("  %-14s %10.1f %s%s%s\n", what, v, unit, note ? "  " : "", note ? note : "");
}

static void print_rope(const tr_model_config *c) {
    printf("rope          theta %.10g", c->rope_theta);
    if (c->rope_type == TR_ROPE_LINEAR) printf(", linear scaling, factor %g", c->rope_factor);
    if (c->rope_type == TR_ROPE_LLAMA3)
        printf(", llama3 scaling: factor %g, low_freq_factor %g, high_freq_factor %g, "
               "original_max_position_embeddings %d",
               c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
               c->rope_original_max_pos);
    printf("\n");
}

static void print_token(const char *name, int32_t id) {
    if (id >= 0)
        printf("%s %d", name, id);
    else
        printf("%s none", name);
}

int tr_cmd_info(int argc, char **argv) {
    const char *model = NULL;
    long tokens = 4096;
    bool help = false;
    tr_arg args[] = {
        {"model", TR_ARG_STR, &model, "DIR", "Hugging Face checkpoint directory (config.json, "
                                             "safetensors)", true, false},
        {"tokens", TR_ARG_INT, &tokens, "N", "tokens per micro-batch for the activation memory "
                                             "estimate (default 4096)", false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse(CMD, argc, argv, args, NULL, 0, NULL, &help);
    if (rc) return rc;
    if (help) {
        tr_args_usage(CMD, "--model DIR [--tokens N]",
                      "Prints a checkpoint's configuration, parameter count and the memory to "
                      "train it in fp32 on the CPU.", args);
        return 0;
    }
    if (tokens < 1 || tokens > INT32_MAX) {
        fprintf(stderr, "troupe %s: --tokens must be between 1 and %d\n", CMD, INT32_MAX);
        return 2;
    }

    tr_err err = {0};
    tr_model_config c;
    tr_param_layout layout;
    if (tr_checkpoint_load_config(model, &c, &err)) return tr_cli_fail(CMD, &err);
    if (tr_param_layout_init(&layout, &c, &err)) return tr_cli_fail(CMD, &err);
    // Check the weight files (headers, names, shapes, dtypes) without reading the data; a
    // directory with only config.json is fine for sizing a model.
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", model);
    bool has_single = tr_file_exists(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", model);
    bool has_index = tr_file_exists(path);
    if ((has_single || has_index) && tr_checkpoint_load(model, &c, &layout, NULL, &err)) {
        tr_param_layout_free(&layout);
        return tr_cli_fail(CMD, &err);
    }

    uint64_t n_params = 0;
    for (int32_t i = 0; i < layout.n_tensors; i++) n_params += layout.tensors[i].numel;

    printf("model         %s\n", model);
    printf("architecture  %s (%s), head: %s\n", c.architecture, arch_name(c.arch), head_name(c.head));
    if (c.head == TR_HEAD_SCORE) printf("labels        %d\n", c.num_labels);
    printf("vocab         %d\n", c.vocab_size);
    printf("hidden        %d\n", c.hidden_size);
    printf("intermediate  %d\n", c.intermediate_size);
    printf("layers        %d\n", c.n_layers);
    printf("heads         %d query, %d key/value, head_dim %d\n", c.n_heads, c.n_kv_heads, c.head_dim);
    printf("qkv bias      %s\n", c.attention_bias ? "yes" : "no");
    printf("o_proj bias   %s\n", c.o_proj_bias ? "yes" : "no");
    printf("tied embed    %s\n", c.head == TR_HEAD_LM ? (c.tie_word_embeddings ? "yes" : "no") : "n/a");
    printf("norm eps      %g\n", (double)c.rms_norm_eps);
    printf("max position  %d\n", c.max_position_embeddings);
    print_rope(&c);
    printf("tokens        ");
    print_token("bos", c.bos_token_id);
    printf(", ");
    print_token("pad", c.pad_token_id);
    printf(", eos");
    if (c.n_eos == 0) printf(" none");
    for (int32_t i = 0; i < c.n_eos; i++) printf("%s%d", i ? ", " : " ", c.eos_token_ids[i]);
    printf("\n");
    printf("dtype         %s\n", c.torch_dtype[0] ? c.torch_dtype : "(not given)");
    printf("weights       %s\n", has_single ? "model.safetensors, checked"
                                 : has_index ? "sharded safetensors with index, checked"
                                             : "none (config only)");
    printf("parameters    %" PRIu64 " (%d tensors)\n", n_params, layout.n_tensors);

    // Training in fp32 on the CPU holds four buffers laid out like the parameters (weights,
    // gradients, Adam's first and second moments: 4 x 4 bytes per parameter, alignment
    // padding included) plus the activation arena of one micro-batch of N tokens, which is
    // what the engine allocates (tr_model_arena_floats): per layer and token the saved
    // inputs of backward (residual, 2 norm outputs + rstd, q, k, v, attention output and
    // log-sum-exp, the residual after attention, gate, up, silu(gate)*up), then the final
    // norm, one chunk of LM logits, and backward's scratch reused by every layer.
    tr_model_opts mo = {.max_tokens = (int32_t)tokens, .training = true};
    double pbytes = (double)layout.total * sizeof(float);
    double abytes = (double)tr_model_arena_floats(&c, &mo) * sizeof(float);
    printf("memory to train in fp32 on the CPU, %ld tokens per micro-batch:\n", tokens);
    print_bytes("parameters", pbytes, NULL);
    print_bytes("gradients", pbytes, NULL);
    print_bytes("adam moments", 2 * pbytes, "(first and second)");
    print_bytes("activations", abytes, NULL);
    print_bytes("total", 4 * pbytes + abytes, NULL);
    tr_param_layout_free(&layout);
    return 0;
}
