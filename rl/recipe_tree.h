// Internal to the recipe module: a YAML document as a small tree of scalars, sequences and
// mappings, each node keeping where it came from (file:line:column, or the --set override
// that produced it) so that every later error can point at its source.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

enum tr_ynode_kind { TR_YNODE_SCALAR, TR_YNODE_SEQ, TR_YNODE_MAP };

typedef struct tr_ynode {
    enum tr_ynode_kind kind;
    char *text;          // scalar text (NUL-terminated); NULL for collections
    bool plain;          // unquoted scalar: only these may be numbers, booleans or null
    int32_t line, col;   // 1-based; 0 for nodes made by an override
    const char *src;     // file name or "--set k=v" (owned by the caller, outlives the tree)
    int32_t n;           // sequence items, or mapping entries
    struct tr_ynode **kids;  // SEQ: n items; MAP: 2n nodes, key then value
} tr_ynode;

// Parses YAML text (the first document) into *root; src names the text in errors, followed
// by :line:column when marks is true. An empty document gives *root = NULL.
int tr_yaml_load(const char *text, size_t len, const char *src, bool marks, tr_ynode **root,
                 tr_err *err);
void tr_ynode_free(tr_ynode *n);

// Mapping lookup by key; NULL when absent or when map is not a mapping.
tr_ynode *tr_ynode_get(const tr_ynode *map, const char *key);
// Lookup by dotted path ("algorithm.clip.low").
tr_ynode *tr_ynode_path(const tr_ynode *root, const char *path);
// The deepest node that exists along a dotted path (root itself when nothing does).
const tr_ynode *tr_ynode_nearest(const tr_ynode *root, const char *path);

// "file:line:col" or the override text; used as the prefix of error messages.
void tr_ynode_where(const tr_ynode *n, char *buf, size_t cap);

// Applies one "a.b.c=value" override to the tree (creating mappings on the way), with src
// the text to name in errors and in the new nodes. *root may be NULL (empty recipe).
int tr_yaml_apply_set(tr_ynode **root, const char *set, const char *src, tr_err *err);
