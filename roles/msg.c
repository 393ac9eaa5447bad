// Encoding and strict decoding of roles protocol messages (docs/protocol.md). The decoder
// first walks the raw msgpack bytes itself, so that msgpack-c never sees a count that does
// not fit in the buffer (it allocates per declared element before reading any).
#include "roles/msg.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

static const char *const dtype_names[TR_DTYPE_COUNT] = {"f32", "bf16", "i32", "i64", "u8"};
static const size_t dtype_sizes[TR_DTYPE_COUNT] = {4, 2, 4, 8, 1};

const char *tr_dtype_name(int dtype) {
    return dtype >= 0 && dtype < TR_DTYPE_COUNT ? dtype_names[dtype] : "?";
}

int tr_dtype_from_name(const char *s, size_t len) {
    for (int i = 0; i < TR_DTYPE_COUNT; i++)
        if (strlen(dtype_names[i]) == len && memcmp(dtype_names[i], s, len) == 0) return i;
    return -1;
}

size_t tr_dtype_size(int dtype) { return dtype >= 0 && dtype < TR_DTYPE_COUNT ? dtype_sizes[dtype] : 0; }

int tr_tensor_view_copy(const tr_tensor_view *t, int dtype, void *dst, size_t cap, const char *what,
                        tr_err *err) {
    if (t->dtype != dtype)
        return tr_errf(err, TR_EINVAL, "%s: expected dtype %s, got %s", what, tr_dtype_name(dtype),
                       tr_dtype_name(t->dtype));
    if (t->nbytes > cap)
        return tr_errf(err, TR_ERANGE, "%s: %zu bytes do not fit in a buffer of %zu", what, t->nbytes, cap);
    if (t->nbytes) memcpy(dst, t->data, t->nbytes);
    return 0;
}

int tr_msg_err_code_from_name(const char *s, size_t len) {
    for (int c = TR_OK + 1; c <= TR_ECANCELED; c++) {
        const char *n = tr_err_code_name(c);
        if (strlen(n) == len && memcmp(n, s, len) == 0) return c;
    }
    return TR_EPEER;
}

// ---- structural check of raw msgpack ----

static uint64_t be_read(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

int tr_msg_check_msgpack(const void *buf, size_t len, tr_err *err) {
    const uint8_t *p = buf;
    size_t pos = 0;
    struct {
        uint64_t left;  // elements still to read; a map of n pairs holds 2n
        bool is_map;
    } stack[TR_MSG_MAX_DEPTH];
    int depth = 0;
    uint64_t objects = 0;
    if (len == 0) return tr_errf(err, TR_EFORMAT, "empty message");
    do {
        if (pos >= len) return tr_errf(err, TR_EFORMAT, "truncated msgpack: object expected at offset %zu", pos);
        bool is_key = depth > 0 && stack[depth - 1].is_map && stack[depth - 1].left % 2 == 0;
        size_t at = pos;
        uint8_t b = p[pos++];
        size_t rest = len - pos;
        int hdr = 0;          // bytes of length/count after the type byte
        uint64_t payload = 0; // bytes of data after the header
        uint64_t count = 0;   // container elements (pairs already doubled)
        bool container = false, map = false, str = false;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        } else if (b >= 0x80 && b <= 0x8f) {
            container = map = true;
            count = 2u * (b & 0x0fu);
        } else if (b >= 0x90 && b <= 0x9f) {
            container = true;
            count = b & 0x0fu;
        } else if (b >= 0xa0 && b <= 0xbf) {
            str = true;
            payload = b & 0x1fu;
        } else {
            switch (b) {
            case 0xc4: hdr = 1; break;                  // bin 8
            case 0xc5: hdr = 2; break;                  // bin 16
            case 0xc6: hdr = 4; break;                  // bin 32
            case 0xca: payload = 4; break;              // float 32
            case 0xcb: payload = 8; break;              // float 64
            case 0xcc: case 0xd0: payload = 1; break;   // (u)int 8
            case 0xcd: case 0xd1: payload = 2; break;
            case 0xce: case 0xd2: payload = 4; break;
            case 0xcf: case 0xd3: payload = 8; break;
            case 0xd9: hdr = 1; str = true; break;      // str 8
            case 0xda: hdr = 2; str = true; break;
            case 0xdb: hdr = 4; str = true; break;
            case 0xdc: hdr = 2; container = true; break;  // array 16
            case 0xdd: hdr = 4; container = true; break;
            case 0xde: hdr = 2; container = map = true; break;  // map 16
            case 0xdf: hdr = 4; container = map = true; break;
            default:
                if (b == 0xc1) return tr_errf(err, TR_EFORMAT, "invalid msgpack type byte 0xc1 at offset %zu", at);
                return tr_errf(err, TR_EFORMAT, "msgpack ext type 0x%02x at offset %zu is not allowed", b, at);
            }
            if ((size_t)hdr > rest)
                return tr_errf(err, TR_EFORMAT, "truncated msgpack header at offset %zu", at);
            if (hdr) {
                uint64_t n = be_read(p + pos, hdr);
                pos += (size_t)hdr;
                rest -= (size_t)hdr;
                if (container)
                    count = map ? 2 * n : n;
                else
                    payload = n;
            }
        }
        if (is_key && !str) return tr_errf(err, TR_EFORMAT, "map key at offset %zu is not a string", at);
        if (++objects > TR_MSG_MAX_OBJECTS)
            return tr_errf(err, TR_ERANGE, "more than %" PRIu64 " msgpack objects", (uint64_t)TR_MSG_MAX_OBJECTS);
        if (payload > rest)
            return tr_errf(err, TR_EFORMAT, "truncated msgpack: %" PRIu64 " bytes declared at offset %zu, %zu left",
                           payload, at, rest);
        pos += (size_t)payload;
        if (container && count > rest)
            return tr_errf(err, TR_EFORMAT,
                           "msgpack container at offset %zu declares %" PRIu64 " elements, only %zu bytes left",
                           at, count, rest);
        if (depth > 0) stack[depth - 1].left--;
        if (container && count > 0) {
            if (depth >= TR_MSG_MAX_DEPTH)
                return tr_errf(err, TR_ERANGE, "msgpack nesting deeper than %d at offset %zu", TR_MSG_MAX_DEPTH, at);
            stack[depth].left = count;
            stack[depth].is_map = map;
            depth++;
        }
        while (depth > 0 && stack[depth - 1].left == 0) depth--;
    } while (depth > 0);
    if (pos != len) return tr_errf(err, TR_EFORMAT, "%zu trailing bytes after the message", len - pos);
    return 0;
}

