// YAML text to the recipe's node tree through libyaml's document loader, keeping start
// marks; and the --set overrides, which graft new nodes into that tree before validation.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "rl/recipe_tree.h"

// Aliases can make a small file expand into a huge (or, with a self-referencing anchor,
// endless) tree; recipes are small, so both bounds stay far above any real one.
#define YAML_MAX_DEPTH 64
#define YAML_MAX_NODES 200000

void tr_ynode_free(tr_ynode *n) {
    if (!n) return;
    int32_t kids = n->kind == TR_YNODE_MAP ? 2 * n->n : (n->kind == TR_YNODE_SEQ ? n->n : 0);
    for (int32_t i = 0; i < kids; i++) tr_ynode_free(n->kids[i]);
    free(n->kids);
    free(n->text);
    free(n);
}

static tr_ynode *node_new(enum tr_ynode_kind kind, const char *src, int32_t line, int32_t col) {
    tr_ynode *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->src = src;
    n->line = line;
    n->col = col;
    return n;
}

static tr_ynode *scalar_new(const char *text, size_t len, bool plain, const char *src, int32_t line,
                            int32_t col) {
    tr_ynode *n = node_new(TR_YNODE_SCALAR, src, line, col);
    if (!n) return NULL;
    n->text = malloc(len + 1);
    if (!n->text) {
        free(n);
        return NULL;
    }
    memcpy(n->text, text, len);
    n->text[len] = '\0';
    n->plain = plain;
    return n;
}

// Appends kid (and for mappings key) to a collection; on failure the caller still owns them.
static int node_push(tr_ynode *n, tr_ynode *key, tr_ynode *value) {
    int32_t per = n->kind == TR_YNODE_MAP ? 2 : 1;
    tr_ynode **k = realloc(n->kids, (size_t)(n->n + 1) * (size_t)per * sizeof *k);
    if (!k) return -1;
    n->kids = k;
    if (per == 2) {
        k[2 * n->n] = key;
        k[2 * n->n + 1] = value;
    } else {
        k[n->n] = value;
    }
    n->n++;
    return 0;
}

void tr_ynode_where(const tr_ynode *n, char *buf, size_t cap) {
    if (!n) {
        snprintf(buf, cap, "?");
        return;
    }
    if (n->line > 0)
        snprintf(buf, cap, "%s:%d:%d", n->src, (int)n->line, (int)n->col);
    else
        snprintf(buf, cap, "%s", n->src);
}

tr_ynode *tr_ynode_get(const tr_ynode *map, const char *key) {
    if (!map || map->kind != TR_YNODE_MAP) return NULL;
    for (int32_t i = 0; i < map->n; i++)
        if (strcmp(map->kids[2 * i]->text, key) == 0) return map->kids[2 * i + 1];
    return NULL;
}

// Walks a dotted path; *last_found receives the deepest existing node.
static tr_ynode *path_walk(const tr_ynode *root, const char *path, const tr_ynode **last_found) {
    const tr_ynode *cur = root;
    *last_found = root;
    char seg[256];
    const char *p = path;
    while (cur && *p) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (len >= sizeof seg) return NULL;
        memcpy(seg, p, len);
        seg[len] = '\0';
        cur = tr_ynode_get(cur, seg);
        if (cur) *last_found = cur;
        p = dot ? dot + 1 : p + len;
    }
    return (tr_ynode *)cur;
}

tr_ynode *tr_ynode_path(const tr_ynode *root, const char *path) {
    const tr_ynode *last;
    return path_walk(root, path, &last);
}

const tr_ynode *tr_ynode_nearest(const tr_ynode *root, const char *path) {
    const tr_ynode *last;
    path_walk(root, path, &last);
    return last;
}

typedef struct convert_ctx {
    yaml_document_t *doc;
    const char *src;
    int64_t count;
    tr_err *err;
} convert_ctx;

