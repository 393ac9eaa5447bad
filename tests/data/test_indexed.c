// Megatron indexed datasets: our builder writes byte-identical files to Megatron-Core's
// IndexedDatasetBuilder (fixtures from tools/indexed_fixtures.py), our reader reads them,
// merge concatenates, and truncated or lying files fail with the file and offset named.
// With TROUPE_INDEXED_OUT=DIR it also leaves its own files there for the Python check.
#include <stdint.h>
#include <sys/stat.h>

#include "data/indexed.h"
#include "engine/file.h"
#include "tests/test.h"

typedef struct {
    const char *name;
    int dtype;
    int n_docs;
    int n_seqs[5];
    int32_t seq[8][5];
    int32_t len[8];
} fixture;

// The same documents as DOCS in tools/indexed_fixtures.py.
static const fixture fx[2] = {
    {"megatron_u16", TR_IDX_UINT16, 5, {2, 1, 1, 1, 3},
     {{1, 2, 3}, {4}, {65000, 7}, {0}, {9, 9, 9, 9, 5}, {0}, {1}, {2}},
     {3, 1, 2, 0, 5, 1, 1, 1}},
    {"megatron_i32", TR_IDX_INT32, 3, {1, 2, 1},
     {{100000, 3, 2147483647}, {5}, {0}, {6, 7, 8, 9}},
     {3, 1, 0, 4}},
};

static int write_fixture(const fixture *f, const char *prefix, tr_err *err) {
    tr_indexed_builder b;
    if (tr_indexed_builder_init(&b, prefix, f->dtype, err)) return -1;
    int s = 0, rc = 0;
    for (int d = 0; d < f->n_docs && !rc; d++) {
        for (int k = 0; k < f->n_seqs[d] && !rc; k++, s++)
            rc = tr_indexed_builder_add(&b, f->seq[s], f->len[s], err);
        if (!rc) rc = tr_indexed_builder_end_document(&b, err);
    }
    if (!rc) rc = tr_indexed_builder_finish(&b, err);
    tr_indexed_builder_free(&b);
    return rc;
}

static void check_contents(const fixture *f, const char *prefix) {
    tr_indexed d;
    tr_err err = {0};
    int rc = tr_indexed_open(&d, prefix, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) return;
    CHECK(d.dtype == f->dtype);
    CHECK(d.n_docs == f->n_docs);
    int total = 0;
    for (int i = 0; i < f->n_docs; i++) total += f->n_seqs[i];
    CHECK(d.n_seqs == total);
    int64_t seq = 0;
    for (int doc = 0; doc < f->n_docs; doc++) {
        CHECK(tr_indexed_doc_index(&d, doc) == seq);
        for (int k = 0; k < f->n_seqs[doc]; k++, seq++) {
            CHECK(tr_indexed_seq_len(&d, seq) == f->len[seq]);
            int32_t buf[8] = {0};
            CHECKF(tr_indexed_read(&d, seq, 0, f->len[seq], buf, &err) == 0, "%s", err.msg);
            CHECK(memcmp(buf, f->seq[seq], (size_t)f->len[seq] * 4) == 0);
        }
    }
    CHECK(tr_indexed_doc_index(&d, f->n_docs) == total);
    // Out-of-range reads are errors, not crashes.
    int32_t x;
    CHECK(tr_indexed_read(&d, 0, f->len[0], 1, &x, &err) == -1 && err.code == TR_ERANGE);
    CHECK(tr_indexed_read(&d, d.n_seqs, 0, 0, &x, &err) == -1);
    tr_indexed_close(&d);
}

static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    tr_err err;
    int ok = tr_file_read(a, &x, &nx, &err) == 0 && tr_file_read(b, &y, &ny, &err) == 0 &&
             nx == ny && memcmp(x, y, nx) == 0;
    free(x);
    free(y);
    return ok;
}

static void write_bytes(const char *path, const char *data, size_t n) {
    tr_err err;
    CHECK(tr_file_write_atomic(path, data, n, &err) == 0);
}

