// `troupe generate`: samples continuations of JSONL prompts with the engine's batched
// generator. A line gives `input_ids`, `prompt` (text, encoded with the model's
// tokenizer.json) or `messages` (rendered with --chat-format plus the generation prompt).
// One output line per sample, prompt by prompt in input order, samples in order. With --tp N
// the model is split over N local rank processes (cli/tp_ranks.h) that draw the same tokens.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cleanup.h"
#include "cli/commands.h"
#include "cli/progress.h"
#include "cli/tp_ranks.h"
#include "data/chat.h"
#include "data/jsonl.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "engine/config.h"
#include "engine/checkpoint.h"
#include "engine/err.h"
#include "engine/strbuf.h"
#include "engine/file.h"
#include "engine/generate.h"
#include "engine/json.h"
#include "engine/plan.h"
#include "kernels/backend.h"
#include "engine/model.h"

static const char *CMD = "generate";

#define MAX_STOPS (TR_MAX_EOS * 2 + 2)

typedef struct gen_prompt {
    int32_t *ids;
    int32_t n;
    bool chat;      // rendered from messages: the chat format's stop tokens apply
} gen_prompt;

typedef struct gen_input {
    gen_prompt *items;
    size_t n, cap;
    tr_chat_format chat;
    bool chat_ready;
    bool no_thinking;   // --no-thinking: qwen3's enable_thinking=False
} gen_input;

static void gen_input_free(gen_input *in) {
    for (size_t i = 0; i < in->n; i++) free(in->items[i].ids);
    free(in->items);
}

static int parse_ids(const char *path, int64_t line, const tr_json *arr, int32_t vocab,
                     gen_prompt *p, tr_err *err) {
    size_t n = (size_t)arr->count;
    if (n == 0)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: 'input_ids' is empty", path, (long long)line);
    if (n > INT32_MAX / 2)
        return tr_errf(err, TR_ERANGE, "%s:%lld: %zu input_ids is too many", path,
                       (long long)line, n);
    if (!(p->ids = malloc(n * sizeof(int32_t))))
        return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
    size_t i = 0;
    for (const tr_json *v = arr->child; v; v = v->next, i++) {
        if (!tr_json_is_int(v))
            return tr_errf(err, TR_EFORMAT, "%s:%lld: input_ids[%zu] must be an integer, got %s",
                           path, (long long)line, i, tr_jsonl_type_name(v));
        int64_t x = v->inum;
        if (x < 0 || x >= vocab)
            return tr_errf(err, TR_ERANGE, "%s:%lld: input_ids[%zu] = %" PRId64
                           " is outside the model's vocabulary [0, %d)", path, (long long)line,
                           i, x, vocab);
        p->ids[i] = (int32_t)x;
    }
    p->n = (int32_t)n;
    return 0;
}

// Takes the ids of a rendering or an encoding, checked against the model's vocabulary.
static int take_ids(const char *path, int64_t line, int32_t *ids, size_t n, int32_t vocab,
                    gen_prompt *p, tr_err *err) {
    p->ids = ids;
    if (n == 0)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: the prompt encodes to no tokens", path,
                       (long long)line);
    if (n > INT32_MAX / 2)
        return tr_errf(err, TR_ERANGE, "%s:%lld: %zu prompt tokens is too many", path,
                       (long long)line, n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= vocab)
            return tr_errf(err, TR_ERANGE, "%s:%lld: the tokenizer gave id %d, outside the "
                           "model's vocabulary [0, %d)", path, (long long)line, ids[i], vocab);
    p->n = (int32_t)n;
    return 0;
}

