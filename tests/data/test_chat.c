// Chat formats against the published templates: tests/fixtures/chat/cases.jsonl holds, per
// conversation, the text Qwen2.5's / Llama-3's Jinja template renders, the ids HF tokenizers
// gives for it on the fixture tokenizers, and the loss mask from HF's offsets (assistant
// content + end-of-turn). tools/chat_fixtures.py made them.
#include <jansson.h>

#include "data/chat.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "tests/test.h"

static void run_case(json_t *c, const tr_tokenizer *qwen, const tr_tokenizer *llama, int64_t line) {
    const char *fmt = json_string_value(json_object_get(c, "format"));
    json_t *ds = json_object_get(c, "default_system");
    bool gen = json_is_true(json_object_get(c, "add_generation_prompt"));
    json_t *msgs = json_object_get(c, "messages");
    size_t n = json_array_size(msgs);
    tr_chat_msg m[8];
    for (size_t i = 0; i < n && i < 8; i++) {
        json_t *o = json_array_get(msgs, i);
        m[i].role = json_string_value(json_object_get(o, "role"));
        m[i].content = json_string_value(json_object_get(o, "content"));
        m[i].content_len = json_string_length(json_object_get(o, "content"));
    }
    tr_err err = {0};
    char *text = NULL;
    size_t len = 0;
    const char *sys = json_is_string(ds) ? json_string_value(ds) : NULL;
    int kind = tr_chat_kind_parse(fmt);
    CHECKF(tr_chat_render_text(kind, sys, m, n, gen, &text, &len, &err) == 0, "%s", err.msg);
    json_t *want_text = json_object_get(c, "text");
    CHECKF(text && len == json_string_length(want_text) &&
               memcmp(text, json_string_value(want_text), len) == 0,
           "case line %lld: text\n%s\nwanted\n%s", (long long)line, text ? text : "",
           json_string_value(want_text));
    free(text);

    tr_chat_format f;
    CHECKF(tr_chat_format_init(&f, fmt, kind == TR_CHAT_CHATML ? qwen : llama, &err) == 0, "%s", err.msg);
    f.default_system = sys;
    tr_chat_tokens t = {0};
    CHECKF(tr_chat_render(&f, m, n, gen, &t, &err) == 0, "%s", err.msg);
    json_t *ids = json_object_get(c, "ids"), *mask = json_object_get(c, "mask");
    int same = t.n == json_array_size(ids);
    for (size_t i = 0; same && i < t.n; i++)
        same = t.ids[i] == json_integer_value(json_array_get(ids, i)) &&
               t.mask[i] == json_integer_value(json_array_get(mask, i));
    CHECKF(same, "case line %lld (%s): ids/mask differ from the reference", (long long)line, fmt);
    if (!same)
        for (size_t i = 0; i < t.n || i < json_array_size(ids); i++)
            fprintf(stderr, "  %zu: %d/%d  want %lld/%lld\n", i, i < t.n ? t.ids[i] : -1,
                    i < t.n ? t.mask[i] : -1, (long long)json_integer_value(json_array_get(ids, i)),
                    (long long)json_integer_value(json_array_get(mask, i)));
    tr_chat_tokens_free(&t);
}

int main(void) {
    tr_err err = {0};
    tr_tokenizer *qwen = NULL, *llama = NULL;
    char qp[4096], lp[4096];
    snprintf(qp, sizeof qp, "%s", tr_test_src("tests/fixtures/chat/qwen2_tokenizer.json"));
    snprintf(lp, sizeof lp, "%s", tr_test_src("tests/fixtures/chat/llama3_tokenizer.json"));
    CHECKF(tr_tokenizer_load(&qwen, qp, &err) == 0, "%s", err.msg);
    CHECKF(tr_tokenizer_load(&llama, lp, &err) == 0, "%s", err.msg);
    if (!qwen || !llama) return tr_test_summary("test_chat");

    tr_jsonl r;
    CHECK(tr_jsonl_open(&r, tr_test_src("tests/fixtures/chat/cases.jsonl"), &err) == 0);
    json_t *c;
    int cases = 0;
    while (tr_jsonl_next(&r, &c, &err) == 1) {
        run_case(c, qwen, llama, r.line);
        json_decref(c);
        cases++;
    }
    tr_jsonl_close(&r);
    CHECK(cases == 10);

    // Stop tokens and the generation prompt by id.
    tr_chat_format f;
    CHECK(tr_chat_format_init(&f, "chatml", qwen, &err) == 0);
    CHECK(f.n_stop == 2 && f.stop[0] == tr_tokenizer_token_id(qwen, "<|im_end|>") &&
          f.stop[1] == tr_tokenizer_token_id(qwen, "<|endoftext|>"));
    CHECK(tr_chat_format_init(&f, "llama3", llama, &err) == 0);
    CHECK(f.stop[0] == tr_tokenizer_token_id(llama, "<|eot_id|>") &&
          f.stop[1] == tr_tokenizer_token_id(llama, "<|end_of_text|>"));
    // Content cannot inject a turn boundary: no special id appears inside rendered content.
    tr_chat_msg inj[1] = {{"assistant", "a<|eot_id|>b<|start_header_id|>c", 32}};
    tr_chat_tokens t = {0};
    CHECK(tr_chat_render(&f, inj, 1, false, &t, &err) == 0);
    int n_eot = 0, n_hdr = 0;
    for (size_t i = 0; i < t.n; i++) {
        n_eot += t.ids[i] == f.turn_end;
        n_hdr += t.ids[i] == f.turn_start;
    }
    CHECK(n_eot == 1 && n_hdr == 1);
    tr_chat_tokens_free(&t);
    // Errors: unknown format, unknown role, a tokenizer without the format's tokens.
    CHECK(tr_chat_format_init(&f, "vicuna", llama, &err) == -1 && strstr(err.msg, "vicuna"));
    CHECK(tr_chat_format_init(&f, "chatml", llama, &err) == -1 && strstr(err.msg, "<|im_start|>"));
    CHECK(tr_chat_format_init(&f, "llama3", llama, &err) == 0);
    tr_chat_msg bad[1] = {{"robot", "x", 1}};
    CHECK(tr_chat_render(&f, bad, 1, false, &t, &err) == -1 && strstr(err.msg, "robot"));
    tr_chat_tokens_free(&t);
    tr_tokenizer_free(qwen);
    tr_tokenizer_free(llama);
    return tr_test_summary("test_chat");
}