// ---- accessors ----

static const char *type_name(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_EXT: return "ext";
    }
    return "?";
}

static bool key_is(const msgpack_object *k, const char *key) {
    size_t n = strlen(key);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, key, n) == 0;
}

static const msgpack_object *map_find(const msgpack_object *map, const char *key) {
    for (uint32_t i = 0; i < map->via.map.size; i++)
        if (key_is(&map->via.map.ptr[i].key, key)) return &map->via.map.ptr[i].val;
    return NULL;
}

// Duplicate keys would make "which value wins" depend on the reader, so they are rejected.
static int check_unique_keys(const msgpack_object *map, const char *op, const char *path, tr_err *err) {
    uint32_t n = map->via.map.size;
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *a = &map->via.map.ptr[i].key;
        if (a->type != MSGPACK_OBJECT_STR) return tr_errf(err, TR_EFORMAT, "%s: %s: map key is not a string", op, path);
        for (uint32_t j = i + 1; j < n; j++) {
            const msgpack_object *b = &map->via.map.ptr[j].key;
            if (b->type == MSGPACK_OBJECT_STR && b->via.str.size == a->via.str.size &&
                memcmp(a->via.str.ptr, b->via.str.ptr, a->via.str.size) == 0)
                return tr_errf(err, TR_EFORMAT, "%s: %s: duplicate key '%.*s'", op, path, (int)a->via.str.size,
                               a->via.str.ptr);
        }
    }
    return 0;
}

int tr_msg_map_wrap(tr_msg_map *out, const msgpack_object *obj, const char *op, const char *path,
                    tr_err *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->op, sizeof out->op, "%s", op ? op : "?");
    snprintf(out->path, sizeof out->path, "%s", path ? path : "");
    if (!obj || obj->type != MSGPACK_OBJECT_MAP)
        return tr_errf(err, TR_EFORMAT, "%s: %s: expected map, got %s", out->op, out->path,
                       obj ? type_name(obj) : "nothing");
    if (check_unique_keys(obj, out->op, out->path, err)) return -1;
    out->obj = obj;
    return 0;
}

bool tr_msg_has(const tr_msg_map *m, const char *key) { return m->obj && map_find(m->obj, key) != NULL; }

static int find_req(const tr_msg_map *m, const char *key, const msgpack_object **v, tr_err *err) {
    *v = m->obj ? map_find(m->obj, key) : NULL;
    if (!*v) return tr_errf(err, TR_EINVAL, "%s: %s.%s: missing", m->op, m->path, key);
    return 0;
}

