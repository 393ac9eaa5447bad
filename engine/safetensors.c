// safetensors reader (mmap + full validation, the same rules as the reference Rust crate:
// offsets must tile the data section exactly, byte sizes must match shapes) and writer.
#include "engine/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

static const struct {
    const char *name;
    enum tr_st_dtype dtype;
    size_t size;
} dtypes[] = {
    {"BOOL", TR_ST_BOOL, 1},         {"U8", TR_ST_U8, 1},   {"I8", TR_ST_I8, 1},
    {"I16", TR_ST_I16, 2},           {"U16", TR_ST_U16, 2}, {"F16", TR_ST_F16, 2},
    {"BF16", TR_ST_BF16, 2},         {"I32", TR_ST_I32, 4}, {"U32", TR_ST_U32, 4},
    {"F32", TR_ST_F32, 4},           {"I64", TR_ST_I64, 8}, {"U64", TR_ST_U64, 8},
    {"F64", TR_ST_F64, 8},           {"F8_E4M3", TR_ST_F8_E4M3, 1},
    {"F8_E5M2", TR_ST_F8_E5M2, 1},
};
#define N_DTYPES (sizeof dtypes / sizeof dtypes[0])

const char *tr_st_dtype_name(enum tr_st_dtype dtype) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].name;
    return "?";
}

int tr_st_dtype_parse(const char *name, enum tr_st_dtype *dtype) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            *dtype = dtypes[i].dtype;
            return 0;
        }
    return -1;
}

size_t tr_st_dtype_size(enum tr_st_dtype dtype) {
    for (size_t i = 0; i < N_DTYPES; i++)
        if (dtypes[i].dtype == dtype) return dtypes[i].size;
    return 0;
}

// ---------------------------------------------------------------------------------------
// Number conversions

uint16_t tr_f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // torch's canonical NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float tr_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

float tr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        // Zero or subnormal: mant * 2^-24 is exact in fp32.
        float v = (float)mant * 0x1p-24f;
        memcpy(&bits, &v, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

// ---------------------------------------------------------------------------------------
// Reading

static uint64_t read_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

// Bottom-up merge sort of tensor indices: qsort has no context argument, and a file-scope
// context would make opening files on several threads unsafe.
static void sort_indices(const tr_st_file *f, int32_t *idx, int32_t *tmp, int32_t n,
                         int (*cmp)(const tr_st_file *, int32_t, int32_t)) {
    for (int32_t width = 1; width < n; width *= 2) {
        for (int32_t lo = 0; lo < n; lo += 2 * width) {
            int32_t mid = lo + width < n ? lo + width : n;
            int32_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            int32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) tmp[k++] = cmp(f, idx[j], idx[i]) < 0 ? idx[j++] : idx[i++];
            while (i < mid) tmp[k++] = idx[i++];
            while (j < hi) tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)n * sizeof *idx);
    }
}

static int offset_cmp(const tr_st_file *f, int32_t a, int32_t b) {
    const tr_st_tensor *x = &f->tensors[a], *y = &f->tensors[b];
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

static int name_cmp(const tr_st_file *f, int32_t a, int32_t b) {
    return strcmp(f->tensors[a].name, f->tensors[b].name);
}

static int shape_text(const tr_st_tensor *t, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf + used, n - used, "[");
    for (int32_t d = 0; d < t->ndim && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < n) snprintf(buf + used, n - used, "]");
    return 0;
}