static int parse_line(const char *path, int64_t line, const tr_json *obj, int32_t vocab,
                      const tr_tokenizer *tok, const char *chat_name, gen_input *in,
                      gen_prompt *p, tr_err *err) {
    const tr_json *ids = tr_json_get(obj, "input_ids");
    const tr_json *text = tr_json_get(obj, "prompt");
    const tr_json *msgs = tr_json_get(obj, "messages");
    int given = (ids != NULL) + (text != NULL) + (msgs != NULL);
    if (given == 0)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: a line needs 'input_ids', 'prompt' or "
                       "'messages'", path, (long long)line);
    if (given > 1)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: give only one of 'input_ids', 'prompt' and "
                       "'messages'", path, (long long)line);
    if (ids) {
        if (ids->type != TR_JSON_ARRAY)
            return tr_errf(err, TR_EFORMAT, "%s:%lld: field 'input_ids' must be an array, got "
                           "%s", path, (long long)line, tr_jsonl_type_name(ids));
        return parse_ids(path, line, ids, vocab, p, err);
    }
    if (!tok)
        return tr_errf(err, TR_EINVAL, "%s:%lld: '%s' needs the model's tokenizer.json, which "
                       "the model directory lacks; give 'input_ids'", path, (long long)line,
                       text ? "prompt" : "messages");
    if (text) {
        const char *s;
        size_t len;
        if (tr_jsonl_get_string(path, line, obj, "prompt", true, &s, &len, err) != 0) return -1;
        int32_t *out = NULL;
        size_t n = 0;
        if (tr_tokenizer_encode(tok, s, len, &out, &n, err) != 0)
            return tr_err_wrap(err, "%s:%lld", path, (long long)line);
        return take_ids(path, line, out, n, vocab, p, err);
    }
    if (!in->chat_ready) {
        if (tr_chat_format_init(&in->chat, chat_name, tok, err) != 0)
            return tr_err_wrap(err, "%s:%lld", path, (long long)line);
        in->chat.enable_thinking = !in->no_thinking;
        in->chat_ready = true;
    }
    tr_chat_msg *m;
    size_t n;
    if (tr_sft_parse_messages(path, line, obj, &m, &n, err) != 0) return -1;
    tr_chat_tokens t = {0};
    int rc = tr_chat_render(&in->chat, m, n, true, &t, err);
    free(m);
    free(t.mask);
    if (rc != 0) {
        free(t.ids);
        return tr_err_wrap(err, "%s:%lld", path, (long long)line);
    }
    p->chat = true;
    return take_ids(path, line, t.ids, t.n, vocab, p, err);
}

static int read_prompts(const char *path, int32_t vocab, const tr_tokenizer *tok,
                        const char *chat_name, gen_input *in, tr_err *err) {
    tr_jsonl r;
    if (tr_jsonl_open(&r, path, err) != 0) return -1;
    int rc;
    for (;;) {
        tr_json_doc doc;
        rc = tr_jsonl_next(&r, &doc, err);
        if (rc <= 0) break;
        if (in->n == in->cap) {
            size_t c = in->cap ? in->cap * 2 : 64;
            gen_prompt *g = realloc(in->items, c * sizeof *g);
            if (!g) {
                tr_json_free(&doc);
                rc = tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)r.line);
                break;
            }
            in->items = g;
            in->cap = c;
        }
        gen_prompt *p = &in->items[in->n++];
        memset(p, 0, sizeof *p);
        rc = parse_line(path, r.line, doc.root, vocab, tok, chat_name, in, p, err);
        tr_json_free(&doc);
        if (rc != 0) break;
    }
    tr_jsonl_close(&r);
    return rc < 0 ? -1 : 0;
}

// Ids outside the vocabulary are left out: the model cannot produce them.
static void add_stop(int32_t *stops, int32_t *n, int32_t id, int32_t vocab) {
    if (id < 0 || id >= vocab) return;
    for (int32_t i = 0; i < *n; i++)
        if (stops[i] == id) return;
    if (*n < MAX_STOPS) stops[(*n)++] = id;
}

// eos_token_id of DIR/generation_config.json (an integer or a list), when the file exists:
// transformers' generate stops on these.
static int read_generation_eos(const char *dir, int32_t vocab, int32_t *stops, int32_t *n,
                               tr_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!tr_file_exists(path)) return 0;
    tr_json_opts o = {.name = path, .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_NO_NUL};
    tr_json_doc doc;
    if (tr_json_parse_file(&doc, path, &o, err)) return -1;
    int rc = 0;
    const tr_json *eos = tr_json_get(doc.root, "eos_token_id");
    if (doc.root->type != TR_JSON_OBJECT && doc.root->type != TR_JSON_ARRAY) {
        rc = tr_errf(err, TR_EFORMAT, "%s:%d:%d: expected a JSON object, got %s", path,
                     doc.root->line, doc.root->col, tr_jsonl_type_name(doc.root));
    } else if (tr_json_is_int(eos)) {
        add_stop(stops, n, (int32_t)eos->inum, vocab);
    } else if (tr_json_is(eos, TR_JSON_ARRAY)) {
        size_t i = 0;
        for (const tr_json *v = eos->child; v && rc == 0; v = v->next, i++) {
            if (!tr_json_is_int(v))
                rc = tr_errf(err, TR_EFORMAT, "%s: eos_token_id[%zu] must be an integer", path, i);
            else add_stop(stops, n, (int32_t)v->inum, vocab);
        }
    } else if (eos && eos->type != TR_JSON_NULL) {
        rc = tr_errf(err, TR_EFORMAT, "%s: eos_token_id must be an integer or a list, got %s",
                     path, tr_jsonl_type_name(eos));
    }
    tr_json_free(&doc);
    return rc;
}

