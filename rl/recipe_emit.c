// Schema walks over a filled tr_recipe: the resolved YAML written into the run directory
// (every key, so a run records exactly what it used), key-by-key comparison, and the
// Markdown key reference of docs/recipes.md.
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/file.h"
#include "rl/recipe.h"
#include "rl/recipe_schema.h"

// A growable string; `failed` sticks after the first allocation failure.
typedef struct strbuf {
    char *data;
    size_t len, cap;
    int failed;
} strbuf;

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->data && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *d = realloc(b->data, cap);
        if (!d) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
}

// The shortest %g form that reads back to the same double, always with a '.' or exponent.
static void fmt_double(double v, char *out, size_t cap) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, cap, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    if (!strpbrk(out, ".e")) {
        size_t l = strlen(out);
        if (l + 2 < cap) memcpy(out + l, ".0", 3);
    }
}

static void emit_string(strbuf *b, const char *s) {
    sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sb_printf(b, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            sb_printf(b, "\\x%02x", *p);
        else
            sb_printf(b, "%c", *p);
    }
    sb_printf(b, "\"");
}

static void emit_flow_map(strbuf *b, const tr_rkey *keys, const char *base);

// A leaf value (no newline).
static void emit_leaf(strbuf *b, const tr_rkey *k, const char *base) {
    const char *src = base + k->off;
    char num[64];
    switch (k->type) {
    case TR_RK_INT: sb_printf(b, "%lld", (long long)*(const int64_t *)src); break;
    case TR_RK_FLOAT:
        fmt_double(*(const double *)src, num, sizeof num);
        sb_printf(b, "%s", num);
        break;
    case TR_RK_BOOL: sb_printf(b, "%s", *(const bool *)src ? "true" : "false"); break;
    case TR_RK_STR: emit_string(b, src); break;
    case TR_RK_ENUM: sb_printf(b, "%s", k->names[*(const int *)src]); break;
    case TR_RK_FLOATS:
        sb_printf(b, "[");
        for (size_t i = 0; i < k->size; i++) {
            fmt_double(((const double *)src)[i], num, sizeof num);
            sb_printf(b, "%s%s", i ? ", " : "", num);
        }
        sb_printf(b, "]");
        break;
    case TR_RK_DEVICES: {
        const tr_recipe_devices *d = (const tr_recipe_devices *)src;
        sb_printf(b, "[");
        for (int32_t i = 0; i < d->n; i++) sb_printf(b, "%s%d", i ? ", " : "", (int)d->ids[i]);
        sb_printf(b, "]");
        break;
    }
    case TR_RK_TOKEN_IDS: {
        const tr_recipe_token_ids *d = (const tr_recipe_token_ids *)src;
        sb_printf(b, "[");
        for (int32_t i = 0; i < d->n; i++) sb_printf(b, "%s%d", i ? ", " : "", (int)d->ids[i]);
        sb_printf(b, "]");
        break;
    }
    case TR_RK_ROLE_GROUPS: {
        const tr_recipe_placement *p = (const tr_recipe_placement *)src;
        sb_printf(b, "[");
        for (int32_t g = 0; g < p->n_colocate; g++) {
            sb_printf(b, "%s[", g ? ", " : "");
            for (int32_t i = 0; i < p->colocate_len[g]; i++)
                sb_printf(b, "%s%s", i ? ", " : "", tr_recipe_role_names[p->colocate[g][i]]);
            sb_printf(b, "]");
        }
        sb_printf(b, "]");
        break;
    }
    case TR_RK_LIST: {
        int32_t n = *(const int32_t *)(base + k->aux_off);
        sb_printf(b, "[");
        for (int32_t i = 0; i < n; i++) {
            sb_printf(b, "%s", i ? ", " : "");
            emit_flow_map(b, k->sub, src + (size_t)i * k->stride);
        }
        sb_printf(b, "]");
        break;
    }
    case TR_RK_MAP: emit_flow_map(b, k->sub, src); break;
    }
}

static bool map_present(const tr_rkey *k, const char *base) {
    return !(k->flags & TR_RK_PRESENCE) || *(const bool *)(base + k->off + k->aux_off);
}

static void emit_flow_map(strbuf *b, const tr_rkey *keys, const char *base) {
    sb_printf(b, "{");
    int first = 1;
    for (const tr_rkey *k = keys; k->name; k++) {
        if (k->type == TR_RK_MAP && !map_present(k, base)) continue;
        sb_printf(b, "%s%s: ", first ? "" : ", ", k->name);
        emit_leaf(b, k, base);
        first = 0;
    }
    sb_printf(b, "}");
}