// Reads one header entry into t; errors name the file, the tensor and the JSON position.
static int parse_entry(tr_st_file *f, const tr_json *v, tr_st_tensor *t, tr_err *err) {
    const char *name = v->key;
    if (strlen(name) != v->key_len || v->key_len == 0)
        return tr_errf(err, TR_EFORMAT, "%s: header:%d:%d: tensor name is empty or holds a NUL",
                       f->path, v->line, v->col);
    t->name = name;
    if (v->type != TR_JSON_OBJECT)
        return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': header:%d:%d: expected an object, got %s",
                       f->path, name, v->line, v->col, tr_json_type_name(v->type));
    const tr_json *dt = tr_json_get(v, "dtype"), *sh = tr_json_get(v, "shape"),
                  *off = tr_json_get(v, "data_offsets");
    if (!dt || !sh || !off)
        return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': header:%d:%d: missing '%s'", f->path, name,
                       v->line, v->col, !dt ? "dtype" : !sh ? "shape" : "data_offsets");
    if (dt->type != TR_JSON_STRING || tr_st_dtype_parse(dt->str, &t->dtype))
        return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': header:%d:%d: unknown dtype %s%s%s",
                       f->path, name, dt->line, dt->col, dt->type == TR_JSON_STRING ? "'" : "",
                       dt->type == TR_JSON_STRING ? dt->str : tr_json_type_name(dt->type),
                       dt->type == TR_JSON_STRING ? "'" : "");
    if (sh->type != TR_JSON_ARRAY)
        return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': header:%d:%d: shape must be an array",
                       f->path, name, sh->line, sh->col);
    if (sh->count > TR_ST_MAX_DIMS)
        return tr_errf(err, TR_EUNSUPPORTED, "%s: tensor '%s': %d dimensions (at most %d supported)",
                       f->path, name, sh->count, TR_ST_MAX_DIMS);
    t->ndim = sh->count;
    uint64_t numel = 1;
    int32_t d = 0;
    for (const tr_json *e = sh->child; e; e = e->next, d++) {
        if (e->type != TR_JSON_NUMBER || !e->is_int || e->inum < 0)
            return tr_errf(err, TR_EFORMAT,
                           "%s: tensor '%s': header:%d:%d: shape entries must be non-negative "
                           "integers", f->path, name, e->line, e->col);
        t->shape[d] = e->inum;
        uint64_t dim = (uint64_t)e->inum;
        if (dim && numel > UINT64_MAX / dim)
            return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': element count overflows", f->path,
                           name);
        numel *= dim;
    }
    t->numel = numel;
    if (off->type != TR_JSON_ARRAY || off->count != 2 || off->child->type != TR_JSON_NUMBER ||
        !off->child->is_int || off->child->inum < 0 || off->child->next->type != TR_JSON_NUMBER ||
        !off->child->next->is_int || off->child->next->inum < 0)
        return tr_errf(err, TR_EFORMAT,
                       "%s: tensor '%s': header:%d:%d: data_offsets must be two non-negative "
                       "integers", f->path, name, off->line, off->col);
    t->begin = (uint64_t)off->child->inum;
    t->end = (uint64_t)off->child->next->inum;
    if (t->end < t->begin)
        return tr_errf(err, TR_EFORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before they "
                       "begin", f->path, name, (unsigned long long)t->begin,
                       (unsigned long long)t->end);
    size_t es = tr_st_dtype_size(t->dtype);
    char shp[256];
    shape_text(t, shp, sizeof shp);
    if (numel > UINT64_MAX / es || numel * es != t->end - t->begin)
        return tr_errf(err, TR_EFORMAT,
                       "%s: tensor '%s': shape %s of %s needs %llu bytes but data_offsets [%llu, "
                       "%llu] span %llu", f->path, name, shp, tr_st_dtype_name(t->dtype),
                       numel > UINT64_MAX / es ? 0ull : (unsigned long long)(numel * es),
                       (unsigned long long)t->begin, (unsigned long long)t->end,
                       (unsigned long long)(t->end - t->begin));
    if (t->end > f->data_len)
        return tr_errf(err, TR_EFORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the data section "
                       "(%llu bytes; file truncated?)", f->path, name, (unsigned long long)t->begin,
                       (unsigned long long)t->end, (unsigned long long)f->data_len);
    t->data = f->data + t->begin;
    return 0;
}

