// Checker for the preprocess end-to-end test: check_preprocess PREFIX REF.jsonl REPEAT DTYPE
// reads PREFIX.bin/.idx with tr_indexed and compares document by document with the HF
// reference ids (tools/preprocess_fixtures.py) repeated REPEAT times.
#include "data/indexed.h"
#include "data/jsonl.h"
#include "tests/test.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: check_preprocess PREFIX REF.jsonl REPEAT DTYPE_CODE\n");
        return 2;
    }
    tr_err err = {0};
    tr_indexed d;
    int rc = tr_indexed_open(&d, argv[1], &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return tr_test_summary("check_preprocess");
    int repeat = atoi(argv[3]);
    CHECKF(d.dtype == atoi(argv[4]), "dtype %d", d.dtype);
    int64_t doc = 0, bad = 0;
    int32_t *buf = malloc(1 << 20);
    for (int k = 0; k < repeat; k++) {
        tr_jsonl r;
        CHECK(tr_jsonl_open(&r, tr_test_src(argv[2]), &err) == 0);
        tr_json_doc o;
        while (tr_jsonl_next(&r, &o, &err) == 1) {
            const tr_json *ids = tr_json_get(o.root, "ids");
            size_t n = (size_t)ids->count;
            if (doc >= d.n_docs) {
                bad++;
            } else {
                // Megatron's layout: one sequence per non-empty document, none for an empty one.
                int64_t s0 = tr_indexed_doc_index(&d, doc), s1 = tr_indexed_doc_index(&d, doc + 1);
                if (n == 0) {
                    bad += s1 != s0;
                } else if (s1 != s0 + 1 || (size_t)tr_indexed_seq_len(&d, s0) != n ||
                           tr_indexed_read(&d, s0, 0, (int64_t)n, buf, &err) != 0) {
                    bad++;
                } else {
                    size_t i = 0;
                    for (const tr_json *v = ids->child; v; v = v->next, i++) bad += buf[i] != v->inum;
                }
            }
            doc++;
            tr_json_free(&o);
        }
        tr_jsonl_close(&r);
    }
    CHECKF(bad == 0, "%lld documents differ from the reference", (long long)bad);
    CHECKF(doc == d.n_docs, "%lld reference documents, %lld in the dataset", (long long)doc,
           (long long)d.n_docs);
    free(buf);
    tr_indexed_close(&d);
    return tr_test_summary("check_preprocess");
}
