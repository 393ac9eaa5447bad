// Plain driver for the fuzz targets, run as a unit test: every seed file given on the
// command line, then deterministic mutations of each (byte flips, truncations, splices,
// inserted delimiters). Under the ASan/UBSan CI build a memory error fails the test.
#include <stdint.h>

#include "engine/file.h"
#include "tests/test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

int main(int argc, char **argv) {
    int seeds = 0;
    long runs = 0;
    uint64_t st = 1;
    for (int a = 1; a < argc; a++) {
        char *data = NULL;
        size_t n = 0;
        tr_err err;
        const char *path = tr_test_src(argv[a]);
        CHECKF(tr_file_read(path, &data, &n, &err) == 0, "%s", err.msg);
        if (!data) continue;
        seeds++;
        CHECK(LLVMFuzzerTestOneInput((const uint8_t *)data, n) == 0);
        runs++;
        uint8_t *m = malloc(n + 64);
        for (int k = 0; k < 400; k++) {
            size_t len = n;
            memcpy(m, data, n);
            switch (k % 5) {
            case 0:  // flip a few bytes
                for (int f = 0; f < 1 + (int)(lcg(&st) % 4) && n; f++) m[lcg(&st) % n] ^= (uint8_t)(1u << (lcg(&st) % 8));
                break;
            case 1:  // truncate
                len = n ? lcg(&st) % n : 0;
                break;
            case 2:  // overwrite with a boundary value
                if (n >= 8) {
                    size_t at = lcg(&st) % (n - 7);
                    uint64_t v = (lcg(&st) & 1) ? UINT64_MAX : (uint64_t)1 << (lcg(&st) % 64);
                    memcpy(m + at, &v, 8);
                }
                break;
            case 3: {  // insert a delimiter
                const char *ins = "\n{}[]\"\\\r\0,:";
                size_t at = n ? lcg(&st) % n : 0, c = 1 + lcg(&st) % 8;
                memmove(m + at + c, m + at, n - at);
                for (size_t i = 0; i < c; i++) m[at + i] = (uint8_t)ins[lcg(&st) % 12];
                len = n + c;
                break;
            }
            default:  // splice a chunk onto itself
                if (n > 2) {
                    size_t a0 = lcg(&st) % n, b0 = lcg(&st) % n, c = lcg(&st) % (n - (a0 > b0 ? a0 : b0));
                    memmove(m + a0, data + b0, c);
                }
            }
            CHECK(LLVMFuzzerTestOneInput(m, len) == 0);
            runs++;
        }
        free(m);
        free(data);
    }
    CHECK(seeds == argc - 1);
    printf("fuzz driver: %d seeds, %ld inputs\n", seeds, runs);
    return tr_test_summary("fuzz_driver");
}