static int parse_header(tr_st_file *f, const unsigned char *buf, size_t len, tr_err *err) {
    if (len < 8)
        return tr_errf(err, TR_EFORMAT, "%s: %zu bytes, too short for the 8-byte header length "
                       "(not a safetensors file?)", f->path, len);
    uint64_t n = read_le64(buf);
    if (n > TR_ST_MAX_HEADER)
        return tr_errf(err, TR_EFORMAT, "%s: header length %llu exceeds the %llu-byte limit "
                       "(not a safetensors file?)", f->path, (unsigned long long)n,
                       (unsigned long long)TR_ST_MAX_HEADER);
    if (n > len - 8)
        return tr_errf(err, TR_EFORMAT, "%s: header length %llu is larger than the file "
                       "(%zu bytes; truncated?)", f->path, (unsigned long long)n, len);
    if (n < 2 || buf[8] != '{')
        return tr_errf(err, TR_EFORMAT, "%s: header does not start with '{'", f->path);
    char hname[4200];
    snprintf(hname, sizeof hname, "%s: header", f->path);
    if (tr_json_parse(&f->header, (const char *)buf + 8, (size_t)n, hname, err)) return -1;
    const tr_json *root = f->header.root;
    if (root->type != TR_JSON_OBJECT)
        return tr_errf(err, TR_EFORMAT, "%s: header is not a JSON object", f->path);
    f->data = buf + 8 + n;
    f->data_len = len - 8 - n;

    int32_t count = 0;
    for (const tr_json *m = root->child; m; m = m->next) {
        if (strcmp(m->key, "__metadata__") == 0 && m->key_len == 12) {
            if (m->type != TR_JSON_OBJECT)
                return tr_errf(err, TR_EFORMAT, "%s: header:%d:%d: __metadata__ must be an object",
                               f->path, m->line, m->col);
            for (const tr_json *e = m->child; e; e = e->next)
                if (e->type != TR_JSON_STRING)
                    return tr_errf(err, TR_EFORMAT,
                                   "%s: header:%d:%d: __metadata__ value '%s' must be a string",
                                   f->path, e->line, e->col, e->key);
            f->metadata = m;
        } else {
            count++;
        }
    }
    f->tensors = calloc(count ? (size_t)count : 1, sizeof *f->tensors);
    f->by_name = calloc(count ? (size_t)count : 1, sizeof *f->by_name);
    int32_t *tmp = calloc(count ? (size_t)count : 1, sizeof *tmp);
    int32_t *order = calloc(count ? (size_t)count : 1, sizeof *order);
    if (!f->tensors || !f->by_name || !tmp || !order) {
        free(tmp);
        free(order);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory for %d tensor entries", f->path, count);
    }
    int rc = 0;
    for (const tr_json *m = root->child; m && !rc; m = m->next) {
        if (m == f->metadata) continue;
        rc = parse_entry(f, m, &f->tensors[f->n_tensors], err);
        if (!rc) f->n_tensors++;
    }
    if (!rc) {
        // The tensors must tile the data section exactly: sorted by offset, each begins
        // where the previous ended, and the last ends at the end of the file.
        for (int32_t i = 0; i < count; i++) order[i] = i;
        sort_indices(f, order, tmp, count, offset_cmp);
        uint64_t pos = 0;
        for (int32_t i = 0; i < count && !rc; i++) {
            const tr_st_tensor *t = &f->tensors[order[i]];
            if (t->begin < pos)
                rc = tr_errf(err, TR_EFORMAT, "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu)",
                             f->path, f->tensors[order[i - 1]].name, t->name,
                             (unsigned long long)t->begin, (unsigned long long)pos);
            else if (t->begin > pos)
                rc = tr_errf(err, TR_EFORMAT, "%s: tensor '%s': %llu unused bytes before its data "
                             "(data_offsets must be contiguous)", f->path, t->name,
                             (unsigned long long)(t->begin - pos));
            pos = t->end;
        }
        if (!rc && pos != f->data_len)
            rc = tr_errf(err, TR_EFORMAT, "%s: %llu bytes after the last tensor's data "
                         "(header lies about sizes?)", f->path,
                         (unsigned long long)(f->data_len - pos));
    }
    if (!rc) {
        for (int32_t i = 0; i < count; i++) f->by_name[i] = i;
        sort_indices(f, f->by_name, tmp, count, name_cmp);
    }
    free(tmp);
    free(order);
    return rc;
}

int tr_st_parse(tr_st_file *f, const void *buf, size_t len, const char *name, tr_err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", name ? name : "<safetensors>");
    if (parse_header(f, buf, len, err)) {
        tr_st_close(f);
        return -1;
    }
    return 0;
}

int tr_st_open(tr_st_file *f, const char *path, tr_err *err) {
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tr_errf(err, TR_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return tr_errf(err, TR_EIO, "%s: not a regular file", path);
    }
    size_t len = (size_t)st.st_size;
    if (len < 8) {
        close(fd);
        return tr_errf(err, TR_EFORMAT, "%s: %zu bytes, too short for the 8-byte header length "
                       "(not a safetensors file?)", path, len);
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) return tr_errf(err, TR_EIO, "%s: cannot map: %s", path, strerror(e));
    if (parse_header(f, map, len, err)) {
        munmap(map, len);
        tr_st_close(f);
        return -1;
    }
    f->map = map;
    f->map_len = len;
    return 0;
}

