// Step checkpoints of a run: temporary step directory, run_state.json, rename into place,
// directory fsyncs, and the scan that finds the last complete step.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/file.h"
#include "engine/json.h"
#include "rl/run_ckpt.h"

static int path_fmt(char *out, size_t cap, tr_err *err, const char *fmt, const char *a, int64_t n) {
    int len = snprintf(out, cap, fmt, a, n);
    if (len < 0 || (size_t)len >= cap) return tr_errf(err, TR_ERANGE, "%s: path too long", a);
    return 0;
}

static int ckpt_root(const char *run_dir, char *out, size_t cap, tr_err *err) {
    int len = snprintf(out, cap, "%s/checkpoints", run_dir);
    if (len < 0 || (size_t)len >= cap) return tr_errf(err, TR_ERANGE, "%s: path too long", run_dir);
    return 0;
}

int tr_run_ckpt_path(const char *run_dir, int64_t step, char *out, size_t cap, tr_err *err) {
    return path_fmt(out, cap, err, "%s/checkpoints/step_%" PRId64, run_dir, step);
}

static void fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);  // best effort: some filesystems refuse fsync on directories
        close(fd);
    }
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)ftw;
    int rc = flag == FTW_DP ? rmdir(path) : unlink(path);
    // Gone already: a process that was writing there (an orphaned worker) removed it.
    return rc == 0 || errno == ENOENT ? 0 : errno;
}

int tr_remove_tree(const char *path, tr_err *err) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT) return 0;
        return tr_errf(err, TR_EIO, "%s: %s", path, strerror(errno));
    }
    int rc = nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    if (rc != 0)
        return tr_errf(err, TR_EIO, "%s: cannot remove: %s", path, strerror(rc > 0 ? rc : errno));
    return 0;
}

int tr_run_ckpt_begin(const char *run_dir, int64_t step, char *tmp, size_t cap, tr_err *err) {
    if (path_fmt(tmp, cap, err, "%s/checkpoints/step_%" PRId64 ".tmp", run_dir, step)) return -1;
    if (tr_remove_tree(tmp, err) || tr_mkdirs(tmp, err))
        return tr_err_wrap(err, "starting the checkpoint of step %" PRId64, step);
    return 0;
}

int tr_run_ckpt_commit(const char *run_dir, const char *tmp, const tr_run_state *st, tr_err *err) {
    char final[4096], old[4200], state[4200], dir[4096];
    if (tr_run_ckpt_path(run_dir, st->step, final, sizeof final, err) ||
        ckpt_root(run_dir, dir, sizeof dir, err))
        return -1;
    snprintf(state, sizeof state, "%s/" TR_RUN_STATE_FILE, tmp);
    char text[512];
    int n = snprintf(text, sizeof text,
                     "{\"step\": %" PRId64 ", \"data_cursor\": %" PRId64 ", \"workflow\": \"%s\"}\n",
                     st->step, st->data_cursor, st->workflow);
    if (tr_file_write_atomic(state, text, (size_t)n, err)) return -1;
    fsync_dir(tmp);
    snprintf(old, sizeof old, "%s.old.%lld", final, (long long)getpid());
    bool had_old = false;
    if (rename(final, old) == 0)
        had_old = true;
    else if (errno != ENOENT)
        return tr_errf(err, TR_EIO, "%s: cannot move aside: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        if (had_old) rename(old, final);
        return tr_errf(err, TR_EIO, "%s -> %s: rename failed: %s", tmp, final, strerror(e));
    }
    fsync_dir(dir);
    if (had_old && tr_remove_tree(old, err)) return -1;
    return 0;
}

int tr_run_state_read(const char *dir, tr_run_state *st, tr_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" TR_RUN_STATE_FILE, dir);
    tr_json_opts opts = {.name = path, .max_depth = TR_JSON_DATA_DEPTH,
                         .flags = TR_JSON_DATA | TR_JSON_NO_NUL};
    tr_json_doc doc;
    if (tr_json_parse_file(&doc, path, &opts, err)) return -1;
    int rc = 0;
    const tr_json *o = doc.root, *w = tr_json_get(o, "workflow");
    const tr_json *s = tr_json_get(o, "step"), *c = tr_json_get(o, "data_cursor");
    if (!tr_json_is_int(s) || s->inum < 0)
        rc = tr_errf(err, TR_EFORMAT, "%s: 'step' must be a non-negative integer", path);
    else if (!tr_json_is_int(c) || c->inum < 0)
        rc = tr_errf(err, TR_EFORMAT, "%s: 'data_cursor' must be a non-negative integer", path);
    else if (!tr_json_is(w, TR_JSON_STRING) || w->len >= sizeof st->workflow)
        rc = tr_errf(err, TR_EFORMAT, "%s: 'workflow' must be a workflow name", path);
    else {
        st->step = s->inum;
        st->data_cursor = c->inum;
        snprintf(st->workflow, sizeof st->workflow, "%s", w->str);
    }
    tr_json_free(&doc);
    return rc;
}

// "step_<digits>" exactly (no sign, no suffix) -> the number; -1 otherwise.
static int64_t step_of(const char *name, const char *suffix) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    if (*p < '0' || *p > '9') return -1;
    int64_t v = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    return strcmp(p, suffix) == 0 ? v : -1;
}

int tr_run_ckpt_find_last(const char *run_dir, tr_run_state *st, tr_err *err) {
    memset(st, 0, sizeof *st);
    st->step = -1;
    char dir[4096];
    if (ckpt_root(run_dir, dir, sizeof dir, err)) return -1;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        return tr_errf(err, TR_EIO, "%s: %s", dir, strerror(errno));
    }
    int64_t best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = step_of(e->d_name, "");
        if (s > best) best = s;
    }
    closedir(d);
    if (best < 0) return 0;
    char path[4096];
    if (tr_run_ckpt_path(run_dir, best, path, sizeof path, err)) return -1;
    if (tr_run_state_read(path, st, err)) return tr_err_wrap(err, "checkpoint %s", path);
    if (st->step != best)
        return tr_errf(err, TR_EFORMAT, "%s: run_state.json says step %" PRId64, path, st->step);
    return 0;
}

int tr_run_ckpt_clean(const char *run_dir, tr_err *err) {
    char dir[4096];
    if (ckpt_root(run_dir, dir, sizeof dir, err)) return -1;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : tr_errf(err, TR_EIO, "%s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (step_of(e->d_name, ".tmp") < 0) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        rc = tr_remove_tree(path, err);
    }
    closedir(d);
    return rc;
}
