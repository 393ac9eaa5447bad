// Plain driver for fuzz_msg.c (no libFuzzer needed): random valid messages from the writer,
// every truncation of them, byte-level mutations and random bytes all go through the fuzz
// target. Checks: generated messages decode, truncations never do, and whenever the
// decoder's own msgpack walk accepts bytes, msgpack-c (the independent parser) parses them
// completely too. Under ASan (CI) this also checks memory safety on all those inputs.
#include <stdint.h>
#include <string.h>

#include "roles/msg.h"
#include "tests/test.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static uint32_t rndn(uint32_t n) { return (uint32_t)(rnd() % n); }

static void gen_value(tr_msg_writer *w, const char *key, int depth) {
    static const char *const words[] = {"", "a", "tokens", "héllo wörld", "x/y", "0123456789abcdefghijklmnopqrstuvwxyz"};
    int kind = (int)rndn(depth < 3 ? 10 : 7);
    switch (kind) {
    case 0: tr_msg_put_int(w, key, (int64_t)rnd()); break;
    case 1: tr_msg_put_int(w, key, (int64_t)rndn(300) - 150); break;
    case 2: tr_msg_put_float(w, key, (double)(int64_t)rnd() / 1e9); break;
    case 3: tr_msg_put_bool(w, key, rndn(2)); break;
    case 4: tr_msg_put_str(w, key, words[rndn(6)]); break;
    case 5: tr_msg_put_nil(w, key); break;
    case 6: {
        uint8_t data[9 * 8];  // up to 3 x 3 elements of 8 bytes
        for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)rnd();
        int dtype = (int)rndn(TR_DTYPE_COUNT);
        int ndim = (int)rndn(3);
        int64_t shape[2] = {1, 1};
        for (int i = 0; i < ndim; i++) shape[i] = rndn(4);
        tr_msg_put_tensor(w, key, dtype, ndim, shape, data);
        break;
    }
    case 7: {
        uint32_t n = rndn(4);
        tr_msg_put_map(w, key, n);
        for (uint32_t i = 0; i < n; i++) {
            char k[8];
            snprintf(k, sizeof k, "k%u", i);
            gen_value(w, k, depth + 1);
        }
        break;
    }
    default: {
        uint32_t n = rndn(5);
        tr_msg_put_array(w, key, n);
        for (uint32_t i = 0; i < n; i++) gen_value(w, NULL, depth + 1);
        break;
    }
    }
}

static void gen_message(tr_msg_writer *w) {
    static const char *const ops[] = {"generate", "logprobs", "train", "score", "hello", "shutdown"};
    uint32_t n = rndn(6);
    int shape = (int)rndn(4);
    if (shape == 0) {
        tr_msg_put_error_reply(w, 1 + rndn(1000), 1 + (int)rndn(TR_ECANCELED), "something failed");
        return;
    }
    if (shape == 1) tr_msg_begin_reply(w, 1 + rnd() % 1000000, n);
    else tr_msg_begin_request(w, ops[rndn(6)], 1 + rnd() % 1000000, n);
    for (uint32_t i = 0; i < n; i++) {
        char k[8];
        snprintf(k, sizeof k, "a%u", i);
        gen_value(w, k, 0);
    }
}

static int check_failures;  // inputs where the checker accepted but msgpack-c did not

static void run_input(const uint8_t *b, size_t n) {
    LLVMFuzzerTestOneInput(b, n);
    tr_err e;
    if (tr_msg_check_msgpack(b, n, &e) == 0) {
        msgpack_unpacked u;
        msgpack_unpacked_init(&u);
        size_t off = 0;
        msgpack_unpack_return r = msgpack_unpack_next(&u, (const char *)b, n, &off);
        if (r != MSGPACK_UNPACK_SUCCESS || off != n) check_failures++;
        msgpack_unpacked_destroy(&u);
    }
}

static void mutate(uint8_t *b, size_t *n, size_t cap) {
    int k = (int)rndn(5);
    if (*n == 0) k = 3;
    size_t at = *n ? rndn((uint32_t)*n) : 0;
    switch (k) {
    case 0: b[at] ^= (uint8_t)(1u << rndn(8)); break;
    case 1: b[at] = (uint8_t)rnd(); break;
    case 2:  // delete one byte
        memmove(b + at, b + at + 1, *n - at - 1);
        (*n)--;
        break;
    case 3:  // insert one byte
        if (*n < cap) {
            memmove(b + at + 1, b + at, *n - at);
            b[at] = (uint8_t)rnd();
            (*n)++;
        }
        break;
    default: {  // interesting header bytes: huge counts and lengths
        static const uint8_t hot[] = {0xdd, 0xdf, 0xdb, 0xc6, 0xff, 0x00, 0xc1, 0xd4, 0x9f, 0x8f};
        b[at] = hot[rndn(sizeof hot)];
        break;
    }
    }
}

int main(void) {
    enum { N_MSG = 3000, N_MUT = 50, N_RANDOM = 20000 };
    int decode_failures = 0, prefix_accepted = 0;
    uint8_t *buf = malloc(1 << 16), *mut = malloc(1 << 16);
    for (int it = 0; it < N_MSG; it++) {
        tr_msg_writer w;
        tr_msg_writer_init(&w);
        gen_message(&w);
        const void *d;
        size_t n;
        tr_err e;
        if (tr_msg_writer_finish(&w, &d, &n, &e) || n > (1 << 15)) {
            fprintf(stderr, "generator: %s\n", e.msg);
            decode_failures++;
            tr_msg_writer_free(&w);
            continue;
        }
        memcpy(buf, d, n);
        tr_msg_writer_free(&w);
        tr_msg m;
        if (tr_msg_decode(&m, buf, n, 1 << 20, &e) != 0) {
            fprintf(stderr, "generated message %d does not decode: %s\n", it, e.msg);
            decode_failures++;
        }
        tr_msg_free(&m);
        run_input(buf, n);
        for (size_t p = 0; p < n; p++) {
            if (tr_msg_decode(&m, buf, p, 1 << 20, &e) == 0) prefix_accepted++;
            tr_msg_free(&m);
            LLVMFuzzerTestOneInput(buf, p);
        }
        for (int k = 0; k < N_MUT; k++) {
            size_t mn = n;
            memcpy(mut, buf, n);
            int rounds = 1 + (int)rndn(4);
            for (int r = 0; r < rounds; r++) mutate(mut, &mn, 1 << 16);
            run_input(mut, mn);
        }
    }
    for (int it = 0; it < N_RANDOM; it++) {
        size_t n = rndn(64);
        for (size_t i = 0; i < n; i++) mut[i] = (uint8_t)rnd();
        if (n) mut[0] = (uint8_t)(0x80 | rndn(16));  // mostly maps, so decoding gets past the first byte
        run_input(mut, n);
    }
    CHECKF(decode_failures == 0, "%d generated messages failed", decode_failures);
    CHECKF(prefix_accepted == 0, "%d truncated messages were accepted", prefix_accepted);
    CHECKF(check_failures == 0, "%d inputs accepted by the structural check but not by msgpack-c", check_failures);
    free(buf);
    free(mut);
    return tr_test_summary("test_fuzz_msg");
}
