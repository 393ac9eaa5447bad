// `troupe logprobs`: per-token log-probabilities of token sequences under a causal LM.
// Input JSONL lines carry input_ids, or text encoded with the model's tokenizer.json; each
// output line, in input order, is {"logprobs": [...]} with
// logprobs[i] = ln p(input_ids[i+1] | input_ids[..i]).
// Sequences are packed as separate documents into forwards of up to --batch-tokens tokens.
// With --tp N the model is split over N local rank processes (cli/tp_ranks.h).
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
#include "data/tokenizer.h"
#include "engine/checkpoint.h"
#include "engine/err.h"
#include "engine/strbuf.h"
#include "engine/file.h"
#include "engine/heads.h"
#include "engine/json.h"
#include "engine/model.h"
#include "engine/pack.h"
#include "kernels/backend.h"

static const char *CMD = "logprobs";

typedef struct seq {
    int32_t *ids;
    int32_t n;
    long long line;     // in the input file, for messages
} seq;

typedef struct seq_list {
    seq *items;
    size_t n, cap;
} seq_list;

static void seq_list_free(seq_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i].ids);
    free(l->items);
}

static const char *type_name(const tr_json *v) {
    if (v->type == TR_JSON_NUMBER) return v->is_int ? "integer" : "number";
    return tr_json_type_name(v->type);
}

// Takes n ids (malloc'd, owned by s afterwards) after checking them against the vocabulary.
static int take_ids(const char *path, long long line, int32_t *ids, size_t n, int32_t vocab,
                    seq *s, tr_err *err) {
    s->ids = ids;
    s->n = (int32_t)n;
    if (n == 0) return tr_errf(err, TR_EFORMAT, "%s:%lld: the text encodes to no tokens", path, line);
    if (n > INT32_MAX / 2) return tr_errf(err, TR_ERANGE, "%s:%lld: %zu tokens is too many", path, line, n);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            return tr_errf(err, TR_ERANGE, "%s:%lld: the tokenizer gave id %d, outside the "
                           "model's vocabulary [0, %d)", path, line, ids[i], vocab);
    return 0;
}

// One line's input_ids (or encoded text) into s, each id checked against the vocabulary.
static int parse_line(const char *path, long long line, const char *text, size_t len,
                      int32_t vocab, const tr_tokenizer *tok, seq *s, tr_err *err) {
    tr_json_opts o = {.name = path, .line = line, .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_NO_NUL};
    tr_json_doc doc;
    if (tr_json_parse_opts(&doc, text, len, &o, err)) return -1;
    const tr_json *obj = doc.root;
    int rc = -1;
    const tr_json *arr = tr_json_get(obj, "input_ids"), *txt = tr_json_get(obj, "text");
    size_t n = tr_json_is(arr, TR_JSON_ARRAY) ? (size_t)arr->count : 0;
    if (obj->type != TR_JSON_OBJECT) {
        tr_errf(err, TR_EFORMAT, "%s:%lld: a line must be a JSON object, got %s", path, line,
                type_name(obj));
    } else if (arr && txt) {
        tr_errf(err, TR_EFORMAT, "%s:%lld: give one of 'input_ids' and 'text', not both", path,
                line);
    } else if (txt) {
        int32_t *ids = NULL;
        size_t k = 0;
        if (txt->type != TR_JSON_STRING)
            tr_errf(err, TR_EFORMAT, "%s:%lld: field 'text' must be a string, got %s", path,
                    line, type_name(txt));
        else if (!tok)
            tr_errf(err, TR_EINVAL, "%s:%lld: 'text' needs the model's tokenizer.json, which "
                    "the model directory lacks; give 'input_ids'", path, line);
        else if (tr_tokenizer_encode(tok, txt->str, txt->len, &ids, &k, err) != 0)
            tr_err_wrap(err, "%s:%lld", path, line);
        else
            rc = take_ids(path, line, ids, k, vocab, s, err);
        tr_json_free(&doc);
        return rc;
    } else if (!arr) {
        tr_errf(err, TR_EFORMAT, "%s:%lld: missing field 'input_ids' (or 'text')", path, line);
    } else if (arr->type != TR_JSON_ARRAY) {
        tr_errf(err, TR_EFORMAT, "%s:%lld: field 'input_ids' must be an array, got %s", path,
                line, type_name(arr));
    } else if (n == 0) {
        tr_errf(err, TR_EFORMAT, "%s:%lld: 'input_ids' is empty", path, line);
    } else if (n > INT32_MAX / 2) {
        tr_errf(err, TR_ERANGE, "%s:%lld: %zu input_ids is too many", path, line, n);
    } else if (!(s->ids = malloc(n * sizeof(int32_t)))) {
        tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, line);
    } else {
        rc = 0;
    }
    size_t i = 0;
    for (const tr_json *v = rc == 0 ? arr->child : NULL; v && rc == 0; v = v->next, i++) {
        if (!tr_json_is_int(v))
            rc = tr_errf(err, TR_EFORMAT, "%s:%lld: input_ids[%zu] must be an integer, got %s",
                         path, line, i, type_name(v));
        else if (v->inum < 0 || v->inum >= vocab)
            rc = tr_errf(err, TR_ERANGE, "%s:%lld: input_ids[%zu] = %" PRId64
                         " is outside the model's vocabulary [0, %d)", path, line, i, v->inum,
                         vocab);
        else
            s->ids[i] = (int32_t)v->inum;
    }
    s->n = (int32_t)n;
    tr_json_free(&doc);
    return rc;
}

