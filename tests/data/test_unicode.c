// Every code point against Hugging Face tokenizers 0.23.3. The tokenizers are fixtures built
// by tools/make_unicode_fixtures.py with the pre-tokenizer (Split regex, ByteLevel settings)
// and normalizer of Llama 3.2's and Qwen3's released tokenizer.json, which cannot be
// downloaded here, over a vocabulary HF trained on the test texts plus merges that make any
// difference in splitting show in the ids; two more cover DeepSeek-V3-style Splits and a
// pattern troupe runs without its shadow text, under NFKC. Each code point U+0000..U+10FFFF
// but surrogates is encoded in every context of tests/fixtures/unicode/expected.json and the
// ids must be HF's: per block of 4096 code points their CRC-32 must match, and a list of code
// points whose properties differ between Unicode versions must give HF's ids exactly. Also
// checks the run-time kind lookup against the generated runs.
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "data/tokenizer_impl.h"
#include "engine/file.h"
#include "tests/json_get.h"
#include "tests/test.h"

static uint32_t crc_table[4][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 4; t++)
            crc_table[t][i] = crc_table[0][crc_table[t - 1][i] & 0xff] ^ (crc_table[t - 1][i] >> 8);
}

// CRC-32 of the ids as little-endian uint32, what Python's zlib.crc32 gives the fixture
// (four bytes a step).
static uint32_t ids_crc(const int32_t *ids, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= (uint32_t)ids[i];
        c = crc_table[3][c & 0xff] ^ crc_table[2][c >> 8 & 0xff] ^ crc_table[1][c >> 16 & 0xff] ^
            crc_table[0][c >> 24];
    }
    return c ^ 0xFFFFFFFFu;
}

typedef struct job {
    const tr_tokenizer *tok;
    const char *name;
    const tr_json *ctx;
    const char *sep;
    uint32_t block;
    int bad_blocks, bad_samples, checks;
} job;

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "    %s:", what);
    for (size_t i = 0; i < n && i < 24; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 24 ? " ...\n" : "\n");
}

// A context: its parts, joined by the code point.
typedef struct context {
    const char *part[8];
    size_t len[8];
    size_t n;
} context;

static bool context_of(const tr_json *parts, context *x) {
    x->n = tj_size(parts);
    if (x->n < 2 || x->n > 8) return false;
    for (size_t k = 0; k < x->n && k < 8; k++) {   // k < 8 spelled out for gcc's bounds check
        x->part[k] = tj_str(tj_at(parts, k));
        x->len[k] = tj_len(tj_at(parts, k));
        if (!x->part[k] || x->len[k] > 32) return false;
    }
    return true;
}

static size_t put_context(const context *x, uint32_t c, char *o) {
    size_t len = 0;
    for (size_t k = 0; k < x->n; k++) {
        if (k) len += tr_tok_utf8_put(c, o + len);
        memcpy(o + len, x->part[k], x->len[k]);
        len += x->len[k];
    }
    return len;
}

// The context as text for messages: its parts joined by "<c>".
static void context_name(const tr_json *parts, char *o, size_t cap) {
    size_t len = 0;
    o[0] = '\0';
    for (size_t k = 0; k < tj_size(parts) && len < cap; k++)
        len += (size_t)snprintf(o + len, cap - len, "%s%s", k ? "<c>" : "",
                                tj_str(tj_at(parts, k)));
}