static int wrong_type(const char *op, const char *path, const char *key, const char *want,
                      const msgpack_object *o, tr_err *err) {
    if (key)
        return tr_errf(err, TR_EINVAL, "%s: %s.%s: expected %s, got %s", op, path, key, want, type_name(o));
    return tr_errf(err, TR_EINVAL, "%s: %s: expected %s, got %s", op, path, want, type_name(o));
}

static int obj_int(const msgpack_object *o, int64_t *out) {
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= (uint64_t)INT64_MAX) {
        *out = (int64_t)o->via.u64;
        return 0;
    }
    return -1;
}

static int obj_float(const msgpack_object *o, double *out) {
    if (o->type == MSGPACK_OBJECT_FLOAT32 || o->type == MSGPACK_OBJECT_FLOAT64) {
        *out = o->via.f64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        *out = (double)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = (double)o->via.i64;
        return 0;
    }
    return -1;
}

static int obj_tensor(const msgpack_object *o, tr_tensor_view *t, const char *op, const char *path,
                      const char *key, tr_err *err) {
    const char *k = key ? key : "";
    const char *dot = key ? "." : "";
    if (o->type != MSGPACK_OBJECT_MAP) return wrong_type(op, path, key, "tensor map", o, err);
    if (check_unique_keys(o, op, path, err)) return -1;
    const msgpack_object *dt = map_find(o, "dtype"), *sh = map_find(o, "shape"), *da = map_find(o, "data");
    if (!dt || !sh || !da || o->via.map.size != 3)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s: a tensor is exactly {dtype, shape, data}", op, path, dot, k);
    if (dt->type != MSGPACK_OBJECT_STR)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.dtype: expected str, got %s", op, path, dot, k, type_name(dt));
    memset(t, 0, sizeof *t);
    t->dtype = tr_dtype_from_name(dt->via.str.ptr, dt->via.str.size);
    if (t->dtype < 0)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.dtype: unknown dtype '%.*s' (f32, bf16, i32, i64, u8)", op, path,
                       dot, k, (int)(dt->via.str.size > 16 ? 16 : dt->via.str.size), dt->via.str.ptr);
    if (sh->type != MSGPACK_OBJECT_ARRAY)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.shape: expected array, got %s", op, path, dot, k, type_name(sh));
    if (sh->via.array.size > TR_TENSOR_MAX_DIMS)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.shape: %u dimensions, at most %d", op, path, dot, k,
                       sh->via.array.size, TR_TENSOR_MAX_DIMS);
    t->ndim = (int)sh->via.array.size;
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        const msgpack_object *d = &sh->via.array.ptr[i];
        if (d->type != MSGPACK_OBJECT_POSITIVE_INTEGER || d->via.u64 > ((uint64_t)1 << 48))
            return tr_errf(err, TR_EINVAL, "%s: %s%s%s.shape[%d]: expected a size in [0, 2^48]", op, path, dot, k, i);
        t->shape[i] = (int64_t)d->via.u64;
        if (d->via.u64 && numel > ((uint64_t)1 << 48) / d->via.u64)
            return tr_errf(err, TR_EINVAL, "%s: %s%s%s.shape: more than 2^48 elements", op, path, dot, k);
        numel *= d->via.u64;
    }
    if (da->type != MSGPACK_OBJECT_BIN)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.data: expected bin, got %s", op, path, dot, k, type_name(da));
    uint64_t want = numel * tr_dtype_size(t->dtype);
    if (da->via.bin.size != want)
        return tr_errf(err, TR_EINVAL, "%s: %s%s%s.data: %u bytes, shape and dtype need %" PRIu64, op, path, dot, k,
                       da->via.bin.size, want);
    t->numel = (int64_t)numel;
    t->data = da->via.bin.ptr;
    t->nbytes = da->via.bin.size;
    return 0;
}

int tr_msg_get_int(const tr_msg_map *m, const char *key, int64_t *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (obj_int(v, out)) return wrong_type(m->op, m->path, key, "int", v, err);
    return 0;
}

int tr_msg_get_uint(const tr_msg_map *m, const char *key, uint64_t *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return wrong_type(m->op, m->path, key, "unsigned int", v, err);
    *out = v->via.u64;
    return 0;
}

int tr_msg_get_float(const tr_msg_map *m, const char *key, double *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (obj_float(v, out)) return wrong_type(m->op, m->path, key, "float", v, err);
    return 0;
}

int tr_msg_get_bool(const tr_msg_map *m, const char *key, bool *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_BOOLEAN) return wrong_type(m->op, m->path, key, "bool", v, err);
    *out = v->via.boolean;
    return 0;
}

