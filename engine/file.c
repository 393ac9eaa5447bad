// File helpers: whole-file reads, atomic writes (tmp + fsync + rename + dir fsync), mkdir -p.
#include "engine/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int tr_file_read(const char *path, char **data, size_t *len, tr_err *err) {
    *data = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
    // fopen succeeds on directories; size them with fstat and refuse anything but a file.
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return tr_errf(err, TR_EIO, "%s: not a regular file", path);
    }
    long size = (long)st.st_size;
    char *buf = malloc((size_t)size + 1);
    if (!buf) {
        fclose(f);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory for %ld bytes", path, size);
    }
    size_t got = fread(buf, 1, (size_t)size, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || got != (size_t)size) {
        free(buf);
        return tr_errf(err, TR_EIO, "%s: short read (%zu of %ld bytes)", path, got, size);
    }
    buf[size] = '\0';
    *data = buf;
    *len = (size_t)size;
    return 0;
}

int tr_file_writer_open(tr_file_writer *w, const char *path, tr_err *err) {
    memset(w, 0, sizeof *w);
    if (strlen(path) >= sizeof w->path) return tr_errf(err, TR_EINVAL, "path too long: %s", path);
    strcpy(w->path, path);
    // Only a regular file (or a new one) is replaced by rename: renaming over /dev/stdout or
    // a FIFO would replace the device itself, so those are written in place, and a symlink to
    // a file has its target replaced. A directory is refused now, not after all the work.
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        bool is_link = S_ISLNK(st.st_mode);
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
            return tr_errf(err, TR_EIO, "%s: is a directory", path);
        char real[PATH_MAX];
        if (is_link && S_ISREG(st.st_mode) && realpath(path, real) &&
            strlen(real) < sizeof w->path) {
            strcpy(w->path, real);
        } else {
            w->f = fopen(path, "wb");
            if (!w->f) return tr_errf(err, TR_EIO, "%s: cannot open: %s", path, strerror(errno));
            return 0;
        }
    }
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", w->path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f)
        return tr_errf(err, TR_EIO, "%s: cannot create %s: %s", path, w->tmp, strerror(errno));
    return 0;
}

int tr_file_writer_write(tr_file_writer *w, const void *data, size_t len, tr_err *err) {
    if (len && fwrite(data, 1, len, w->f) != len) {
        int e = errno;
        tr_file_writer_abort(w);
        return tr_errf(err, TR_EIO, "%s: write failed: %s", w->path, strerror(e));
    }
    return 0;
}

static void fsync_dir_of(const char *path) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", path);
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);  // best effort: some filesystems refuse fsync on directories
        close(fd);
    }
}

int tr_file_writer_sync(tr_file_writer *w, tr_err *err) {
    if (fflush(w->f) != 0 || (w->tmp[0] && fsync(fileno(w->f)) != 0)) {
        int e = errno;
        tr_file_writer_abort(w);
        return tr_errf(err, TR_EIO, "%s: flush failed: %s", w->path, strerror(e));
    }
    return 0;
}

int tr_file_writer_commit(tr_file_writer *w, tr_err *err) {
    if (!w->tmp[0]) {   // written in place: a device, pipe or symlink cannot be fsync'd
        int bad = fflush(w->f) != 0 || ferror(w->f);
        int e = errno;
        if (fclose(w->f) != 0 && !bad) {
            bad = 1;
            e = errno;
        }
        w->f = NULL;
        return bad ? tr_errf(err, TR_EIO, "%s: write failed: %s", w->path, strerror(e)) : 0;
    }
    if (fflush(w->f) != 0 || fsync(fileno(w->f)) != 0) {
        int e = errno;
        tr_file_writer_abort(w);
        return tr_errf(err, TR_EIO, "%s: flush failed: %s", w->path, strerror(e));
    }
    if (fclose(w->f) != 0) {
        w->f = NULL;
        int e = errno;
        unlink(w->tmp);
        return tr_errf(err, TR_EIO, "%s: close failed: %s", w->path, strerror(e));
    }
    w->f = NULL;
    if (rename(w->tmp, w->path) != 0) {
        int e = errno;
        unlink(w->tmp);
        return tr_errf(err, TR_EIO, "%s: rename failed: %s", w->path, strerror(e));
    }
    fsync_dir_of(w->path);
    return 0;
}

void tr_file_writer_abort(tr_file_writer *w) {
    if (w->f) fclose(w->f);
    w->f = NULL;
    if (w->tmp[0]) unlink(w->tmp);
}

int tr_file_write_atomic(const char *path, const void *data, size_t len, tr_err *err) {
    tr_file_writer w;
    if (tr_file_writer_open(&w, path, err)) return -1;
    if (tr_file_writer_write(&w, data, len, err)) return -1;
    return tr_file_writer_commit(&w, err);
}

int tr_mkdirs(const char *path, tr_err *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return tr_errf(err, TR_EINVAL, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return tr_errf(err, TR_EIO, "%s: cannot create directory: %s", buf, strerror(errno));
            buf[i] = c;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return tr_errf(err, TR_EIO, "%s: not a directory", path);
    return 0;
}

int tr_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}
