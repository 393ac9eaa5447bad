// Rule rewards: exact and numeric answer match against meta.answer, and PCRE2 format checks.
// The number scanner is hand-written so that what counts as "the answer" is fixed by the
// rules in reward_rule.h, not by a locale or a regex engine's flavour.
#include "roles/reward_rule.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <inttypes.h>
#include <math.h>
#include <pcre2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/json.h"

#define MATCH_LIMIT 1000000u
#define NUMBER_MAX_CHARS 400  // longer digit runs are not answers; they parse as infinity

struct tr_reward_rule {
    int kind;
    double rel_tol;
    pcre2_code *re;
    pcre2_match_context *mctx;
    _Atomic uint64_t limit_hits;
};

int tr_reward_rule_kind_from_name(const char *name) {
    if (strcmp(name, "exact_match") == 0) return TR_REWARD_RULE_EXACT;
    if (strcmp(name, "numeric_match") == 0) return TR_REWARD_RULE_NUMERIC;
    if (strcmp(name, "regex") == 0) return TR_REWARD_RULE_REGEX;
    return -1;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alnum(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static size_t digits_at(const char *s, size_t len, size_t i) {
    size_t j = i;
    while (j < len && is_digit(s[j])) j++;
    return j - i;
}

// Parses the characters of s[a, b) that are digits, '-' or '.' (commas dropped) with strtod.
static double parse_plain(const char *s, size_t a, size_t b) {
    char buf[NUMBER_MAX_CHARS + 1];
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        if (s[i] == ',') continue;
        if (n == NUMBER_MAX_CHARS) return s[a] == '-' ? -HUGE_VAL : HUGE_VAL;
        buf[n++] = s[i];
    }
    buf[n] = '\0';
    return strtod(buf, NULL);
}

// Scans one number starting at i (which must be a valid start); returns the end index.
static size_t scan_number(const char *s, size_t len, size_t i, double *out) {
    size_t start = i;
    bool neg = false;
    if (s[i] == '-') {
        neg = true;
        i++;
    }
    size_t int_start = i;
    size_t nd = digits_at(s, len, i);
    i += nd;
    // Thousands groups: a first group of 1-3 digits, then ",ddd" groups of exactly 3. A number
    // that itself follows "<digit>," is part of a list or of another grouping ("12,34,567"),
    // so it takes no groups.
    bool after_list = int_start >= 2 && s[int_start - 1] == ',' && is_digit(s[int_start - 2]);
    if (nd >= 1 && nd <= 3 && !after_list)
        while (i < len && s[i] == ',' && digits_at(s, len, i + 1) == 3) i += 4;
    // Decimal part.
    if (i + 1 < len && s[i] == '.' && is_digit(s[i + 1])) {
        i++;
        i += digits_at(s, len, i);
        *out = parse_plain(s, start, i);
        return i;
    }
    // Simple fraction of integers: "n/d" with d > 0 not followed by a decimal part.
    if (nd > 0 && i + 1 < len && s[i] == '/' && is_digit(s[i + 1])) {
        size_t dd = digits_at(s, len, i + 1);
        size_t end = i + 1 + dd;
        bool decimal_after = end + 1 < len && s[end] == '.' && is_digit(s[end + 1]);
        double den = parse_plain(s, i + 1, end);
        if (!decimal_after && den != 0) {
            double num = parse_plain(s, int_start, i);
            *out = (neg ? -num : num) / den;
            return end;
        }
    }
    *out = parse_plain(s, start, i);
    return i;
}

int tr_reward_last_number(const char *s, size_t len, double *out) {
    int found = 0;
    size_t i = 0;
    while (i < len) {
        char c = s[i];
        char prev = i > 0 ? s[i - 1] : ' ';
        bool start = false;
        if (is_digit(c)) {
            start = true;
        } else if (c == '-' && !(is_alnum(prev) || prev == ')' || prev == '.')) {
            // A sign, unless it reads as a hyphen or a minus between operands.
            start = (i + 1 < len && is_digit(s[i + 1])) ||
                    (i + 2 < len && s[i + 1] == '.' && is_digit(s[i + 2]));
        } else if (c == '.' && !is_digit(prev) && i + 1 < len && is_digit(s[i + 1])) {
            start = true;
        }
        if (!start) {
            i++;
            continue;
        }
        double v;
        size_t end;
        if (c == '-' && s[i + 1] == '.') {  // "-.5"
            size_t j = i + 2 + digits_at(s, len, i + 2);
            v = parse_plain(s, i, j);
            end = j;
        } else if (c == '.') {
            size_t j = i + 1 + digits_at(s, len, i + 1);
            v = parse_plain(s, i, j);
            end = j;
        } else {
            end = scan_number(s, len, i, &v);
        }
        *out = v;
        found = 1;
        i = end;
    }
    return found;
}

static void trim(const char **s, size_t *n) {
    while (*n && is_space((*s)[0])) {
        (*s)++;
        (*n)--;
    }
    while (*n && is_space((*s)[*n - 1])) (*n)--;
}

bool tr_reward_exact_match(const char *a, size_t an, const char *b, size_t bn) {
    trim(&a, &an);
    trim(&b, &bn);
    return an == bn && memcmp(a, b, an) == 0;
}

bool tr_reward_numbers_equal(double a, double b, double rel_tol) {
    if (!isfinite(a) || !isfinite(b)) return false;
    double scale = fmax(1.0, fmax(fabs(a), fabs(b)));
    return fabs(a - b) <= rel_tol * scale;
}

int tr_reward_rule_init(tr_reward_rule **out, const tr_reward_rule_opts *o, tr_err *err) {
    *out = NULL;
    if (o->kind < TR_REWARD_RULE_EXACT || o->kind > TR_REWARD_RULE_REGEX)
        return tr_errf(err, TR_EINVAL, "reward rule: unknown kind %d", o->kind);
    if (o->rel_tol < 0 || o->rel_tol != o->rel_tol)
        return tr_errf(err, TR_EINVAL, "reward rule: rel_tol must be >= 0");
    tr_reward_rule *r = calloc(1, sizeof *r);
    if (!r) return tr_errf(err, TR_ENOMEM, "out of memory for a reward rule");
    r->kind = o->kind;
    r->rel_tol = o->rel_tol > 0 ? o->rel_tol : 1e-9;
    atomic_init(&r->limit_hits, 0);
    if (r->kind == TR_REWARD_RULE_REGEX) {
        if (!o->pattern || !o->pattern[0]) {
            free(r);
            return tr_errf(err, TR_EINVAL, "reward rule regex: no pattern");
        }
        int code;
        PCRE2_SIZE off;
        r->re = pcre2_compile((PCRE2_SPTR)o->pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF,
                              &code, &off, NULL);
        if (!r->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(code, msg, sizeof msg);
            free(r);
            return tr_errf(err, TR_EINVAL, "reward rule regex: pattern at offset %zu: %s", (size_t)off, (char *)msg);
        }
        r->mctx = pcre2_match_context_create(NULL);
        if (!r->mctx) {
            tr_reward_rule_free(r);
            return tr_errf(err, TR_ENOMEM, "out of memory for a regex match context");
        }
        pcre2_set_match_limit(r->mctx, MATCH_LIMIT);
    }
    *out = r;
    return 0;
}

void tr_reward_rule_free(tr_reward_rule *r) {
    if (!r) return;
    pcre2_match_context_free(r->mctx);
    pcre2_code_free(r->re);
    free(r);
}

uint64_t tr_reward_rule_limit_hits(const tr_reward_rule *r) {
    return atomic_load(&((tr_reward_rule *)r)->limit_hits);
}

static int score_regex(tr_reward_rule *r, const char *resp, size_t len, float *score, tr_err *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->re, NULL);
    if (!md) return tr_errf(err, TR_ENOMEM, "out of memory for regex match data");
    int rc = pcre2_match(r->re, (PCRE2_SPTR)(len ? resp : ""), len, 0, 0, md, r->mctx);
    pcre2_match_data_free(md);
    if (rc >= 0) {
        *score = 1.0f;
        return 0;
    }
    if (rc == PCRE2_ERROR_NOMATCH) {
        *score = 0.0f;
        return 0;
    }
    if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT) {
        atomic_fetch_add(&r->limit_hits, 1);
        *score = 0.0f;
        return 0;
    }
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof msg);
    return tr_errf(err, TR_EINVAL, "reward rule regex: match failed: %s", (char *)msg);
}