int tr_msg_get_str(const tr_msg_map *m, const char *key, tr_msg_str *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_STR) return wrong_type(m->op, m->path, key, "str", v, err);
    out->ptr = v->via.str.ptr;
    out->len = v->via.str.size;
    return 0;
}

int tr_msg_get_str_buf(const tr_msg_map *m, const char *key, char *buf, size_t cap, tr_err *err) {
    tr_msg_str s;
    if (tr_msg_get_str(m, key, &s, err)) return -1;
    if (s.len >= cap) return tr_errf(err, TR_ERANGE, "%s: %s.%s: %zu bytes, at most %zu", m->op, m->path, key, s.len, cap - 1);
    if (memchr(s.ptr, '\0', s.len)) return tr_errf(err, TR_EINVAL, "%s: %s.%s: contains a NUL byte", m->op, m->path, key);
    memcpy(buf, s.ptr, s.len);
    buf[s.len] = '\0';
    return 0;
}

int tr_msg_get_bin(const tr_msg_map *m, const char *key, tr_msg_str *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_BIN) return wrong_type(m->op, m->path, key, "bin", v, err);
    out->ptr = v->via.bin.ptr;
    out->len = v->via.bin.size;
    return 0;
}

int tr_msg_get_tensor(const tr_msg_map *m, const char *key, tr_tensor_view *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    return obj_tensor(v, out, m->op, m->path, key, err);
}

// Paths longer than the buffer are cut; they only serve error messages.
static void child_path(char *dst, size_t cap, const char *parent, const char *key) {
    size_t pl = strnlen(parent, cap - 1), kl = strlen(key);
    memcpy(dst, parent, pl);
    size_t n = pl;
    if (n + 1 < cap) dst[n++] = '.';
    if (kl > cap - 1 - n) kl = cap - 1 - n;
    memcpy(dst + n, key, kl);
    dst[n + kl] = '\0';
}

int tr_msg_get_map(const tr_msg_map *m, const char *key, tr_msg_map *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_MAP) return wrong_type(m->op, m->path, key, "map", v, err);
    char path[sizeof out->path];
    child_path(path, sizeof path, m->path, key);
    return tr_msg_map_wrap(out, v, m->op, path, err);
}

int tr_msg_get_array(const tr_msg_map *m, const char *key, tr_msg_array *out, tr_err *err) {
    const msgpack_object *v;
    if (find_req(m, key, &v, err)) return -1;
    if (v->type != MSGPACK_OBJECT_ARRAY) return wrong_type(m->op, m->path, key, "array", v, err);
    memset(out, 0, sizeof *out);
    out->obj = v;
    out->n = v->via.array.size;
    snprintf(out->op, sizeof out->op, "%s", m->op);
    child_path(out->path, sizeof out->path, m->path, key);
    return 0;
}

int tr_msg_get_int_opt(const tr_msg_map *m, const char *key, int64_t *out, tr_err *err) {
    return tr_msg_has(m, key) ? tr_msg_get_int(m, key, out, err) : 0;
}

int tr_msg_get_float_opt(const tr_msg_map *m, const char *key, double *out, tr_err *err) {
    return tr_msg_has(m, key) ? tr_msg_get_float(m, key, out, err) : 0;
}

int tr_msg_get_bool_opt(const tr_msg_map *m, const char *key, bool *out, tr_err *err) {
    return tr_msg_has(m, key) ? tr_msg_get_bool(m, key, out, err) : 0;
}

int tr_msg_check_keys(const tr_msg_map *m, const char *const *keys, tr_err *err) {
    if (!m->obj) return 0;
    for (uint32_t i = 0; i < m->obj->via.map.size; i++) {
        const msgpack_object *k = &m->obj->via.map.ptr[i].key;
        bool known = false;
        for (const char *const *q = keys; *q && !known; q++) known = key_is(k, *q);
        if (!known) {
            int n = k->type == MSGPACK_OBJECT_STR ? (int)(k->via.str.size > 64 ? 64 : k->via.str.size) : 0;
            return tr_errf(err, TR_EINVAL, "%s: %s: unknown key '%.*s'", m->op, m->path, n,
                           n ? k->via.str.ptr : "");
        }
    }
    return 0;
}

static int array_elem(const tr_msg_array *a, uint32_t i, const msgpack_object **o, char *path, size_t cap,
                      tr_err *err) {
    snprintf(path, cap, "%s[%u]", a->path, i);
    if (i >= a->n) return tr_errf(err, TR_ERANGE, "%s: %s: index out of range (array of %u)", a->op, path, a->n);
    *o = &a->obj->via.array.ptr[i];
    return 0;
}