// Copies PREFIX.{idx,bin} to DST.{idx,bin}, keeping only keep bytes of the file named by ext.
static void copy_cut(const char *src, const char *dst, const char *ext, long keep) {
    const char *exts[2] = {"idx", "bin"};
    for (int i = 0; i < 2; i++) {
        char a[1100], b[1100], *data = NULL;
        size_t n = 0;
        tr_err err;
        snprintf(a, sizeof a, "%s.%s", src, exts[i]);
        snprintf(b, sizeof b, "%s.%s", dst, exts[i]);
        CHECK(tr_file_read(a, &data, &n, &err) == 0);
        if (strcmp(ext, exts[i]) == 0 && keep >= 0 && (size_t)keep < n) n = (size_t)keep;
        write_bytes(b, data, n);
        free(data);
    }
}

static void expect_open_error(const char *prefix, const char *want1, const char *want2) {
    tr_indexed d;
    tr_err err = {0};
    int rc = tr_indexed_open(&d, prefix, &err);
    CHECKF(rc == -1, "%s opened", prefix);
    if (rc == 0) {
        tr_indexed_close(&d);
        return;
    }
    CHECKF(strstr(err.msg, want1) != NULL, "'%s' lacks '%s'", err.msg, want1);
    CHECKF(!want2 || strstr(err.msg, want2) != NULL, "'%s' lacks '%s'", err.msg, want2);
}