int tr_reward_rule_score_answer(tr_reward_rule *r, const char *resp, size_t len, const char *answer,
                                size_t answer_len, float *score, tr_err *err) {
    *score = 0.0f;
    if (r->kind == TR_REWARD_RULE_REGEX) return score_regex(r, resp, len, score, err);
    if (!answer) return tr_errf(err, TR_EINVAL, "reward rule: no answer");
    if (r->kind == TR_REWARD_RULE_EXACT) {
        *score = tr_reward_exact_match(resp, len, answer, answer_len) ? 1.0f : 0.0f;
        return 0;
    }
    double want, got;
    if (!tr_reward_last_number(answer, answer_len, &want))
        return tr_errf(err, TR_EINVAL, "reward rule numeric_match: answer '%.*s' holds no number",
                       (int)(answer_len > 60 ? 60 : answer_len), answer);
    if (tr_reward_last_number(resp, len, &got) && tr_reward_numbers_equal(got, want, r->rel_tol)) *score = 1.0f;
    return 0;
}

// Shortest "%.Ng" text that reads back as the same double, so 0.1 is "0.1".
static void shortest_real(double v, char *buf, size_t cap) {
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

int tr_reward_rule_score(tr_reward_rule *r, const char *resp, size_t len, const char *meta_json, float *score,
                         tr_err *err) {
    *score = 0.0f;
    if (r->kind == TR_REWARD_RULE_REGEX) return score_regex(r, resp, len, score, err);
    if (!meta_json) return tr_errf(err, TR_EINVAL, "reward rule: no meta (the prompt record needs an 'answer')");
    tr_json_opts o = {.name = "reward rule: meta JSON", .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_NO_NUL};
    tr_json_doc doc;
    if (tr_json_parse_opts(&doc, meta_json, strlen(meta_json), &o, err)) return -1;
    int rc;
    const tr_json *meta = doc.root, *a = tr_json_get(meta, "answer");
    char num[64];
    if (meta->type != TR_JSON_OBJECT && meta->type != TR_JSON_ARRAY) {
        rc = tr_errf(err, TR_EFORMAT, "reward rule: meta JSON:%d:%d: expected an object, got %s",
                     meta->line, meta->col, tr_json_type_name(meta->type));
    } else if (meta->type != TR_JSON_OBJECT) {
        rc = tr_errf(err, TR_EINVAL, "reward rule: meta is not a JSON object");
    } else if (tr_json_is(a, TR_JSON_STRING)) {
        rc = tr_reward_rule_score_answer(r, resp, len, a->str, a->len, score, err);
    } else if (tr_json_is(a, TR_JSON_NUMBER)) {
        if (a->is_int)
            snprintf(num, sizeof num, "%" PRId64, a->inum);
        else
            shortest_real(a->num, num, sizeof num);
        rc = tr_reward_rule_score_answer(r, resp, len, num, strlen(num), score, err);
    } else {
        rc = tr_errf(err, TR_EINVAL, "reward rule: meta.answer is %s (a string or number is needed)",
                     a ? "neither a string nor a number" : "missing");
    }
    tr_json_free(&doc);
    return rc;
}
