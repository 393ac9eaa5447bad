// Fuzz target for the protocol message decoder: decodes arbitrary bytes and, when they
// decode, reads every argument through the typed accessors. Built with
// clang -fsanitize=fuzzer when available; test_fuzz_msg.c drives it without libFuzzer.
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "roles/msg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void walk_map(const tr_msg_map *m, int depth);

static void walk_value(const tr_msg_map *m, const char *key, int depth) {
    tr_err e;
    int64_t i;
    uint64_t u;
    double d;
    bool b;
    tr_msg_str s;
    char buf[32];
    tr_tensor_view t;
    tr_msg_map sub;
    tr_msg_array a;
    tr_msg_get_int(m, key, &i, &e);
    tr_msg_get_uint(m, key, &u, &e);
    tr_msg_get_float(m, key, &d, &e);
    tr_msg_get_bool(m, key, &b, &e);
    tr_msg_get_str(m, key, &s, &e);
    tr_msg_get_str_buf(m, key, buf, sizeof buf, &e);
    tr_msg_get_bin(m, key, &s, &e);
    if (tr_msg_get_tensor(m, key, &t, &e) == 0) {
        // Touch every byte the view claims, so a wrong length shows up under ASan.
        volatile uint8_t x = 0;
        for (size_t k = 0; k < t.nbytes; k++) x ^= ((const uint8_t *)t.data)[k];
        (void)x;
    }
    if (depth < 4 && tr_msg_get_map(m, key, &sub, &e) == 0) walk_map(&sub, depth + 1);
    if (tr_msg_get_array(m, key, &a, &e) == 0) {
        for (uint32_t k = 0; k < a.n && k < 64; k++) {
            tr_msg_array_int(&a, k, &i, &e);
            tr_msg_array_float(&a, k, &d, &e);
            tr_msg_array_str(&a, k, &s, &e);
            tr_msg_array_tensor(&a, k, &t, &e);
            if (depth < 4 && tr_msg_array_map(&a, k, &sub, &e) == 0) walk_map(&sub, depth + 1);
        }
    }
}

static void walk_map(const tr_msg_map *m, int depth) {
    for (uint32_t k = 0; k < m->obj->via.map.size && k < 64; k++) {
        const msgpack_object *key = &m->obj->via.map.ptr[k].key;
        char name[64];
        if (key->type != MSGPACK_OBJECT_STR || key->via.str.size >= sizeof name) continue;
        memcpy(name, key->via.str.ptr, key->via.str.size);
        name[key->via.str.size] = '\0';
        walk_value(m, name, depth);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tr_msg m;
    tr_err e;
    if (tr_msg_decode(&m, data, size, 1 << 20, &e) == 0) {
        if (m.args.obj) walk_map(&m.args, 0);
    }
    tr_msg_free(&m);
    return 0;
}