void tr_st_close(tr_st_file *f) {
    if (!f) return;
    if (f->map) munmap(f->map, f->map_len);
    tr_json_free(&f->header);
    free(f->tensors);
    free(f->by_name);
    f->map = NULL;
    f->tensors = NULL;
    f->by_name = NULL;
    f->n_tensors = 0;
    f->metadata = NULL;
}

const tr_st_tensor *tr_st_find(const tr_st_file *f, const char *name) {
    int32_t lo = 0, hi = f->n_tensors;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[f->by_name[mid]].name, name);
        if (c == 0) return &f->tensors[f->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *tr_st_metadata(const tr_st_file *f, const char *key) {
    const tr_json *v = tr_json_get(f->metadata, key);
    return v && v->type == TR_JSON_STRING ? v->str : NULL;
}

int tr_st_read_f32(const tr_st_file *f, const tr_st_tensor *t, float *out, tr_err *err) {
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case TR_ST_F32: memcpy(out, p, t->numel * 4); return 0;
    case TR_ST_BF16:
        if ((uintptr_t)p % 2 == 0) {
            // The usual case: aligned data converts in one pass the compiler can vectorize
            // (the project builds with -fno-strict-aliasing).
            const uint16_t *h = (const uint16_t *)(const void *)p;
            uint32_t *u = (uint32_t *)(void *)out;
            for (uint64_t i = 0; i < t->numel; i++) u[i] = (uint32_t)h[i] << 16;
            return 0;
        }
        for (uint64_t i = 0; i < t->numel; i++) {  // a hostile file may misalign the data
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = tr_bf16_to_f32(h);
        }
        return 0;
    case TR_ST_F16:
        for (uint64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = tr_f16_to_f32(h);
        }
        return 0;
    case TR_ST_F64:
        for (uint64_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            out[i] = (float)d;
        }
        return 0;
    default:
        return tr_errf(err, TR_EUNSUPPORTED, "%s: tensor '%s': dtype %s cannot be read as floats "
                       "(F32, BF16, F16 or F64 expected)", f->path, t->name,
                       tr_st_dtype_name(t->dtype));
    }
}

int tr_st_read_i64(const tr_st_file *f, const tr_st_tensor *t, int64_t *out, tr_err *err) {
    const unsigned char *p = t->data;
    size_t es = tr_st_dtype_size(t->dtype);
    switch (t->dtype) {
    case TR_ST_BOOL: case TR_ST_U8: case TR_ST_I8: case TR_ST_I16: case TR_ST_U16:
    case TR_ST_I32: case TR_ST_U32: case TR_ST_I64: case TR_ST_U64: break;
    default:
        return tr_errf(err, TR_EUNSUPPORTED, "%s: tensor '%s': dtype %s cannot be read as "
                       "integers", f->path, t->name, tr_st_dtype_name(t->dtype));
    }
    for (uint64_t i = 0; i < t->numel; i++) {
        const unsigned char *q = p + es * i;
        switch (t->dtype) {
        case TR_ST_BOOL:
        case TR_ST_U8: out[i] = q[0]; break;
        case TR_ST_I8: out[i] = (int8_t)q[0]; break;
        case TR_ST_I16: { int16_t v; memcpy(&v, q, 2); out[i] = v; break; }
        case TR_ST_U16: { uint16_t v; memcpy(&v, q, 2); out[i] = v; break; }
        case TR_ST_I32: { int32_t v; memcpy(&v, q, 4); out[i] = v; break; }
        case TR_ST_U32: { uint32_t v; memcpy(&v, q, 4); out[i] = v; break; }
        case TR_ST_I64: { int64_t v; memcpy(&v, q, 8); out[i] = v; break; }
        case TR_ST_U64: {
            uint64_t v;
            memcpy(&v, q, 8);
            if (v > (uint64_t)INT64_MAX)
                return tr_errf(err, TR_ERANGE, "%s: tensor '%s': element %llu (%llu) does not fit "
                               "in int64", f->path, t->name, (unsigned long long)i,
                               (unsigned long long)v);
            out[i] = (int64_t)v;
            break;
        }
        default: break;
        }
    }
    return 0;
}

// ---------------------------------------------------------------------------------------
// Writing