// Reads every non-blank line of path ("-": standard input).
static int read_sequences(const char *path, int32_t vocab, const tr_tokenizer *tok,
                          seq_list *out, tr_err *err) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    char *buf = NULL;
    size_t cap = 0;
    long long line = 0;
    int rc = 0;
    for (;;) {
        errno = 0;
        ssize_t len = getline(&buf, &cap, f);
        if (len < 0) {
            if (ferror(f)) rc = tr_errf(err, TR_EIO, "%s: read failed: %s", path, strerror(errno));
            break;
        }
        line++;
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r')) len--;
        size_t k = 0;
        while (k < (size_t)len && (buf[k] == ' ' || buf[k] == '\t')) k++;
        if (k == (size_t)len) continue;
        if (out->n == out->cap) {
            size_t c = out->cap ? out->cap * 2 : 256;
            seq *g = realloc(out->items, c * sizeof *g);
            if (!g) {
                rc = tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, line);
                break;
            }
            out->items = g;
            out->cap = c;
        }
        seq *s = &out->items[out->n++];
        s->ids = NULL;
        s->n = 0;
        s->line = line;
        if ((rc = parse_line(path, line, buf, (size_t)len, vocab, tok, s, err)) != 0) break;
    }
    free(buf);
    if (f != stdin) fclose(f);
    return rc;
}

static int write_line(tr_strbuf *b, const float *lp, int32_t n) {
    char num[32];
    if (tr_strbuf_put(b, "{\"logprobs\": [", 14) != 0) return -1;
    for (int32_t i = 0; i < n; i++) {
        // %.9g reads back as the same float.
        int k = snprintf(num, sizeof num, i ? ", %.9g" : "%.9g", (double)lp[i]);
        if (tr_strbuf_put(b, num, (size_t)k) != 0) return -1;
    }
    return tr_strbuf_put(b, "]}\n", 3);
}

typedef struct output {
    FILE *stdout_f;          // NULL when writing a file
    tr_file_writer w;
    tr_strbuf buf;
} output;

static int flush_output(output *o, tr_err *err) {
    if (o->buf.len == 0) return 0;
    int rc = 0;
    if (o->stdout_f) {
        if (fwrite(o->buf.s, 1, o->buf.len, o->stdout_f) != o->buf.len)
            rc = tr_errf(err, TR_EIO, "writing standard output failed");
    } else {
        rc = tr_file_writer_write(&o->w, o->buf.s, o->buf.len, err);
    }
    o->buf.len = 0;
    return rc;
}

