// Plain driver for the fuzz targets when libFuzzer is not available: runs the target over
// the given files (or every file in the given directories) and over deterministic mutations
// of each (byte flips, truncations, header-length edits, spliced bytes), so the unit suite
// exercises the hostile-input paths on every build.
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void) {  // xorshift64*: fixed seed, so runs are reproducible
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static long runs;

static void run_one(const uint8_t *data, size_t size) {
    // A fresh copy of exactly `size` bytes, so reads past the end are caught by ASan builds.
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy) return;
    memcpy(copy, data, size);
    LLVMFuzzerTestOneInput(copy, size);
    free(copy);
    runs++;
}

static void mutate_and_run(const uint8_t *data, size_t size, int n) {
    uint8_t *buf = malloc(size + 64);
    if (!buf) return;
    for (int k = 0; k < n; k++) {
        memcpy(buf, data, size);
        size_t len = size;
        switch (next_u64() % 5) {
        case 0:  // flip a few bytes, mostly in the header where the structure is
            for (int j = 0; j < 1 + (int)(next_u64() % 4); j++) {
                size_t span = len < 256 ? len : 256;
                if (span) buf[next_u64() % span] ^= (uint8_t)(1u << (next_u64() % 8));
            }
            break;
        case 1:  // truncate
            len = len ? next_u64() % len : 0;
            break;
        case 2:  // header length field moved around its true value
            if (len >= 8) {
                int64_t delta = (int64_t)(next_u64() % 33) - 16;
                uint64_t h = 0;
                for (int i = 7; i >= 0; i--) h = (h << 8) | buf[i];
                h += (uint64_t)delta;
                for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(h >> (8 * i));
            }
            break;
        case 3:  // overwrite a digit in the header (offsets, shapes)
            for (size_t i = 8, tries = 0; i < len && tries < 4096; tries++) {
                size_t p = 8 + next_u64() % (len - 8 < 512 ? len - 8 : 512);
                if (buf[p] >= '0' && buf[p] <= '9') {
                    buf[p] = (uint8_t)('0' + next_u64() % 10);
                    break;
                }
            }
            break;
        default:  // append junk
            for (int j = 0; j < 16; j++) buf[len++] = (uint8_t)next_u64();
            break;
        }
        run_one(buf, len);
    }
    free(buf);
}

static int run_path(const char *path, int mutations) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "%s: cannot stat\n", path);
        return -1;
    }
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (!d) return -1;
        struct dirent *e;
        int rc = 0;
        while ((e = readdir(d)) && !rc) {
            if (e->d_name[0] == '.') continue;
            char sub[4096];
            if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) continue;
            rc = run_path(sub, mutations);
        }
        closedir(d);
        return rc;
    }
    char *data;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(path, &data, &len, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    run_one((const uint8_t *)data, len);
    mutate_and_run((const uint8_t *)data, len, mutations);
    free(data);
    return 0;
}

int main(int argc, char **argv) {
    int mutations = 200;
    int first = 1;
    if (argc > 2 && strcmp(argv[1], "--mutations") == 0) {
        mutations = atoi(argv[2]);
        first = 3;
    }
    if (first >= argc) {
        fprintf(stderr, "usage: %s [--mutations N] FILE|DIR...\n", argv[0]);
        return 2;
    }
    for (int i = first; i < argc; i++)
        if (run_path(argv[i], mutations)) return 1;
    printf("fuzz driver: %ld inputs, no crash\n", runs);
    return runs > 0 ? 0 : 1;
}
