// Reward rule tests against hand-worked cases: the last-number scanner on its edge cases
// (no number, several numbers, "1,000", "-3.5", "3/4", hyphens, minus signs), exact and
// numeric answers read from meta JSON, and regex format checks including PCRE2's match limit.
#include <string.h>

#include "roles/reward_rule.h"
#include "tests/test.h"

static void num_case(const char *s, int want_found, double want, int line) {
    double v = 12345.678;
    int found = tr_reward_last_number(s, strlen(s), &v);
    tr_test_checks++;
    if (found != want_found || (found && !(v == want || (v == 0 && want == 0)))) {
        tr_test_failures++;
        fprintf(stderr, "%s:%d: last number of '%s': got %d %.17g, want %d %.17g\n", __FILE__, line, s, found, v,
                want_found, want);
    }
}
#define NUM(s, v) num_case(s, 1, v, __LINE__)
#define NONUM(s) num_case(s, 0, 0, __LINE__)

static void test_last_number(void) {
    NONUM("");
    NONUM("no number here");
    NONUM("- . -. ,");
    NUM("42", 42);
    NUM("The answer is 42.", 42);
    NUM("first 3, then 5, finally 7", 7);
    NUM("x = -3.5", -3.5);
    NUM("-3.5", -3.5);
    NUM("1,000", 1000);
    NUM("It costs $1,234,567.89 in total", 1234567.89);
    NUM("3/4", 0.75);
    NUM("-1/2", -0.5);
    NUM("1,000/8", 125);
    NUM(".5", 0.5);
    NUM("-.25", -0.25);
    NUM("(-2)", -2);
    NUM("answer:-7", -7);
    NUM("5-3=2", 2);
    NUM("5-3", 3);        // a minus between operands is not a sign
    NUM("T-5", 5);        // a hyphen after a letter is not a sign
    NUM("3/0", 0);        // no fraction with a zero denominator: the numbers are 3 and 0
    NUM("1,0000", 0);     // not a thousands group: "1" then "0000"
    NUM("3,14", 14);      // decimal commas are not read: "3" then "14"
    NUM("12,34,567", 567);  // not a western grouping: "12", "34", "567"
    NUM("1,2,3", 3);
    NUM("1,234,567", 1234567);
    NUM("1,000,00", 0);   // "1,000" then "00"
    NUM("50%", 50);
    NUM("1.2.3", 3);
    NUM("3.5/2", 2);      // fractions are of integers only
    NUM("3/4.5", 4.5);    // nor of a decimal denominator
    NUM("1e5", 5);        // no exponents
    NUM("Step 1: 2+2=4\nStep 2: 4*2=8\nAnswer: 8\n", 8);
    NUM("#### 72", 72);
    NUM("-0", 0);
    NUM("007", 7);
    NUM("99999999999999999999", 1e20);
    NUM("\xff\xfe 12 \xc3", 12);  // invalid UTF-8 around a number
}

static void test_compare(void) {
    CHECK(tr_reward_exact_match("  Paris\n", 8, "Paris", 5));
    CHECK(tr_reward_exact_match("Paris", 5, "\tParis ", 7));
    CHECK(!tr_reward_exact_match("paris", 5, "Paris", 5));
    CHECK(!tr_reward_exact_match("Par is", 6, "Paris", 5));
    CHECK(tr_reward_exact_match("", 0, " \n", 2));
    CHECK(tr_reward_numbers_equal(0.75, 0.75000000001, 1e-9));
    CHECK(!tr_reward_numbers_equal(1e6, 1e6 + 1, 1e-9));
    CHECK(!tr_reward_numbers_equal(1.0 / 3.0, 0.333333, 1e-9));
    CHECK(tr_reward_numbers_equal(-0.0, 0.0, 1e-9));
    CHECK(!tr_reward_numbers_equal(1.0 / 0.0, 1.0 / 0.0, 1e-9));
}

static float score(tr_reward_rule *r, const char *resp, const char *meta, int *rc, tr_err *e) {
    float s = -1;
    *rc = tr_reward_rule_score(r, resp, strlen(resp), meta, &s, e);
    return s;
}