static int convert(convert_ctx *c, yaml_node_t *y, int depth, tr_ynode **out) {
    *out = NULL;
    int32_t line = (int32_t)y->start_mark.line + 1, col = (int32_t)y->start_mark.column + 1;
    if (depth > YAML_MAX_DEPTH)
        return tr_errf(c->err, TR_EFORMAT, "%s:%d:%d: nesting deeper than %d (a recursive alias?)",
                       c->src, (int)line, (int)col, YAML_MAX_DEPTH);
    if (++c->count > YAML_MAX_NODES)
        return tr_errf(c->err, TR_EFORMAT, "%s:%d:%d: more than %d YAML nodes (aliases expanding?)",
                       c->src, (int)line, (int)col, YAML_MAX_NODES);
    if (y->type == YAML_SCALAR_NODE) {
        const char *v = (const char *)y->data.scalar.value;
        size_t len = y->data.scalar.length;
        if (memchr(v, '\0', len))
            return tr_errf(c->err, TR_EFORMAT, "%s:%d:%d: a scalar contains a NUL byte", c->src,
                           (int)line, (int)col);
        *out = scalar_new(v, len, y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE, c->src, line, col);
        if (!*out) return tr_errf(c->err, TR_ENOMEM, "%s: out of memory", c->src);
        return 0;
    }
    bool is_map = y->type == YAML_MAPPING_NODE;
    tr_ynode *n = node_new(is_map ? TR_YNODE_MAP : TR_YNODE_SEQ, c->src, line, col);
    if (!n) return tr_errf(c->err, TR_ENOMEM, "%s: out of memory", c->src);
    if (!is_map) {
        for (yaml_node_item_t *it = y->data.sequence.items.start; it < y->data.sequence.items.top; it++) {
            tr_ynode *kid;
            if (convert(c, yaml_document_get_node(c->doc, *it), depth + 1, &kid) != 0) {
                tr_ynode_free(n);
                return -1;
            }
            if (node_push(n, NULL, kid) != 0) {
                tr_ynode_free(kid);
                tr_ynode_free(n);
                return tr_errf(c->err, TR_ENOMEM, "%s: out of memory", c->src);
            }
        }
        *out = n;
        return 0;
    }
    for (yaml_node_pair_t *p = y->data.mapping.pairs.start; p < y->data.mapping.pairs.top; p++) {
        yaml_node_t *yk = yaml_document_get_node(c->doc, p->key);
        tr_ynode *key = NULL, *value = NULL;
        if (yk->type != YAML_SCALAR_NODE) {
            tr_ynode_free(n);
            return tr_errf(c->err, TR_EFORMAT, "%s:%d:%d: mapping keys must be plain strings", c->src,
                           (int)yk->start_mark.line + 1, (int)yk->start_mark.column + 1);
        }
        if (convert(c, yk, depth + 1, &key) != 0) {
            tr_ynode_free(n);
            return -1;
        }
        for (int32_t i = 0; i < n->n; i++)
            if (strcmp(n->kids[2 * i]->text, key->text) == 0) {
                tr_errf(c->err, TR_EFORMAT, "%s:%d:%d: duplicate key '%s' (first at line %d)", c->src,
                        (int)key->line, (int)key->col, key->text, (int)n->kids[2 * i]->line);
                tr_ynode_free(key);
                tr_ynode_free(n);
                return -1;
            }
        if (convert(c, yaml_document_get_node(c->doc, p->value), depth + 1, &value) != 0) {
            tr_ynode_free(key);
            tr_ynode_free(n);
            return -1;
        }
        if (node_push(n, key, value) != 0) {
            tr_ynode_free(key);
            tr_ynode_free(value);
            tr_ynode_free(n);
            return tr_errf(c->err, TR_ENOMEM, "%s: out of memory", c->src);
        }
    }
    *out = n;
    return 0;
}

int tr_yaml_load(const char *text, size_t len, const char *src, bool marks, tr_ynode **root,
                 tr_err *err) {
    *root = NULL;
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return tr_errf(err, TR_ENOMEM, "%s: cannot start the YAML parser", src);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        char where[64] = "";
        if (marks)
            snprintf(where, sizeof where, ":%d:%d", (int)parser.problem_mark.line + 1,
                     (int)parser.problem_mark.column + 1);
        int rc = tr_errf(err, TR_EFORMAT, "%s%s: YAML syntax error: %s%s%s", src, where,
                         parser.problem ? parser.problem : "malformed",
                         parser.context ? " " : "", parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return rc;
    }
    int rc = 0;
    yaml_node_t *y = yaml_document_get_root_node(&doc);
    if (y) {
        convert_ctx c = {.doc = &doc, .src = src, .err = err};
        rc = convert(&c, y, 0, root);
    }
    yaml_document_delete(&doc);
    // A second document ("---") would be silently ignored; say so instead.
    if (rc == 0 && y) {
        if (!yaml_parser_load(&parser, &doc)) {
            rc = tr_errf(err, TR_EFORMAT, "%s:%d:%d: YAML syntax error: %s", src,
                         (int)parser.problem_mark.line + 1, (int)parser.problem_mark.column + 1,
                         parser.problem ? parser.problem : "malformed");
        } else {
            yaml_node_t *extra = yaml_document_get_root_node(&doc);
            if (extra)
                rc = tr_errf(err, TR_EFORMAT, "%s:%d:%d: a recipe is a single YAML document; a second one starts here",
                             src, (int)extra->start_mark.line + 1, (int)extra->start_mark.column + 1);
            yaml_document_delete(&doc);
        }
        if (rc) {
            tr_ynode_free(*root);
            *root = NULL;
        }
    }
    yaml_parser_delete(&parser);
    return rc;
}

