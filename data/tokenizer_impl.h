// Internal layout of a loaded tokenizer, shared by the data/tokenizer*.c files only: the
// vocabulary maps, the merge table, added tokens with their match tries, the normalizer and
// pre-tokenizer steps, and the per-call scratch that encode uses.
#pragma once
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/tokenizer.h"
#include "data/unicode_tables.h"
#include "engine/err.h"

// Ids are array indices, so a file may not ask for absurdly large ones.
#define TR_TOK_MAX_ID (1 << 24)
#define TR_TOK_MAX_PRETOK 16
#define TR_TOK_MAX_NORM 8

// ---- hash maps (tokenizer_map.c) ----

// Byte string -> id. Keys are copied into the map's pool; a later put of the same key
// replaces the value, as serde's HashMap does for tokenizer.json.
typedef struct tr_tok_strmap_entry {
    uint64_t off;
    uint32_t len;
    int32_t val;
} tr_tok_strmap_entry;

typedef struct tr_tok_strmap {
    uint32_t *slots;  // 0 = empty, else entry index + 1
    uint32_t mask;    // slot count - 1 (a power of two)
    tr_tok_strmap_entry *entries;
    uint32_t n, n_cap;
    char *pool;
    size_t pool_len, pool_cap;
} tr_tok_strmap;

int tr_tok_strmap_init(tr_tok_strmap *m, uint32_t expected, tr_err *err);
void tr_tok_strmap_free(tr_tok_strmap *m);
int tr_tok_strmap_put(tr_tok_strmap *m, const void *key, size_t len, int32_t val, tr_err *err);
// The id stored for key, or -1.
int32_t tr_tok_strmap_get(const tr_tok_strmap *m, const void *key, size_t len);

// (left id, right id) -> (merge rank, merged id).
typedef struct tr_tok_pair_slot {
    uint64_t key;  // UINT64_MAX = empty
    uint32_t rank;
    int32_t id;
} tr_tok_pair_slot;

typedef struct tr_tok_pairmap {
    tr_tok_pair_slot *slots;
    uint64_t mask;
    uint64_t n;
} tr_tok_pairmap;

int tr_tok_pairmap_init(tr_tok_pairmap *m, size_t expected, tr_err *err);
void tr_tok_pairmap_free(tr_tok_pairmap *m);
// Inserts or replaces (a later duplicate merge takes the later rank, as HF's map does).
void tr_tok_pairmap_put(tr_tok_pairmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);
// Returns the slot for (a, b) or NULL.
const tr_tok_pair_slot *tr_tok_pairmap_get(const tr_tok_pairmap *m, int32_t a, int32_t b);

// ---- Unicode helpers (tokenizer_unicode.c) ----

// Offset of the first byte that is not valid UTF-8 (Rust String rules), or len if valid.
size_t tr_tok_utf8_check(const char *s, size_t len);
// Decodes the character at s[0..len) (valid UTF-8 assumed); *n gets its byte length.
// Writes code point c (< 0x110000) as UTF-8 into o (room for 4 bytes); returns its length.
size_t tr_tok_utf8_put(uint32_t c, char *o);
int32_t tr_tok_utf8_next(const char *s, size_t len, size_t *n);
// Decodes the character that ends at s[len] (valid UTF-8 assumed).
int32_t tr_tok_utf8_prev(const char *s, size_t len, size_t *n);
// Fills the kind lookup below; tokenizer load calls it before anything reads it.
void tr_tok_unicode_init(void);
extern uint16_t tr_tok_kind_stage1[0x110000 / TR_UNI_BLOCK];
extern uint8_t tr_tok_kind_stage2[TR_UNI_N_BLOCKS * TR_UNI_BLOCK];
// The kind of a code point (see data/unicode_tables.h); out-of-range values read as U+10FFFF.
static inline uint8_t tr_tok_kind(int32_t c) {
    uint32_t u = (uint32_t)c <= 0x10FFFF ? (uint32_t)c : 0x10FFFF;
    return tr_tok_kind_stage2[(size_t)tr_tok_kind_stage1[u / TR_UNI_BLOCK] * TR_UNI_BLOCK +
                              u % TR_UNI_BLOCK];
}
// General category (bits 0..4) and TR_UNI_* flags (bits 5..) of a code point.
static inline uint16_t tr_tok_props(int32_t c) { return tr_uni_kind_props[tr_tok_kind(c)]; }
// White_Space: what lstrip/rstrip of added tokens take.
bool tr_tok_is_space(int32_t c);
// The regex crate's Unicode \w, which single_word added tokens look at.
bool tr_tok_is_word(int32_t c);
// Appends s with invalid UTF-8 replaced by U+FFFD per maximal subpart (Rust from_utf8_lossy).
// out must hold 3 * len bytes; returns the bytes written.
size_t tr_tok_utf8_lossy(const uint8_t *s, size_t len, char *out);