// One output line; the text is the decode of the tokens without a final stop token.
static int format_line(tr_strbuf *b, int64_t index, const tr_gen_output *o,
                       const tr_tokenizer *tok, tr_err *err) {
    // printf's "nan" is not JSON; a non-finite logprob means the model's numbers are.
    for (int32_t i = 0; i < o->n_tokens; i++)
        if (!isfinite(o->logprobs[i]))
            return tr_errf(err, TR_ERANGE, "index %" PRId64 " sample %d: the logprob of output "
                           "token %d is %g: the model computes non-finite numbers (NaN or "
                           "infinite weights or activations)", index, o->sample, i,
                           (double)o->logprobs[i]);
    char num[64];
    int k = snprintf(num, sizeof num, "{\"index\": %" PRId64 ", \"sample\": %d, \"output_ids\": [",
                     index, o->sample);
    int bad = tr_strbuf_put(b, num, (size_t)k);
    for (int32_t i = 0; i < o->n_tokens && !bad; i++) {
        k = snprintf(num, sizeof num, i ? ", %d" : "%d", o->tokens[i]);
        bad = tr_strbuf_put(b, num, (size_t)k);
    }
    bad = bad || tr_strbuf_str(b, "], \"logprobs\": [");
    for (int32_t i = 0; i < o->n_tokens && !bad; i++) {
        // %.9g reads back as the same float.
        k = snprintf(num, sizeof num, i ? ", %.9g" : "%.9g", (double)o->logprobs[i]);
        bad = tr_strbuf_put(b, num, (size_t)k);
    }
    bad = bad || tr_strbuf_str(b, o->finish == TR_GEN_STOP ? "], \"finish_reason\": \"stop\""
                                                        : "], \"finish_reason\": \"length\"");
    if (bad) return tr_errf(err, TR_ENOMEM, "out of memory formatting output");
    if (tok) {
        size_t n = (size_t)o->n_tokens - (o->finish == TR_GEN_STOP ? 1 : 0), len = 0;
        char *text = NULL;
        if (tr_tokenizer_decode(tok, o->tokens, n, &text, &len, err) != 0)
            return tr_err_wrap(err, "decoding prompt %" PRId64 " sample %d", index, o->sample);
        tr_json_writer w;
        tr_json_writer_init(&w, 0);
        w.flags = TR_JSON_W_DATA;
        tr_json_string_n(&w, text, len);
        const char *enc;
        size_t enc_len;
        bad = tr_json_writer_finish(&w, &enc, &enc_len, NULL) ||
              tr_strbuf_str(b, ", \"text\": ") || tr_strbuf_put(b, enc, enc_len);
        tr_json_writer_free(&w);
        free(text);
        if (bad) return tr_errf(err, TR_ENOMEM, "out of memory formatting output");
    }
    if (tr_strbuf_str(b, "}\n")) return tr_errf(err, TR_ENOMEM, "out of memory formatting output");
    return 0;
}

// Progress of a running tr_generate: samples finished and tokens sampled so far.
typedef struct gen_watch {
    tr_progress pg;
    const tr_gen_output *outs;
    int64_t n_out;
} gen_watch;

static void gen_tokens(const gen_watch *w, int64_t *done, int64_t *tokens) {
    *done = 0;
    *tokens = 0;
    for (int64_t i = 0; i < w->n_out; i++) {
        *done += w->outs[i].finish != TR_GEN_RUNNING;
        *tokens += w->outs[i].n_tokens;
    }
}

static void gen_on_pass(void *ctx, const tr_gen_stats *stats) {
    (void)stats;
    gen_watch *w = ctx;
    if (!tr_progress_due(&w->pg)) return;
    int64_t done, tokens;
    gen_tokens(w, &done, &tokens);
    tr_progress_show(&w->pg, done, w->n_out, tokens, false);
}

