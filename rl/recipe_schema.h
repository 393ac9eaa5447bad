// Internal to the recipe module: the schema, one table entry per recipe key with its type,
// where it lives in tr_recipe, its default, its allowed range or values and one line of
// documentation. Parsing, defaults, emitting, comparing and docs/recipes.md all walk it.
#pragma once
#include <stddef.h>
#include <stdint.h>

enum tr_rkey_type {
    TR_RK_MAP,          // nested mapping (sub); off is added to the parent's base
    TR_RK_INT,          // int64_t
    TR_RK_FLOAT,        // double
    TR_RK_BOOL,         // bool
    TR_RK_STR,          // char[size]
    TR_RK_ENUM,         // an enum (int-sized) spelled by names
    TR_RK_FLOATS,       // double[size]: a list of exactly size numbers
    TR_RK_DEVICES,      // tr_recipe_devices: a list of device ids
    TR_RK_ROLE_GROUPS,  // placement.colocate (off: the tr_recipe_placement): lists of roles
    TR_RK_LIST,         // a list of mappings (sub): size items at most, stride bytes apart
    TR_RK_TOKEN_IDS,    // tr_recipe_token_ids: a list of distinct token ids (each in min..max)
};

#define TR_RK_REQUIRED 1u   // must appear (within its mapping, when that mapping is present)
#define TR_RK_HAS_MIN 2u
#define TR_RK_HAS_MAX 4u
#define TR_RK_MIN_OPEN 8u   // value > min rather than >= min
#define TR_RK_MAX_OPEN 16u  // value < max rather than <= max
#define TR_RK_PRESENCE 32u  // MAP: a bool at aux_off records that the mapping appeared

typedef struct tr_rkey {
    const char *name;
    enum tr_rkey_type type;
    size_t off;
    size_t size;                 // STR capacity, FLOATS count, LIST capacity
    size_t stride;               // LIST item size
    size_t aux_off;              // LIST: the int32_t count, offset within the parent's base;
                                 // PRESENCE: the bool flag, offset within base + off
    uint32_t flags;
    double min, max;             // numbers (and list items) when HAS_MIN / HAS_MAX
    const char *const *names;    // ENUM spellings, NULL-terminated
    const struct tr_rkey *sub;   // MAP, LIST
    const char *def;             // default as YAML text; NULL: none (required, or resolved)
    const char *def_doc;         // the default as docs/recipes.md states it when def is NULL
    const char *doc;             // one line for docs/recipes.md
} tr_rkey;

// The root mapping, terminated by an entry with name == NULL (as is every sub table).
extern const tr_rkey tr_recipe_schema[];