int main(void) {
    const char *dir = tr_test_tmpdir();
    const char *keep = getenv("TROUPE_INDEXED_OUT");
    char p[1024], q[1024], a[8300], b[8300];
    tr_err err = {0};

    for (int i = 0; i < 2; i++) {
        // Megatron-Core's files read back with our reader.
        char fixp[8192];
        snprintf(fixp, sizeof fixp, "%s", tr_test_src("tests/fixtures/indexed/"));
        strncat(fixp, fx[i].name, sizeof fixp - strlen(fixp) - 1);
        check_contents(&fx[i], fixp);
        // Ours are byte-identical to theirs.
        snprintf(p, sizeof p, "%s/%s", keep ? keep : dir, fx[i].name);
        CHECKF(write_fixture(&fx[i], p, &err) == 0, "%s", err.msg);
        check_contents(&fx[i], p);
        snprintf(a, sizeof a, "%s.idx", p);
        snprintf(b, sizeof b, "%s.idx", fixp);
        CHECKF(same_file(a, b), "%s differs from Megatron's %s", a, b);
        snprintf(a, sizeof a, "%s.bin", p);
        snprintf(b, sizeof b, "%s.bin", fixp);
        CHECKF(same_file(a, b), "%s differs from Megatron's %s", a, b);
    }

    // Merging a dataset with itself doubles documents and shifts the document indices.
    snprintf(p, sizeof p, "%s/megatron_u16", keep ? keep : dir);
    snprintf(q, sizeof q, "%s/merged", dir);
    const char *parts[2] = {p, p};
    CHECKF(tr_indexed_merge(q, parts, 2, &err) == 0, "%s", err.msg);
    tr_indexed m;
    if (tr_indexed_open(&m, q, &err) == 0) {
        CHECK(m.n_docs == 10 && m.n_seqs == 16);
        CHECK(tr_indexed_doc_index(&m, 5) == 8 && tr_indexed_doc_index(&m, 6) == 10);
        CHECK(tr_indexed_seq_ptr(&m, 8) == 28);  // 14 uint16 tokens before the second copy
        int32_t t[2];
        CHECK(tr_indexed_read(&m, 10, 0, 2, t, &err) == 0 && t[0] == 65000 && t[1] == 7);
        tr_indexed_close(&m);
    } else {
        CHECKF(0, "%s", err.msg);
    }
    // Merging datasets of different dtypes is refused.
    char pi[1024];
    snprintf(pi, sizeof pi, "%s/megatron_i32", keep ? keep : dir);
    const char *mixed[2] = {p, pi};
    CHECK(tr_indexed_merge(q, mixed, 2, &err) == -1 && strstr(err.msg, "dtype"));

    // Ids that do not fit the dtype are refused with the value named.
    tr_indexed_builder bb;
    snprintf(q, sizeof q, "%s/range", dir);
    CHECK(tr_indexed_builder_init(&bb, q, TR_IDX_UINT16, &err) == 0);
    int32_t big[2] = {5, 70000};
    CHECK(tr_indexed_builder_add(&bb, big, 2, &err) == -1 && strstr(err.msg, "70000"));
    tr_indexed_builder_free(&bb);
    snprintf(a, sizeof a, "%s.bin", q);
    CHECK(!tr_file_exists(a));  // an unfinished builder leaves nothing behind
    // A finish that cannot write the .idx (a directory in its place) leaves no .bin either.
    snprintf(b, sizeof b, "%s.idx", q);
    CHECK(mkdir(b, 0700) == 0);
    CHECK(tr_indexed_builder_init(&bb, q, TR_IDX_UINT16, &err) == 0);
    CHECK(tr_indexed_builder_add(&bb, big, 1, &err) == 0);
    CHECK(tr_indexed_builder_finish(&bb, &err) == -1 && strstr(err.msg, "range.idx"));
    tr_indexed_builder_free(&bb);
    CHECK(!tr_file_exists(a));
    CHECK(rmdir(b) == 0);
    CHECK(tr_indexed_dtype_for_vocab(65499) == TR_IDX_UINT16);
    CHECK(tr_indexed_dtype_for_vocab(65500) == TR_IDX_INT32);
    CHECK(tr_indexed_dtype_for_vocab(151665) == TR_IDX_INT32);

    // Bad files: each names the file and where.
    snprintf(q, sizeof q, "%s/bad", dir);
    copy_cut(p, q, "idx", 20);
    expect_open_error(q, "bad.idx", "truncated");
    copy_cut(p, q, "idx", 100);  // header intact, arrays cut
    expect_open_error(q, "bad.idx", "offset 18");
    copy_cut(p, q, "bin", 20);   // the last sequences point past the end
    expect_open_error(q, "bad.idx: offset", "bad.bin");
    copy_cut(p, q, "bin", 0);
    expect_open_error(q, "bad.bin", "truncated .bin");
    snprintf(q, sizeof q, "%s/missing", dir);
    expect_open_error(q, "missing.idx", "cannot open");
    // Lying header fields.
    {
        char *data = NULL;
        size_t n = 0;
        snprintf(a, sizeof a, "%s.idx", p);
        CHECK(tr_file_read(a, &data, &n, &err) == 0);
        snprintf(q, sizeof q, "%s/bad", dir);
        copy_cut(p, q, "", -1);
        snprintf(b, sizeof b, "%s.idx", q);
        data[0] = 'X';
        write_bytes(b, data, n);
        expect_open_error(q, "offset 0", "magic");
        data[0] = 'M';
        data[9] = 2;
        write_bytes(b, data, n);
        expect_open_error(q, "offset 9", "version 2");
        data[9] = 1;
        data[17] = 9;
        write_bytes(b, data, n);
        expect_open_error(q, "offset 17", "dtype code 9");
        data[17] = 8;
        data[18] = (char)0xff;  // sequence count far beyond the file
        write_bytes(b, data, n);
        expect_open_error(q, "offset 18", "truncated");
        data[18] = 8;
        int32_t neg = -1;
        memcpy(data + 34 + 4, &neg, 4);  // sequence 1's length
        write_bytes(b, data, n);
        expect_open_error(q, "offset 38", "negative length");
        int32_t one = 1;
        memcpy(data + 34 + 4, &one, 4);
        int64_t back = 5;  // document index 2 (offset 34+12*8+16) below index 1
        memcpy(data + 34 + 96 + 16, &back, 8);
        int64_t back1 = 1;
        memcpy(data + 34 + 96 + 16, &back1, 8);
        memcpy(data + 34 + 96 + 8, &back, 8);
        write_bytes(b, data, n);
        expect_open_error(q, "offset 146", "out of order");
        free(data);
    }
    return tr_test_summary("test_indexed");
}