// One context of one tokenizer: all blocks, then the samples.
static void *run_context(void *arg) {
    job *j = arg;
    const tr_json *parts = tr_json_get(j->ctx, "parts");
    const char *hashes = tj_str(tr_json_get(j->ctx, "hashes"));
    char name[128];
    context_name(parts, name, sizeof name);
    // Contexts of the released configurations run to U+10FFFF, the others stop earlier.
    size_t end = (size_t)tj_int(tr_json_get(j->ctx, "end"));
    size_t nsep = strlen(j->sep), n_blocks = end / j->block, per = nsep + 8 * (32 + 4);
    context x;
    bool released = strcmp(j->name, "llama32") == 0 || strcmp(j->name, "qwen3") == 0;
    if (!hashes || strlen(hashes) != 8 * n_blocks || !context_of(parts, &x) || nsep > 64 ||
        end % j->block != 0 || end > 0x110000 || (released && end != 0x110000) || end == 0) {
        j->bad_blocks = -1;
        return NULL;
    }
    char *text = malloc((size_t)j->block * per);
    if (!text) {
        j->bad_blocks = -1;
        return NULL;
    }
    for (size_t b = 0; b < n_blocks; b++) {
        size_t len = 0;
        for (uint32_t c = (uint32_t)b * j->block; c < (uint32_t)(b + 1) * j->block; c++) {
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            len += put_context(&x, c, text + len);
            memcpy(text + len, j->sep, nsep);
            len += nsep;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        tr_err err = {0};
        char want[9];
        memcpy(want, hashes + 8 * b, 8);
        want[8] = '\0';
        uint32_t crc = 0;
        int rc = tr_tokenizer_encode(j->tok, text, len, &ids, &n, &err);
        if (rc == 0) crc = ids_crc(ids, n);
        j->checks++;
        if (rc || crc != (uint32_t)strtoul(want, NULL, 16)) {
            if (j->bad_blocks++ < 8)
                fprintf(stderr, "%s, context '%s': U+%04zX..U+%04zX differ from HF%s%s\n", j->name,
                        name, b * j->block, (b + 1) * j->block - 1, rc ? ": " : "",
                        rc ? err.msg : "");
        }
        free(ids);
    }

    const tr_json *samples = tr_json_get(j->ctx, "samples");
    for (const tr_json *want = samples ? samples->child : NULL; want; want = want->next) {
        const char *key = want->key;
        uint32_t c = (uint32_t)strtoul(key, NULL, 16);
        size_t len = put_context(&x, c, text);
        int32_t *ids = NULL;
        size_t n = 0;
        tr_err err = {0};
        int rc = tr_tokenizer_encode(j->tok, text, len, &ids, &n, &err);
        bool same = rc == 0 && n == tj_size(want);
        for (size_t i = 0; same && i < n; i++)
            same = ids[i] == tj_int(tj_at(want, i));
        j->checks++;
        if (!same && j->bad_samples++ < 8) {
            fprintf(stderr, "%s, context '%s', c = U+%04X:\n", j->name, name, (unsigned)c);
            int32_t w[64];
            size_t nw = tj_size(want) < 64 ? tj_size(want) : 64;
            for (size_t i = 0; i < nw; i++)
                w[i] = (int32_t)tj_int(tj_at(want, i));
            print_ids("HF    ", w, nw);
            if (rc == 0) print_ids("troupe", ids, n);
            else fprintf(stderr, "    troupe: %s\n", err.msg);
        }
        free(ids);
    }
    free(text);
    return NULL;
}

// Loads every fixture tokenizer and lists one job per context.
static size_t load_jobs(const tr_json *toks, uint32_t block, tr_tokenizer **loaded, job *jobs,
                        size_t cap) {
    size_t n = 0;
    for (size_t i = 0; i < tj_size(toks); i++) {
        const tr_json *entry = tj_at(toks, i);
        const char *name = tj_str(tr_json_get(entry, "name"));
        const char *file = tj_str(tr_json_get(entry, "file"));
        const char *sep = tj_str(tr_json_get(entry, "separator"));
        const tr_json *ctxs = tr_json_get(entry, "contexts");
        CHECK(name && file && sep && tj_size(ctxs) > 0);
        if (!name || !file || !sep) continue;
        char rel[256];
        snprintf(rel, sizeof rel, "tests/fixtures/unicode/%s", file);
        tr_err err = {0};
        int rc = tr_tokenizer_load(&loaded[i], tr_test_src(rel), &err);
        CHECKF(rc == 0, "%s: %s", name, err.msg);
        if (rc) continue;
        CHECKF(tr_tokenizer_token_id(loaded[i], sep) >= 0, "%s: no separator token %s", name, sep);
        for (size_t k = 0; k < tj_size(ctxs) && n < cap; k++)
            jobs[n++] = (job){.tok = loaded[i], .name = name, .ctx = tj_at(ctxs, k),
                              .sep = sep, .block = block};
    }
    return n;
}

typedef struct pool {
    job *jobs;
    size_t n;
    atomic_size_t next;
} pool;

static void *worker(void *arg) {
    pool *p = arg;
    // The last contexts (the ones with the most code points per text) go first.
    for (size_t k; (k = atomic_fetch_add(&p->next, 1)) < p->n;) run_context(&p->jobs[p->n - 1 - k]);
    return NULL;
}

// The contexts are independent and a loaded tokenizer is shared read-only: up to four
// threads.
static void check_all(const tr_json *toks, uint32_t block) {
    enum { MAX_JOBS = 64, MAX_TOKS = 16 };
    tr_tokenizer *loaded[MAX_TOKS] = {0};
    job jobs[MAX_JOBS];
    CHECK(tj_size(toks) <= MAX_TOKS);
    if (tj_size(toks) > MAX_TOKS) return;
    pool p = {.jobs = jobs, .n = load_jobs(toks, block, loaded, jobs, MAX_JOBS)};
    atomic_init(&p.next, 0);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int n_th = cpus > 4 ? 3 : cpus > 1 ? (int)cpus - 1 : 0, started = 0;
    pthread_t th[3];
    while (started < n_th && pthread_create(&th[started], NULL, worker, &p) == 0) started++;
    worker(&p);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    int released = 0;
    for (size_t k = 0; k < p.n; k++) {
        char cname[128];
        const char *name = jobs[k].name;
        context_name(tr_json_get(jobs[k].ctx, "parts"), cname, sizeof cname);
        CHECKF(jobs[k].bad_blocks == 0, "%s, context '%s': %d blocks differ", name, cname,
               jobs[k].bad_blocks);
        CHECKF(jobs[k].bad_samples == 0, "%s, context '%s': %d samples differ", name, cname,
               jobs[k].bad_samples);
        size_t end = (size_t)tj_int(tr_json_get(jobs[k].ctx, "end"));
        CHECKF(jobs[k].checks > (int)(end / block), "%s, context '%s': only %d checks", name,
               cname, jobs[k].checks);
        released += strcmp(name, "llama32") == 0 || strcmp(name, "qwen3") == 0;
    }
    CHECKF(released >= 4, "only %d contexts of the released configurations", released);
    for (size_t i = 0; i < MAX_TOKS; i++) tr_tokenizer_free(loaded[i]);
}

// The two-stage kind table built at run time agrees with the generated runs everywhere.
static void check_kind_table(void) {
    tr_tok_unicode_init();
    int bad = 0;
    size_t run = 0;
    for (uint32_t c = 0; c < 0x110000; c++) {
        while (run + 1 < TR_UNI_N_KIND_RUNS && tr_uni_kind_runs[run + 1] >> 8 <= c) run++;
        if (tr_tok_kind((int32_t)c) != (tr_uni_kind_runs[run] & 0xff) && bad++ < 5)
            fprintf(stderr, "kind of U+%04X: %d, runs say %d\n", (unsigned)c,
                    tr_tok_kind((int32_t)c), (int)(tr_uni_kind_runs[run] & 0xff));
    }
    CHECKF(bad == 0, "%d code points with the wrong kind", bad);
    CHECK(tr_tok_kind(-1) == tr_tok_kind(0x10FFFF));
    CHECK(tr_tok_kind(0x110000) == tr_tok_kind(0x10FFFF));
}

int main(void) {
    crc_init();
    check_kind_table();
    tr_err err = {0};
    tr_json_doc doc;
    CHECKF(tj_load(&doc, tr_test_src("tests/fixtures/unicode/expected.json"), &err) == 0, "%s",
           err.msg);
    const tr_json *root = doc.root;
    if (root) {
        uint32_t block = (uint32_t)tj_int(tr_json_get(root, "block"));
        CHECK(block > 0 && 0x110000 % block == 0);
        const tr_json *toks = tr_json_get(root, "tokenizers");
        if (block > 0 && 0x110000 % block == 0) check_all(toks, block);
        tr_json_free(&doc);
    }
    return tr_test_summary("test_unicode");
}
