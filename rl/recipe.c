// Recipe loading: YAML tree (with --set overrides grafted in) checked against the schema
// into a tr_recipe, then the rules that tie keys together (which roles a workflow needs,
// consistent sizes) and the values resolved from others. Every error names its source.
#include "rl/recipe.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/file.h"
#include "rl/recipe_schema.h"
#include "rl/recipe_tree.h"
#include "roles/reward_rule.h"

#define PATH_CAP 512

// "WHERE: PATH: message" where WHERE is the node's file:line:column or its override.
static int fail_node(const tr_ynode *n, const char *path, tr_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_node(const tr_ynode *n, const char *path, tr_err *err, const char *fmt, ...) {
    char where[600], msg[TR_ERR_MSG_MAX];
    tr_ynode_where(n, where, sizeof where);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return tr_errf(err, TR_EINVAL, "%s: %s: %s", where, path, msg);
}

static void join_path(char *out, const char *parent, const char *name) {
    if (parent[0])
        snprintf(out, PATH_CAP, "%s.%s", parent, name);
    else
        snprintf(out, PATH_CAP, "%s", name);
}

// Edit distance with adjacent transpositions (optimal string alignment), for "did you mean"
// hints: "gpro" is one step from "grpo".
static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int d[64][64];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
            d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < d[i][j])
                d[i][j] = d[i - 2][j - 2] + 1;
        }
    return d[la][lb];
}

// ", did you mean 'x'?" for the closest candidate within a small distance, else "".
static void suggestion(const char *got, const char *const *cands, size_t n, char *out, size_t cap) {
    int best = 99;
    const char *pick = NULL;
    for (size_t i = 0; i < n; i++) {
        int dist = edit_distance(got, cands[i]);
        if (dist < best) best = dist, pick = cands[i];
    }
    int limit = strlen(got) <= 4 ? 1 : 2;
    if (!pick || best > limit) {
        // "optimizer" for "optim": a known name that starts the unknown one, or vice versa.
        pick = NULL;
        for (size_t i = 0; i < n && !pick; i++) {
            size_t lc = strlen(cands[i]), lg = strlen(got);
            size_t shorter = lc < lg ? lc : lg;
            if (shorter >= 3 && !strncmp(got, cands[i], shorter)) pick = cands[i];
        }
    }
    if (pick)
        snprintf(out, cap, " (did you mean '%s'?)", pick);
    else
        out[0] = '\0';
}