enum tr_tok_norm { TR_TOK_NFC, TR_TOK_NFD, TR_TOK_NFKC, TR_TOK_NFKD };
// Applies the normalizer steps to s; *out is s itself when nothing changes, else a malloc'd
// buffer the caller frees (*owned set to true).
int tr_tok_normalize(const int *steps, int n_steps, const char *s, size_t len, char **out,
                     size_t *out_len, bool *owned, tr_err *err);

// ---- byte-level alphabet (tokenizer_bytelevel.c) ----

// The GPT-2 byte <-> character table: each byte maps to one printable code point.
int32_t tr_tok_byte_to_char(uint8_t b);
// The byte a code point stands for, or -1 when it is not in the byte-level alphabet.
int tr_tok_char_to_byte(int32_t c);
// Converts a byte-level token string to raw bytes in out (len bytes at most); returns the
// byte count, or -1 when a character is outside the alphabet (then HF uses the raw text).
long tr_tok_bytelevel_unmap(const char *s, size_t len, uint8_t *out);

// ---- added tokens (tokenizer_added.c) ----

typedef struct tr_tok_added {
    char *content;   // as in tokenizer.json
    size_t len;
    int32_t id;
    bool special, single_word, lstrip, rstrip, normalized;
} tr_tok_added;

// A byte trie over the added tokens' texts; leftmost-longest matching like aho-corasick's.
typedef struct tr_tok_trie_node {
    int32_t child;    // first child or -1
    int32_t sibling;  // next sibling or -1
    int32_t token;    // index into tok->added, or -1
    uint8_t byte;
} tr_tok_trie_node;

typedef struct tr_tok_trie {
    tr_tok_trie_node *nodes;
    int32_t n, cap;
    uint8_t first[256];  // 1 where some token starts with this byte
    uint8_t firsts[3];   // those bytes while there are at most 3 (then memchr finds them)
    int n_firsts;        // distinct first bytes, counted up to 4
} tr_tok_trie;

int tr_tok_trie_init(tr_tok_trie *t, tr_err *err);
void tr_tok_trie_free(tr_tok_trie *t);
// Adds s -> token; an existing identical string keeps its first token.
int tr_tok_trie_add(tr_tok_trie *t, const char *s, size_t len, int32_t token, tr_err *err);

// A piece of text: bytes [start, end) of some buffer, with the added token that covers it
// (its index into tok->added) or -1 for ordinary text.
typedef struct tr_tok_seg {
    size_t start, end;
    int32_t token;
} tr_tok_seg;

typedef struct tr_tok_segs {
    tr_tok_seg *v;
    size_t n, cap;
} tr_tok_segs;

int tr_tok_segs_push(tr_tok_segs *s, size_t start, size_t end, int32_t token, tr_err *err);

// Splits s into ordinary text and added-token matches, as HF's AddedVocabulary::find_matches
// (single_word, lstrip, rstrip applied). Appends to out (cleared first).
int tr_tok_added_split(const tr_tokenizer *tok, const tr_tok_trie *trie, const char *s,
                       size_t len, tr_tok_segs *out, tr_err *err);

// ---- pre-tokenizer steps (tokenizer_pretok.c) ----

enum tr_tok_behavior {
    TR_TOK_REMOVED,
    TR_TOK_ISOLATED,
    TR_TOK_MERGED_PREV,
    TR_TOK_MERGED_NEXT,
    TR_TOK_CONTIGUOUS,
};

enum tr_tok_pretok_kind { TR_TOK_SPLIT, TR_TOK_BYTELEVEL };

typedef struct tr_tok_pretok {
    int kind;
    pcre2_code *re;  // Split's pattern; ByteLevel's GPT-2 regex when use_regex, else NULL
    int behavior;
    bool invert;
    bool add_prefix_space;
    bool jit;  // re has JIT code
    // When set, re runs on a shadow of the text in which each non-ASCII character stands in
    // for its class of characters; shadow_part maps a kind to that class (tokenizer_pretok.c).
    bool shadow;
    uint8_t shadow_part[TR_UNI_N_KINDS];
} tr_tok_pretok;