// The command line, checked.
typedef struct gen_opts {
    const char *model_dir, *prompts, *out_path, *chat_name, *backend, *precision;
    long n, max_new, min_new, top_k, seed, threads, kv_tokens, device, tp;
    long block_size, max_seqs, batch_tokens;
    double temperature, top_p;
    bool progress, quiet, no_thinking, sp;
} gen_opts;

// Parses and checks the options: 0 to run, else the exit status (2: a usage error; --help
// printed: *help set and 0 returned).
static int parse_opts(int argc, char **argv, gen_opts *o, bool *help) {
    *o = (gen_opts){.chat_name = "chatml", .n = 1, .max_new = 64, .tp = 1, .block_size = 16,
                    .batch_tokens = 2048, .temperature = 1.0, .top_p = 1.0,
                    .backend = getenv("TROUPE_BACKEND") ? getenv("TROUPE_BACKEND") : "cpu",
                    .precision = getenv("TROUPE_PRECISION")};
    tr_arg table[] = {
        {"model", TR_ARG_STR, &o->model_dir, "DIR", "Hugging Face model directory (a causal LM)",
         true, false},
        {"prompts", TR_ARG_STR, &o->prompts, "FILE",
         "JSONL with \"input_ids\", \"prompt\" or \"messages\" per line ('-': stdin)", true,
         false},
        {"out", TR_ARG_STR, &o->out_path, "FILE", "output JSONL ('-' or default: standard output)",
         false, false},
        {"n", TR_ARG_INT, &o->n, "N", "samples per prompt (default 1)", false, false},
        {"max-new-tokens", TR_ARG_INT, &o->max_new, "N", "tokens per sample at most (default 64)",
         false, false},
        {"min-new-tokens", TR_ARG_INT, &o->min_new, "N",
         "a stop id among a sample's first N tokens does not end it (default 0)", false, false},
        {"temperature", TR_ARG_FLOAT, &o->temperature, "T", "0 = greedy (default 1)", false, false},
        {"top-p", TR_ARG_FLOAT, &o->top_p, "P", "nucleus mass, in (0, 1] (default 1: off)", false,
         false},
        {"top-k", TR_ARG_INT, &o->top_k, "K", "most likely tokens kept (default 0: off)", false,
         false},
        {"seed", TR_ARG_INT, &o->seed, "S", "sampling seed (default 0)", false, false},
        {"chat-format", TR_ARG_STR, &o->chat_name, "NAME",
         "format of \"messages\" lines: chatml, llama3 or qwen3 (default chatml)", false, false},
        {"no-thinking", TR_ARG_FLAG, &o->no_thinking, NULL,
         "qwen3: close an empty think block in the prompt (enable_thinking=False)", false, false},
        {"threads", TR_ARG_INT, &o->threads, "N", "CPU threads (default: all cores)", false, false},
        {"backend", TR_ARG_STR, &o->backend, "NAME", "cpu or cuda (default: $TROUPE_BACKEND, else cpu)", false, false},
        {"device", TR_ARG_INT, &o->device, "N", "CUDA device index (default 0; tensor-parallel "
         "rank r uses N + r)", false, false},
        {"tp", TR_ARG_INT, &o->tp, "N", "tensor-parallel ranks: the model split over N local "
         "processes, which draw the same tokens (default 1)", false, false},
        {"sequence-parallel", TR_ARG_FLAG, &o->sp, NULL, "with --tp: norms and the residual stream "
         "split along the sequence (less activation memory; results equal to rounding)", false, false},
        {"precision", TR_ARG_STR, &o->precision, "P", TR_CLI_PRECISION_HELP, false, false},
        {"kv-tokens", TR_ARG_INT, &o->kv_tokens, "N",
         "KV cache size in tokens (default: what every request at once needs, as far as the "
         "device's free memory allows)", false, false},
        {"block-size", TR_ARG_INT, &o->block_size, "N", "tokens per KV block (default 16)", false,
         false},
        {"max-seqs", TR_ARG_INT, &o->max_seqs, "N",
         "samples decoded together (default: every sample at once)", false, false},
        {"batch-tokens", TR_ARG_INT, &o->batch_tokens, "N",
         "prompt tokens per prefill pass (default 2048)", false, false},
        {"progress", TR_ARG_FLAG, &o->progress, NULL,
         "progress on stderr even when it is not a terminal (a line every 10 s)", false, false},
        {"quiet", TR_ARG_FLAG, &o->quiet, NULL, "no progress on stderr, not even on a terminal",
         false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse(CMD, argc, argv, table, NULL, 0, NULL, help);
    if (rc) return rc;
    if (*help) {
        tr_args_usage(CMD, "--model DIR --prompts FILE.jsonl [--out FILE] [--n N] "
                      "[--max-new-tokens N] [--min-new-tokens N] [--temperature T] [--top-p P] [--top-k K] "
                      "[--seed S] [--chat-format NAME [--no-thinking]] [--threads N] "
                      "[--backend cpu|cuda] [--device N] [--precision fp32|bf16] [--tp N [--sequence-parallel]] [--kv-tokens N] [--max-seqs N] "
                      "[--progress | --quiet]",
                      "Writes one line per sample, prompt by prompt in input order:\n"
                      "{\"index\": i, \"sample\": j, \"output_ids\": [...], \"logprobs\": [...],\n"
                      " \"finish_reason\": \"stop\"|\"length\", \"text\": ...}\n"
                      "logprobs are ln p(token) under the model's unmodified distribution\n"
                      "(temperature 1, no top-k/top-p). A sample stops at config.json's and\n"
                      "generation_config.json's eos ids, and for \"messages\" lines at the chat\n"
                      "format's end-of-turn tokens; the stop token ends output_ids and is left\n"
                      "out of text (present when the model has tokenizer.json). Line i samples\n"
                      "from streams derived from --seed and i, so its output does not depend on\n"
                      "the other lines.",
                      table);
        return 0;
    }
    const char *bad = NULL;
    if (o->n < 1 || o->n > 65536) bad = "--n must be in 1..65536";
    else if (o->max_new < 1 || o->max_new > (1 << 24)) bad = "--max-new-tokens must be in 1..16777216";
    else if (o->min_new < 0 || o->min_new > o->max_new) bad = "--min-new-tokens must be in 0..--max-new-tokens";
    else if (!(o->temperature >= 0 && o->temperature <= 1e6)) bad = "--temperature must be in [0, 1e6]";
    else if (!(o->top_p > 0 && o->top_p <= 1)) bad = "--top-p must be in (0, 1]";
    else if (o->top_k < 0 || o->top_k > INT32_MAX) bad = "--top-k must be in 0..2147483647";
    else if (o->seed < 0) bad = "--seed must be >= 0";
    else if (o->threads < 0 || o->threads > 1024) bad = "--threads must be in 0..1024";
    else if (o->kv_tokens < 0 || o->kv_tokens > ((long)1 << 34)) bad = "--kv-tokens must be in 0..2^34";
    else if (o->block_size < 1 || o->block_size > 4096) bad = "--block-size must be in 1..4096";
    else if (o->max_seqs < 0 || o->max_seqs > 65536) bad = "--max-seqs must be in 0..65536";
    else if (o->batch_tokens < 1 || o->batch_tokens > (1 << 24))
        bad = "--batch-tokens must be in 1..16777216";
    else if (o->tp < 1 || o->tp > 64) bad = "--tp must be in 1..64";
    else if (o->sp && o->tp < 2) bad = "--sequence-parallel needs --tp 2 or more";
    else if (tr_chat_kind_parse(o->chat_name) == 0) bad = "--chat-format must be chatml, llama3 or qwen3";
    else if (o->no_thinking && tr_chat_kind_parse(o->chat_name) != TR_CHAT_QWEN3)
        bad = "--no-thinking applies to --chat-format qwen3 only";
    if (bad) {
        fprintf(stderr, "troupe %s: %s\n", CMD, bad);
        return 2;
    }
    if ((rc = tr_cli_backend_check(CMD, o->backend, o->device, o->precision)) != 0) return rc;
    if (o->out_path && strcmp(o->out_path, "-") == 0) o->out_path = NULL;
    return 0;
}

// What the requests need of the KV cache and the passes: in blocks, every request at once
// (its prompt plus n worst-case samples) and the largest one alone; the longest sequence;
// the prompts' tokens; the samples.
typedef struct gen_need {
    int64_t all_blocks, one_blocks, longest, prompt_tokens, n_out;
} gen_need;

// One request per prompt (stops: the model's, or for chat lines the chat format's too).
static void make_requests(const gen_opts *o, const gen_input *in, const int32_t *stops, int32_t n_stops,
                          const int32_t *chat_stops, int32_t n_chat, tr_gen_request *reqs, gen_need *need) {
    *need = (gen_need){.longest = 1};
    for (size_t i = 0; i < in->n; i++) {
        const gen_prompt *p = &in->items[i];
        tr_gen_request *r = &reqs[i];
        r->prompt = p->ids;
        r->n_prompt = p->n;
        r->n_samples = (int32_t)o->n;
        r->sampling = (tr_sample_params){.temperature = (float)o->temperature,
                                         .top_k = (int32_t)o->top_k, .top_p = (float)o->top_p};
        r->seed = tr_rng_derive((uint64_t)o->seed, (uint64_t)i);
        r->stop_ids = p->chat ? chat_stops : stops;
        r->n_stop = p->chat ? n_chat : n_stops;
        r->max_new_tokens = (int32_t)o->max_new;
        r->min_new_tokens = (int32_t)o->min_new;
        int64_t pb = tr_kv_blocks_for(p->n, (int32_t)o->block_size);
        int64_t sb = tr_gen_sample_blocks(p->n, (int32_t)o->max_new, (int32_t)o->block_size);
        need->all_blocks += pb + o->n * sb;
        if (pb + sb > need->one_blocks) need->one_blocks = pb + sb;
        if (p->n + o->max_new - 1 > need->longest) need->longest = p->n + o->max_new - 1;
        need->prompt_tokens += p->n;
        need->n_out += o->n;
    }
}

// The rank's memory plan for the passes and the KV cache: a pass holds at most every prompt
// (prefill) or every sample (decode), beyond which the arena would only cost memory; the
// cache holds every request at once where the memory allows and at least the longest one
// (the generator then takes turns). The ranks agree on the smallest pool any has room for,
// so that they schedule alike. *rows: the pass's rows.
static int plan_pool(const gen_opts *o, const tr_model_config *cfg, const gen_need *need, tr_backend *be,
                     tr_tp_ranks *ranks, tr_plan *plan, int64_t *rows, tr_err *err) {
    int64_t seqs = o->max_seqs > 0 && o->max_seqs < need->n_out ? o->max_seqs : need->n_out;
    int64_t fit = need->prompt_tokens > seqs ? need->prompt_tokens : seqs;
    *rows = o->batch_tokens > seqs ? o->batch_tokens : seqs;
    if (fit < *rows) *rows = fit > 1 ? fit : 1;
    tr_plan_req pr = {.cfg = cfg, .max_tokens = (int32_t)*rows, .generate = true,
                      .block_size = (int32_t)o->block_size, .kv_tokens = o->kv_tokens,
                      .kv_want = need->all_blocks * o->block_size, .max_seqs = (int32_t)seqs,
                      .max_seqs_want = (int32_t)seqs, .tp_size = (int32_t)o->tp,
                      .tp_rank = ranks->rank, .sequence_parallel = o->sp};
    if (tr_plan_make(be, &pr, plan, err) != 0) return -1;
    int64_t agree[2] = {plan->kv_tokens, plan->max_seqs};
    if (tr_tp_ranks_min(ranks, agree, 2, err) != 0) return -1;
    plan->kv_tokens = agree[0];
    plan->max_seqs = (int32_t)agree[1];
    if (plan->kv_tokens < need->one_blocks * o->block_size)
        return tr_errf(err, TR_ENOMEM, "the longest request needs %" PRId64 " tokens of KV cache, the "
                       "memory left after the weights holds %" PRId64, need->one_blocks * o->block_size,
                       plan->kv_tokens);
    return 0;
}

// The samples as JSON lines, to the writer when open (else standard output), in chunks of
// about 1 MiB.
static int write_lines(const tr_gen_output *outs, int64_t n_out, const tr_tokenizer *tok, tr_file_writer *w,
                       bool to_file, tr_strbuf *buf, tr_err *err) {
    for (int64_t i = 0; i < n_out; i++) {
        if (format_line(buf, outs[i].request, &outs[i], tok, err) != 0) return -1;
        if (buf->len >= (1 << 20) || i + 1 == n_out) {
            if (to_file) {
                if (tr_file_writer_write(w, buf->s, buf->len, err) != 0) return -1;
            } else if (fwrite(buf->s, 1, buf->len, stdout) != buf->len) {
                return tr_errf(err, TR_EIO, "writing standard output failed");
            }
            buf->len = 0;
        }
    }
    return 0;
}

// A run's state from the model's files to the output, freed by gen_run_end whatever stage
// the run reached.
typedef struct gen_run {
    tr_model_config cfg;
    int32_t stops[MAX_STOPS], n_stops, chat_stops[MAX_STOPS], n_chat;
    tr_tokenizer *tok;
    gen_input in;
    tr_gen_request *reqs;
    tr_gen_output *outs;
    gen_need need;
    tr_tp_ranks ranks;
    tr_backend be;
    tr_model m;
    tr_generator g;
    tr_file_writer w;
    tr_strbuf buf;
    gen_watch watch;
    bool be_ok, model_ok, gen_ok, writer_open;
    bool writer;   // rank 0, the one that writes the output
} gen_run;

// The model's config (checked against --tp), its stop ids (config.json's and
// generation_config.json's eos) and its tokenizer when it has one.
static int load_model_info(const gen_opts *o, gen_run *r, tr_err *err) {
    tr_tp tp_shape;
    if (tr_checkpoint_load_lm_config(o->model_dir, CMD, &r->cfg, err) != 0 ||
        tr_tp_init(&tp_shape, &r->cfg, (int32_t)o->tp, 0, err) != 0)
        return -1;
    const int32_t V = r->cfg.vocab_size;
    for (int32_t i = 0; i < r->cfg.n_eos; i++) add_stop(r->stops, &r->n_stops, r->cfg.eos_token_ids[i], V);
    if (read_generation_eos(o->model_dir, V, r->stops, &r->n_stops, err) != 0) return -1;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->model_dir);
    if (tr_file_exists(path) && tr_tokenizer_load(&r->tok, path, err) != 0) return -1;
    return 0;
}

// Reads the prompts into one request each and sizes the outputs, after opening the output
// first, so a bad --out fails before the work rather than after it.
static int prepare_requests(const gen_opts *o, gen_run *r, tr_err *err) {
    if (o->out_path) {
        if (tr_file_writer_open(&r->w, o->out_path, err) != 0) return -1;
        r->writer_open = true;
        tr_cleanup_add(r->w.tmp);
    }
    const int32_t V = r->cfg.vocab_size;
    if (read_prompts(o->prompts, V, r->tok, o->chat_name, &r->in, err) != 0) return -1;
    if (r->in.chat_ready) {
        for (int32_t i = 0; i < r->n_stops; i++) add_stop(r->chat_stops, &r->n_chat, r->stops[i], V);
        for (int32_t i = 0; i < r->in.chat.n_stop; i++) add_stop(r->chat_stops, &r->n_chat, r->in.chat.stop[i], V);
    }
    if (!(r->reqs = calloc(r->in.n ? r->in.n : 1, sizeof *r->reqs)))
        return tr_errf(err, TR_ENOMEM, "out of memory for %zu prompts", r->in.n);
    make_requests(o, &r->in, r->stops, r->n_stops, r->chat_stops, r->n_chat, r->reqs, &r->need);
    if (o->kv_tokens > 0 && o->kv_tokens < r->need.one_blocks * o->block_size)
        return tr_errf(err, TR_EINVAL, "--kv-tokens %ld is too small: the longest request needs %"
                       PRId64 " tokens of KV cache (its prompt and one sample of --max-new-tokens, in "
                       "blocks of %ld)", o->kv_tokens, r->need.one_blocks * o->block_size, o->block_size);
    if (r->need.longest > INT32_MAX) return tr_errf(err, TR_ERANGE, "prompt + --max-new-tokens is too long");
    if (!(r->outs = calloc(r->need.n_out ? (size_t)r->need.n_out : 1, sizeof *r->outs)))
        return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " samples", r->need.n_out);
    return 0;
}