// Runs the sequences [first, last), packed into pk, as one forward and appends their lines
// (o NULL: a tensor-parallel rank other than 0, which only computes).
static int run_batch(tr_model *m, const char *path, const seq_list *seqs, size_t first,
                     size_t last, const tr_pack *pk, float *lp, output *o, tr_err *err) {
    if (tr_model_forward(m, pk->ids, &pk->docs, err) != 0 ||
        tr_lm_head_forward(m, pk->targets, lp, NULL, err) != 0)
        return -1;
    if (!o) return 0;
    for (size_t i = first; i < last; i++) {
        int32_t off = pk->doc_start[i - first];
        // printf's "nan" is not JSON; a non-finite logprob means the model's numbers are.
        for (int32_t j = 0; j + 1 < seqs->items[i].n; j++)
            if (!isfinite(lp[off + j]))
                return tr_errf(err, TR_ERANGE, "%s:%lld: logprob %d is %g: the model computes "
                               "non-finite numbers (NaN or infinite weights or activations)",
                               path, seqs->items[i].line, j, (double)lp[off + j]);
        if (write_line(&o->buf, lp + off, seqs->items[i].n - 1) != 0)
            return tr_errf(err, TR_ENOMEM, "out of memory formatting output");
    }
    return flush_output(o, err);
}

// The command line, checked.
typedef struct lp_opts {
    const char *model_dir, *data, *out_path, *backend, *precision;
    long threads, batch_tokens, device, tp;
    bool progress, quiet, sp;
} lp_opts;