uint64_t tr_st_entry_bytes(const tr_st_entry *e, enum tr_st_dtype dtype) {
    uint64_t n = tr_st_dtype_size(dtype);
    for (int32_t d = 0; d < e->ndim; d++) n *= (uint64_t)e->shape[d];
    return n;
}

static int write_bf16(tr_file_writer *w, const float *x, uint64_t n, tr_err *err) {
    uint16_t buf[8192];
    for (uint64_t i = 0; i < n;) {
        uint64_t k = n - i < 8192 ? n - i : 8192;
        for (uint64_t j = 0; j < k; j++) buf[j] = tr_f32_to_bf16(x[i + j]);
        if (tr_file_writer_write(w, buf, (size_t)k * 2, err)) return -1;
        i += k;
    }
    return 0;
}

int tr_st_save(const char *path, const tr_st_entry *entries, int32_t n, enum tr_st_dtype dtype,
               const char *const *meta_kv, int32_t n_meta, tr_err *err) {
    if (dtype != TR_ST_F32 && dtype != TR_ST_BF16)
        return tr_errf(err, TR_EUNSUPPORTED, "%s: can only write F32 or BF16, not %s", path,
                       tr_st_dtype_name(dtype));
    for (int32_t i = 0; i < n; i++) {
        const tr_st_entry *e = &entries[i];
        if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0)
            return tr_errf(err, TR_EINVAL, "%s: tensor %d has an invalid name", path, i);
        if (e->ndim < 0 || e->ndim > TR_ST_MAX_DIMS)
            return tr_errf(err, TR_EINVAL, "%s: tensor '%s': %d dimensions", path, e->name, e->ndim);
        for (int32_t d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0)
                return tr_errf(err, TR_EINVAL, "%s: tensor '%s': negative dimension", path, e->name);
        for (int32_t j = 0; j < i; j++)
            if (strcmp(entries[j].name, e->name) == 0)
                return tr_errf(err, TR_EINVAL, "%s: tensor '%s' given twice", path, e->name);
    }
    tr_json_writer jw;
    tr_json_writer_init(&jw, 0);
    tr_json_begin_object(&jw);
    if (n_meta > 0) {
        tr_json_key(&jw, "__metadata__");
        tr_json_begin_object(&jw);
        for (int32_t i = 0; i < n_meta; i++) {
            tr_json_key(&jw, meta_kv[2 * i]);
            tr_json_string(&jw, meta_kv[2 * i + 1]);
        }
        tr_json_end_object(&jw);
    }
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        const tr_st_entry *e = &entries[i];
        uint64_t bytes = tr_st_entry_bytes(e, dtype);
        tr_json_key(&jw, e->name);
        tr_json_begin_object(&jw);
        tr_json_key(&jw, "dtype");
        tr_json_string(&jw, tr_st_dtype_name(dtype));
        tr_json_key(&jw, "shape");
        tr_json_begin_array(&jw);
        for (int32_t d = 0; d < e->ndim; d++) tr_json_int(&jw, e->shape[d]);
        tr_json_end_array(&jw);
        tr_json_key(&jw, "data_offsets");
        tr_json_begin_array(&jw);
        tr_json_uint(&jw, off);
        tr_json_uint(&jw, off + bytes);
        tr_json_end_array(&jw);
        tr_json_end_object(&jw);
        off += bytes;
    }
    tr_json_end_object(&jw);
    // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
    while (jw.len % 8) tr_json_raw(&jw, " ", 1);
    const char *hdr;
    size_t hlen;
    if (tr_json_writer_finish(&jw, &hdr, &hlen, err)) {
        tr_json_writer_free(&jw);
        return tr_err_wrap(err, "%s", path);
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    tr_file_writer w;
    int rc = tr_file_writer_open(&w, path, err);
    if (!rc) rc = tr_file_writer_write(&w, lenbuf, 8, err);
    if (!rc) rc = tr_file_writer_write(&w, hdr, hlen, err);
    tr_json_writer_free(&jw);
    for (int32_t i = 0; i < n && !rc; i++) {
        const tr_st_entry *e = &entries[i];
        uint64_t numel = tr_st_entry_bytes(e, TR_ST_U8);
        if (dtype == TR_ST_F32)
            rc = tr_file_writer_write(&w, e->data, (size_t)numel * 4, err);
        else
            rc = write_bf16(&w, e->data, numel, err);
    }
    // A failed write already removed the temporary file.
    if (!rc) rc = tr_file_writer_commit(&w, err);
    return rc;
}
