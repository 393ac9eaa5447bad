// Built-in reward rules (verifiers) for responses with checkable answers. Every score is
// 0 or 1:
//   exact_match    1 when the response, trimmed of ASCII whitespace, equals meta.answer
//                  (trimmed; a numeric answer is compared as its shortest decimal text)
//   numeric_match  1 when the last number in the response equals meta.answer numerically
//                  (|a - b| <= rel_tol * max(1, |a|, |b|), rel_tol 1e-9 by default)
//   regex          1 when the PCRE2 pattern matches anywhere in the response (format checks);
//                  invalid UTF-8 in a response never matches a pattern item (PCRE2_MATCH_INVALID_UTF)
// The number syntax is tr_reward_last_number's, documented in docs/protocol.md.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

enum tr_reward_rule_kind { TR_REWARD_RULE_EXACT, TR_REWARD_RULE_NUMERIC, TR_REWARD_RULE_REGEX };

typedef struct tr_reward_rule_opts {
    int kind;             // enum tr_reward_rule_kind
    const char *pattern;  // regex: the PCRE2 pattern (UTF-8; use (?s), (?m), (?i) for flags)
    double rel_tol;       // numeric: 0 = 1e-9
} tr_reward_rule_opts;

typedef struct tr_reward_rule tr_reward_rule;

// Maps "exact_match", "numeric_match", "regex" to a kind; -1 when unknown.
int tr_reward_rule_kind_from_name(const char *name);
int tr_reward_rule_init(tr_reward_rule **out, const tr_reward_rule_opts *o, tr_err *err);
void tr_reward_rule_free(tr_reward_rule *r);
// Scores one response. meta_json is the prompt record's other fields as a JSON object text
// (exact_match and numeric_match read its "answer"; regex ignores it and accepts NULL).
// A missing or unusable answer is an error (a data problem), a wrong response scores 0.
// Safe to call from several threads on one rule.
int tr_reward_rule_score(tr_reward_rule *r, const char *response, size_t len, const char *meta_json,
                         float *score, tr_err *err);
// The same with the answer already in hand (as text; numeric answers as their text).
int tr_reward_rule_score_answer(tr_reward_rule *r, const char *response, size_t len, const char *answer,
                                size_t answer_len, float *score, tr_err *err);
// Regex matches given up at PCRE2's match limit (scored 0): pathological pattern or input.
uint64_t tr_reward_rule_limit_hits(const tr_reward_rule *r);

// Finds the last number in s: optional '-' sign (when not preceded by a letter, digit, ')'
// or '.'), digits with optional ',' thousands groups ("1,234,567"; not for a number right
// after "<digit>,", which is a list), an optional decimal part
// ("3.5", ".5"), or a simple fraction of integers ("3/4", "-1/2"; denominator not 0).
// Returns 1 and sets *out, or 0 when s holds no number.
int tr_reward_last_number(const char *s, size_t len, double *out);
bool tr_reward_exact_match(const char *a, size_t an, const char *b, size_t bn);
bool tr_reward_numbers_equal(double a, double b, double rel_tol);
