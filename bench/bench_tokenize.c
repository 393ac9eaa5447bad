// Encode throughput of troupe's tokenizer on one thread: every document of a JSONL corpus
// ({"text": ...} per line, made by bench/bench_tokenize_hf.py --write-corpus) is encoded in
// turn; prints MB/s over the best of a few passes and the token count (to compare with HF).
//
// usage: bench_tokenize TOKENIZER_JSON CORPUS_JSONL [PASSES]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tokenizer.h"
#include "engine/file.h"
#include "engine/json.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenize TOKENIZER_JSON CORPUS_JSONL [PASSES]\n");
        return 2;
    }
    int passes = argc > 3 ? atoi(argv[3]) : 3;
    if (passes < 1) passes = 1;
    tr_err err = {0};
    tr_tokenizer *tok;
    if (tr_tokenizer_load(&tok, argv[1], &err)) {
        fprintf(stderr, "bench_tokenize: %s\n", err.msg);
        return 1;
    }
    char *data;
    size_t len;
    if (tr_file_read(argv[2], &data, &len, &err)) {
        fprintf(stderr, "bench_tokenize: %s\n", err.msg);
        return 1;
    }
    // Parse the corpus up front: only encoding is timed.
    size_t n_docs = 0, cap = 0, bytes = 0;
    char **docs = NULL;
    size_t *lens = NULL;
    for (char *p = data; p < data + len;) {
        char *nl = memchr(p, '\n', (size_t)(data + len - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(data + len - p);
        tr_json_doc j;
        tr_json_opts o = {.name = argv[2], .line = (int64_t)n_docs + 1, .flags = TR_JSON_DATA};
        const tr_json *t = tr_json_parse_opts(&j, p, n, &o, &err) ? NULL : tr_json_get(j.root, "text");
        if (!tr_json_is(t, TR_JSON_STRING)) {
            fprintf(stderr, "bench_tokenize: %s: line %zu has no \"text\"\n", argv[2], n_docs + 1);
            return 1;
        }
        if (n_docs == cap) {
            cap = cap ? 2 * cap : 1024;
            docs = realloc(docs, cap * sizeof *docs);
            lens = realloc(lens, cap * sizeof *lens);
            if (!docs || !lens) return 1;
        }
        lens[n_docs] = t->len;
        docs[n_docs] = malloc(lens[n_docs] + 1);
        if (!docs[n_docs]) return 1;
        memcpy(docs[n_docs], t->str, lens[n_docs]);
        bytes += lens[n_docs];
        n_docs++;
        tr_json_free(&j);
        p += n + 1;
    }
    free(data);

    double best = 1e30;
    size_t tokens = 0;
    for (int pass = 0; pass < passes; pass++) {
        tokens = 0;
        double t0 = now();
        for (size_t i = 0; i < n_docs; i++) {
            int32_t *ids;
            size_t n;
            if (tr_tokenizer_encode(tok, docs[i], lens[i], &ids, &n, &err)) {
                fprintf(stderr, "bench_tokenize: document %zu: %s\n", i + 1, err.msg);
                return 1;
            }
            tokens += n;
            free(ids);
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("troupe: %zu docs, %.2f MB, %zu tokens, %.3f s, %.2f MB/s\n", n_docs, bytes / 1e6,
           tokens, best, bytes / 1e6 / best);
    for (size_t i = 0; i < n_docs; i++) free(docs[i]);
    free(docs);
    free(lens);
    tr_tokenizer_free(tok);
    return 0;
}