// Forks the tensor-parallel ranks (every rank has the requests from here on) and starts each
// rank's own backend, then the model and the generator on the rank's memory plan.
static int start_engine(gen_opts *o, gen_run *r, tr_err *err) {
    if (tr_tp_ranks_fork(&r->ranks, (int32_t)o->tp, err) != 0) return -1;
    r->writer = r->ranks.rank == 0;
    if (!r->writer) r->writer_open = false;   // rank 0's file, never this rank's to touch
    if (o->threads == 0 && o->tp > 1) {       // the cores shared among the ranks
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o->threads = cores / o->tp > 0 ? cores / o->tp : 1;
    }
    if (tr_cli_backend_start(&r->be, o->backend, o->device + r->ranks.rank, o->threads, o->precision, err) != 0)
        return -1;
    r->be_ok = true;
    if (tr_tp_ranks_comm(&r->ranks, &r->be, err) != 0) return -1;
    tr_plan plan;
    int64_t rows;
    if (plan_pool(o, &r->cfg, &r->need, &r->be, &r->ranks, &plan, &rows, err) != 0) return -1;
    tr_model_opts mo = {.max_tokens = (int32_t)rows, .training = false, .tp_size = (int32_t)o->tp,
                        .tp_rank = r->ranks.rank, .logit_rows = plan.logit_rows,
                        .sequence_parallel = o->sp};
    if (tr_model_load(&r->m, o->model_dir, &r->be, &mo, err) != 0) return -1;
    r->model_ok = true;
    if (o->tp > 1 && tr_model_set_tp_comm(&r->m, r->ranks.comm, err) != 0) return -1;
    tr_gen_opts go = {.kv_tokens = plan.kv_tokens, .block_size = (int32_t)o->block_size,
                      .max_seqs = plan.max_seqs, .max_seq_len = (int32_t)r->need.longest};
    if (tr_generator_init(&r->g, &r->m, &go, err) != 0) return -1;
    r->gen_ok = true;
    return 0;
}