static void list_names(const char *const *names, size_t n, char *out, size_t cap) {
    out[0] = '\0';
    size_t used = 0;
    for (size_t i = 0; i < n && used < cap; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%s", i ? ", " : "", names[i]);
}

static const char *describe(const tr_ynode *n, char *buf, size_t cap) {
    if (n->kind == TR_YNODE_SEQ) return "a list";
    if (n->kind == TR_YNODE_MAP) return "a mapping";
    snprintf(buf, cap, n->plain ? "'%.200s'" : "the quoted string '%.200s'", n->text);
    return buf;
}

static int fail_type(const tr_ynode *n, const char *path, const char *want, tr_err *err) {
    char buf[256];
    return fail_node(n, path, err, "expected %s, got %s", want, describe(n, buf, sizeof buf));
}

static bool is_null(const tr_ynode *n) {
    return n->kind == TR_YNODE_SCALAR && n->plain &&
           (!n->text[0] || !strcmp(n->text, "~") || !strcmp(n->text, "null") ||
            !strcmp(n->text, "Null") || !strcmp(n->text, "NULL"));
}

// Whole numbers in full (bounds such as 16777216), others in %g's shortest form.
static const char *num_text(double v, char *buf, size_t cap) {
    if (v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%g", v);
    return buf;
}

static int check_range(const tr_rkey *k, const tr_ynode *n, const char *path, double v, tr_err *err) {
    bool lo_ok = !(k->flags & TR_RK_HAS_MIN) || ((k->flags & TR_RK_MIN_OPEN) ? v > k->min : v >= k->min);
    bool hi_ok = !(k->flags & TR_RK_HAS_MAX) || ((k->flags & TR_RK_MAX_OPEN) ? v < k->max : v <= k->max);
    if (lo_ok && hi_ok) return 0;
    char range[128], lo[40], hi[40], got[40];
    if ((k->flags & TR_RK_HAS_MIN) && (k->flags & TR_RK_HAS_MAX))
        snprintf(range, sizeof range, "in %c%s, %s%c", (k->flags & TR_RK_MIN_OPEN) ? '(' : '[',
                 num_text(k->min, lo, sizeof lo), num_text(k->max, hi, sizeof hi),
                 (k->flags & TR_RK_MAX_OPEN) ? ')' : ']');
    else
        snprintf(range, sizeof range, "%s %s", (k->flags & TR_RK_MIN_OPEN) ? ">" : ">=",
                 num_text(k->min, lo, sizeof lo));
    return fail_node(n, path, err, "%s is out of range: must be %s", num_text(v, got, sizeof got), range);
}

static int parse_int(const tr_ynode *n, const char *path, int64_t *out, tr_err *err) {
    if (n->kind != TR_YNODE_SCALAR || !n->plain || !n->text[0]) return fail_type(n, path, "an integer", err);
    char *end;
    errno = 0;
    long long v = strtoll(n->text, &end, 10);
    if (*end) return fail_type(n, path, "an integer", err);
    if (errno == ERANGE) return fail_node(n, path, err, "'%s' does not fit in 64 bits", n->text);
    *out = v;
    return 0;
}

static int parse_float(const tr_ynode *n, const char *path, double *out, tr_err *err) {
    if (n->kind != TR_YNODE_SCALAR || !n->plain || !n->text[0]) return fail_type(n, path, "a number", err);
    char *end;
    errno = 0;
    double v = strtod(n->text, &end);
    // strtod also reads hex floats, inf and nan; a recipe number is decimal and finite.
    if (*end || !isfinite(v) || strpbrk(n->text, "xXnN")) return fail_type(n, path, "a number", err);
    if (errno == ERANGE && v != 0.0) return fail_node(n, path, err, "'%s' is out of the double range", n->text);
    *out = v;
    return 0;
}

static int parse_bool(const tr_ynode *n, const char *path, bool *out, tr_err *err) {
    if (n->kind == TR_YNODE_SCALAR && n->plain) {
        if (!strcmp(n->text, "true") || !strcmp(n->text, "True") || !strcmp(n->text, "TRUE")) {
            *out = true;
            return 0;
        }
        if (!strcmp(n->text, "false") || !strcmp(n->text, "False") || !strcmp(n->text, "FALSE")) {
            *out = false;
            return 0;
        }
    }
    return fail_type(n, path, "true or false", err);
}

static size_t count_names(const char *const *names) {
    size_t n = 0;
    while (names[n]) n++;
    return n;
}

static int parse_enum(const char *const *names, const tr_ynode *n, const char *path, int *out, tr_err *err) {
    size_t cnt = count_names(names);
    char allowed[512];
    list_names(names, cnt, allowed, sizeof allowed);
    if (n->kind != TR_YNODE_SCALAR) {
        char want[600];
        snprintf(want, sizeof want, "one of: %s", allowed);
        return fail_type(n, path, want, err);
    }
    for (size_t i = 0; i < cnt; i++)
        if (!strcmp(n->text, names[i])) {
            *out = (int)i;
            return 0;
        }
    char hint[128];
    suggestion(n->text, names, cnt, hint, sizeof hint);
    return fail_node(n, path, err, "'%.200s' is not one of: %s%s", n->text, allowed, hint);
}

static int fill_map(const tr_rkey *keys, char *base, const tr_ynode *n, const tr_ynode *anchor,
                    const char *path, tr_err *err);
static int apply_defaults(const tr_rkey *keys, char *base, tr_err *err);

typedef struct id_at {
    int32_t id, at;
} id_at;

static int cmp_id_at(const void *a, const void *b) {
    const id_at *x = a, *y = b;
    return x->id != y->id ? (x->id > y->id) - (x->id < y->id) : (x->at > y->at) - (x->at < y->at);
}

// A list of distinct token ids; repeats are found by sorting a copy (lists run to thousands).
static int set_token_ids(const tr_rkey *k, tr_recipe_token_ids *d, const tr_ynode *n, const char *path,
                         tr_err *err) {
    if (n->kind != TR_YNODE_SEQ) return fail_type(n, path, "a list of token ids", err);
    if ((size_t)n->n > k->size) return fail_node(n, path, err, "%d ids, at most %zu", (int)n->n, k->size);
    id_at *s = malloc((size_t)(n->n > 0 ? n->n : 1) * sizeof *s);
    if (!s) return tr_errf(err, TR_ENOMEM, "%s: out of memory for %d ids", path, (int)n->n);
    for (int32_t i = 0; i < n->n; i++) {
        char ipath[PATH_CAP];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, (int)i);
        int64_t v = 0;  // parse_int sets it; gcc -O3 cannot tell once set_value is inlined
        if (parse_int(n->kids[i], ipath, &v, err) || check_range(k, n->kids[i], ipath, (double)v, err)) {
            free(s);
            return -1;
        }
        s[i] = (id_at){(int32_t)v, i};
        d->ids[i] = (int32_t)v;   // a recipe that fails to parse is thrown away whole
    }
    qsort(s, (size_t)n->n, sizeof *s, cmp_id_at);
    for (int32_t i = 1; i < n->n; i++)
        if (s[i].id == s[i - 1].id) {
            char ipath[PATH_CAP];
            snprintf(ipath, sizeof ipath, "%s[%d]", path, (int)s[i].at);
            int32_t id = s[i].id, first = s[i - 1].at;
            const tr_ynode *at = n->kids[s[i].at];
            free(s);
            return fail_node(at, ipath, err, "id %d is listed twice (first at [%d])", (int)id, (int)first);
        }
    free(s);
    d->n = n->n;
    return 0;
}

// A string key: null reads as "", and the text must fit the fixed-size field.
static int set_str(const tr_rkey *k, char *dst, const tr_ynode *n, const char *path, tr_err *err) {
    if (n->kind != TR_YNODE_SCALAR) return fail_type(n, path, "a string", err);
    const char *s = is_null(n) ? "" : n->text;
    size_t len = strlen(s);
    if (len >= k->size) return fail_node(n, path, err, "longer than %zu bytes", k->size - 1);
    memset(dst, 0, k->size);
    memcpy(dst, s, len);
    return 0;
}

// A list of exactly k->size numbers, each in the key's range.
static int set_floats(const tr_rkey *k, char *dst, const tr_ynode *n, const char *path,
                      tr_err *err) {
    if (n->kind != TR_YNODE_SEQ || (size_t)n->n != k->size) {
        char want[64];
        snprintf(want, sizeof want, "a list of %zu numbers", k->size);
        if (n->kind == TR_YNODE_SEQ)
            return fail_node(n, path, err, "expected %s, got %d items", want, (int)n->n);
        return fail_type(n, path, want, err);
    }
    double v[8];
    for (int32_t i = 0; i < n->n; i++) {
        char ipath[PATH_CAP];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, (int)i);
        if (parse_float(n->kids[i], ipath, &v[i], err) || check_range(k, n->kids[i], ipath, v[i], err))
            return -1;
    }
    memcpy(dst, v, k->size * sizeof(double));
    return 0;
}