int tr_msg_array_int(const tr_msg_array *a, uint32_t i, int64_t *out, tr_err *err) {
    const msgpack_object *o = NULL;
    char path[128];
    if (array_elem(a, i, &o, path, sizeof path, err)) return -1;
    if (obj_int(o, out)) return wrong_type(a->op, path, NULL, "int", o, err);
    return 0;
}

int tr_msg_array_float(const tr_msg_array *a, uint32_t i, double *out, tr_err *err) {
    const msgpack_object *o = NULL;
    char path[128];
    if (array_elem(a, i, &o, path, sizeof path, err)) return -1;
    if (obj_float(o, out)) return wrong_type(a->op, path, NULL, "float", o, err);
    return 0;
}

int tr_msg_array_str(const tr_msg_array *a, uint32_t i, tr_msg_str *out, tr_err *err) {
    const msgpack_object *o = NULL;
    char path[128];
    if (array_elem(a, i, &o, path, sizeof path, err)) return -1;
    if (o->type != MSGPACK_OBJECT_STR) return wrong_type(a->op, path, NULL, "str", o, err);
    out->ptr = o->via.str.ptr;
    out->len = o->via.str.size;
    return 0;
}

int tr_msg_array_tensor(const tr_msg_array *a, uint32_t i, tr_tensor_view *out, tr_err *err) {
    const msgpack_object *o = NULL;
    char path[128];
    if (array_elem(a, i, &o, path, sizeof path, err)) return -1;
    return obj_tensor(o, out, a->op, path, NULL, err);
}

int tr_msg_array_map(const tr_msg_array *a, uint32_t i, tr_msg_map *out, tr_err *err) {
    const msgpack_object *o = NULL;
    char path[128];
    if (array_elem(a, i, &o, path, sizeof path, err)) return -1;
    if (o->type != MSGPACK_OBJECT_MAP) return wrong_type(a->op, path, NULL, "map", o, err);
    return tr_msg_map_wrap(out, o, a->op, path, err);
}

// ---- decoding ----

static bool valid_op(const char *s, size_t n) {
    if (n == 0 || n >= TR_MSG_OP_MAX || s[0] < 'a' || s[0] > 'z') return false;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return false;
    return true;
}