static void test_rules(void) {
    tr_reward_rule *num, *exact, *re, *bad;
    tr_err e;
    CHECK(tr_reward_rule_kind_from_name("numeric_match") == TR_REWARD_RULE_NUMERIC);
    CHECK(tr_reward_rule_kind_from_name("exact_match") == TR_REWARD_RULE_EXACT);
    CHECK(tr_reward_rule_kind_from_name("regex") == TR_REWARD_RULE_REGEX);
    CHECK(tr_reward_rule_kind_from_name("fuzzy") == -1);
    tr_reward_rule_opts o = {.kind = TR_REWARD_RULE_NUMERIC};
    CHECK(tr_reward_rule_init(&num, &o, &e) == 0);
    o.kind = TR_REWARD_RULE_EXACT;
    CHECK(tr_reward_rule_init(&exact, &o, &e) == 0);
    int rc;
    CHECK(score(num, "so the total is 1000", "{\"answer\": \"1,000\"}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(num, "so the total is 1001", "{\"answer\": \"1,000\"}", &rc, &e) == 0.0f && rc == 0);
    CHECK(score(num, "3/4", "{\"answer\": 0.75, \"id\": 3}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(num, "72 apples", "{\"answer\": 72}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(num, "I think 72, no wait, 73", "{\"answer\": 72}", &rc, &e) == 0.0f && rc == 0);
    CHECK(score(num, "reasoning...\n#### 72", "{\"answer\": \"She sold 48/2 = 24 clips.\\n#### 72\"}", &rc, &e) == 1.0f);
    CHECK(score(num, "no idea", "{\"answer\": 5}", &rc, &e) == 0.0f && rc == 0);
    CHECK(score(num, "-3.5", "{\"answer\": -3.5}", &rc, &e) == 1.0f);
    // Data problems are errors, naming what is wrong.
    score(num, "5", "{\"answer\": \"five\"}", &rc, &e);
    CHECK(rc == -1 && strstr(e.msg, "holds no number"));
    score(num, "5", "{\"question\": 1}", &rc, &e);
    CHECK(rc == -1 && strstr(e.msg, "meta.answer is missing"));
    score(num, "5", "{\"answer\": [5]}", &rc, &e);
    CHECK(rc == -1 && strstr(e.msg, "string or number"));
    score(num, "5", "{\"answer\": 5", &rc, &e);
    CHECKF(rc == -1 && e.code == TR_EFORMAT && strstr(e.msg, "meta JSON:1:13:"), "%s", e.msg);
    score(num, "5", "[5]", &rc, &e);
    CHECK(rc == -1 && strstr(e.msg, "not a JSON object"));
    score(num, "5", "5", &rc, &e);  // a bare scalar is malformed meta, as before
    CHECK(rc == -1 && e.code == TR_EFORMAT && strstr(e.msg, "meta JSON:1:1:"));
    score(num, "5", NULL, &rc, &e);
    CHECK(rc == -1);

    CHECK(score(exact, "  Paris \n", "{\"answer\": \"Paris\"}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(exact, "The answer is Paris", "{\"answer\": \"Paris\"}", &rc, &e) == 0.0f && rc == 0);
    CHECK(score(exact, "0.1", "{\"answer\": 0.1}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(exact, "12", "{\"answer\": 12}", &rc, &e) == 1.0f && rc == 0);
    CHECK(score(exact, "12.0", "{\"answer\": 12}", &rc, &e) == 0.0f && rc == 0);
    float s = -1;
    CHECK(tr_reward_rule_score_answer(exact, "B", 1, "B ", 2, &s, &e) == 0 && s == 1.0f);

    o.kind = TR_REWARD_RULE_REGEX;
    o.pattern = "(?s)^<think>.+</think>\\s*Answer: \\S+\\s*$";
    CHECKF(tr_reward_rule_init(&re, &o, &e) == 0, "%s", e.msg);
    CHECK(score(re, "<think>a\nb</think>\nAnswer: 4", NULL, &rc, &e) == 1.0f && rc == 0);
    CHECK(score(re, "<think>a</think> 4", NULL, &rc, &e) == 0.0f && rc == 0);
    CHECK(score(re, "", NULL, &rc, &e) == 0.0f && rc == 0);
    // Invalid UTF-8 never matches any pattern item (PCRE2_MATCH_INVALID_UTF), but text
    // around it still can.
    CHECK(score(re, "<think>\xff\xfe</think>Answer: 4", NULL, &rc, &e) == 0.0f && rc == 0);
    CHECK(score(re, "<think>ok</think>Answer: 4", NULL, &rc, &e) == 1.0f && rc == 0);
    o.pattern = "(?i)answer";
    tr_reward_rule *re2;
    CHECK(tr_reward_rule_init(&re2, &o, &e) == 0);
    CHECK(score(re2, "The ANSWER is", NULL, &rc, &e) == 1.0f);
    CHECK(score(re2, "\xff\xfe answer \xc3", NULL, &rc, &e) == 1.0f && rc == 0);
    tr_reward_rule_free(re2);
    o.pattern = "(unclosed";
    CHECK(tr_reward_rule_init(&bad, &o, &e) == -1 && strstr(e.msg, "offset 9"));
    o.pattern = "";
    CHECK(tr_reward_rule_init(&bad, &o, &e) == -1);
    // Catastrophic backtracking stops at the match limit and scores 0.
    o.pattern = "^(a|aa)+$";
    tr_reward_rule *slow;
    CHECK(tr_reward_rule_init(&slow, &o, &e) == 0);
    char evil[64];
    memset(evil, 'a', 60);
    evil[60] = 'b';
    evil[61] = '\0';
    CHECK(score(slow, evil, NULL, &rc, &e) == 0.0f && rc == 0);
    CHECK(tr_reward_rule_limit_hits(slow) == 1);
    CHECK(score(slow, "aaaa", NULL, &rc, &e) == 1.0f);
    tr_reward_rule_free(slow);
    tr_reward_rule_free(re);
    tr_reward_rule_free(num);
    tr_reward_rule_free(exact);
}

int main(void) {
    test_last_number();
    test_compare();
    test_rules();
    return tr_test_summary("test_reward_rule");
}
