// Every recipe shipped in configs/ validates and round-trips through its resolved form, names
// model configs that exist, and every workflow has a CPU recipe whose every file is in the
// repository (so it runs as shipped); the key table in docs/recipes.md is exactly the one
// generated from the schema (so the documented defaults are the real ones).
// `test_recipe_configs --table` prints that table.
#include <dirent.h>

#include "engine/file.h"
#include "rl/recipe.h"
#include "tests/test.h"

#define TABLE_BEGIN "<!-- keys:begin (generated: build/tests/rl/test_recipe_configs --table) -->\n"
#define TABLE_END "<!-- keys:end -->"

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// A path a recipe names, relative to the source root (recipes are run from there).
static bool src_exists(const char *rel, const char *suffix) {
    char path[8192];
    snprintf(path, sizeof path, "%s%s", tr_test_src(rel), suffix);
    return tr_file_exists(path);
}

// Whether every file the recipe reads is in the repository; names each one missing.
static bool files_present(const tr_recipe *r, const char *name) {
    const tr_recipe_model *p = &r->models[TR_RECIPE_POLICY];
    bool ok = true;
    if (p->path[0] && !src_exists(p->path, "/config.json")) {
        printf("%s: %s/config.json is missing\n", name, p->path);
        ok = false;
    }
    const char *files[] = {r->data.train, r->data.eval};
    for (int i = 0; i < 2; i++)
        if (files[i][0] && !src_exists(files[i], "")) {
            printf("%s: %s is missing\n", name, files[i]);
            ok = false;
        }
    for (int32_t i = 0; i < r->data.n_prefixes; i++) {
        const char *pre = r->data.prefixes[i].path;
        if (!src_exists(pre, ".bin") || !src_exists(pre, ".idx")) {
            printf("%s: %s.bin or .idx is missing\n", name, pre);
            ok = false;
        }
    }
    return ok;
}

static void test_configs(void) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", tr_test_src("configs"));
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s", dir);
    if (!d) return;
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 5 && !strcmp(e->d_name + l - 5, ".yaml")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    bool quick = false, quick_sft = false;
    bool workflows[4] = {false}, on_cpu[4] = {false};
    for (int i = 0; i < n; i++) {
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        tr_recipe r, back;
        tr_err err = {0};
        int rc = tr_recipe_load(path, NULL, 0, &r, &err);
        CHECKF(rc == 0, "%s", err.msg);
        if (rc) continue;
        workflows[r.workflow] = true;
        for (int role = 0; role < TR_RECIPE_REWARD; role++)
            if (r.models[role].present && r.models[role].has_init)
                CHECKF(src_exists(r.models[role].init_config, ""), "%s: %s does not exist", names[i],
                       r.models[role].init_config);
        if (r.backend == TR_RECIPE_CPU && files_present(&r, names[i])) on_cpu[r.workflow] = true;
        char *yaml;
        size_t len;
        CHECK(tr_recipe_emit(&r, &yaml, &len, &err) == 0);
        rc = tr_recipe_parse(yaml, len, path, NULL, 0, &back, &err);
        CHECKF(rc == 0, "%s resolved: %s", names[i], err.msg);
        char key[256];
        CHECKF(rc == 0 && tr_recipe_diff(&r, &back, key, sizeof key) == 0, "%s: round trip differs at %s",
               names[i], key);
        free(yaml);
        if (!strcmp(names[i], "quickstart.yaml")) {
            quick = true;
            CHECK(r.workflow == TR_RECIPE_GRPO && r.backend == TR_RECIPE_CPU);
            CHECK(!strncmp(r.models[TR_RECIPE_POLICY].path, "examples/arith/", 15));
            CHECK(!strncmp(r.data.train, "examples/arith/", 15));
        }
        if (!strcmp(names[i], "quickstart-sft.yaml")) {
            quick_sft = true;
            CHECK(r.workflow == TR_RECIPE_SFT && r.backend == TR_RECIPE_CPU);
            CHECK(!strncmp(r.data.train, "examples/arith/", 15));
        }
    }
    CHECK(quick && quick_sft);
    CHECKF(workflows[0] && workflows[1] && workflows[2] && workflows[3], "configs/ lacks a workflow example");
    for (int w = 0; w < 4; w++)
        CHECKF(on_cpu[w], "configs/ has no %s recipe that runs on the CPU as shipped", tr_recipe_workflow_names[w]);
    for (int i = 0; i < n; i++) free(names[i]);
}

static void test_docs_table(void) {
    char *doc, *table;
    size_t len, tlen;
    tr_err err = {0};
    CHECK(tr_recipe_doc_table(&table, &tlen, &err) == 0);
    int rc = tr_file_read(tr_test_src("docs/recipes.md"), &doc, &len, &err);
    CHECKF(rc == 0, "%s", err.msg);
    if (rc) {
        free(table);
        return;
    }
    const char *b = strstr(doc, TABLE_BEGIN), *e = b ? strstr(b, TABLE_END) : NULL;
    CHECKF(b && e, "docs/recipes.md lacks the %s ... %s markers", TABLE_BEGIN, TABLE_END);
    if (b && e) {
        b += strlen(TABLE_BEGIN);
        bool same = (size_t)(e - b) == tlen && !memcmp(b, table, tlen);
        CHECKF(same, "docs/recipes.md key table is stale: regenerate it with test_recipe_configs --table");
    }
    // The row format the page relies on, and a default the struct agrees with.
    tr_recipe r;
    CHECK(tr_recipe_defaults(&r, &err) == 0 && r.algorithm.clip_low == 0.2);
    CHECK(strstr(table, "| `algorithm.clip.low` | number | `0.2` | [0, 1) |") != NULL);
    free(doc);
    free(table);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--table")) {
        char *table;
        size_t len;
        tr_err err = {0};
        if (tr_recipe_doc_table(&table, &len, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        fwrite(table, 1, len, stdout);
        free(table);
        return 0;
    }
    test_configs();
    test_docs_table();
    return tr_test_summary("test_recipe_configs");
}