static void emit_block(strbuf *b, const tr_rkey *keys, const char *base, int indent) {
    for (const tr_rkey *k = keys; k->name; k++) {
        if (k->type == TR_RK_MAP) {
            if (!map_present(k, base)) continue;
            sb_printf(b, "%*s%s:\n", indent, "", k->name);
            emit_block(b, k->sub, base + k->off, indent + 2);
            continue;
        }
        sb_printf(b, "%*s%s: ", indent, "", k->name);
        emit_leaf(b, k, base);
        sb_printf(b, "\n");
    }
}

int tr_recipe_emit(const tr_recipe *r, char **yaml, size_t *len, tr_err *err) {
    strbuf b = {0};
    sb_printf(&b, "# Resolved recipe: every key with the value this run used (defaults filled in,\n"
                  "# --set overrides applied). It loads back as a recipe.\n");
    emit_block(&b, tr_recipe_schema, (const char *)r, 0);
    if (b.failed) {
        free(b.data);
        *yaml = NULL;
        return tr_errf(err, TR_ENOMEM, "resolved recipe: out of memory");
    }
    *yaml = b.data;
    *len = b.len;
    return 0;
}

int tr_recipe_write_resolved(const tr_recipe *r, tr_err *err) {
    if (!r->run_dir[0]) return tr_errf(err, TR_EINVAL, "resolved recipe: run_dir is empty");
    if (tr_mkdirs(r->run_dir, err)) return tr_err_wrap(err, "creating run_dir");
    char *yaml;
    size_t len;
    if (tr_recipe_emit(r, &yaml, &len, err)) return -1;
    char path[TR_RECIPE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/resolved.yaml", r->run_dir);
    int rc = tr_file_write_atomic(path, yaml, len, err);
    free(yaml);
    return rc;
}

static int diff_map(const tr_rkey *keys, const char *a, const char *b, const char *path, char *key,
                    size_t cap);

static int differs(char *key, size_t cap, const char *path, const char *name) {
    if (key && cap) snprintf(key, cap, "%s%s%s", path, path[0] ? "." : "", name);
    return 1;
}

static int diff_map(const tr_rkey *keys, const char *a, const char *b, const char *path, char *key,
                    size_t cap) {
    for (const tr_rkey *k = keys; k->name; k++) {
        const char *pa = a + k->off, *pb = b + k->off;
        switch (k->type) {
        case TR_RK_MAP: {
            bool ina = map_present(k, a), inb = map_present(k, b);
            if (ina != inb) return differs(key, cap, path, k->name);
            if (!ina) break;
            char sub[512];
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k->name);
            if (diff_map(k->sub, pa, pb, sub, key, cap)) return 1;
            break;
        }
        case TR_RK_INT:
            if (*(const int64_t *)pa != *(const int64_t *)pb) return differs(key, cap, path, k->name);
            break;
        case TR_RK_FLOAT:
            if (*(const double *)pa != *(const double *)pb) return differs(key, cap, path, k->name);
            break;
        case TR_RK_BOOL:
            if (*(const bool *)pa != *(const bool *)pb) return differs(key, cap, path, k->name);
            break;
        case TR_RK_STR:
            if (strcmp(pa, pb)) return differs(key, cap, path, k->name);
            break;
        case TR_RK_ENUM:
            if (*(const int *)pa != *(const int *)pb) return differs(key, cap, path, k->name);
            break;
        case TR_RK_FLOATS:
            for (size_t i = 0; i < k->size; i++)
                if (((const double *)pa)[i] != ((const double *)pb)[i]) return differs(key, cap, path, k->name);
            break;
        case TR_RK_DEVICES: {
            const tr_recipe_devices *da = (const tr_recipe_devices *)pa, *db = (const tr_recipe_devices *)pb;
            if (da->n != db->n || memcmp(da->ids, db->ids, (size_t)da->n * sizeof da->ids[0]))
                return differs(key, cap, path, k->name);
            break;
        }
        case TR_RK_TOKEN_IDS: {
            const tr_recipe_token_ids *ta = (const tr_recipe_token_ids *)pa, *tb = (const tr_recipe_token_ids *)pb;
            if (ta->n != tb->n || memcmp(ta->ids, tb->ids, (size_t)ta->n * sizeof ta->ids[0]))
                return differs(key, cap, path, k->name);
            break;
        }
        case TR_RK_ROLE_GROUPS: {
            const tr_recipe_placement *x = (const tr_recipe_placement *)pa, *y = (const tr_recipe_placement *)pb;
            if (x->n_colocate != y->n_colocate) return differs(key, cap, path, k->name);
            for (int32_t g = 0; g < x->n_colocate; g++) {
                if (x->colocate_len[g] != y->colocate_len[g] ||
                    memcmp(x->colocate[g], y->colocate[g], (size_t)x->colocate_len[g] * sizeof(int32_t)))
                    return differs(key, cap, path, k->name);
            }
            break;
        }
        case TR_RK_LIST: {
            int32_t na = *(const int32_t *)(a + k->aux_off), nb = *(const int32_t *)(b + k->aux_off);
            if (na != nb) return differs(key, cap, path, k->name);
            for (int32_t i = 0; i < na; i++) {
                char sub[512];
                snprintf(sub, sizeof sub, "%s%s%s[%d]", path, path[0] ? "." : "", k->name, (int)i);
                if (diff_map(k->sub, pa + (size_t)i * k->stride, pb + (size_t)i * k->stride, sub, key, cap))
                    return 1;
            }
            break;
        }
        }
    }
    return 0;
}

