// Fuzz target: Megatron .idx validation and every accessor behind it. The input is the
// index and also serves as the .bin bytes, so pointers into "data" are exercised too.
#include <stdint.h>
#include <stdlib.h>

#include "data/indexed.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tr_indexed d;
    tr_err err;
    if (tr_indexed_open_mem(&d, "fuzz", data, size, data, size, &err) != 0) return 0;
    int32_t buf[256];
    for (int64_t s = 0; s < d.n_seqs && s < 4096; s++) {
        int32_t len = tr_indexed_seq_len(&d, s);
        for (int64_t at = 0; at < len && at < 4096; at += 256) {
            int64_t take = len - at < 256 ? len - at : 256;
            tr_indexed_read(&d, s, at, take, buf, &err);
        }
    }
    for (int64_t k = 0; k < d.n_docs && k < 4096; k++) (void)tr_indexed_doc_tokens(&d, k);
    tr_indexed_close(&d);
    return 0;
}
