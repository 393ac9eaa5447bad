// `troupe info --model DIR [--tokens N] [--recompute M] [--backend B --device N --precision P] [--tp N
// [--sequence-parallel]]`: what a Hugging Face checkpoint directory holds (architecture, head,
// sizes, RoPE, token ids), its parameter count, a check of its weight files without reading
// the data, and the memory plan of training and generating with it on the chosen backend and
// precision (of the largest tensor-parallel rank's shard with --tp, whose training
// activations are shown with and without sequence parallelism).
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "engine/checkpoint.h"
#include "engine/err.h"
#include "engine/file.h"
#include "engine/model.h"
#include "engine/plan.h"
#include "kernels/backend.h"

static const char *CMD = "info";

static const char *head_name(enum tr_head h) {
    return h == TR_HEAD_SCORE ? "score (reward model)" : h == TR_HEAD_VALUE ? "value (critic)" : "lm";
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

// The command line, checked.
typedef struct info_opts {
    const char *model, *backend, *precision, *recompute;
    long tokens, device, kv_tokens, tp;
    double memory_gb;
    bool sp;
    int rec;   // --recompute, parsed
} info_opts;

// Parses and checks the options: 0 to run, else the exit status (2: a usage error; --help
// printed: *help set and 0 returned).
static int parse_opts(int argc, char **argv, info_opts *o, bool *help) {
    *o = (info_opts){.backend = getenv("TROUPE_BACKEND") ? getenv("TROUPE_BACKEND") : "cpu",
                     .precision = getenv("TROUPE_PRECISION"), .recompute = "auto", .tp = 1};
    *help = false;
    tr_arg args[] = {
        {"model", TR_ARG_STR, &o->model, "DIR", "Hugging Face checkpoint directory (config.json, "
                                                "safetensors)", true, false},
        {"tokens", TR_ARG_INT, &o->tokens, "N", "tokens per micro-batch for the activation memory "
                                                "estimate (default 0: the plan's choice, as a run's "
                                                "train.micro_batch_tokens 0)", false, false},
        {"recompute", TR_ARG_STR, &o->recompute, "MODE", "activation recompute: auto (only where the "
                                                         "micro-batch does not fit otherwise), off, on", false, false},
        {"backend", TR_ARG_STR, &o->backend, "NAME", "plan for cpu or cuda (default: $TROUPE_BACKEND, else cpu)",
         false, false},
        {"device", TR_ARG_INT, &o->device, "N", "CUDA device whose free memory bounds the plan "
                                                "(default 0)", false, false},
        {"precision", TR_ARG_STR, &o->precision, "P", TR_CLI_PRECISION_HELP, false, false},
        {"kv-tokens", TR_ARG_INT, &o->kv_tokens, "N", "KV cache tokens to plan for (default: "
                                                      "what the memory left holds)", false, false},
        {"memory-gb", TR_ARG_FLOAT, &o->memory_gb, "G", "plan with this budget instead of the "
                                                        "device's free memory", false, false},
        {"tp", TR_ARG_INT, &o->tp, "N", "plan one rank of a model split over N tensor-parallel "
                                        "ranks (default 1)", false, false},
        {"sequence-parallel", TR_ARG_FLAG, &o->sp, NULL, "with --tp: plan with sequence "
         "parallelism (norms and the residual stream split along the sequence)", false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse(CMD, argc, argv, args, NULL, 0, NULL, help);
    if (rc) return rc;
    if (*help) {
        tr_args_usage(CMD, "--model DIR [--tokens N] [--recompute auto|off|on] [--backend cpu|cuda] [--device N] "
                      "[--precision fp32|bf16] [--kv-tokens N] [--memory-gb G] [--tp N [--sequence-parallel]]",
                      "Prints a checkpoint's configuration, parameter count and the memory plan "
                      "of training it (weights, gradients, Adam moments, activations) and "
                      "generating with it (the KV cache the memory left holds).", args);
        return 0;
    }
    if (o->tokens < 0 || o->tokens > INT32_MAX) {
        fprintf(stderr, "troupe %s: --tokens must be between 0 and %d\n", CMD, INT32_MAX);
        return 2;
    }
    o->rec = tr_recompute_parse(o->recompute);
    if (o->rec < 0) {
        fprintf(stderr, "troupe %s: --recompute must be auto, off or on, got '%s'\n", CMD, o->recompute);
        return 2;
    }
    if (o->kv_tokens < 0 || !(o->memory_gb >= 0) || o->tp < 1 || o->tp > 1024) {
        fprintf(stderr, "troupe %s: --kv-tokens and --memory-gb must be >= 0, --tp in 1..1024\n", CMD);
        return 2;
    }
    if (o->sp && o->tp < 2) {
        fprintf(stderr, "troupe %s: --sequence-parallel needs --tp 2 or more\n", CMD);
        return 2;
    }
    return tr_cli_backend_check(CMD, o->backend, o->device, o->precision);
}

// The configuration and the parameter count; weights: what the directory's weight files are.
static void print_config(const char *model, const tr_model_config *c, const tr_param_layout *layout,
                         const char *weights) {
    uint64_t n_params = 0;
    for (int32_t i = 0; i < layout->n_tensors; i++) n_params += layout->tensors[i].numel;

    printf("model         %s\n", model);
    printf("architecture  %s (%s), head: %s\n", c->architecture, c->model_type, head_name(c->head));
    if (c->head == TR_HEAD_SCORE) printf("labels        %d\n", c->num_labels);
    printf("vocab         %d\n", c->vocab_size);
    printf("hidden        %d\n", c->hidden_size);
    printf("intermediate  %d\n", c->intermediate_size);
    printf("layers        %d\n", c->n_layers);
    printf("heads         %d query, %d key/value, head_dim %d\n", c->n_heads, c->n_kv_heads, c->head_dim);
    printf("qkv bias      %s\n", c->attention_bias ? "yes" : "no");
    printf("o_proj bias   %s\n", c->o_proj_bias ? "yes" : "no");
    printf("qk norm       %s\n", c->qk_norm ? "yes (per head, before RoPE)" : "no");
    printf("tied embed    %s\n", c->head == TR_HEAD_LM ? (c->tie_word_embeddings ? "yes" : "no") : "n/a");
    printf("norm eps      %g\n", (double)c->rms_norm_eps);
    printf("max position  %d\n", c->max_position_embeddings);
    print_rope(c);
    printf("tokens        ");
    print_token("bos", c->bos_token_id);
    printf(", ");
    print_token("pad", c->pad_token_id);
    printf(", eos");
    if (c->n_eos == 0) printf(" none");
    for (int32_t i = 0; i < c->n_eos; i++) printf("%s%d", i ? ", " : " ", c->eos_token_ids[i]);
    printf("\n");
    printf("dtype         %s\n", c->torch_dtype[0] ? c->torch_dtype : "(not given)");
    printf("weights       %s\n", weights);
    printf("parameters    %" PRIu64 " (%d tensors)\n", n_params, layout->n_tensors);
}

// The memory plan of the largest tensor-parallel rank and what printing it needs.
typedef struct info_plan {
    tr_plan plan;
    tr_tp shape;
    size_t acts[2];   // with --tp: the rank's training activations without, with sequence parallelism
    tr_dt act, wt;    // the backend's activation and weight types
} info_plan;

// The plan of a policy that trains and generates on one device: fp32 masters, the working
// copy when it is bf16, gradients and Adam's two moments (alignment padding included), the
// activation arena of one micro-batch of N tokens (what tr_model_arena_bytes gives: per
// layer and token the saved inputs of backward, the final norm, a chunk of LM logits and
// backward's scratch), shared with the generation's KV cache, which gets what is left.
static int plan_memory(const info_opts *o, const tr_model_config *c, info_plan *ip, tr_err *err) {
    tr_backend be;
    if (tr_cli_backend_start(&be, o->backend, o->device, 1, o->precision, err) != 0) return -1;
    // With --tp, the ranks' shards differ by a vocabulary row at most: the largest plan.
    int32_t rank = 0;
    int prc = tr_tp_init(&ip->shape, c, (int32_t)o->tp, 0, err);
    for (int32_t r = 0; prc == 0 && r < (int32_t)o->tp; r++) {
        tr_plan p;
        tr_plan_req pr = {.cfg = c, .max_tokens = (int32_t)o->tokens, .recompute = o->rec, .training = true,
                          .generate = c->head == TR_HEAD_LM, .kv_tokens = o->kv_tokens,
                          .kv_want = (int64_t)1 << 30, .max_seqs_want = o->tokens > 0 ? (int32_t)o->tokens : INT32_MAX,
                          .budget = (size_t)(o->memory_gb * (double)(1 << 30)),
                          .tp_size = (int32_t)o->tp, .tp_rank = r, .sequence_parallel = o->sp};
        prc = tr_plan_make(&be, &pr, &p, err);
        if (prc == 0 && (r == 0 || p.total > ip->plan.total)) {
            ip->plan = p;
            rank = r;
        }
    }
    // That rank's training activations both ways: what sequence parallelism saves.
    ip->acts[0] = ip->acts[1] = 0;
    for (int k = 0; k < 2 && o->tp > 1; k++) {
        tr_model_opts mo = {.max_tokens = ip->plan.max_tokens, .training = true, .tp_size = (int32_t)o->tp,
                            .tp_rank = rank, .sequence_parallel = k, .recompute = ip->plan.recompute};
        ip->acts[k] = tr_model_arena_bytes(c, &mo, be.act);
    }
    ip->act = be.act;
    ip->wt = be.wt;
    tr_backend_free(&be);
    return prc;
}

static void print_plan(const info_opts *o, const info_plan *ip) {
    char text[1024];
    tr_plan_format(&ip->plan, text, sizeof text);
    // Bytes per parameter by role: a trained role keeps fp32 masters, the working copy (when
    // narrower), fp32 gradients and two fp32 Adam moments; a role that never trains (reference,
    // reward model) keeps the working copy alone.
    size_t w = tr_dt_size(ip->wt), trained = 4 + (ip->wt == TR_F32 ? 0 : w) + 4 + 8;
    printf("precision     %s weights, %s activations and KV cache, fp32 masters and optimizer\n",
           tr_dt_name(ip->wt), tr_dt_name(ip->act));
    printf("bytes/param   %zu trained (policy, critic), %zu frozen (reference, reward)\n", trained, w);
    const tr_tp *shape = &ip->shape;
    if (o->tp > 1)
        printf("tensor par.   tp %ld: %d query and %d key/value heads%s, %d intermediate channels "
               "and about %d vocabulary rows per rank\n", o->tp, shape->n_heads, shape->n_kv_heads,
               shape->kv_replicas > 1 ? " (replicated)" : "", shape->inter, shape->vocab);
    if (o->tp > 1)
        printf("sequence par. %s: training activations %.1f MiB per rank with it, %.1f MiB "
               "without (%.1f MiB saved)\n", o->sp ? "on" : "off (--sequence-parallel)",
               (double)ip->acts[1] / (1 << 20), (double)ip->acts[0] / (1 << 20),
               ((double)ip->acts[0] - (double)ip->acts[1]) / (1 << 20));
    printf("memory plan to train and generate in %s on %s%s, %d tokens per micro-batch%s%s:\n%s",
           tr_dt_name(ip->act), o->backend, strcmp(o->backend, "cuda") == 0 ? " (this device's free memory)" : "",
           ip->plan.max_tokens, o->tokens == 0 ? " (the plan's choice)" : "",
           o->tp > 1 ? ", per tensor-parallel rank" : "", text);
}

int tr_cmd_info(int argc, char **argv) {
    info_opts o;
    bool help;
    int rc = parse_opts(argc, argv, &o, &help);
    if (rc || help) return rc;

    tr_err err = {0};
    tr_model_config c;
    tr_param_layout layout;
    if (tr_checkpoint_load_config(o.model, &c, &err)) return tr_cli_fail(CMD, &err);
    if (tr_param_layout_init(&layout, &c, &err)) return tr_cli_fail(CMD, &err);
    // Check the weight files (headers, names, shapes, dtypes) without reading the data; a
    // directory with only config.json is fine for sizing a model.
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", o.model);
    bool has_single = tr_file_exists(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", o.model);
    bool has_index = tr_file_exists(path);
    if ((has_single || has_index) && tr_checkpoint_load(o.model, &c, &layout, NULL, &err)) {
        tr_param_layout_free(&layout);
        return tr_cli_fail(CMD, &err);
    }
    print_config(o.model, &c, &layout, has_single ? "model.safetensors, checked"
                                       : has_index ? "sharded safetensors with index, checked"
                                                   : "none (config only)");
    info_plan ip;
    if (plan_memory(&o, &c, &ip, &err) != 0) {
        tr_param_layout_free(&layout);
        return tr_cli_fail(CMD, &err);
    }
    print_plan(&o, &ip);
    tr_param_layout_free(&layout);
    return 0;
}
