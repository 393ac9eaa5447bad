// Tests of error formatting and the atomic file writer: a committed write replaces the file
// whole, an aborted one leaves the old content and no temporary behind.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "engine/err.h"
#include "engine/file.h"
#include "tests/test.h"

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    if (d) closedir(d);
    return n;
}

int main(void) {
    tr_err err = {0};
    CHECK(tr_errf(&err, TR_EFORMAT, "%s:%d: bad %s", "a.json", 3, "key") == -1);
    CHECK(err.code == TR_EFORMAT);
    CHECK(strcmp(err.msg, "a.json:3: bad key") == 0);
    tr_err_wrap(&err, "loading %s", "model");
    CHECK(strcmp(err.msg, "loading model: a.json:3: bad key") == 0);
    CHECK(strcmp(tr_err_code_name(TR_ETIMEOUT), "timeout") == 0);

    const char *dir = tr_test_tmpdir();
    char path[512], sub[512];
    snprintf(path, sizeof path, "%s/x.txt", dir);
    CHECK(tr_file_write_atomic(path, "hello", 5, &err) == 0);
    char *data;
    size_t len;
    CHECK(tr_file_read(path, &data, &len, &err) == 0);
    CHECK(len == 5 && memcmp(data, "hello", 5) == 0 && data[5] == 0);
    free(data);

    tr_file_writer w;
    CHECK(tr_file_writer_open(&w, path, &err) == 0);
    CHECK(tr_file_writer_write(&w, "partial", 7, &err) == 0);
    tr_file_writer_abort(&w);
    CHECK(tr_file_read(path, &data, &len, &err) == 0);
    CHECK(len == 5 && memcmp(data, "hello", 5) == 0);
    free(data);
    CHECK(count_entries(dir) == 1);

    // Writers never rename over what is not a regular file: a FIFO (like /dev/stdout on a
    // pipe) is written in place and stays a FIFO, a symlink keeps pointing at its file, which
    // gets the new content, and a directory is refused at open, leaving no temporary.
    char fifo[512], link[512];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    CHECK(mkfifo(fifo, 0600) == 0);
    int rd = open(fifo, O_RDONLY | O_NONBLOCK);
    CHECK(rd >= 0);
    CHECK(tr_file_writer_open(&w, fifo, &err) == 0);
    CHECK(tr_file_writer_write(&w, "piped", 5, &err) == 0);
    CHECK(tr_file_writer_commit(&w, &err) == 0);
    char got[16] = {0};
    CHECK(read(rd, got, sizeof got) == 5 && memcmp(got, "piped", 5) == 0);
    close(rd);
    struct stat st;
    CHECK(lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode));
    CHECK(unlink(fifo) == 0);
    snprintf(link, sizeof link, "%s/link", dir);
    CHECK(symlink("x.txt", link) == 0);
    CHECK(tr_file_write_atomic(link, "linked", 6, &err) == 0);
    CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK(tr_file_read(path, &data, &len, &err) == 0);
    CHECK(len == 6 && memcmp(data, "linked", 6) == 0);
    free(data);
    CHECK(unlink(link) == 0);
    CHECK(tr_file_writer_open(&w, dir, &err) == -1);
    CHECK(strstr(err.msg, "is a directory") != NULL);
    CHECK(count_entries(dir) == 1);
    snprintf(link, sizeof link, "%s/missing/out.txt", dir);
    CHECK(tr_file_writer_open(&w, link, &err) == -1);
    CHECK(strncmp(err.msg, link, strlen(link)) == 0 && strstr(err.msg, "No such file") != NULL);

    CHECK(tr_file_read("/nonexistent/zz", &data, &len, &err) == -1);
    CHECK(err.code == TR_EIO && strstr(err.msg, "/nonexistent/zz") != NULL);

    // A directory opens with fopen; reading it must be a clean error, not a huge malloc.
    CHECK(tr_file_read(dir, &data, &len, &err) == -1);
    CHECK(strstr(err.msg, "not a regular file") != NULL);

    snprintf(sub, sizeof sub, "%s/a/b/c", dir);
    CHECK(tr_mkdirs(sub, &err) == 0);
    CHECK(tr_mkdirs(sub, &err) == 0);
    CHECK(tr_file_exists(sub));
    CHECK(tr_mkdirs(path, &err) == -1);  // a file is in the way
    return tr_test_summary("test_err_file");
}