// Compiles p->re from a tokenizer.json pattern (Oniguruma syntax) so that PCRE2 matches as
// HF's Oniguruma does, with every Unicode class taken from the generated tables; literal is
// for Split's {"String": ...} patterns. Errors name key.
int tr_tok_regex_compile(tr_tok_pretok *p, const char *pat, size_t len, bool literal,
                         const char *key, tr_err *err);

// ---- BPE (tokenizer_bpe.c) ----

typedef struct tr_tok_symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t len;
} tr_tok_symbol;

typedef struct tr_tok_merge {
    uint32_t rank;
    uint32_t pos;
    int32_t id;
} tr_tok_merge;

// ---- word cache (tokenizer_cache.c) ----

#define TR_TOK_CACHE_SLOTS 8192  // a power of two
#define TR_TOK_CACHE_KEY 16      // longest cached word, bytes
#define TR_TOK_CACHE_IDS 8       // most ids a cached word may merge to

typedef struct tr_tok_cache {
    _Atomic uint64_t *slots;
} tr_tok_cache;

int tr_tok_cache_init(tr_tok_cache *c, tr_err *err);
void tr_tok_cache_free(tr_tok_cache *c);
// Safe from any number of threads at once; a miss costs nothing but the lookup.
bool tr_tok_cache_get(const tr_tok_cache *c, const uint8_t *w, size_t len, int32_t *ids, size_t *n);
void tr_tok_cache_put(const tr_tok_cache *c, const uint8_t *w, size_t len, const int32_t *ids, size_t n);

// ---- per-call scratch (tokenizer.c) ----

typedef struct tr_tok_ctx {
    const tr_tokenizer *tok;
    int32_t *ids;
    size_t n_ids, cap_ids;
    pcre2_match_data *md;
    tr_tok_segs levels[TR_TOK_MAX_PRETOK + 1];  // split results per pre-tokenizer step
    tr_tok_segs raw;                             // scratch for regex matches
    char *shadow;                                // the shadow text of a regex step
    size_t shadow_cap;
    char *prefix;                                // " " + piece for add_prefix_space
    size_t prefix_cap;
    tr_tok_symbol *sym;
    size_t sym_cap;
    tr_tok_merge *heap;
    size_t heap_cap;
    tr_err *err;
} tr_tok_ctx;

int tr_tok_push_id(tr_tok_ctx *c, int32_t id);
// Runs pre-tokenizer steps [step, n) on a piece and BPE on what comes out.
int tr_tok_pretokenize(tr_tok_ctx *c, int step, const char *s, size_t len);
// Byte-level BPE of one pre-tokenized word (raw bytes), appending ids.
int tr_tok_bpe(tr_tok_ctx *c, const uint8_t *w, size_t len);

// ---- the tokenizer ----

struct tr_tokenizer {
    // model: BPE over raw bytes (the byte-level strings of tokenizer.json, unmapped)
    tr_tok_strmap bpe_vocab;    // raw bytes -> id, for tokens inside the byte alphabet
    tr_tok_strmap model_vocab;  // token string as written -> id
    int32_t byte_ids[256];      // id of each single byte, -1 if absent
    tr_tok_pairmap merges;
    uint32_t model_vocab_count;  // distinct entries in model.vocab (HF's get_vocab_size)
    int32_t unk_id;              // -1: no unk_token
    bool unk_missing;            // unk_token names no vocab entry: an error when needed
    char *unk_token;
    bool fuse_unk, ignore_merges;

    // ids -> text
    int32_t n_ids;       // max id + 1
    uint64_t *id_str;    // per id: offset << 32 | length into str_pool; UINT64_MAX = none
    char *str_pool;
    size_t str_pool_len, str_pool_cap;
    uint64_t *id_bytes;  // per id: what the ByteLevel decoder emits (into bytes_pool)
    uint8_t *bytes_pool;
    size_t bytes_pool_len;
    bool decoder_bytelevel;  // false: no decoder, tokens are joined with spaces
    uint8_t *special;        // per id: 1 for special added tokens

    // added tokens
    tr_tok_added *added;
    int32_t n_added;
    tr_tok_strmap added_vocab;  // content -> id
    tr_tok_trie trie_raw;       // tokens with normalized = false, matched before normalizing
    tr_tok_trie trie_norm;      // tokens with normalized = true, matched after

    tr_tok_cache cache;  // the one part written after load (lock-free, see tokenizer_cache.c)

    int norm[TR_TOK_MAX_NORM];
    int n_norm;
    tr_tok_pretok pretok[TR_TOK_MAX_PRETOK];
    int n_pretok;
};