static int decode_body(tr_msg *m, const msgpack_object *root, size_t len, uint64_t max_bytes, tr_err *err) {
    if (root->type != MSGPACK_OBJECT_MAP)
        return tr_errf(err, TR_EFORMAT, "message is a msgpack %s, expected a map", type_name(root));
    if (check_unique_keys(root, "message", "top level", err)) return -1;
    const msgpack_object *v = map_find(root, "v"), *id = map_find(root, "id"), *op = map_find(root, "op"),
                         *args = map_find(root, "args"), *ok = map_find(root, "ok"),
                         *result = map_find(root, "result"), *error = map_find(root, "error");
    // Read what an error reply needs before anything can fail.
    if (id && id->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        m->id = id->via.u64;
        m->has_id = true;
    }
    if (op && op->type == MSGPACK_OBJECT_STR && valid_op(op->via.str.ptr, op->via.str.size)) {
        memcpy(m->op, op->via.str.ptr, op->via.str.size);
        m->op[op->via.str.size] = '\0';
    }
    if (!v) return tr_errf(err, TR_EFORMAT, "message has no protocol version 'v'");
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return tr_errf(err, TR_EFORMAT, "message: 'v' is a %s, expected int", type_name(v));
    if (v->via.u64 != TR_PROTOCOL_VERSION)
        return tr_errf(err, TR_EUNSUPPORTED, "message speaks protocol version %" PRIu64 ", this peer speaks %d",
                       v->via.u64, TR_PROTOCOL_VERSION);
    m->version = TR_PROTOCOL_VERSION;
    if (len > max_bytes)
        return tr_errf(err, TR_ERANGE, "message of %zu bytes exceeds the maximum of %" PRIu64 " bytes", len, max_bytes);
    if (!id) return tr_errf(err, TR_EFORMAT, "message has no 'id'");
    if (!m->has_id) return tr_errf(err, TR_EFORMAT, "message: 'id' is a %s, expected unsigned int", type_name(id));
    if (op && ok) return tr_errf(err, TR_EFORMAT, "message has both 'op' (request) and 'ok' (reply)");
    if (op) {
        static const char *const keys[] = {"v", "op", "id", "args", NULL};
        if (op->type != MSGPACK_OBJECT_STR) return tr_errf(err, TR_EFORMAT, "request: 'op' is a %s, expected str", type_name(op));
        if (!m->op[0])
            return tr_errf(err, TR_EFORMAT, "request: op '%.*s' is not a valid op name", (int)(op->via.str.size > 40 ? 40 : op->via.str.size),
                           op->via.str.ptr);
        tr_msg_map top;
        top.obj = root;
        snprintf(top.op, sizeof top.op, "%s", m->op);
        snprintf(top.path, sizeof top.path, "request");
        if (tr_msg_check_keys(&top, keys, err)) return -1;
        if (!args) return tr_errf(err, TR_EFORMAT, "%s: request has no 'args'", m->op);
        if (m->id == 0 && strcmp(m->op, "heartbeat") != 0)
            return tr_errf(err, TR_EFORMAT, "%s: request id 0 is reserved for heartbeats", m->op);
        if (tr_msg_map_wrap(&m->args, args, m->op, "args", err)) return -1;
        m->kind = TR_MSG_REQUEST;
        return 0;
    }
    if (!ok) return tr_errf(err, TR_EFORMAT, "message has neither 'op' (request) nor 'ok' (reply)");
    static const char *const keys[] = {"v", "id", "ok", "result", "error", NULL};
    tr_msg_map top;
    top.obj = root;
    snprintf(top.op, sizeof top.op, "reply");
    snprintf(top.path, sizeof top.path, "reply %" PRIu64, m->id);
    if (tr_msg_check_keys(&top, keys, err)) return -1;
    if (ok->type != MSGPACK_OBJECT_BOOLEAN) return tr_errf(err, TR_EFORMAT, "reply %" PRIu64 ": 'ok' is a %s, expected bool", m->id, type_name(ok));
    if (m->id == 0) return tr_errf(err, TR_EFORMAT, "reply with id 0 (reserved for heartbeats)");
    m->ok = ok->via.boolean;
    if (m->ok) {
        if (error) return tr_errf(err, TR_EFORMAT, "reply %" PRIu64 ": ok reply carries an 'error'", m->id);
        if (!result) return tr_errf(err, TR_EFORMAT, "reply %" PRIu64 ": ok reply has no 'result'", m->id);
        if (tr_msg_map_wrap(&m->args, result, "reply", "result", err)) return -1;
    } else {
        if (result) return tr_errf(err, TR_EFORMAT, "reply %" PRIu64 ": error reply carries a 'result'", m->id);
        if (!error) return tr_errf(err, TR_EFORMAT, "reply %" PRIu64 ": error reply has no 'error'", m->id);
        tr_msg_map e;
        static const char *const ekeys[] = {"code", "message", NULL};
        if (tr_msg_map_wrap(&e, error, "reply", "error", err)) return -1;
        if (tr_msg_check_keys(&e, ekeys, err)) return -1;
        tr_msg_str code, msg;
        if (tr_msg_get_str(&e, "code", &code, err) || tr_msg_get_str(&e, "message", &msg, err)) return -1;
        m->remote.code = tr_msg_err_code_from_name(code.ptr, code.len);
        size_t n = msg.len < sizeof m->remote.msg - 1 ? msg.len : sizeof m->remote.msg - 1;
        memcpy(m->remote.msg, msg.ptr, n);
        m->remote.msg[n] = '\0';
    }
    m->kind = TR_MSG_REPLY;
    return 0;
}

int tr_msg_decode(tr_msg *m, const void *buf, size_t len, uint64_t max_bytes, tr_err *err) {
    memset(m, 0, sizeof *m);
    msgpack_unpacked_init(&m->unpacked_);
    if (tr_msg_check_msgpack(buf, len, err)) return -1;
    size_t off = 0;
    msgpack_unpack_return r = msgpack_unpack_next(&m->unpacked_, buf, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len) {
        tr_msg_free(m);
        if (r == MSGPACK_UNPACK_NOMEM_ERROR) return tr_errf(err, TR_ENOMEM, "out of memory decoding a %zu-byte message", len);
        return tr_errf(err, TR_EFORMAT, "msgpack-c rejected the message (%d)", (int)r);
    }
    if (decode_body(m, &m->unpacked_.data, len, max_bytes, err)) {
        bool has_id = m->has_id;
        uint64_t id = m->id;
        char op[TR_MSG_OP_MAX];
        memcpy(op, m->op, sizeof op);
        tr_msg_free(m);
        m->has_id = has_id;
        m->id = id;
        memcpy(m->op, op, sizeof op);
        return -1;
    }
    return 0;
}

void tr_msg_free(tr_msg *m) {
    msgpack_unpacked_destroy(&m->unpacked_);
    memset(m, 0, sizeof *m);
    msgpack_unpacked_init(&m->unpacked_);
}

// ---- encoding ----

