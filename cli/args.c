// Long-option parser for troupe's commands; see args.h.
#include "cli/args.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int set_value(const char *cmd, tr_arg *a, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (a->kind) {
    case TR_ARG_STR:
        // An empty path or name is an unset shell variable more often than a wish.
        if (!*v) {
            fprintf(stderr, "troupe %s: --%s needs a non-empty value\n", cmd, a->name);
            return 2;
        }
        *(const char **)a->out = v;
        return 0;
    case TR_ARG_INT: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end) {
            fprintf(stderr, "troupe %s: --%s expects an integer, got '%s'\n", cmd, a->name, v);
            return 2;
        }
        *(long *)a->out = x;
        return 0;
    }
    case TR_ARG_FLOAT: {
        double x = strtod(v, &end);
        if (errno || end == v || *end) {
            fprintf(stderr, "troupe %s: --%s expects a number, got '%s'\n", cmd, a->name, v);
            return 2;
        }
        *(double *)a->out = x;
        return 0;
    }
    case TR_ARG_STR_LIST: {
        tr_str_list *l = a->out;
        if (l->n >= (int)(sizeof l->items / sizeof l->items[0])) {
            fprintf(stderr, "troupe %s: too many --%s options\n", cmd, a->name);
            return 2;
        }
        l->items[l->n++] = v;
        return 0;
    }
    case TR_ARG_FLAG: break;
    }
    return 2;
}

int tr_args_parse(const char *cmd, int argc, char **argv, tr_arg *table,
                  const char **pos, int max_pos, int *n_pos, bool *help) {
    *help = false;
    if (n_pos) *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (strcmp(s, "--help") == 0 || strcmp(s, "-h") == 0) {
            *help = true;
            return 0;
        }
        if (strncmp(s, "--", 2) != 0 || s[2] == '\0') {
            if (!pos || !n_pos || *n_pos >= max_pos) {
                fprintf(stderr, "troupe %s: unexpected argument '%s' (see troupe %s --help)\n",
                        cmd, s, cmd);
                return 2;
            }
            pos[(*n_pos)++] = s;
            continue;
        }
        const char *name = s + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq ? (size_t)(eq - name) : strlen(name);
        tr_arg *a = NULL;
        for (tr_arg *t = table; t && t->name; t++)
            if (strlen(t->name) == nlen && strncmp(t->name, name, nlen) == 0) a = t;
        if (!a) {
            fprintf(stderr, "troupe %s: unknown option '--%.*s' (see troupe %s --help)\n", cmd,
                    (int)nlen, name, cmd);
            return 2;
        }
        a->seen = true;
        if (a->kind == TR_ARG_FLAG) {
            if (eq) {
                fprintf(stderr, "troupe %s: --%s takes no value\n", cmd, a->name);
                return 2;
            }
            *(bool *)a->out = true;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "troupe %s: --%s needs a value\n", cmd, a->name);
            return 2;
        }
        int rc = set_value(cmd, a, v);
        if (rc) return rc;
    }
    for (tr_arg *t = table; t && t->name; t++) {
        if (t->required && !t->seen) {
            fprintf(stderr, "troupe %s: --%s is required (see troupe %s --help)\n", cmd, t->name,
                    cmd);
            return 2;
        }
    }
    return 0;
}

void tr_args_usage(const char *cmd, const char *synopsis, const char *summary,
                   const tr_arg *table) {
    printf("usage: troupe %s %s\n\n%s\n", cmd, synopsis, summary);
    if (!table || !table->name) return;
    printf("\noptions:\n");
    for (const tr_arg *t = table; t->name; t++) {
        char left[64];
        snprintf(left, sizeof left, "--%s%s%s", t->name, t->metavar ? " " : "",
                 t->metavar ? t->metavar : "");
        printf("  %-26s %s%s\n", left, t->help, t->required ? " (required)" : "");
    }
    printf("  %-26s %s\n", "--help", "show this help");
}