// Parses and checks the options: 0 to run, else the exit status (2: a usage error; --help
// printed: *help set and 0 returned).
static int parse_opts(int argc, char **argv, lp_opts *o, bool *help) {
    *o = (lp_opts){.batch_tokens = 4096, .tp = 1,
                   .backend = getenv("TROUPE_BACKEND") ? getenv("TROUPE_BACKEND") : "cpu",
                   .precision = getenv("TROUPE_PRECISION")};
    tr_arg table[] = {
        {"model", TR_ARG_STR, &o->model_dir, "DIR", "Hugging Face model directory (a causal LM)",
         true, false},
        {"data", TR_ARG_STR, &o->data, "FILE",
         "JSONL with \"input_ids\" (or \"text\", with the model's tokenizer.json) per line "
         "('-': stdin)", true, false},
        {"out", TR_ARG_STR, &o->out_path, "FILE", "output JSONL ('-' or default: standard output)",
         false, false},
        {"threads", TR_ARG_INT, &o->threads, "N", "CPU threads (default: all cores)", false, false},
        {"backend", TR_ARG_STR, &o->backend, "NAME", "cpu or cuda (default: $TROUPE_BACKEND, else cpu)", false,
         false},
        {"device", TR_ARG_INT, &o->device, "N", "CUDA device index (default 0; tensor-parallel "
         "rank r uses N + r)", false, false},
        {"tp", TR_ARG_INT, &o->tp, "N", "tensor-parallel ranks: the model split over N local "
         "processes (default 1)", false, false},
        {"sequence-parallel", TR_ARG_FLAG, &o->sp, NULL, "with --tp: norms and the residual stream "
         "split along the sequence (less activation memory; results equal to rounding)", false, false},
        {"precision", TR_ARG_STR, &o->precision, "P", TR_CLI_PRECISION_HELP, false, false},
        {"batch-tokens", TR_ARG_INT, &o->batch_tokens, "N",
         "tokens per forward pass; longer sequences get a pass of their own (default 4096)",
         false, false},
        {"progress", TR_ARG_FLAG, &o->progress, NULL,
         "progress on stderr even when it is not a terminal (a line every 10 s)", false, false},
        {"quiet", TR_ARG_FLAG, &o->quiet, NULL, "no progress on stderr, not even on a terminal",
         false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse(CMD, argc, argv, table, NULL, 0, NULL, help);
    if (rc) return rc;
    if (*help) {
        tr_args_usage(CMD, "--model DIR --data FILE.jsonl [--out FILE] [--threads N] "
                      "[--backend cpu|cuda] [--device N] [--precision fp32|bf16] [--tp N [--sequence-parallel]] "
                      "[--batch-tokens N] [--progress | --quiet]",
                      "Writes one line {\"logprobs\": [...]} per input line, in input order:\n"
                      "logprobs[i] = ln p(input_ids[i+1] | input_ids[0..i]), len - 1 values.\n"
                      "\"text\" is encoded as transformers' encode(text, "
                      "add_special_tokens=False).",
                      table);
        return 0;
    }
    if (o->threads < 0 || o->threads > 1024 || o->batch_tokens < 1 || o->batch_tokens > (1 << 24) ||
        o->tp < 1 || o->tp > 64) {
        fprintf(stderr, "troupe %s: --threads must be in 0..1024, --batch-tokens in "
                "1..16777216 and --tp in 1..64\n", CMD);
        return 2;
    }
    if (o->sp && o->tp < 2) {
        fprintf(stderr, "troupe %s: --sequence-parallel needs --tp 2 or more\n", CMD);
        return 2;
    }
    if ((rc = tr_cli_backend_check(CMD, o->backend, o->device, o->precision)) != 0) return rc;
    if (o->out_path && strcmp(o->out_path, "-") == 0) o->out_path = NULL;
    return 0;
}

// Reads the sequences (checked against the model's config, text encoded with its tokenizer
// when it has one); *max_tokens: the tokens of the largest pass.
static int load_input(const lp_opts *o, seq_list *seqs, int32_t *max_tokens, tr_err *err) {
    tr_model_config cfg;
    tr_tp tp_shape;
    if (tr_checkpoint_load_lm_config(o->model_dir, CMD, &cfg, err) != 0 ||
        tr_tp_init(&tp_shape, &cfg, (int32_t)o->tp, 0, err) != 0)
        return -1;
    tr_tokenizer *tok = NULL;
    char tok_path[4200];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o->model_dir);
    if (tr_file_exists(tok_path) && tr_tokenizer_load(&tok, tok_path, err) != 0) return -1;
    int rc = read_sequences(o->data, cfg.vocab_size, tok, seqs, err);
    tr_tokenizer_free(tok);
    if (rc != 0) return -1;
    int32_t longest = 1;
    int64_t total = 0;
    for (size_t i = 0; i < seqs->n; i++) {
        if (seqs->items[i].n > longest) longest = seqs->items[i].n;
        total += seqs->items[i].n;
    }
    // No pass holds more than the whole input: a small input needs no arena for
    // --batch-tokens tokens (which is zeroed, so it would cost time and memory).
    *max_tokens = longest > o->batch_tokens ? longest : (int32_t)o->batch_tokens;
    if (total < *max_tokens) *max_tokens = total > longest ? (int32_t)total : longest;
    return 0;
}

// Rank 0's output: the file (*open set; removed at exit unless committed), or standard output.
static int open_output(const char *out_path, output *out, bool *open, tr_err *err) {
    if (!out_path) {
        out->stdout_f = stdout;
        return 0;
    }
    if (tr_file_writer_open(&out->w, out_path, err) != 0) return -1;
    *open = true;
    tr_cleanup_add(out->w.tmp);
    return 0;
}

// Runs every sequence through passes packed into pk, appending the lines to out (NULL on a
// rank that only computes), with progress after each pass; *tokens_done: the tokens run.
static int run_passes(tr_model *m, const char *path, const seq_list *seqs, tr_pack *pk, float *lp,
                      output *out, tr_progress *pg, int64_t *tokens_done, tr_err *err) {
    size_t first = 0;
    *tokens_done = 0;
    for (size_t i = 0; i <= seqs->n; i++) {
        // A sequence goes into the current pass if it fits; the pass runs when one does not.
        if (i < seqs->n && tr_pack_add(pk, seqs->items[i].ids, NULL, seqs->items[i].n)) continue;
        if (i > first) {
            if (run_batch(m, path, seqs, first, i, pk, lp, out, err) != 0) return -1;
            *tokens_done += pk->docs.n_tokens;
            tr_progress_show(pg, (int64_t)i, (int64_t)seqs->n, *tokens_done, false);
            first = i;
            tr_pack_clear(pk);
        }
        if (i < seqs->n) tr_pack_add(pk, seqs->items[i].ids, NULL, seqs->items[i].n);
    }
    return 0;
}

int tr_cmd_logprobs(int argc, char **argv) {
    lp_opts o;
    bool help;
    int rc = parse_opts(argc, argv, &o, &help);
    if (rc || help) return rc;

    tr_err err = {0};
    seq_list seqs = {0};
    int32_t max_tokens;
    if (load_input(&o, &seqs, &max_tokens, &err) != 0) {
        seq_list_free(&seqs);
        return tr_cli_fail(CMD, &err);
    }
    // Every rank has the input from here on; each starts its own backend.
    tr_tp_ranks ranks;
    if (tr_tp_ranks_fork(&ranks, (int32_t)o.tp, &err) != 0) {
        seq_list_free(&seqs);
        return tr_cli_fail(CMD, &err);
    }
    const bool writer = ranks.rank == 0;
    if (o.threads == 0 && o.tp > 1) {   // the cores shared among the ranks
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        o.threads = cores / o.tp > 0 ? cores / o.tp : 1;
    }
    tr_backend be;
    if (tr_cli_backend_start(&be, o.backend, o.device + ranks.rank, o.threads, o.precision, &err) != 0) {
        seq_list_free(&seqs);
        return tr_tp_ranks_end(&ranks, CMD, 1, &err) ? tr_cli_fail(CMD, &err) : 0;
    }
    tr_model m;
    tr_model_opts opts = {.max_tokens = max_tokens, .training = false, .tp_size = (int32_t)o.tp,
                          .tp_rank = ranks.rank, .sequence_parallel = o.sp};
    tr_pack pk = {0};
    float *lp = malloc((size_t)max_tokens * sizeof(float));
    output out = {0};
    tr_progress pg = {0};
    bool model_ok = false, writer_open = false;
    rc = 1;
    if (!lp) {
        tr_errf(&err, TR_ENOMEM, "out of memory for %d-token batches", max_tokens);
        goto done;
    }
    if (tr_pack_init(&pk, max_tokens, &err) != 0) goto done;
    if (tr_model_load(&m, o.model_dir, &be, &opts, &err) != 0) goto done;
    model_ok = true;
    if (o.tp > 1 && (tr_tp_ranks_comm(&ranks, &be, &err) != 0 ||
                     tr_model_set_tp_comm(&m, ranks.comm, &err) != 0))
        goto done;
    if (writer && open_output(o.out_path, &out, &writer_open, &err) != 0) goto done;
    tr_progress_init(&pg, CMD, "sequences", o.progress && writer, o.quiet || !writer);
    int64_t tokens_done;
    if (run_passes(&m, o.data, &seqs, &pk, lp, writer ? &out : NULL, &pg, &tokens_done, &err) != 0) goto done;
    if (writer_open) {
        writer_open = false;
        if (tr_file_writer_commit(&out.w, &err) != 0) goto done;
    } else if (writer && fflush(stdout) != 0) {
        tr_errf(&err, TR_EIO, "writing standard output failed");
        goto done;
    }
    tr_progress_show(&pg, (int64_t)seqs.n, (int64_t)seqs.n, tokens_done, true);
    rc = 0;
done:
    tr_progress_end(&pg);
    if (writer_open) tr_file_writer_abort(&out.w);
    if (o.out_path && writer) tr_cleanup_remove(out.w.tmp);
    tr_strbuf_free(&out.buf);
    // A failing rank aborts the group first, so no other waits in a collective for it.
    if (rc && ranks.comm) tr_comm_abort(ranks.comm, err.msg);
    if (model_ok) tr_model_free(&m);
    tr_backend_free(&be);
    tr_pack_free(&pk);
    free(lp);
    seq_list_free(&seqs);
    rc = tr_tp_ranks_end(&ranks, CMD, rc, &err);
    return rc == 0 ? 0 : tr_cli_fail(CMD, &err);
}