// A list of distinct device ids; *d changes only when the whole list is good.
static int set_devices(const tr_rkey *k, tr_recipe_devices *d, const tr_ynode *n, const char *path,
                       tr_err *err) {
    if (n->kind != TR_YNODE_SEQ) return fail_type(n, path, "a list of device ids", err);
    if (n->n > TR_RECIPE_MAX_DEVICES)
        return fail_node(n, path, err, "%d devices, at most %d", (int)n->n, TR_RECIPE_MAX_DEVICES);
    tr_recipe_devices tmp = {0};
    for (int32_t i = 0; i < n->n; i++) {
        char ipath[PATH_CAP];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, (int)i);
        int64_t v;
        if (parse_int(n->kids[i], ipath, &v, err) || check_range(k, n->kids[i], ipath, (double)v, err))
            return -1;
        if (v > INT32_MAX) return fail_node(n->kids[i], ipath, err, "device id %lld is too large", (long long)v);
        for (int32_t j = 0; j < i; j++)
            if (tmp.ids[j] == (int32_t)v)
                return fail_node(n->kids[i], ipath, err, "device %lld is listed twice", (long long)v);
        tmp.ids[i] = (int32_t)v;
    }
    tmp.n = n->n;
    *d = tmp;
    return 0;
}

// placement.colocate: a list of groups, each a list of role names.
static int set_role_groups(tr_recipe_placement *p, const tr_ynode *n, const char *path, tr_err *err) {
    if (n->kind != TR_YNODE_SEQ) return fail_type(n, path, "a list of role lists, e.g. [[policy, reference]]", err);
    if (n->n > TR_RECIPE_MAX_GROUPS)
        return fail_node(n, path, err, "%d groups, at most %d", (int)n->n, TR_RECIPE_MAX_GROUPS);
    for (int32_t g = 0; g < n->n; g++) {
        const tr_ynode *grp = n->kids[g];
        char gpath[PATH_CAP];
        snprintf(gpath, sizeof gpath, "%s[%d]", path, (int)g);
        if (grp->kind != TR_YNODE_SEQ) return fail_type(grp, gpath, "a list of roles", err);
        if (grp->n > TR_RECIPE_N_ROLES)
            return fail_node(grp, gpath, err, "%d roles, there are only %d", (int)grp->n, TR_RECIPE_N_ROLES);
        for (int32_t i = 0; i < grp->n; i++) {
            char ipath[PATH_CAP + 32];
            snprintf(ipath, sizeof ipath, "%s[%d]", gpath, (int)i);
            int role;
            if (parse_enum(tr_recipe_role_names, grp->kids[i], ipath, &role, err)) return -1;
            p->colocate[g][i] = role;
        }
        p->colocate_len[g] = grp->n;
    }
    p->n_colocate = n->n;
    return 0;
}

// A list of mappings of schema k->sub: each item starts from its defaults, then takes what
// the recipe writes; the count goes to base + k->aux_off.
static int set_list(const tr_rkey *k, char *base, const tr_ynode *n, const char *path, tr_err *err) {
    char *dst = base + k->off;
    if (n->kind != TR_YNODE_SEQ) return fail_type(n, path, "a list", err);
    if ((size_t)n->n > k->size) return fail_node(n, path, err, "%d items, at most %zu", (int)n->n, k->size);
    for (int32_t i = 0; i < n->n; i++) {
        char ipath[PATH_CAP];
        snprintf(ipath, sizeof ipath, "%s[%d]", path, (int)i);
        char *item = dst + (size_t)i * k->stride;
        memset(item, 0, k->stride);
        if (apply_defaults(k->sub, item, err)) return -1;
        if (n->kids[i]->kind != TR_YNODE_MAP) return fail_type(n->kids[i], ipath, "a mapping", err);
        if (fill_map(k->sub, item, n->kids[i], n->kids[i], ipath, err)) return -1;
    }
    *(int32_t *)(base + k->aux_off) = n->n;
    return 0;
}

// Stores one value of key k (found at node n) into base + k->off.
static int set_value(const tr_rkey *k, char *base, const tr_ynode *n, const char *path, tr_err *err) {
    char *dst = base + k->off;
    switch (k->type) {
    case TR_RK_MAP:
        if (n->kind != TR_YNODE_MAP) return fail_type(n, path, "a mapping", err);
        if (k->flags & TR_RK_PRESENCE) *(bool *)(dst + k->aux_off) = true;
        return fill_map(k->sub, dst, n, n, path, err);
    case TR_RK_INT: {
        int64_t v;
        if (parse_int(n, path, &v, err) || check_range(k, n, path, (double)v, err)) return -1;
        *(int64_t *)dst = v;
        return 0;
    }
    case TR_RK_FLOAT: {
        double v;
        if (parse_float(n, path, &v, err) || check_range(k, n, path, v, err)) return -1;
        *(double *)dst = v;
        return 0;
    }
    case TR_RK_BOOL:
        return parse_bool(n, path, (bool *)dst, err);
    case TR_RK_STR:
        return set_str(k, dst, n, path, err);
    case TR_RK_ENUM:
        return parse_enum(k->names, n, path, (int *)dst, err);
    case TR_RK_FLOATS:
        return set_floats(k, dst, n, path, err);
    case TR_RK_DEVICES:
        return set_devices(k, (tr_recipe_devices *)dst, n, path, err);
    case TR_RK_TOKEN_IDS:
        return set_token_ids(k, (tr_recipe_token_ids *)dst, n, path, err);
    case TR_RK_ROLE_GROUPS:
        return set_role_groups((tr_recipe_placement *)dst, n, path, err);
    case TR_RK_LIST:
        return set_list(k, base, n, path, err);
    }
    return tr_errf(err, TR_EINVAL, "%s: unknown schema type %d", path, (int)k->type);
}

