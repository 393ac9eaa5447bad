// Recipe parsing on thousands of deterministic mutations of the shipped configs (bytes
// replaced by YAML-significant characters, inserted, deleted): the parser never crashes
// (CI runs this under ASan/UBSan), every rejection is an error that starts with the file's
// name, and every accepted mutant round-trips through its resolved YAML unchanged.
#include <stdint.h>

#include "engine/file.h"
#include "rl/recipe.h"
#include "tests/test.h"

static uint32_t rng = 99991;
static uint32_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

static const char alphabet[] = ":-[]{},#'\"&*!|>%@` \n\t019.ae~\x80";

static void mutate_and_check(const char *text, size_t len, int rounds, int *accepted, int *rejected) {
    char *buf = malloc(len + 64);
    if (!buf) {
        CHECK(0);
        return;
    }
    for (int round = 0; round < rounds; round++) {
        memcpy(buf, text, len);
        size_t n = len;
        int edits = 1 + (int)(next() % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = next() % (n ? n : 1);
            char c = alphabet[next() % (sizeof alphabet - 1)];
            switch (next() % 3) {
            case 0:
                if (n) buf[at] = c;
                break;
            case 1:
                memmove(buf + at + 1, buf + at, n - at);
                buf[at] = c;
                n++;
                break;
            default:
                if (n) {
                    memmove(buf + at, buf + at + 1, n - at - 1);
                    n--;
                }
            }
        }
        tr_recipe r, back;
        tr_err err = {0};
        if (tr_recipe_parse(buf, n, "fuzz.yaml", NULL, 0, &r, &err) != 0) {
            CHECKF(!strncmp(err.msg, "fuzz.yaml", 9), "round %d: unlocated error: %s", round, err.msg);
            (*rejected)++;
            continue;
        }
        (*accepted)++;
        char *yaml;
        size_t ylen;
        CHECK(tr_recipe_emit(&r, &yaml, &ylen, &err) == 0);
        int rc = tr_recipe_parse(yaml, ylen, "resolved.yaml", NULL, 0, &back, &err);
        char key[256] = "";
        CHECKF(rc == 0 && tr_recipe_diff(&r, &back, key, sizeof key) == 0, "round %d: round trip: %s %s", round,
               rc ? err.msg : "differs at", key);
        free(yaml);
    }
    free(buf);
}

int main(void) {
    const char *files[] = {"configs/grpo.yaml", "configs/ppo.yaml", "configs/pretrain.yaml"};
    int accepted = 0, rejected = 0;
    for (int f = 0; f < 3; f++) {
        char *text;
        size_t len;
        tr_err err = {0};
        int rc = tr_file_read(tr_test_src(files[f]), &text, &len, &err);
        CHECKF(rc == 0, "%s", err.msg);
        if (rc) continue;
        mutate_and_check(text, len, 700, &accepted, &rejected);
        free(text);
    }
    // Both outcomes must occur, or the mutations test nothing.
    CHECKF(accepted > 50 && rejected > 50, "accepted %d, rejected %d", accepted, rejected);
    printf("mutants: %d accepted, %d rejected\n", accepted, rejected);
    return tr_test_summary("test_recipe_mutations");
}
