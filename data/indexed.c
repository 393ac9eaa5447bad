// Megatron indexed dataset reader (mmap, validated once at open) and builder (sequence
// lengths and document indices kept in memory, tokens streamed to the .bin).
#include "data/indexed.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the indexed dataset format is little-endian; this reader assumes a little-endian host"
#endif

static const char idx_magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};

size_t tr_indexed_dtype_size(int dtype) {
    switch (dtype) {
    case TR_IDX_UINT8:
    case TR_IDX_INT8: return 1;
    case TR_IDX_INT16:
    case TR_IDX_UINT16: return 2;
    case TR_IDX_INT32:
    case TR_IDX_FLOAT32: return 4;
    case TR_IDX_INT64:
    case TR_IDX_FLOAT64: return 8;
    }
    return 0;
}

const char *tr_indexed_dtype_name(int dtype) {
    switch (dtype) {
    case TR_IDX_UINT8: return "uint8";
    case TR_IDX_INT8: return "int8";
    case TR_IDX_INT16: return "int16";
    case TR_IDX_INT32: return "int32";
    case TR_IDX_INT64: return "int64";
    case TR_IDX_FLOAT64: return "float64";
    case TR_IDX_FLOAT32: return "float32";
    case TR_IDX_UINT16: return "uint16";
    }
    return "unknown";
}

int tr_indexed_dtype_for_vocab(int64_t vocab_size) {
    return vocab_size < 65500 ? TR_IDX_UINT16 : TR_IDX_INT32;
}

static bool is_int_dtype(int dtype) {
    return dtype != TR_IDX_FLOAT32 && dtype != TR_IDX_FLOAT64 && tr_indexed_dtype_size(dtype);
}

static uint64_t rd_u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

int32_t tr_indexed_seq_len(const tr_indexed *d, int64_t seq) {
    int32_t v;
    memcpy(&v, d->idx + TR_IDX_HEADER_SIZE + 4 * (size_t)seq, 4);
    return v;
}

int64_t tr_indexed_seq_ptr(const tr_indexed *d, int64_t seq) {
    int64_t v;
    memcpy(&v, d->idx + TR_IDX_HEADER_SIZE + 4 * (size_t)d->n_seqs + 8 * (size_t)seq, 8);
    return v;
}

int64_t tr_indexed_doc_index(const tr_indexed *d, int64_t doc) {
    int64_t v;
    memcpy(&v, d->idx + TR_IDX_HEADER_SIZE + 12 * (size_t)d->n_seqs + 8 * (size_t)doc, 8);
    return v;
}

int64_t tr_indexed_doc_tokens(const tr_indexed *d, int64_t doc) {
    int64_t s0 = tr_indexed_doc_index(d, doc), s1 = tr_indexed_doc_index(d, doc + 1), n = 0;
    for (int64_t s = s0; s < s1; s++) n += tr_indexed_seq_len(d, s);
    return n;
}