void tr_msg_writer_init(tr_msg_writer *w) {
    memset(w, 0, sizeof *w);
    msgpack_sbuffer_init(&w->buf);
    msgpack_packer_init(&w->pk, &w->buf, msgpack_sbuffer_write);
}

void tr_msg_writer_free(tr_msg_writer *w) {
    msgpack_sbuffer_destroy(&w->buf);
    memset(w, 0, sizeof *w);
}

void tr_msg_writer_reset(tr_msg_writer *w) {
    msgpack_sbuffer_clear(&w->buf);
    w->depth = 0;
    w->failed = false;
    tr_err_clear(&w->err);
}

static void wfail(tr_msg_writer *w, int code, const char *fmt, const char *a) {
    if (w->failed) return;
    w->failed = true;
    tr_errf(&w->err, code, fmt, a ? a : "");
}

static void pop_done(tr_msg_writer *w) {
    while (w->depth > 0 && w->stack[w->depth - 1].written == w->stack[w->depth - 1].declared) w->depth--;
}

// Accounts for one value at the current position and packs its key; false if the writer failed.
static bool wslot(tr_msg_writer *w, const char *key) {
    if (w->failed) return false;
    if (w->depth == 0) {
        if (w->buf.size > 0) {
            wfail(w, TR_EINVAL, "msg writer: value '%s' after the message was complete", key);
            return false;
        }
        if (key) {
            wfail(w, TR_EINVAL, "msg writer: key '%s' outside any map", key);
            return false;
        }
        return true;
    }
    tr_msg_frame *top = &w->stack[w->depth - 1];
    if (top->written >= top->declared) {
        wfail(w, TR_EINVAL, "msg writer: container overflow at '%s'", key);
        return false;
    }
    if (top->is_map != (key != NULL)) {
        wfail(w, TR_EINVAL, top->is_map ? "msg writer: value without a key in a map%s" : "msg writer: key '%s' inside an array",
              key);
        return false;
    }
    top->written++;
    if (key) {
        size_t n = strlen(key);
        if (msgpack_pack_str(&w->pk, n) || msgpack_pack_str_body(&w->pk, key, n)) {
            wfail(w, TR_ENOMEM, "msg writer: out of memory at '%s'", key);
            return false;
        }
    }
    return true;
}

static void wdone(tr_msg_writer *w, int rc, const char *key) {
    if (rc) wfail(w, TR_ENOMEM, "msg writer: out of memory at '%s'", key);
    else pop_done(w);
}

static void wpush(tr_msg_writer *w, bool is_map, uint32_t n, const char *key) {
    if (w->failed) return;
    if (w->depth >= TR_MSG_MAX_DEPTH) {
        wfail(w, TR_ERANGE, "msg writer: nesting too deep at '%s'", key);
        return;
    }
    w->stack[w->depth].is_map = is_map;
    w->stack[w->depth].declared = n;
    w->stack[w->depth].written = 0;
    w->depth++;
    pop_done(w);
}

void tr_msg_put_int(tr_msg_writer *w, const char *key, int64_t v) {
    if (wslot(w, key)) wdone(w, msgpack_pack_int64(&w->pk, v), key);
}

void tr_msg_put_uint(tr_msg_writer *w, const char *key, uint64_t v) {
    if (wslot(w, key)) wdone(w, msgpack_pack_uint64(&w->pk, v), key);
}

void tr_msg_put_float(tr_msg_writer *w, const char *key, double v) {
    if (wslot(w, key)) wdone(w, msgpack_pack_double(&w->pk, v), key);
}

void tr_msg_put_bool(tr_msg_writer *w, const char *key, bool v) {
    if (wslot(w, key)) wdone(w, v ? msgpack_pack_true(&w->pk) : msgpack_pack_false(&w->pk), key);
}

void tr_msg_put_nil(tr_msg_writer *w, const char *key) {
    if (wslot(w, key)) wdone(w, msgpack_pack_nil(&w->pk), key);
}

void tr_msg_put_strn(tr_msg_writer *w, const char *key, const char *s, size_t len) {
    if (len > UINT32_MAX) {
        wfail(w, TR_ERANGE, "msg writer: string '%s' longer than 4 GiB", key);
        return;
    }
    if (wslot(w, key)) wdone(w, msgpack_pack_str(&w->pk, len) || msgpack_pack_str_body(&w->pk, s, len), key);
}

void tr_msg_put_str(tr_msg_writer *w, const char *key, const char *s) { tr_msg_put_strn(w, key, s, strlen(s)); }

