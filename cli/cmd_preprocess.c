// `troupe preprocess`: JSONL documents -> Megatron indexed dataset (PREFIX.bin/.idx).
// The reader thread keeps one batch of lines ahead; worker threads parse and tokenize a batch
// while the previous one is written, and results are written in input order, so the output
// does not depend on the number of workers.
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/cleanup.h"
#include "cli/commands.h"
#include "data/indexed.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "engine/err.h"

#define BATCH_LINES 4096
#define BATCH_BYTES (16u << 20)

typedef struct slot {
    int32_t *ids;
    size_t n;
    int failed;
    tr_err err;
} slot;

typedef struct batch {
    char *text;          // lines back to back, each NUL-terminated
    size_t len, cap;
    size_t off[BATCH_LINES];
    size_t tlen[BATCH_LINES];
    int64_t line[BATCH_LINES];
    int n;
    slot out[BATCH_LINES];
} batch;

typedef struct pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    batch *cur;          // the batch being tokenized, NULL when idle
    int next;            // next line index to take
    int finished;        // lines finished
    int generation;
    bool quit;
    const tr_tokenizer *tok;
    const char *path, *key;
    bool append_eod;
    int32_t eod;
} pool;

static void encode_line(pool *p, batch *b, int i) {
    slot *s = &b->out[i];
    tr_json_doc doc = {0};
    const char *text;
    size_t len;
    s->failed = 0;
    s->ids = NULL;
    s->n = 0;
    if (tr_jsonl_parse(p->path, b->line[i], b->text + b->off[i], b->tlen[i], &doc, &s->err) ||
        tr_jsonl_get_string(p->path, b->line[i], doc.root, p->key, true, &text, &len, &s->err)) {
        s->failed = 1;
        tr_json_free(&doc);
        return;
    }
    if (tr_tokenizer_encode(p->tok, text, len, &s->ids, &s->n, &s->err)) {
        tr_err_wrap(&s->err, "%s:%lld", p->path, (long long)b->line[i]);
        s->failed = 1;
    } else if (p->append_eod && s->n > 0) {
        // As Megatron's preprocess_data.py: EOD closes every non-empty document.
        int32_t *g = realloc(s->ids, (s->n + 1) * sizeof *g);
        if (!g) {
            tr_errf(&s->err, TR_ENOMEM, "%s:%lld: out of memory", p->path, (long long)b->line[i]);
            s->failed = 1;
        } else {
            s->ids = g;
            s->ids[s->n++] = p->eod;
        }
    }
    tr_json_free(&doc);
}