// Samples every request, with progress on rank 0's stderr after each pass.
static int sample_all(const gen_opts *o, gen_run *r, tr_err *err) {
    r->watch.outs = r->outs;
    r->watch.n_out = r->need.n_out;
    tr_progress_init(&r->watch.pg, CMD, "samples", o->progress && r->writer, o->quiet || !r->writer);
    r->g.on_pass = gen_on_pass;
    r->g.on_pass_ctx = &r->watch;
    if (tr_generate(&r->g, r->reqs, (int32_t)r->in.n, r->outs, err) != 0) {
        r->need.n_out = 0;   // tr_generate freed them
        return -1;
    }
    int64_t done_n, tokens;
    gen_tokens(&r->watch, &done_n, &tokens);
    tr_progress_show(&r->watch.pg, done_n, r->need.n_out, tokens, true);
    return 0;
}

// Rank 0 writes the samples and commits the output file (or flushes standard output).
static int write_output(gen_run *r, tr_err *err) {
    if (!r->writer) return 0;
    if (write_lines(r->outs, r->need.n_out, r->tok, &r->w, r->writer_open, &r->buf, err) != 0) return -1;
    if (r->writer_open) {
        r->writer_open = false;
        return tr_file_writer_commit(&r->w, err) != 0 ? -1 : 0;
    }
    if (fflush(stdout) != 0) return tr_errf(err, TR_EIO, "writing standard output failed");
    return 0;
}