// n: the mapping (NULL when absent); anchor: where to point when something is missing.
static int fill_map(const tr_rkey *keys, char *base, const tr_ynode *n, const tr_ynode *anchor,
                    const char *path, tr_err *err) {
    char kpath[PATH_CAP];
    if (n) {
        if (n->kind != TR_YNODE_MAP) return fail_type(n, path[0] ? path : "recipe", "a mapping", err);
        for (int32_t i = 0; i < n->n; i++) {
            const tr_ynode *key = n->kids[2 * i];
            const tr_rkey *k = keys;
            while (k->name && strcmp(k->name, key->text)) k++;
            join_path(kpath, path, key->text);
            if (!k->name) {
                const char *names[32];
                size_t cnt = 0;
                for (const tr_rkey *q = keys; q->name && cnt < 32; q++) names[cnt++] = q->name;
                char allowed[512], hint[128];
                list_names(names, cnt, allowed, sizeof allowed);
                suggestion(key->text, names, cnt, hint, sizeof hint);
                return fail_node(key, kpath, err, "unknown key; allowed keys: %s%s", allowed, hint);
            }
            if (set_value(k, base, n->kids[2 * i + 1], kpath, err)) return -1;
        }
    }
    for (const tr_rkey *k = keys; k->name; k++) {
        if (n && tr_ynode_get(n, k->name)) continue;
        join_path(kpath, path, k->name);
        if (k->flags & TR_RK_REQUIRED) return fail_node(anchor, kpath, err, "required key missing");
        // An absent plain mapping may still hold required keys (train.steps).
        if (k->type == TR_RK_MAP && !(k->flags & TR_RK_PRESENCE) &&
            fill_map(k->sub, base + k->off, NULL, anchor, kpath, err))
            return -1;
    }
    return 0;
}

static int apply_defaults(const tr_rkey *keys, char *base, tr_err *err) {
    for (const tr_rkey *k = keys; k->name; k++) {
        if (k->type == TR_RK_MAP) {
            if (apply_defaults(k->sub, base + k->off, err)) return -1;
            continue;
        }
        if (!k->def) continue;
        tr_ynode *n;
        if (tr_yaml_load(k->def, strlen(k->def), "schema default", true, &n, err)) return -1;
        if (!n) return tr_errf(err, TR_EINVAL, "schema default of %s is empty", k->name);
        int rc = set_value(k, base, n, k->name, err);
        tr_ynode_free(n);
        if (rc) return -1;
    }
    return 0;
}

int tr_recipe_defaults(tr_recipe *r, tr_err *err) {
    memset(r, 0, sizeof *r);
    return apply_defaults(tr_recipe_schema, (char *)r, err);
}

