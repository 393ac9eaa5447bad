// Metrics log: JSON lines written with one fwrite + fflush + fsync per step, the resume
// filter that trims records past the checkpoint, TensorBoard scalars and the progress line.
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine/file.h"
#include "engine/json.h"
#include "rl/metrics.h"

double tr_metrics_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Keeps the lines of path that are whole JSON objects with an integer step <= last.
static int trim_log(const char *path, int64_t last, tr_err *err) {
    if (!tr_file_exists(path)) return 0;
    char *data;
    size_t len;
    if (tr_file_read(path, &data, &len, err)) return -1;
    char *out = malloc(len + 1);
    if (!out) {
        free(data);
        return tr_errf(err, TR_ENOMEM, "%s: out of memory", path);
    }
    size_t n_out = 0;
    tr_json_opts opts = {.name = path, .max_depth = TR_JSON_DATA_DEPTH,
                         .flags = TR_JSON_DATA | TR_JSON_NO_NUL | TR_JSON_DUP_LAST};
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && data[j] != '\n') j++;
        // A line without its newline was torn by a crash: drop it.
        if (j < len) {
            tr_json_doc doc;
            if (tr_json_parse_opts(&doc, data + i, j - i, &opts, NULL) == 0) {
                const tr_json *s = tr_json_get(doc.root, "step");
                if (tr_json_is_int(s) && s->inum <= last) {
                    memcpy(out + n_out, data + i, j - i + 1);
                    n_out += j - i + 1;
                }
                tr_json_free(&doc);
            }
        }
        i = j + 1;
    }
    int rc = tr_file_write_atomic(path, out, n_out, err);
    free(out);
    free(data);
    return rc;
}

int tr_metrics_open(tr_metrics *m, const tr_metrics_opts *o, tr_err *err) {
    memset(m, 0, sizeof *m);
    m->last_eval = NAN;
    m->last_eval_step = -1;
    m->total_steps = o->total_steps;
    m->progress = o->progress;
    m->progress_out = o->progress_out ? o->progress_out : stderr;
    snprintf(m->workflow, sizeof m->workflow, "%s", o->workflow ? o->workflow : "run");
    int len = snprintf(m->path, sizeof m->path, "%s/metrics.jsonl", o->run_dir);
    if (len < 0 || (size_t)len >= sizeof m->path)
        return tr_errf(err, TR_ERANGE, "%s: run directory path too long", o->run_dir);
    if (tr_mkdirs(o->run_dir, err)) return -1;
    if (o->resume_step >= 0 && trim_log(m->path, o->resume_step, err))
        return tr_err_wrap(err, "resuming the metrics log");
    m->f = fopen(m->path, o->resume_step >= 0 ? "ab" : "wb");
    if (!m->f) return tr_errf(err, TR_EIO, "%s: cannot open: %s", m->path, strerror(errno));
    if (o->tensorboard) {
        char dir[4200];
        snprintf(dir, sizeof dir, "%s/tensorboard", o->run_dir);
        double now = wall_now();
        if (tr_tfevents_open(&m->tb, dir, now, err) ||
            (o->resume_step >= 0 && (tr_tfevents_session_start(&m->tb, now, o->resume_step + 1, err) ||
                                     tr_tfevents_flush(&m->tb, err)))) {
            tr_tfevents_close(&m->tb);
            fclose(m->f);
            m->f = NULL;
            return -1;
        }
        m->tb_on = true;
    }
    m->first_step = o->resume_step >= 0 ? o->resume_step : 0;
    m->t_open = tr_metrics_now();
    m->step = -1;
    return 0;
}

void tr_metrics_close(tr_metrics *m) {
    if (m->f) fclose(m->f);
    m->f = NULL;
    if (m->tb_on) tr_tfevents_close(&m->tb);
    m->tb_on = false;
}

void tr_metrics_begin(tr_metrics *m, int64_t step) {
    m->step = step;
    m->n = 0;
}

static bool key_ok(const char *k) {
    if (!k[0]) return false;
    for (const char *p = k; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '/' || c == '.' || c == '-';
        if (!ok) return false;
    }
    return true;
}