// Nodes parsed from an override's value point at the override, not at a line of it.
static void mark_override(tr_ynode *n, const char *src) {
    n->src = src;
    n->line = n->col = 0;
    int32_t kids = n->kind == TR_YNODE_MAP ? 2 * n->n : (n->kind == TR_YNODE_SEQ ? n->n : 0);
    for (int32_t i = 0; i < kids; i++) mark_override(n->kids[i], src);
}

static const char *kind_name(enum tr_ynode_kind k) {
    return k == TR_YNODE_MAP ? "mapping" : (k == TR_YNODE_SEQ ? "list" : "value");
}

int tr_yaml_apply_set(tr_ynode **root, const char *set, const char *src, tr_err *err) {
    const char *eq = strchr(set, '=');
    if (!eq || eq == set) return tr_errf(err, TR_EINVAL, "%s: expected KEY=VALUE (e.g. train.steps=10)", src);
    size_t klen = (size_t)(eq - set);
    char key[512];
    if (klen >= sizeof key) return tr_errf(err, TR_EINVAL, "%s: key too long", src);
    memcpy(key, set, klen);
    key[klen] = '\0';
    for (size_t i = 0; i < klen; i++)
        if (key[i] == '.' && (i == 0 || key[i - 1] == '.' || i + 1 == klen))
            return tr_errf(err, TR_EINVAL, "%s: empty key segment in '%s'", src, key);

    // The value: YAML flow for lists, mappings and quoted strings; literal text otherwise, so
    // that '#', ':' or '*' in a regex or an endpoint are taken as written.
    const char *v = eq + 1;
    tr_ynode *value = NULL;
    if (v[0] == '[' || v[0] == '{' || v[0] == '"' || v[0] == '\'') {
        if (tr_yaml_load(v, strlen(v), src, false, &value, err) != 0) return -1;
    }
    if (!value) value = scalar_new(v, strlen(v), true, src, 0, 0);
    if (!value) return tr_errf(err, TR_ENOMEM, "%s: out of memory", src);
    mark_override(value, src);

    if (!*root) {
        *root = node_new(TR_YNODE_MAP, src, 0, 0);
        if (!*root) {
            tr_ynode_free(value);
            return tr_errf(err, TR_ENOMEM, "%s: out of memory", src);
        }
    }
    tr_ynode *cur = *root;
    if (cur->kind != TR_YNODE_MAP) {
        char where[600];
        tr_ynode_where(cur, where, sizeof where);
        tr_ynode_free(value);
        return tr_errf(err, TR_EINVAL, "%s: the recipe (%s) is a %s, not a mapping", src, where,
                       kind_name(cur->kind));
    }
    char *seg = key;
    for (;;) {
        char *dot = strchr(seg, '.');
        if (dot) *dot = '\0';
        tr_ynode *next = NULL;
        int32_t idx = -1;
        for (int32_t i = 0; i < cur->n; i++)
            if (strcmp(cur->kids[2 * i]->text, seg) == 0) {
                idx = i;
                next = cur->kids[2 * i + 1];
            }
        if (!dot) {  // last segment: replace or add
            if (idx >= 0) {
                tr_ynode_free(next);
                cur->kids[2 * idx + 1] = value;
                return 0;
            }
            tr_ynode *k = scalar_new(seg, strlen(seg), true, src, 0, 0);
            if (!k || node_push(cur, k, value) != 0) {
                tr_ynode_free(k);
                tr_ynode_free(value);
                return tr_errf(err, TR_ENOMEM, "%s: out of memory", src);
            }
            return 0;
        }
        if (!next) {
            tr_ynode *k = scalar_new(seg, strlen(seg), true, src, 0, 0);
            next = node_new(TR_YNODE_MAP, src, 0, 0);
            if (!k || !next || node_push(cur, k, next) != 0) {
                tr_ynode_free(k);
                tr_ynode_free(next);
                tr_ynode_free(value);
                return tr_errf(err, TR_ENOMEM, "%s: out of memory", src);
            }
        } else if (next->kind != TR_YNODE_MAP) {
            char where[600];
            tr_ynode_where(next, where, sizeof where);
            // key still ends at this segment: it names the prefix that is not a mapping.
            tr_errf(err, TR_EINVAL, "%s: '%s' is a %s (%s), not a mapping", src, key,
                    kind_name(next->kind), where);
            tr_ynode_free(value);
            return -1;
        }
        *dot = '.';
        cur = next;
        seg = dot + 1;
    }
}