// Frees what the run reached (an unfinished output file is dropped) and ends the ranks;
// rc: the run's status. Returns the command's exit status.
static int gen_run_end(const gen_opts *o, gen_run *r, int rc, tr_err *err) {
    tr_progress_end(&r->watch.pg);
    if (r->writer_open) tr_file_writer_abort(&r->w);
    if (o->out_path && r->ranks.rank == 0) tr_cleanup_remove(r->w.tmp);
    tr_strbuf_free(&r->buf);
    // A failing rank aborts the group first, so no other waits in a collective for it.
    if (rc && r->ranks.comm) tr_comm_abort(r->ranks.comm, err->msg);
    if (r->outs) tr_gen_outputs_free(r->outs, r->need.n_out);
    free(r->outs);
    free(r->reqs);
    if (r->gen_ok) tr_generator_free(&r->g);
    if (r->model_ok) tr_model_free(&r->m);
    if (r->be_ok) tr_backend_free(&r->be);
    gen_input_free(&r->in);
    tr_tokenizer_free(r->tok);
    rc = tr_tp_ranks_end(&r->ranks, CMD, rc, err);
    return rc == 0 ? 0 : tr_cli_fail(CMD, err);
}

int tr_cmd_generate(int argc, char **argv) {
    gen_opts o;
    bool help;
    int rc = parse_opts(argc, argv, &o, &help);
    if (rc || help) return rc;
    tr_err err = {0};
    gen_run r = {.in = {.no_thinking = o.no_thinking}, .ranks = {.size = 1}};
    if (load_model_info(&o, &r, &err) != 0) return tr_cli_fail(CMD, &err);
    rc = prepare_requests(&o, &r, &err) || start_engine(&o, &r, &err) || sample_all(&o, &r, &err) ||
         write_output(&r, &err);
    return gen_run_end(&o, &r, rc, &err);
}