static void *worker(void *arg) {
    pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && (!p->cur || p->next >= p->cur->n)) pthread_cond_wait(&p->work, &p->mu);
        if (p->quit) break;
        batch *b = p->cur;
        int i = p->next++;
        pthread_mutex_unlock(&p->mu);
        encode_line(p, b, i);
        pthread_mutex_lock(&p->mu);
        if (++p->finished == b->n) pthread_cond_broadcast(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void pool_start(pool *p, batch *b) {
    pthread_mutex_lock(&p->mu);
    p->cur = b;
    p->next = 0;
    p->finished = 0;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
}

static void pool_wait(pool *p) {
    pthread_mutex_lock(&p->mu);
    while (p->cur && p->finished < p->cur->n) pthread_cond_wait(&p->done, &p->mu);
    p->cur = NULL;
    pthread_mutex_unlock(&p->mu);
}

// Reads up to BATCH_LINES lines (or BATCH_BYTES) into b; returns lines read or -1.
static int read_batch(tr_jsonl *r, batch *b, tr_err *err) {
    b->n = 0;
    b->len = 0;
    while (b->n < BATCH_LINES && b->len < BATCH_BYTES) {
        const char *t;
        size_t n;
        int rc = tr_jsonl_next_line(r, &t, &n, err);
        if (rc < 0) return -1;
        if (rc == 0) break;
        if (b->len + n + 1 > b->cap) {
            size_t c = b->cap ? b->cap : 1 << 20;
            while (c < b->len + n + 1) c *= 2;
            char *x = realloc(b->text, c);
            if (!x) return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory for a %zu-byte line",
                                   r->path, (long long)r->line, n);
            b->text = x;
            b->cap = c;
        }
        memcpy(b->text + b->len, t, n);
        b->text[b->len + n] = '\0';
        b->off[b->n] = b->len;
        b->tlen[b->n] = n;
        b->line[b->n] = r->line;
        b->len += n + 1;
        b->n++;
    }
    return b->n;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct progress {
    double start, last;
    bool tty;
} progress;

static void progress_show(progress *pg, const tr_jsonl *r, int64_t docs, bool final) {
    double t = now_s(), el = t - pg->start;
    if (!final && t - pg->last < (pg->tty ? 0.25 : 10.0)) return;
    pg->last = t;
    double mb = (double)r->bytes_read / 1e6, rate = el > 0 ? mb / el : 0;
    double lps = el > 0 ? (double)docs / el : 0;
    char eta[64] = "";
    if (r->size && rate > 0 && !final) {
        double left = ((double)r->size - (double)r->bytes_read) / 1e6 / rate;
        snprintf(eta, sizeof eta, ", ETA %.0f s", left > 0 ? left : 0);
    }
    char pct[32] = "";
    if (r->size) snprintf(pct, sizeof pct, "%5.1f%% ", 100.0 * (double)r->bytes_read / (double)r->size);
    fprintf(stderr, "%s%s%" PRId64 " lines, %.1f MB, %.0f lines/s, %.2f MB/s%s%s",
            pg->tty ? "\r" : "", pct, docs, mb, lps, rate, eta, pg->tty && !final ? "   " : "\n");
    fflush(stderr);
}

// The command line, checked.
typedef struct pre_opts {
    const char *input, *key, *tok_path, *prefix, *eod_tok;
    bool append_eod, quiet;
    long workers;
} pre_opts;

// Parses and checks the options: 0 to run, else the exit status (2: a usage error; --help
// printed: *help set and 0 returned).
static int parse_opts(int argc, char **argv, pre_opts *o, bool *help) {
    *o = (pre_opts){.key = "text", .workers = 1};
    *help = false;
    tr_arg table[] = {
        {"input", TR_ARG_STR, &o->input, "FILE", "JSONL input, one document per line ('-' = stdin)", true, false},
        {"json-key", TR_ARG_STR, &o->key, "KEY", "field holding the text (default: text)", false, false},
        {"tokenizer", TR_ARG_STR, &o->tok_path, "FILE", "Hugging Face tokenizer.json", true, false},
        {"output-prefix", TR_ARG_STR, &o->prefix, "PREFIX", "writes PREFIX.bin and PREFIX.idx", true, false},
        {"append-eod", TR_ARG_FLAG, &o->append_eod, NULL, "end every document with the EOD token", false, false},
        {"eod-token", TR_ARG_STR, &o->eod_tok, "TOKEN", "EOD token (default: <|endoftext|> or <|end_of_text|>)",
         false, false},
        {"workers", TR_ARG_INT, &o->workers, "N", "tokenizing threads (default: 1)", false, false},
        {"quiet", TR_ARG_FLAG, &o->quiet, NULL, "no progress on stderr", false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse("preprocess", argc, argv, table, NULL, 0, NULL, help);
    if (rc) return rc;
    if (*help) {
        tr_args_usage("preprocess", "--input FILE.jsonl --tokenizer tokenizer.json --output-prefix P [options]",
                      "Tokenizes one JSON field of every line into a Megatron indexed dataset\n"
                      "(P.bin/P.idx; uint16 tokens when the vocabulary has fewer than 65500 ids,\n"
                      "int32 otherwise). Output order is input order for any --workers.",
                      table);
        return 0;
    }
    size_t plen = strlen(o->prefix);
    if (plen == 0 || o->prefix[plen - 1] == '/') {
        fprintf(stderr, "troupe preprocess: --output-prefix must end in a file name (it writes "
                        "PREFIX.bin and PREFIX.idx), got '%s'\n", o->prefix);
        return 2;
    }
    if (o->workers < 1 || o->workers > 256) {
        fprintf(stderr, "troupe preprocess: --workers must be 1..256, got %ld\n", o->workers);
        return 2;
    }
    return 0;
}

// The EOD token's id into *eod: --eod-token's, else <|endoftext|> or <|end_of_text|> (-1:
// neither). Returns 0, or 2 (a usage error, printed) when --eod-token is not a token or
// --append-eod finds none.
static int find_eod(const pre_opts *o, const tr_tokenizer *tok, int32_t *eod) {
    if (o->eod_tok) {
        *eod = tr_tokenizer_token_id(tok, o->eod_tok);
        if (*eod < 0) {
            fprintf(stderr, "troupe preprocess: --eod-token '%s' is not a token of %s\n", o->eod_tok, o->tok_path);
            return 2;
        }
    } else {
        *eod = tr_tokenizer_token_id(tok, "<|endoftext|>");
        if (*eod < 0) *eod = tr_tokenizer_token_id(tok, "<|end_of_text|>");
    }
    if (o->append_eod && *eod < 0) {
        fprintf(stderr, "troupe preprocess: %s has no <|endoftext|> or <|end_of_text|>; name the EOD "
                        "token with --eod-token\n", o->tok_path);
        return 2;
    }
    return 0;
}

// Adds a tokenized batch's documents to the dataset in input order; the first failed line
// stops it with that line's error (the ids of it and the lines after it freed).
static int write_batch(tr_indexed_builder *bld, batch *a, int64_t *docs, int64_t *tokens, tr_err *err) {
    for (int i = 0; i < a->n; i++) {
        slot *s = &a->out[i];
        if (!s->failed) {
            if (s->n && tr_indexed_builder_add(bld, s->ids, (int64_t)s->n, &s->err)) s->failed = 1;
            else if (tr_indexed_builder_end_document(bld, &s->err)) s->failed = 1;
        }
        if (s->failed) {
            *err = s->err;
            for (int j = i; j < a->n; j++) free(a->out[j].ids);
            return -1;
        }
        (*docs)++;
        *tokens += (int64_t)s->n;
        free(s->ids);
        s->ids = NULL;
    }
    return 0;
}

// The input batch by batch through the two buffers: the pool tokenizes one while the next
// is read, then it is written; progress after each batch unless pg is NULL.
static int run_batches(pool *p, tr_jsonl *r, batch *bufs, tr_indexed_builder *bld, progress *pg, int64_t *docs,
                       int64_t *tokens, tr_err *err) {
    batch *a = &bufs[0], *b = &bufs[1];
    if (read_batch(r, a, err) < 0) return -1;
    while (a->n > 0) {
        pool_start(p, a);
        int got = read_batch(r, b, err);
        pool_wait(p);
        if (write_batch(bld, a, docs, tokens, err) != 0) return -1;
        if (got < 0) return -1;
        if (pg) progress_show(pg, r, *docs, false);
        batch *t = a;
        a = b;
        b = t;
    }
    return 0;
}

int tr_cmd_preprocess(int argc, char **argv) {
    pre_opts o;
    bool help;
    int rc = parse_opts(argc, argv, &o, &help);
    if (rc || help) return rc;
    tr_err err = {0};
    tr_tokenizer *tok = NULL;
    if (tr_tokenizer_load(&tok, o.tok_path, &err)) return tr_cli_fail("preprocess", &err);
    int32_t eod = -1;
    if ((rc = find_eod(&o, tok, &eod)) != 0) {
        tr_tokenizer_free(tok);
        return rc;
    }
    int dtype = tr_indexed_dtype_for_vocab(tr_tokenizer_vocab_size(tok));
    tr_jsonl r;
    if (tr_jsonl_open(&r, o.input, &err)) {
        tr_tokenizer_free(tok);
        return tr_cli_fail("preprocess", &err);
    }
    tr_indexed_builder bld;
    batch *bufs = calloc(2, sizeof *bufs);
    pool p = {.tok = tok, .path = o.input, .key = o.key, .append_eod = o.append_eod, .eod = eod};
    pthread_t th[256];
    int n_th = 0, status = 1;
    int64_t docs = 0, tokens = 0;
    progress pg = {now_s(), now_s(), !o.quiet && isatty(2)};
    if (!bufs) {
        tr_errf(&err, TR_ENOMEM, "out of memory");
        goto out_nobuilder;
    }
    if (tr_indexed_builder_init(&bld, o.prefix, dtype, &err)) goto out_nobuilder;
    tr_cleanup_add(bld.bin.tmp);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.work, NULL);
    pthread_cond_init(&p.done, NULL);
    for (; n_th < o.workers; n_th++)
        if (pthread_create(&th[n_th], NULL, worker, &p) != 0) {
            tr_errf(&err, TR_EIO, "cannot start worker thread %d: %s", n_th, strerror(errno));
            goto out;
        }
    if (run_batches(&p, &r, bufs, &bld, o.quiet ? NULL : &pg, &docs, &tokens, &err) != 0) goto out;
    if (tr_indexed_builder_finish(&bld, &err)) goto out;
    status = 0;
    if (!o.quiet) {
        progress_show(&pg, &r, docs, true);
        fprintf(stderr, "troupe preprocess: %" PRId64 " documents, %" PRId64 " tokens (%s) -> %s.bin, "
                        "%s.idx in %.1f s\n", docs, tokens, tr_indexed_dtype_name(dtype), o.prefix,
                o.prefix, now_s() - pg.start);
    }
out:
    pthread_mutex_lock(&p.mu);
    p.quit = true;
    pthread_cond_broadcast(&p.work);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < n_th; i++) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.work);
    pthread_cond_destroy(&p.done);
    tr_cleanup_remove(bld.bin.tmp);
    tr_indexed_builder_free(&bld);
out_nobuilder:
    if (bufs) {
        free(bufs[0].text);
        free(bufs[1].text);
    }
    free(bufs);
    tr_jsonl_close(&r);
    tr_tokenizer_free(tok);
    if (status) {
        if (pg.tty) fputc('\n', stderr);
        return tr_cli_fail("preprocess", &err);
    }
    return 0;
}