int tr_recipe_diff(const tr_recipe *a, const tr_recipe *b, char *key, size_t cap) {
    if (key && cap) key[0] = '\0';
    return diff_map(tr_recipe_schema, (const char *)a, (const char *)b, "", key, cap);
}

static const char *type_name(const tr_rkey *k) {
    switch (k->type) {
    case TR_RK_MAP: return "mapping";
    case TR_RK_INT: return "integer";
    case TR_RK_FLOAT: return "number";
    case TR_RK_BOOL: return "bool";
    case TR_RK_STR: return "string";
    case TR_RK_ENUM: return "enum";
    case TR_RK_FLOATS: return "numbers";
    case TR_RK_DEVICES: return "integers";
    case TR_RK_TOKEN_IDS: return "integers";
    case TR_RK_ROLE_GROUPS: return "role lists";
    case TR_RK_LIST: return "list of mappings";
    }
    return "?";
}

static void doc_allowed(strbuf *b, const tr_rkey *k) {
    if (k->type == TR_RK_ENUM) {
        for (size_t i = 0; k->names[i]; i++) sb_printf(b, "%s`%s`", i ? ", " : "", k->names[i]);
        return;
    }
    if (k->type == TR_RK_ROLE_GROUPS) {
        for (size_t i = 0; tr_recipe_role_names[i]; i++) sb_printf(b, "%s`%s`", i ? ", " : "", tr_recipe_role_names[i]);
        return;
    }
    if (k->type == TR_RK_TOKEN_IDS) {
        sb_printf(b, "distinct, %zu at most, each below the vocabulary size", k->size);
        return;
    }
    if (k->type == TR_RK_FLOATS) sb_printf(b, "%zu items", k->size);
    if (!(k->flags & TR_RK_HAS_MIN)) return;
    if (k->type == TR_RK_FLOATS) sb_printf(b, ", each ");
    if (k->flags & TR_RK_HAS_MAX)
        sb_printf(b, "%c%.10g, %.10g%c", (k->flags & TR_RK_MIN_OPEN) ? '(' : '[', k->min, k->max,
                  (k->flags & TR_RK_MAX_OPEN) ? ')' : ']');
    else
        sb_printf(b, "%s %.10g", (k->flags & TR_RK_MIN_OPEN) ? ">" : ">=", k->min);
}

static void doc_rows(strbuf *b, const tr_rkey *keys, const char *path) {
    for (const tr_rkey *k = keys; k->name; k++) {
        char kp[512];
        snprintf(kp, sizeof kp, "%s%s%s", path, path[0] ? "." : "", k->name);
        sb_printf(b, "| `%s` | %s | ", kp, type_name(k));
        if (k->def)
            sb_printf(b, "`%s`", k->def);
        else if (k->def_doc)
            sb_printf(b, "%s", k->def_doc);
        else if (k->flags & TR_RK_REQUIRED)
            sb_printf(b, "required");
        else if (k->flags & TR_RK_PRESENCE)
            sb_printf(b, "absent");
        // Roles sharing a key table (reference, critic) point at the first one's rows.
        const tr_rkey *same = NULL;
        for (const tr_rkey *q = keys; q < k && !same; q++)
            if (k->type == TR_RK_MAP && q->type == TR_RK_MAP && q->sub == k->sub) same = q;
        sb_printf(b, " | ");
        if (same)
            sb_printf(b, "keys as `%s%s%s`", path, path[0] ? "." : "", same->name);
        else
            doc_allowed(b, k);
        sb_printf(b, " | %s |\n", k->doc);
        if (k->type == TR_RK_MAP && !same) doc_rows(b, k->sub, kp);
        if (k->type == TR_RK_LIST) {
            snprintf(kp, sizeof kp, "%s%s%s[]", path, path[0] ? "." : "", k->name);
            doc_rows(b, k->sub, kp);
        }
    }
}

int tr_recipe_doc_table(char **md, size_t *len, tr_err *err) {
    strbuf b = {0};
    sb_printf(&b, "| Key | Type | Default | Allowed | Meaning |\n|---|---|---|---|---|\n");
    doc_rows(&b, tr_recipe_schema, "");
    if (b.failed) {
        free(b.data);
        *md = NULL;
        return tr_errf(err, TR_ENOMEM, "recipe key table: out of memory");
    }
    *md = b.data;
    *len = b.len;
    return 0;
}