static int map_file(const char *path, const uint8_t **data, size_t *size, tr_err *err) {
    *data = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return tr_errf(err, TR_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    *size = (size_t)st.st_size;
    if (*size > 0) {
        void *p = mmap(NULL, *size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tr_errf(err, TR_EIO, "%s: cannot mmap %zu bytes: %s", path, *size, strerror(e));
        }
        *data = p;
    }
    close(fd);
    return 0;
}

void tr_indexed_close(tr_indexed *d) {
    if (d->mapped && d->idx) munmap((void *)d->idx, d->idx_size);
    if (d->mapped && d->bin) munmap((void *)d->bin, d->bin_size);
    d->idx = d->bin = NULL;
}

// Checks the header and every array entry against the file sizes, so later accessors can
// read without bounds checks.
static int validate(tr_indexed *d, const char *ip, const char *bp, tr_err *err) {
    if (d->idx_size < TR_IDX_HEADER_SIZE)
        return tr_errf(err, TR_EFORMAT, "%s: truncated: %zu bytes, the header alone is %d", ip,
                       d->idx_size, TR_IDX_HEADER_SIZE);
    if (memcmp(d->idx, idx_magic, 9) != 0)
        return tr_errf(err, TR_EFORMAT, "%s: offset 0: not an MMIDIDX index (bad magic)", ip);
    uint64_t version = rd_u64(d->idx + 9);
    if (version != 1)
        return tr_errf(err, TR_EFORMAT, "%s: offset 9: version %" PRIu64 ", only 1 is supported",
                       ip, version);
    d->dtype = d->idx[17];
    d->elem = tr_indexed_dtype_size(d->dtype);
    if (!d->elem)
        return tr_errf(err, TR_EFORMAT, "%s: offset 17: unknown dtype code %d", ip, d->dtype);
    uint64_t ns = rd_u64(d->idx + 18), nd = rd_u64(d->idx + 26);
    // Bound the counts by the file size before multiplying, so the checks cannot overflow.
    uint64_t room = d->idx_size - TR_IDX_HEADER_SIZE;
    if (ns > room / 12 || nd > room / 8 || 12 * ns + 8 * nd > room)
        return tr_errf(err, TR_EFORMAT,
                       "%s: offset 18: %" PRIu64 " sequences and %" PRIu64
                       " document indices need %" PRIu64 " bytes after the header, file has %"
                       PRIu64 " (truncated .idx?)",
                       ip, ns, nd,
                       (ns >> 59 || nd >> 59) ? UINT64_MAX : 12 * ns + 8 * nd, room);
    uint64_t want = 12 * ns + 8 * nd;
    // Megatron's multimodal variant appends one int8 mode per sequence; accept and ignore it.
    if (room != want && room != want + ns)
        return tr_errf(err, TR_EFORMAT, "%s: %" PRIu64 " bytes after the arrays end at offset %" PRIu64
                       " (expected none)", ip, room - want, (uint64_t)TR_IDX_HEADER_SIZE + want);
    if (nd < 1)
        return tr_errf(err, TR_EFORMAT, "%s: offset 26: document count is 0 (needs at least the "
                       "leading 0)", ip);
    d->n_seqs = (int64_t)ns;
    d->n_docs = (int64_t)nd - 1;
    uint64_t bin_size = d->bin_size;
    int64_t tokens = 0;
    for (int64_t i = 0; i < d->n_seqs; i++) {
        int32_t len = tr_indexed_seq_len(d, i);
        int64_t ptr = tr_indexed_seq_ptr(d, i);
        if (len < 0)
            return tr_errf(err, TR_EFORMAT, "%s: offset %" PRId64 ": sequence %" PRId64
                           " has negative length %d", ip, (int64_t)TR_IDX_HEADER_SIZE + 4 * i, i, len);
        if (ptr < 0 || (uint64_t)ptr > bin_size || (uint64_t)len * d->elem > bin_size - (uint64_t)ptr)
            return tr_errf(err, TR_EFORMAT, "%s: offset %" PRId64 ": sequence %" PRId64
                           " spans bytes [%" PRId64 ", %" PRId64 ") but %s has %" PRIu64
                           " bytes (truncated .bin?)", ip,
                           (int64_t)TR_IDX_HEADER_SIZE + 4 * d->n_seqs + 8 * i, i, ptr,
                           ptr + (int64_t)len * (int64_t)d->elem, bp, bin_size);
        tokens += len;
    }
    d->n_tokens = tokens;
    int64_t prev = 0;
    for (int64_t k = 0; k <= d->n_docs; k++) {
        int64_t v = tr_indexed_doc_index(d, k);
        int64_t off = TR_IDX_HEADER_SIZE + 12 * d->n_seqs + 8 * k;
        if ((k == 0 && v != 0) || v < prev || v > d->n_seqs)
            return tr_errf(err, TR_EFORMAT, "%s: offset %" PRId64 ": document index %" PRId64
                           " = %" PRId64 " is out of order or past %" PRId64 " sequences", ip, off,
                           k, v, d->n_seqs);
        prev = v;
    }
    if (prev != d->n_seqs)
        return tr_errf(err, TR_EFORMAT, "%s: last document index is %" PRId64 ", expected the "
                       "sequence count %" PRId64, ip, prev, d->n_seqs);
    return 0;
}

int tr_indexed_open(tr_indexed *d, const char *prefix, tr_err *err) {
    memset(d, 0, sizeof *d);
    if (strlen(prefix) >= sizeof d->prefix - 8)
        return tr_errf(err, TR_EINVAL, "dataset prefix too long: %s", prefix);
    strcpy(d->prefix, prefix);
    char ip[4200], bp[4200];
    snprintf(ip, sizeof ip, "%s.idx", prefix);
    snprintf(bp, sizeof bp, "%s.bin", prefix);
    d->mapped = true;
    if (map_file(ip, &d->idx, &d->idx_size, err)) return -1;
    if (map_file(bp, &d->bin, &d->bin_size, err) || validate(d, ip, bp, err)) {
        tr_indexed_close(d);
        return -1;
    }
    return 0;
}

int tr_indexed_open_mem(tr_indexed *d, const char *name, const void *idx, size_t idx_size,
                        const void *bin, size_t bin_size, tr_err *err) {
    memset(d, 0, sizeof *d);
    snprintf(d->prefix, sizeof d->prefix, "%s", name);
    d->idx = idx;
    d->idx_size = idx_size;
    d->bin = bin_size ? bin : NULL;
    d->bin_size = bin_size;
    char ip[4200], bp[4200];
    snprintf(ip, sizeof ip, "%s.idx", d->prefix);
    snprintf(bp, sizeof bp, "%s.bin", d->prefix);
    if (validate(d, ip, bp, err)) {
        memset(d, 0, sizeof *d);
        return -1;
    }
    return 0;
}

int tr_indexed_read(const tr_indexed *d, int64_t seq, int64_t offset, int64_t count,
                    int32_t *out, tr_err *err) {
    if (seq < 0 || seq >= d->n_seqs)
        return tr_errf(err, TR_ERANGE, "%s: sequence %" PRId64 " out of range (%" PRId64 ")",
                       d->prefix, seq, d->n_seqs);
    int32_t len = tr_indexed_seq_len(d, seq);
    if (offset < 0 || count < 0 || offset + count > len)
        return tr_errf(err, TR_ERANGE, "%s: tokens [%" PRId64 ", %" PRId64 ") of sequence %" PRId64
                       " (length %d) out of range", d->prefix, offset, offset + count, seq, len);
    if (!is_int_dtype(d->dtype))
        return tr_errf(err, TR_EUNSUPPORTED, "%s: dtype %s does not hold token ids", d->prefix,
                       tr_indexed_dtype_name(d->dtype));
    const uint8_t *p = d->bin + tr_indexed_seq_ptr(d, seq) + (size_t)offset * d->elem;
    for (int64_t i = 0; i < count; i++, p += d->elem) {
        int64_t v;
        switch (d->dtype) {
        case TR_IDX_UINT8: v = p[0]; break;
        case TR_IDX_INT8: v = (int8_t)p[0]; break;
        case TR_IDX_INT16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
        case TR_IDX_UINT16: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
        case TR_IDX_INT32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
        default: memcpy(&v, p, 8); break;
        }
        if (v < INT32_MIN || v > INT32_MAX)
            return tr_errf(err, TR_ERANGE, "%s.bin: offset %td: token %" PRId64 " does not fit int32",
                           d->prefix, p - d->bin, v);
        out[i] = (int32_t)v;
    }
    return 0;
}

// ---- builder ----

int tr_indexed_builder_init(tr_indexed_builder *b, const char *prefix, int dtype, tr_err *err) {
    memset(b, 0, sizeof *b);
    if (!is_int_dtype(dtype))
        return tr_errf(err, TR_EINVAL, "%s: dtype code %d is not an integer token type", prefix, dtype);
    b->dtype = dtype;
    b->elem = tr_indexed_dtype_size(dtype);
    if (snprintf(b->idx_path, sizeof b->idx_path, "%s.idx", prefix) >= (int)sizeof b->idx_path - 8)
        return tr_errf(err, TR_EINVAL, "dataset prefix too long: %s", prefix);
    char bp[4200];
    snprintf(bp, sizeof bp, "%s.bin", prefix);
    b->cap_doc_idx = 1024;
    b->doc_idx = malloc((size_t)b->cap_doc_idx * sizeof *b->doc_idx);
    if (!b->doc_idx) return tr_errf(err, TR_ENOMEM, "%s: out of memory", prefix);
    b->doc_idx[0] = 0;
    b->n_doc_idx = 1;
    if (tr_file_writer_open(&b->bin, bp, err)) {
        free(b->doc_idx);
        b->doc_idx = NULL;
        return -1;
    }
    b->open = true;
    return 0;
}

static int grow(void **p, int64_t *cap, int64_t need, size_t elem, tr_err *err) {
    if (need <= *cap) return 0;
    int64_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return tr_errf(err, TR_ENOMEM, "out of memory growing an index to %" PRId64 " entries", c);
    *p = q;
    *cap = c;
    return 0;
}

static int fits(int dtype, int32_t v) {
    switch (dtype) {
    case TR_IDX_UINT8: return v >= 0 && v <= 255;
    case TR_IDX_INT8: return v >= -128 && v <= 127;
    case TR_IDX_INT16: return v >= INT16_MIN && v <= INT16_MAX;
    case TR_IDX_UINT16: return v >= 0 && v <= 65535;
    }
    return 1;
}

int tr_indexed_builder_add(tr_indexed_builder *b, const int32_t *ids, int64_t n, tr_err *err) {
    if (!b->open) return tr_errf(err, TR_EINVAL, "%s: builder is not open", b->idx_path);
    if (n < 0 || n > INT32_MAX)
        return tr_errf(err, TR_EINVAL, "%s: sequence of %" PRId64 " tokens (int32 lengths)",
                       b->idx_path, n);
    if (grow((void **)&b->seq_len, &b->cap_seqs, b->n_seqs + 1, sizeof *b->seq_len, err))
        return -1;
    size_t bytes = (size_t)n * b->elem;
    if (bytes > b->conv_cap) {
        uint8_t *c = realloc(b->conv, bytes);
        if (!c) return tr_errf(err, TR_ENOMEM, "out of memory for %zu bytes", bytes);
        b->conv = c;
        b->conv_cap = bytes;
    }
    uint8_t *p = b->conv;
    for (int64_t i = 0; i < n; i++, p += b->elem) {
        int32_t v = ids[i];
        if (!fits(b->dtype, v))
            return tr_errf(err, TR_ERANGE, "%s: token id %d does not fit %s (sequence %" PRId64 ")",
                           b->idx_path, v, tr_indexed_dtype_name(b->dtype), b->n_seqs);
        switch (b->elem) {
        case 1: { uint8_t x = (uint8_t)v; memcpy(p, &x, 1); break; }
        case 2: { uint16_t x = (uint16_t)v; memcpy(p, &x, 2); break; }
        case 4: memcpy(p, &v, 4); break;
        default: { int64_t x = v; memcpy(p, &x, 8); break; }
        }
    }
    if (tr_file_writer_write(&b->bin, b->conv, bytes, err)) {
        b->open = false;
        return -1;
    }
    b->seq_len[b->n_seqs++] = (int32_t)n;
    b->bin_bytes += (int64_t)bytes;
    return 0;
}

int tr_indexed_builder_end_document(tr_indexed_builder *b, tr_err *err) {
    if (grow((void **)&b->doc_idx, &b->cap_doc_idx, b->n_doc_idx + 1, sizeof *b->doc_idx, err))
        return -1;
    b->doc_idx[b->n_doc_idx++] = b->n_seqs;
    return 0;
}

int tr_indexed_builder_append(tr_indexed_builder *b, const char *prefix, tr_err *err) {
    if (!b->open) return tr_errf(err, TR_EINVAL, "%s: builder is not open", b->idx_path);
    tr_indexed d;
    if (tr_indexed_open(&d, prefix, err)) return -1;
    int rc = -1;
    if (d.dtype != b->dtype) {
        tr_errf(err, TR_EINVAL, "%s: dtype %s differs from the output's %s", prefix,
                tr_indexed_dtype_name(d.dtype), tr_indexed_dtype_name(b->dtype));
        goto done;
    }
    if (grow((void **)&b->seq_len, &b->cap_seqs, b->n_seqs + d.n_seqs, sizeof *b->seq_len, err) ||
        grow((void **)&b->doc_idx, &b->cap_doc_idx, b->n_doc_idx + d.n_docs, sizeof *b->doc_idx, err))
        goto done;
    int64_t base = b->n_seqs;
    // Copy the tokens sequence by sequence: a valid index may leave gaps in its .bin, and the
    // output's pointers are recomputed as a contiguous run.
    for (int64_t i = 0; i < d.n_seqs; i++) {
        int32_t len = tr_indexed_seq_len(&d, i);
        if (tr_file_writer_write(&b->bin, d.bin + tr_indexed_seq_ptr(&d, i), (size_t)len * d.elem, err)) {
            b->open = false;
            goto done;
        }
        b->seq_len[b->n_seqs++] = len;
        b->bin_bytes += (int64_t)len * (int64_t)d.elem;
    }
    for (int64_t k = 1; k <= d.n_docs; k++) b->doc_idx[b->n_doc_idx++] = base + tr_indexed_doc_index(&d, k);
    rc = 0;
done:
    tr_indexed_close(&d);
    return rc;
}

int tr_indexed_builder_finish(tr_indexed_builder *b, tr_err *err) {
    if (!b->open) return tr_errf(err, TR_EINVAL, "%s: builder is not open", b->idx_path);
    // A trailing partial document (sequences after the last end_document) is closed here, so
    // the last document index always equals the sequence count, as readers require.
    if (b->doc_idx[b->n_doc_idx - 1] != b->n_seqs && tr_indexed_builder_end_document(b, err))
        return -1;
    // Both files are written and synced before either is renamed into place, so a failure
    // (a full disk, a directory at PREFIX.idx) leaves no new .bin beside an old or no .idx.
    tr_file_writer w;
    if (tr_file_writer_open(&w, b->idx_path, err)) return -1;
    uint8_t head[TR_IDX_HEADER_SIZE];
    uint64_t version = 1, ns = (uint64_t)b->n_seqs, nd = (uint64_t)b->n_doc_idx;
    memcpy(head, idx_magic, 9);
    memcpy(head + 9, &version, 8);
    head[17] = (uint8_t)b->dtype;
    memcpy(head + 18, &ns, 8);
    memcpy(head + 26, &nd, 8);
    if (tr_file_writer_write(&w, head, sizeof head, err) ||
        tr_file_writer_write(&w, b->seq_len, (size_t)b->n_seqs * 4, err))
        return -1;
    // Pointers are written in chunks to avoid a second array the size of the index.
    int64_t chunk[1024], ptr = 0;
    for (int64_t i = 0; i < b->n_seqs;) {
        int64_t m = 0;
        for (; m < 1024 && i < b->n_seqs; m++, i++) {
            chunk[m] = ptr;
            ptr += (int64_t)b->seq_len[i] * (int64_t)b->elem;
        }
        if (tr_file_writer_write(&w, chunk, (size_t)m * 8, err)) return -1;
    }
    if (tr_file_writer_write(&w, b->doc_idx, (size_t)b->n_doc_idx * 8, err) ||
        tr_file_writer_sync(&w, err))
        return -1;
    if (tr_file_writer_sync(&b->bin, err)) {
        tr_file_writer_abort(&w);
        return -1;
    }
    b->open = false;
    if (tr_file_writer_commit(&b->bin, err)) {
        tr_file_writer_abort(&w);
        return -1;
    }
    return tr_file_writer_commit(&w, err);
}

void tr_indexed_builder_free(tr_indexed_builder *b) {
    if (b->open) tr_file_writer_abort(&b->bin);
    b->open = false;
    free(b->seq_len);
    free(b->doc_idx);
    free(b->conv);
    b->seq_len = NULL;
    b->doc_idx = NULL;
    b->conv = NULL;
}

int tr_indexed_merge(const char *out_prefix, const char *const *prefixes, int n, tr_err *err) {
    if (n < 1) return tr_errf(err, TR_EINVAL, "%s: nothing to merge", out_prefix);
    tr_indexed first;
    if (tr_indexed_open(&first, prefixes[0], err)) return -1;
    int dtype = first.dtype;
    tr_indexed_close(&first);
    tr_indexed_builder b;
    if (tr_indexed_builder_init(&b, out_prefix, dtype, err)) return -1;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) rc = tr_indexed_builder_append(&b, prefixes[i], err);
    if (!rc) rc = tr_indexed_builder_finish(&b, err);
    tr_indexed_builder_free(&b);
    return rc;
}
