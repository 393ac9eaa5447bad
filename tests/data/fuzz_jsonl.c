// Fuzz target: JSONL parsing and field access over arbitrary bytes. Built with
// clang -fsanitize=fuzzer by tools/build_fuzzers.sh, and run by fuzz_driver.c as a unit test.
#include <stdint.h>
#include <stdio.h>

#include "data/jsonl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f) return 0;
    tr_jsonl r;
    tr_err err;
    if (tr_jsonl_open_stream(&r, f, "fuzz.jsonl", &err) == 0) {
        tr_json_doc doc;
        int rc;
        while ((rc = tr_jsonl_next(&r, &doc, &err)) == 1) {
            const char *s;
            size_t n;
            const tr_json *o = doc.root, *arr;
            tr_jsonl_get_string(r.path, r.line, o, "text", false, &s, &n, &err);
            tr_jsonl_get_string(r.path, r.line, o, "prompt", true, &s, &n, &err);
            tr_jsonl_get_array(r.path, r.line, o, "messages", false, &arr, &err);
            tr_json_free(&doc);
        }
        tr_jsonl_close(&r);
    }
    fclose(f);
    return 0;
}