// Errors of the cross-key rules point at the key when it is written, else at its nearest
// written ancestor.
static int fail_path(const tr_ynode *root, const char *path, tr_err *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_path(const tr_ynode *root, const char *path, tr_err *err, const char *fmt, ...) {
    char msg[TR_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fail_node(tr_ynode_nearest(root, path), path, err, "%s", msg);
}

static bool valid_endpoint(const char *e) {
    return !strncmp(e, "tcp://", 6) || !strncmp(e, "ipc://", 6) || !strncmp(e, "inproc://", 9);
}

static int check_model_source(const tr_recipe_model *m, const char *role, const tr_ynode *root, tr_err *err) {
    char path[64];
    snprintf(path, sizeof path, "models.%s", role);
    int sources = (m->path[0] != 0) + (m->has_init ? 1 : 0) + (m->from != TR_RECIPE_FROM_NONE);
    bool policy = !strcmp(role, "policy");
    if (policy && m->from != TR_RECIPE_FROM_NONE)
        return fail_path(root, "models.policy.from", err, "the policy cannot start from itself; give path or init");
    if (sources == 0)
        return fail_path(root, path, err, "needs one of %s", policy ? "path, init" : "path, init, from");
    if (sources > 1)
        return fail_path(root, path, err, "give only one of path, init%s", policy ? "" : ", from");
    return 0;
}

static int check_devices(const tr_recipe_devices *d, const tr_recipe_parallel *p, const char *role,
                         const tr_ynode *root, tr_err *err) {
    int64_t ranks;
    bool overflow = __builtin_mul_overflow(p->tp, p->dp, &ranks);
    if (d->n == 0 || (!overflow && d->n == ranks)) return 0;
    char path[64];
    snprintf(path, sizeof path, "models.%s.devices", role);
    if (overflow) return fail_path(root, path, err, "tp x dp overflows");
    return fail_path(root, path, err, "%d devices for tp %lld x dp %lld = %lld ranks", (int)d->n,
                     (long long)p->tp, (long long)p->dp, (long long)ranks);
}

// Sequence parallelism splits along the sequence what the tensor-parallel ranks otherwise
// each hold whole; at tp 1 there is nothing to split, and a recipe asking for it is mistaken.
static int check_sequence_parallel(const tr_recipe_parallel *p, const char *role, const tr_ynode *root,
                                   tr_err *err) {
    if (!p->sequence_parallel || p->tp > 1) return 0;
    char path[80];
    snprintf(path, sizeof path, "models.%s.parallel.sequence_parallel", role);
    return fail_path(root, path, err, "true needs parallel.tp 2 or more (it splits along the sequence "
                     "what the tensor-parallel ranks would each hold whole)");
}

// "a,b,c": three non-negative proportions, not all zero (Megatron's --split).
static bool valid_split(const char *s) {
    double sum = 0;
    for (int i = 0; i < 3; i++) {
        char *end;
        double v = strtod(s, &end);
        if (end == s || !(v >= 0) || !isfinite(v)) return false;
        sum += v;
        s = end;
        if (i < 2) {
            if (*s != ',') return false;
            s++;
        }
    }
    return *s == '\0' && sum > 0;
}

static bool role_present(const tr_recipe *r, int role) {
    return role == TR_RECIPE_REWARD      ? r->reward.present
           : role == TR_RECIPE_GENERATOR ? r->generator.present
                                         : r->models[role].present;
}

static int64_t role_dp(const tr_recipe *r, int role) {
    return role == TR_RECIPE_REWARD      ? r->reward.parallel.dp
           : role == TR_RECIPE_GENERATOR ? r->generator.parallel.dp
                                         : r->models[role].parallel.dp;
}

static int64_t role_tp(const tr_recipe *r, int role) {
    return role == TR_RECIPE_REWARD      ? r->reward.parallel.tp
           : role == TR_RECIPE_GENERATOR ? r->generator.parallel.tp
                                         : r->models[role].parallel.tp;
}

int64_t tr_recipe_device_of(const tr_recipe_devices *d, int64_t rank) { return rank < d->n ? d->ids[rank] : rank; }

// Generator rank r can read policy rank r's working weights: the same tensor-parallel layout,
// a policy rank for every generator rank, and (on CUDA) the same device.
static bool gen_pairs(const tr_recipe *r, bool devices) {
    const tr_recipe_generator *g = &r->generator;
    const tr_recipe_model *p = &r->models[TR_RECIPE_POLICY];
    int64_t G = g->parallel.tp * g->parallel.dp;
    if (g->parallel.tp != p->parallel.tp || G > p->parallel.tp * p->parallel.dp) return false;
    for (int64_t k = 0; devices && k < G; k++)
        if (tr_recipe_device_of(&g->devices, k) != tr_recipe_device_of(&p->devices, k)) return false;
    return true;
}

bool tr_recipe_old_lp_from_rollout(const tr_recipe *r) {
    switch (r->algorithm.old_logprobs) {
    case TR_RECIPE_OLD_LP_ROLLOUT: return true;
    case TR_RECIPE_OLD_LP_RECOMPUTE: return false;
    default:
        // The CPU backend's sums do not depend on the rows beside them, so sampling reports
        // the training path's bits: the policy's own, or a generator's at the policy's tp
        // (another tp sums in another layout) that does not lag a step.
        // The CUDA backend's bf16 products are too in its batch-invariant mode.
        return (r->backend == TR_RECIPE_CPU ||
                (r->batch_invariant && r->precision != TR_RECIPE_FP32)) &&
               (!r->generator.present || (!r->generator.one_step_off &&
                                          r->generator.parallel.tp == r->models[TR_RECIPE_POLICY].parallel.tp));
    }
}

bool tr_recipe_generator_shares(const tr_recipe *r) {
    const tr_recipe_generator *g = &r->generator;
    if (!g->present || g->share_weights == TR_RECIPE_SHARE_NO) return false;
    return g->share_weights == TR_RECIPE_SHARE_YES || (r->backend == TR_RECIPE_CUDA && gen_pairs(r, true));
}

// share_weights yes needs the pairing; on CUDA a generator that copies needs GPUs of its own,
// since the sync communicator (NCCL) cannot join two processes on one device.
static int check_share(const tr_recipe *r, const tr_ynode *root, tr_err *err) {
    const tr_recipe_generator *g = &r->generator;
    const tr_recipe_model *p = &r->models[TR_RECIPE_POLICY];
    bool cuda = r->backend == TR_RECIPE_CUDA;
    if (g->share_weights == TR_RECIPE_SHARE_YES && !gen_pairs(r, cuda))
        return fail_path(root, "models.generator.share_weights", err, "yes, but generator rank r reads policy rank "
                         "r's weights: the generator needs the policy's tp (%lld, not %lld), at most its %lld ranks%s",
                         (long long)p->parallel.tp, (long long)g->parallel.tp,
                         (long long)(p->parallel.tp * p->parallel.dp), cuda ? " and each rank on its device" : "");
    if (!cuda || tr_recipe_generator_shares(r)) return 0;
    for (int64_t k = 0; k < g->parallel.tp * g->parallel.dp; k++)
        for (int64_t q = 0; q < p->parallel.tp * p->parallel.dp; q++)
            if (tr_recipe_device_of(&g->devices, k) == tr_recipe_device_of(&p->devices, q))
                return fail_path(root, "models.generator.devices", err, "generator rank %lld and policy rank %lld are "
                                 "both on device %lld: a copying sync cannot join two processes on one GPU; give the "
                                 "generator devices of its own, or share the weights (share_weights: auto shares when "
                                 "generator rank r is on policy rank r's device at the policy's tp)", (long long)k,
                                 (long long)q, (long long)tr_recipe_device_of(&g->devices, k));
    return 0;
}

// models.generator: replicas is parallel.dp by another name; one layout, one backend with the
// policy (the weight sync's communicator spans both), and a batch sampled a step ahead cannot
// grow within its step as dynamic sampling needs.
static int check_generator(tr_recipe *r, const tr_ynode *root, bool rl, tr_err *err) {
    tr_recipe_generator *g = &r->generator;
    if (!g->present) return 0;
    if (!rl)
        return fail_path(root, "models.generator", err, "workflow %s does not generate (grpo and ppo do)",
                         tr_recipe_workflow_names[r->workflow]);
    if (g->replicas > 0) {
        if (tr_ynode_path(root, "models.generator.parallel.dp") && g->parallel.dp != g->replicas)
            return fail_path(root, "models.generator.replicas", err, "%lld, but parallel.dp says %lld: give one of them",
                             (long long)g->replicas, (long long)g->parallel.dp);
        g->parallel.dp = g->replicas;
    }
    g->replicas = g->parallel.dp;
    if (check_devices(&g->devices, &g->parallel, "generator", root, err)) return -1;
    if (g->backend != TR_RECIPE_GEN_BACKEND_RUN &&
        (g->backend == TR_RECIPE_GEN_BACKEND_CUDA) != (r->backend == TR_RECIPE_CUDA))
        return fail_path(root, "models.generator.backend", err, "%s, but the policy runs on %s: the weight sync's "
                         "communicator spans both, so they share one backend (run: the recipe's)",
                         g->backend == TR_RECIPE_GEN_BACKEND_CUDA ? "cuda" : "cpu",
                         r->backend == TR_RECIPE_CUDA ? "cuda" : "cpu");
    if (check_share(r, root, err)) return -1;
    if (g->one_step_off && r->rollout.dynamic_sampling)
        return fail_path(root, "models.generator.one_step_off", err, "cannot go with rollout.dynamic_sampling: a "
                         "batch sampled a step ahead cannot draw more prompts within its step");
    return 0;
}

// The reward worker compiles the pattern at init; compiling it here too reports a bad
// pattern against the recipe line instead of from inside a started run.
static int check_pattern(const tr_recipe_reward *rw, const tr_ynode *root, tr_err *err) {
    tr_reward_rule *rule = NULL;
    tr_err e = {0};
    tr_reward_rule_opts o = {.kind = TR_REWARD_RULE_REGEX, .pattern = rw->pattern};
    if (tr_reward_rule_init(&rule, &o, &e)) return fail_path(root, "models.reward.pattern", err, "%s", e.msg);
    tr_reward_rule_free(rule);
    return 0;
}

// A reward's settings that hang together: what its kind needs, its endpoint, devices and
// regex.
static int check_reward(const tr_recipe_reward *rw, const tr_ynode *root, tr_err *err) {
    if (!rw->present) return 0;
    if (rw->kind == TR_RECIPE_REWARD_RULE && rw->function == TR_RECIPE_FN_REGEX && !rw->pattern[0])
        return fail_path(root, "models.reward.pattern", err, "function regex needs a pattern");
    if (rw->kind == TR_RECIPE_REWARD_MODEL && !rw->path[0])
        return fail_path(root, "models.reward.path", err, "kind model needs the reward model's path");
    if (rw->kind == TR_RECIPE_REWARD_SERVICE && !rw->endpoint[0])
        return fail_path(root, "models.reward.endpoint", err, "kind service needs an endpoint (tcp://HOST:PORT or ipc://PATH)");
    if (rw->endpoint[0] && !valid_endpoint(rw->endpoint))
        return fail_path(root, "models.reward.endpoint", err, "'%s' is not a ZeroMQ endpoint (tcp://, ipc://, inproc://)", rw->endpoint);
    if ((rw->kind == TR_RECIPE_REWARD_MODEL || rw->parallel.tp != 1) &&
        check_devices(&rw->devices, &rw->parallel, "reward", root, err))
        return -1;
    if (check_sequence_parallel(&rw->parallel, "reward", root, err)) return -1;
    if (rw->kind == TR_RECIPE_REWARD_RULE && rw->function == TR_RECIPE_FN_REGEX && check_pattern(rw, root, err))
        return -1;
    return 0;
}

// GRPO and PPO: a reward and prompts, an advantage estimator with what it needs, and a step
// whose responses split into the mini-batches.
static int check_rl(const tr_recipe *r, const tr_ynode *root, tr_err *err) {
    const char *wf = tr_recipe_workflow_names[r->workflow];
    const tr_recipe_reward *rw = &r->reward;
    if (!rw->present) return fail_path(root, "models.reward", err, "workflow %s needs a reward", wf);
    if (!r->data.train[0]) return fail_path(root, "data.train", err, "workflow %s needs a prompt set (JSONL)", wf);
    enum tr_adv_kind adv = r->algorithm.advantage;
    if (adv == TR_ADV_GAE && !r->models[TR_RECIPE_CRITIC].present) {
        if (tr_ynode_path(root, "algorithm.advantage"))
            return fail_path(root, "algorithm.advantage", err, "gae needs models.critic (e.g. critic: {from: policy})");
        return fail_path(root, "models.critic", err, "workflow ppo estimates advantages with gae, which needs a critic (e.g. critic: {from: policy})");
    }
    bool grouped = adv == TR_ADV_GRPO || adv == TR_ADV_RLOO || adv == TR_ADV_REINFORCE_PP_BASELINE;
    if (grouped && r->rollout.n < 2)
        return fail_path(root, "rollout.n", err, "advantage %s compares responses within a group: needs n >= 2, got %lld",
                         tr_adv_kind_names[adv], (long long)r->rollout.n);
    if (r->algorithm.kl_coef > 0 && !r->models[TR_RECIPE_REFERENCE].present)
        return fail_path(root, "algorithm.kl.coef", err, "a KL term needs models.reference (e.g. reference: {from: policy})");
    int64_t seqs;
    if (__builtin_mul_overflow(r->train.prompts_per_step, r->rollout.n, &seqs) || seqs > INT32_MAX)
        return fail_path(root, "train.prompts_per_step", err, "prompts_per_step x rollout.n is more than %d "
                         "responses per step", INT32_MAX);
    // The optimizer steps of the run: the length of the learning-rate schedule.
    int64_t updates;
    if (__builtin_mul_overflow(r->train.steps, r->algorithm.ppo_epochs * r->algorithm.mini_batches, &updates))
        return fail_path(root, "train.steps", err, "train.steps x algorithm.ppo_epochs x algorithm.mini_batches "
                         "optimizer steps overflow");
    if (r->algorithm.old_logprobs == TR_RECIPE_OLD_LP_ROLLOUT && r->generator.one_step_off)
        return fail_path(root, "algorithm.old_logprobs", err, "rollout cannot go with "
                         "models.generator.one_step_off: those rollouts come from the previous step's "
                         "weights, and the ratio's old logprobs must be the current policy's");
    if (seqs % r->algorithm.mini_batches)
        return fail_path(root, "algorithm.mini_batches", err,
                         "%lld responses per step (prompts_per_step x rollout.n) do not split into %lld mini-batches",
                         (long long)seqs, (long long)r->algorithm.mini_batches);
    if (r->rollout.overlong_buffer > r->rollout.max_new_tokens)
        return fail_path(root, "rollout.overlong.buffer", err, "%lld is longer than rollout.max_new_tokens (%lld)",
                         (long long)r->rollout.overlong_buffer, (long long)r->rollout.max_new_tokens);
    if (r->rollout.min_new_tokens > r->rollout.max_new_tokens)
        return fail_path(root, "rollout.min_new_tokens", err, "%lld is more than rollout.max_new_tokens (%lld)",
                         (long long)r->rollout.min_new_tokens, (long long)r->rollout.max_new_tokens);
    return 0;
}

// What each workflow needs of the data.
static int check_workflow(const tr_recipe *r, const tr_ynode *root, bool rl, tr_err *err) {
    if (rl) return check_rl(r, root, err);
    if (r->workflow == TR_RECIPE_SFT) {
        if (!r->data.train[0]) return fail_path(root, "data.train", err, "workflow sft needs conversations (JSONL)");
        if (r->data.chat_format == TR_RECIPE_CHAT_NONE)
            return fail_path(root, "data.chat_format", err, "workflow sft renders conversations through a chat "
                             "format (chatml, llama3 or qwen3), not none");
    } else {
        if (r->data.n_prefixes == 0)
            return fail_path(root, "data.prefixes", err, "workflow pretrain needs indexed datasets: [{path: PREFIX, weight: 1.0}]");
    }
    return 0;
}

// train.max_len, resolved from the longest row a trainer must hold when 0, and the
// micro-batches that must hold one such row.
static int check_max_len(tr_recipe *r, const tr_ynode *root, bool rl, tr_err *err) {
    int64_t need = r->workflow == TR_RECIPE_SFT ? r->data.max_len : r->data.seq_len;
    if (rl && __builtin_add_overflow(r->data.max_prompt_len, r->rollout.max_new_tokens, &need))
        return fail_path(root, "rollout.max_new_tokens", err, "max_prompt_len + max_new_tokens overflows");
    if (r->train.max_len == 0) r->train.max_len = need;
    if (r->train.max_len < need)
        return fail_path(root, "train.max_len", err, "%lld is shorter than the longest row (%lld)",
                         (long long)r->train.max_len, (long long)need);
    if (r->train.micro_batch_tokens > 0 && r->train.micro_batch_tokens < r->train.max_len)
        return fail_path(root, "train.micro_batch_tokens", err, "%lld cannot hold one row of train.max_len %lld tokens",
                         (long long)r->train.micro_batch_tokens, (long long)r->train.max_len);
    return 0;
}

// placement.colocate: groups of two or more roles with workers, each role once, all of a
// group's roles with the same data- and tensor-parallel sizes.
static int check_colocation(const tr_recipe *r, const tr_ynode *root, tr_err *err) {
    bool seen[TR_RECIPE_N_ROLES] = {false};
    for (int32_t g = 0; g < r->placement.n_colocate; g++) {
        char gpath[64];
        snprintf(gpath, sizeof gpath, "placement.colocate");
        if (r->placement.colocate_len[g] < 2)
            return fail_path(root, gpath, err, "group %d has %d role(s); colocation needs two or more", (int)g,
                             (int)r->placement.colocate_len[g]);
        for (int32_t i = 0; i < r->placement.colocate_len[g]; i++) {
            int role = r->placement.colocate[g][i];
            const char *name = tr_recipe_role_names[role];
            if (!role_present(r, role))
                return fail_path(root, gpath, err, "role %s is not defined under models", name);
            if (role == TR_RECIPE_REWARD && r->reward.kind != TR_RECIPE_REWARD_MODEL)
                return fail_path(root, gpath, err, "a %s reward has no worker to colocate",
                                 r->reward.kind == TR_RECIPE_REWARD_RULE ? "rule" : "service");
            if (role == TR_RECIPE_GENERATOR)
                return fail_path(root, gpath, err, "the generator runs in processes of its own (to generate in "
                                 "the policy's process, leave models.generator out)");
            if (seen[role]) return fail_path(root, gpath, err, "role %s appears in more than one place", name);
            seen[role] = true;
            // One process per rank holds the whole group, so every role has that many ranks.
            int first = r->placement.colocate[g][0];
            if (role_dp(r, role) != role_dp(r, first))
                return fail_path(root, gpath, err, "%s has parallel.dp %lld and %s %lld; colocated roles need "
                                 "the same data-parallel size", tr_recipe_role_names[first],
                                 (long long)role_dp(r, first), name, (long long)role_dp(r, role));
            if (role_tp(r, role) != role_tp(r, first))
                return fail_path(root, gpath, err, "%s has parallel.tp %lld and %s %lld; colocated roles need "
                                 "the same tensor-parallel size", tr_recipe_role_names[first],
                                 (long long)role_tp(r, first), name, (long long)role_tp(r, role));
        }
    }
    return 0;
}

// Rules across keys, and values resolved from others.
static int validate(tr_recipe *r, const tr_ynode *root, tr_err *err) {
    bool rl = r->workflow == TR_RECIPE_GRPO || r->workflow == TR_RECIPE_PPO;

    if (!tr_ynode_path(root, "algorithm.advantage"))
        r->algorithm.advantage = r->workflow == TR_RECIPE_PPO ? TR_ADV_GAE : TR_ADV_GRPO;

    for (int role = 0; role < TR_RECIPE_REWARD; role++) {
        const tr_recipe_model *m = &r->models[role];
        if (!m->present) continue;
        if (check_model_source(m, tr_recipe_role_names[role], root, err)) return -1;
        if (check_devices(&m->devices, &m->parallel, tr_recipe_role_names[role], root, err) ||
            check_sequence_parallel(&m->parallel, tr_recipe_role_names[role], root, err))
            return -1;
    }
    // Only Qwen3's template has think blocks: elsewhere the switch would be silently ignored.
    if (!r->data.enable_thinking && r->data.chat_format != TR_RECIPE_CHAT_QWEN3)
        return fail_path(root, "data.enable_thinking", err, "false applies to chat_format qwen3 only "
                         "(%s has no think blocks)", tr_recipe_chat_names[r->data.chat_format]);

    if (check_generator(r, root, rl, err) || check_reward(&r->reward, root, err)) return -1;
    if (r->placement.endpoint[0] && !valid_endpoint(r->placement.endpoint))
        return fail_path(root, "placement.endpoint", err, "'%s' is not a ZeroMQ endpoint (tcp://, ipc://, inproc://)",
                         r->placement.endpoint);
    if (r->placement.attach && !r->placement.endpoint[0])
        return fail_path(root, "placement.attach", err, "needs placement.endpoint: the address workers started "
                         "elsewhere connect to");
    // Every trainer gets the loss settings, whatever the workflow.
    if (r->algorithm.clip_dual != 0.0 && !(r->algorithm.clip_dual > 1.0))
        return fail_path(root, "algorithm.clip.dual", err, "%g: the dual clip must be 0 (off) or > 1", r->algorithm.clip_dual);

    if (check_workflow(r, root, rl, err)) return -1;
    if (!valid_split(r->data.split))
        return fail_path(root, "data.split", err, "'%s' is not three proportions like \"969,30,1\"", r->data.split);
    if (r->train.eval_every > 0 && r->workflow != TR_RECIPE_PRETRAIN && !r->data.eval[0])
        return fail_path(root, "train.eval_every", err, "periodic eval needs data.eval (or eval_every: 0)");

    if (check_max_len(r, root, rl, err) || check_colocation(r, root, err)) return -1;
    return 0;
}

int tr_recipe_parse(const char *text, size_t len, const char *name, const char *const *sets,
                    int n_sets, tr_recipe *r, tr_err *err) {
    if (n_sets < 0 || n_sets > TR_RECIPE_MAX_SETS)
        return tr_errf(err, TR_EINVAL, "%d overrides, at most %d", n_sets, TR_RECIPE_MAX_SETS);
    tr_ynode *root = NULL;
    if (tr_yaml_load(text, len, name, true, &root, err)) return -1;
    char **srcs = calloc((size_t)n_sets + 1, sizeof *srcs);
    tr_recipe *tmp = malloc(sizeof *tmp);
    int rc = -1;
    if (!srcs || !tmp) {
        tr_errf(err, TR_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    for (int i = 0; i < n_sets; i++) {
        size_t sl = strlen(sets[i]) + 8;
        srcs[i] = malloc(sl);
        if (!srcs[i]) {
            tr_errf(err, TR_ENOMEM, "%s: out of memory", name);
            goto done;
        }
        snprintf(srcs[i], sl, "--set %s", sets[i]);
        if (tr_yaml_apply_set(&root, sets[i], srcs[i], err)) goto done;
    }
    if (!root) {
        tr_errf(err, TR_EINVAL, "%s: the recipe is empty (it needs at least workflow, run_dir, models.policy, train.steps)", name);
        goto done;
    }
    if (tr_recipe_defaults(tmp, err)) goto done;
    if (fill_map(tr_recipe_schema, (char *)tmp, root, root, "", err)) goto done;
    if (validate(tmp, root, err)) goto done;
    memcpy(r, tmp, sizeof *r);
    rc = 0;
done:
    tr_ynode_free(root);
    if (srcs)
        for (int i = 0; i < n_sets; i++) free(srcs[i]);
    free(srcs);
    free(tmp);
    return rc;
}

int tr_recipe_load(const char *path, const char *const *sets, int n_sets, tr_recipe *r, tr_err *err) {
    char *text;
    size_t len;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = tr_recipe_parse(text, len, path, sets, n_sets, r, err);
    free(text);
    return rc;
}
