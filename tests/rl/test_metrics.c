// The metrics log read back by the JSON parser under the data-file rules: one object per line,
// "step" first, values as set, null for non-finite; the resume trim drops later steps and a
// torn line; the progress line; the TensorBoard file beside it.
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/file.h"
#include "rl/metrics.h"
#include "tests/json_get.h"
#include "tests/test.h"

// Parses every line of path; returns the number of lines and stores up to max objects.
static int read_lines(const char *path, tr_json_doc *objs, int max) {
    char *data;
    size_t len;
    tr_err err = {0};
    if (tr_file_read(path, &data, &len, &err)) return -1;
    int n = 0;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        tr_json_doc o;
        int bad = tj_parse(&o, line, strlen(line), path, &err);
        CHECKF(!bad && o.root->type == TR_JSON_OBJECT, "line %d not a JSON object: %s", n + 1, line);
        // "step" is the first key as written.
        CHECKF(strncmp(line, "{\"step\": ", 9) == 0, "line %d: %s", n + 1, line);
        if (n < max && !bad)
            objs[n] = o;
        else if (!bad)
            tr_json_free(&o);
        n++;
    }
    CHECK(len == 0 || data[len - 1] == '\n' || data[len - 1] == '\0');
    free(data);
    return n;
}

static double num(const tr_json_doc *o, const char *key) { return tj_num(tr_json_get(o->root, key)); }

static int count_files(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) n++;
    closedir(d);
    return n;
}

static void log_step(tr_metrics *m, int64_t step, double reward, double acc) {
    tr_err err = {0};
    tr_metrics_begin(m, step);
    CHECK(tr_metrics_set(m, "reward/mean", reward, &err) == 0);
    CHECK(tr_metrics_set(m, "lr", 1e-4, &err) == 0);
    if (!isnan(acc)) CHECK(tr_metrics_set(m, "eval/accuracy", acc, &err) == 0);
    CHECK(tr_metrics_set(m, "kl", NAN, &err) == 0);
    CHECK(tr_metrics_set(m, "reward/mean", reward, &err) == 0);  // replaces, not duplicates
    CHECK(tr_metrics_commit(m, &err) == 0);
}

int main(void) {
    const char *dir = tr_test_tmpdir();
    char path[512], prog[512], tb[512];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(prog, sizeof prog, "%s/progress.txt", dir);
    snprintf(tb, sizeof tb, "%s/tensorboard", dir);
    tr_err err = {0};

    FILE *pf = fopen(prog, "w");
    tr_metrics m;
    tr_metrics_opts o = {.run_dir = dir, .workflow = "grpo", .total_steps = 10,
                         .resume_step = -1, .tensorboard = true, .progress = true,
                         .progress_out = pf};
    CHECK(tr_metrics_open(&m, &o, &err) == 0);
    for (int s = 0; s <= 4; s++) log_step(&m, s, 0.1 * s, s % 2 == 0 ? 0.5 + 0.01 * s : NAN);
    // Bad keys and a full record are errors, not silent drops.
    tr_metrics_begin(&m, 5);
    CHECK(tr_metrics_set(&m, "has space", 1, &err) == -1 && err.code == TR_EINVAL);
    CHECK(tr_metrics_set(&m, "x\"", 1, &err) == -1);
    char key[16];
    int ok = 0;
    for (int i = 0; i < TR_METRICS_MAX_KEYS + 1; i++) {
        snprintf(key, sizeof key, "k%d", i);
        ok += tr_metrics_set(&m, key, i, &err) == 0;
    }
    CHECK(ok == TR_METRICS_MAX_KEYS && err.code == TR_ERANGE);
    tr_metrics_begin(&m, 5);  // discards the record above
    tr_metrics_close(&m);
    fclose(pf);

    tr_json_doc objs[16] = {0};
    int n = read_lines(path, objs, 16);
    CHECK(n == 5);
    for (int i = 0; i < n && i < 16; i++) {
        CHECK(num(&objs[i], "step") == i);
        CHECK_NEAR(num(&objs[i], "reward/mean"), 0.1 * i, 1e-12);
        CHECK_NEAR(num(&objs[i], "lr"), 1e-4, 1e-16);
        CHECK(tr_json_is(tr_json_get(objs[i].root, "kl"), TR_JSON_NULL));
        CHECK(tj_size(objs[i].root) == (size_t)(i % 2 == 0 ? 5 : 4));
        if (i % 2 == 0) CHECK_NEAR(num(&objs[i], "eval/accuracy"), 0.5 + 0.01 * i, 1e-12);
        tr_json_free(&objs[i]);
    }

    // Progress lines: one per commit, step/total, reward, the latest eval and an ETA.
    char *ptext;
    size_t plen;
    CHECK(tr_file_read(prog, &ptext, &plen, &err) == 0);
    int lines = 0;
    for (size_t i = 0; i < plen; i++) lines += ptext[i] == '\n';
    CHECK(lines == 5);
    CHECK(strstr(ptext, "grpo step 0/10 | reward 0.000 | eval 0.500 @0 | ETA ?\n") != NULL);
    CHECK(strstr(ptext, "grpo step 3/10 | reward 0.300 | eval 0.520 @2 | ") != NULL);
    CHECK(strstr(ptext, "s/step | ETA ") != NULL);
    free(ptext);
    CHECK(count_files(tb, "events.out.tfevents.") == 1);

    // A crash mid-write leaves a torn line; resuming from step 2 keeps steps 0..2 only.
    FILE *f = fopen(path, "ab");
    fputs("{\"step\": 5, \"reward/me", f);
    fclose(f);
    o.resume_step = 2;
    o.progress = false;
    CHECK(tr_metrics_open(&m, &o, &err) == 0);
    log_step(&m, 3, 0.9, NAN);
    tr_metrics_close(&m);
    n = read_lines(path, objs, 16);
    CHECK(n == 4);
    for (int i = 0; i < n && i < 16; i++) {
        CHECK(num(&objs[i], "step") == i);
        CHECK_NEAR(num(&objs[i], "reward/mean"), i == 3 ? 0.9 : 0.1 * i, 1e-12);
        tr_json_free(&objs[i]);
    }

    // ETA arithmetic: 4 steps done in 8 s since open at step 2 -> 2 s/step, 4 steps left.
    tr_metrics pm = {0};
    strcpy(pm.workflow, "sft");
    pm.total_steps = 10;
    pm.first_step = 2;
    pm.t_open = 100.0;
    pm.last_eval = NAN;
    tr_metrics_begin(&pm, 6);
    CHECK(tr_metrics_set(&pm, "loss", 1.5, &err) == 0);
    char line[256];
    tr_metrics_progress_line(&pm, 108.0, line, sizeof line);
    CHECKF(strcmp(line, "sft step 6/10 | loss 1.5000 | 2.00 s/step | ETA 8s") == 0, "%s", line);
    pm.total_steps = 4000;
    tr_metrics_progress_line(&pm, 108.0, line, sizeof line);
    CHECKF(strstr(line, "ETA 2h13m") != NULL, "%s", line);  // 3994 steps x 2 s
    return tr_test_summary("test_metrics");
}