int tr_metrics_set(tr_metrics *m, const char *key, double value, tr_err *err) {
    if (strlen(key) >= TR_METRICS_KEY_MAX || !key_ok(key))
        return tr_errf(err, TR_EINVAL, "metric key '%s': at most %d characters of [A-Za-z0-9_/.-]",
                       key, TR_METRICS_KEY_MAX - 1);
    for (int32_t i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) {
            m->values[i] = value;
            return 0;
        }
    if (m->n == TR_METRICS_MAX_KEYS)
        return tr_errf(err, TR_ERANGE, "metric '%s': more than %d metrics in one step", key,
                       TR_METRICS_MAX_KEYS);
    strcpy(m->keys[m->n], key);
    m->values[m->n++] = value;
    return 0;
}

double tr_metrics_get(const tr_metrics *m, const char *key) {
    for (int32_t i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0) return m->values[i];
    return NAN;
}

static void fmt_duration(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long long t = (long long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%lldh%02lldm", t / 3600, t / 60 % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%llds", t);
}

void tr_metrics_progress_line(const tr_metrics *m, double now, char *buf, size_t cap) {
    size_t n = 0;
#define ADD(...)                                                              \
    do {                                                                      \
        if (n < cap) {                                                        \
            int k_ = snprintf(buf + n, cap - n, __VA_ARGS__);                 \
            n = k_ < 0 ? cap : n + (size_t)k_;                                \
        }                                                                     \
    } while (0)
    ADD("%s step %" PRId64 "/%" PRId64, m->workflow, m->step, m->total_steps);
    double r = tr_metrics_get(m, "reward/mean");
    double loss = tr_metrics_get(m, "loss");
    if (isfinite(r))
        ADD(" | reward %.3f", r);
    else if (isfinite(loss))
        ADD(" | loss %.4f", loss);
    if (isfinite(m->last_eval)) ADD(" | eval %.3f @%" PRId64, m->last_eval, m->last_eval_step);
    int64_t done = m->step - m->first_step;
    double elapsed = now - m->t_open;
    if (done > 0) {
        double per = elapsed / (double)done;
        char eta[32];
        fmt_duration(per * (double)(m->total_steps - m->step), eta, sizeof eta);
        ADD(" | %.2f s/step | ETA %s", per, eta);
    } else {
        ADD(" | ETA ?");
    }
#undef ADD
}

int tr_metrics_commit(tr_metrics *m, tr_err *err) {
    if (!m->f) return tr_errf(err, TR_EINVAL, "metrics log is not open");
    char line[TR_METRICS_MAX_KEYS * (TR_METRICS_KEY_MAX + 32) + 64];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"step\": %" PRId64, m->step);
    for (int32_t i = 0; i < m->n; i++) {
        double v = m->values[i];
        if (isfinite(v))
            n += (size_t)snprintf(line + n, sizeof line - n, ", \"%s\": %.10g", m->keys[i], v);
        else
            n += (size_t)snprintf(line + n, sizeof line - n, ", \"%s\": null", m->keys[i]);
    }
    n += (size_t)snprintf(line + n, sizeof line - n, "}\n");
    if (fwrite(line, 1, n, m->f) != n || fflush(m->f) != 0 || fsync(fileno(m->f)) != 0)
        return tr_errf(err, TR_EIO, "%s: write failed: %s", m->path, strerror(errno));
    if (m->tb_on) {
        const char *tags[TR_METRICS_MAX_KEYS];
        for (int32_t i = 0; i < m->n; i++) tags[i] = m->keys[i];
        if (tr_tfevents_scalars(&m->tb, wall_now(), m->step, tags, m->values, m->n, err) ||
            tr_tfevents_flush(&m->tb, err))
            return -1;
    }
    double acc = tr_metrics_get(m, "eval/accuracy");
    if (!isfinite(acc)) acc = tr_metrics_get(m, "eval/loss");
    if (isfinite(acc)) {
        m->last_eval = acc;
        m->last_eval_step = m->step;
    }
    if (m->progress) {
        char p[512];
        tr_metrics_progress_line(m, tr_metrics_now(), p, sizeof p);
        fprintf(m->progress_out, "%s\n", p);
        fflush(m->progress_out);
    }
    return 0;
}