void tr_msg_put_bin(tr_msg_writer *w, const char *key, const void *data, size_t len) {
    if (len > UINT32_MAX) {
        wfail(w, TR_ERANGE, "msg writer: bin '%s' longer than 4 GiB", key);
        return;
    }
    if (wslot(w, key)) wdone(w, msgpack_pack_bin(&w->pk, len) || msgpack_pack_bin_body(&w->pk, data, len), key);
}

void tr_msg_put_map(tr_msg_writer *w, const char *key, uint32_t n) {
    if (!wslot(w, key)) return;
    if (msgpack_pack_map(&w->pk, n)) {
        wfail(w, TR_ENOMEM, "msg writer: out of memory at '%s'", key);
        return;
    }
    wpush(w, true, n, key);
}

void tr_msg_put_array(tr_msg_writer *w, const char *key, uint32_t n) {
    if (!wslot(w, key)) return;
    if (msgpack_pack_array(&w->pk, n)) {
        wfail(w, TR_ENOMEM, "msg writer: out of memory at '%s'", key);
        return;
    }
    wpush(w, false, n, key);
}

void tr_msg_put_tensor(tr_msg_writer *w, const char *key, int dtype, int ndim, const int64_t *shape,
                       const void *data) {
    if (w->failed) return;
    if (dtype < 0 || dtype >= TR_DTYPE_COUNT) {
        wfail(w, TR_EINVAL, "msg writer: tensor '%s' has an unknown dtype", key);
        return;
    }
    if (ndim < 0 || ndim > TR_TENSOR_MAX_DIMS) {
        wfail(w, TR_EINVAL, "msg writer: tensor '%s' has too many dimensions", key);
        return;
    }
    uint64_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || (uint64_t)shape[i] > ((uint64_t)1 << 48) ||
            (shape[i] && numel > ((uint64_t)1 << 48) / (uint64_t)shape[i])) {
            wfail(w, TR_EINVAL, "msg writer: tensor '%s' has a negative or huge shape", key);
            return;
        }
        numel *= (uint64_t)shape[i];
    }
    uint64_t nbytes = numel * tr_dtype_size(dtype);
    if (nbytes && !data) {
        wfail(w, TR_EINVAL, "msg writer: tensor '%s' has no data", key);
        return;
    }
    tr_msg_put_map(w, key, 3);
    tr_msg_put_str(w, "dtype", tr_dtype_name(dtype));
    tr_msg_put_array(w, "shape", (uint32_t)ndim);
    for (int i = 0; i < ndim; i++) tr_msg_put_int(w, NULL, shape[i]);
    tr_msg_put_bin(w, "data", data, (size_t)nbytes);
}

void tr_msg_begin_request(tr_msg_writer *w, const char *op, uint64_t id, uint32_t n_args) {
    if (!valid_op(op, strlen(op))) {
        wfail(w, TR_EINVAL, "msg writer: '%s' is not a valid op name", op);
        return;
    }
    tr_msg_put_map(w, NULL, 4);
    tr_msg_put_uint(w, "v", TR_PROTOCOL_VERSION);
    tr_msg_put_str(w, "op", op);
    tr_msg_put_uint(w, "id", id);
    tr_msg_put_map(w, "args", n_args);
}

void tr_msg_begin_reply(tr_msg_writer *w, uint64_t id, uint32_t n_results) {
    tr_msg_put_map(w, NULL, 4);
    tr_msg_put_uint(w, "v", TR_PROTOCOL_VERSION);
    tr_msg_put_uint(w, "id", id);
    tr_msg_put_bool(w, "ok", true);
    tr_msg_put_map(w, "result", n_results);
}

void tr_msg_put_error_reply(tr_msg_writer *w, uint64_t id, int code, const char *message) {
    tr_msg_put_map(w, NULL, 4);
    tr_msg_put_uint(w, "v", TR_PROTOCOL_VERSION);
    tr_msg_put_uint(w, "id", id);
    tr_msg_put_bool(w, "ok", false);
    tr_msg_put_map(w, "error", 2);
    tr_msg_put_str(w, "code", tr_err_code_name(code == TR_OK ? TR_EPEER : code));
    tr_msg_put_str(w, "message", message ? message : "");
}

int tr_msg_writer_finish(tr_msg_writer *w, const void **data, size_t *len, tr_err *err) {
    if (w->failed) {
        if (err) *err = w->err;
        return -1;
    }
    if (w->buf.size == 0) return tr_errf(err, TR_EINVAL, "msg writer: empty message");
    if (w->depth != 0)
        return tr_errf(err, TR_EINVAL, "msg writer: %u of %u elements written in an open container",
                       w->stack[w->depth - 1].written, w->stack[w->depth - 1].declared);
    *data = w->buf.data;
    *len = w->buf.size;
    return 0;
}
