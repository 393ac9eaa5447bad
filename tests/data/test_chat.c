// Chat formats against the published templates: tests/fixtures/chat/cases.jsonl holds, per
// conversation, the text Qwen2.5's / Llama-3's Jinja template renders, the ids HF tokenizers
// gives for it on the fixture tokenizers, and the loss mask from HF's offsets (assistant
// content + end-of-turn); qwen3_cases.jsonl the same for Qwen3's template as transformers'
// apply_chat_template renders it (think blocks, enable_thinking). tools/chat_fixtures.py
// made them.
#include "data/chat.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "tests/test.h"

// Integer element i of an array (-1 when missing).
static long long int_at(const tr_json *arr, size_t i) {
    const tr_json *v = tr_json_at(arr, (int32_t)i);
    return tr_json_is_int(v) ? v->inum : -1;
}

// toks: the fixture tokenizer of each format, indexed by TR_CHAT_* kind.
static void run_case(const tr_json *c, const tr_tokenizer *const *toks, int64_t line) {
    const char *fmt = tr_json_get(c, "format")->str;
    const tr_json *ds = tr_json_get(c, "default_system");
    const tr_json *gv = tr_json_get(c, "add_generation_prompt");
    const tr_json *tv = tr_json_get(c, "enable_thinking");
    bool gen = tr_json_is(gv, TR_JSON_BOOL) && gv->boolean;
    bool thinking = !(tr_json_is(tv, TR_JSON_BOOL) && !tv->boolean);
    const tr_json *msgs = tr_json_get(c, "messages");
    size_t n = (size_t)msgs->count;
    tr_chat_msg m[8];
    size_t k = 0;
    for (const tr_json *o = msgs->child; o && k < 8; o = o->next, k++) {
        const tr_json *content = tr_json_get(o, "content");
        m[k].role = tr_json_get(o, "role")->str;
        m[k].content = content->str;
        m[k].content_len = content->len;
    }
    tr_err err = {0};
    char *text = NULL;
    size_t len = 0;
    const char *sys = tr_json_is(ds, TR_JSON_STRING) ? ds->str : NULL;
    int kind = tr_chat_kind_parse(fmt);
    CHECKF(tr_chat_render_text(kind, sys, m, n, gen, thinking, &text, &len, &err) == 0, "%s",
           err.msg);
    const tr_json *want_text = tr_json_get(c, "text");
    CHECKF(text && len == want_text->len && memcmp(text, want_text->str, len) == 0,
           "case line %lld: text\n%s\nwanted\n%s", (long long)line, text ? text : "",
           want_text->str);
    free(text);

    tr_chat_format f;
    CHECKF(kind > 0 && tr_chat_format_init(&f, fmt, toks[kind], &err) == 0, "%s", err.msg);
    f.default_system = sys;
    f.enable_thinking = thinking;
    tr_chat_tokens t = {0};
    CHECKF(tr_chat_render(&f, m, n, gen, &t, &err) == 0, "%s", err.msg);
    const tr_json *ids = tr_json_get(c, "ids"), *mask = tr_json_get(c, "mask");
    int same = t.n == (size_t)ids->count;
    for (size_t i = 0; same && i < t.n; i++)
        same = t.ids[i] == int_at(ids, i) && t.mask[i] == int_at(mask, i);
    CHECKF(same, "case line %lld (%s): ids/mask differ from the reference", (long long)line, fmt);
    if (!same)
        for (size_t i = 0; i < t.n || i < (size_t)ids->count; i++)
            fprintf(stderr, "  %zu: %d/%d  want %lld/%lld\n", i, i < t.n ? t.ids[i] : -1,
                    i < t.n ? t.mask[i] : -1, int_at(ids, i), int_at(mask, i));
    tr_chat_tokens_free(&t);
}

// Runs every case of a fixture file; returns how many there were.
static int run_cases(const char *rel, const tr_tokenizer *const *toks) {
    tr_err err = {0};
    tr_jsonl r;
    CHECKF(tr_jsonl_open(&r, tr_test_src(rel), &err) == 0, "%s", err.msg);
    tr_json_doc doc;
    int cases = 0;
    while (tr_jsonl_next(&r, &doc, &err) == 1) {
        run_case(doc.root, toks, r.line);
        tr_json_free(&doc);
        cases++;
    }
    tr_jsonl_close(&r);
    return cases;
}

static tr_tokenizer *load_tok(const char *rel) {
    char path[4096];
    tr_err err = {0};
    tr_tokenizer *t = NULL;
    snprintf(path, sizeof path, "%s", tr_test_src(rel));
    CHECKF(tr_tokenizer_load(&t, path, &err) == 0, "%s", err.msg);
    return t;
}

// qwen3 beyond the fixtures: its stops, the tokens it requires, and think-tag spellings
// in user content that stay text.
static void test_qwen3(const tr_tokenizer *qwen3, const tr_tokenizer *qwen2) {
    tr_chat_format f;
    tr_err err = {0};
    CHECK(tr_chat_format_init(&f, "qwen3", qwen3, &err) == 0 && f.kind == TR_CHAT_QWEN3);
    CHECK(f.enable_thinking && f.n_stop == 2 &&
          f.stop[0] == tr_tokenizer_token_id(qwen3, "<|im_end|>") &&
          f.stop[1] == tr_tokenizer_token_id(qwen3, "<|endoftext|>"));
    CHECK(strcmp(tr_chat_kind_name(tr_chat_kind_parse("qwen3")), "qwen3") == 0);
    // A tokenizer without <think> (Qwen2.5's) would spell the tags out: refused by name.
    CHECK(tr_chat_format_init(&f, "qwen3", qwen2, &err) == -1 && strstr(err.msg, "<think>"));
    // The generation prompt is never trained, with or without its closed think block.
    CHECK(tr_chat_format_init(&f, "qwen3", qwen3, &err) == 0);
    tr_chat_msg m[1] = {{"user", "hi", 2}};
    for (int think = 0; think < 2; think++) {
        tr_chat_tokens t = {0};
        f.enable_thinking = think;
        CHECK(tr_chat_render(&f, m, 1, true, &t, &err) == 0);
        int32_t open = tr_tokenizer_token_id(qwen3, "<think>");
        int n_open = 0, trained = 0;
        for (size_t i = 0; i < t.n; i++) {
            n_open += t.ids[i] == open;
            trained += t.mask[i];
        }
        CHECK(n_open == !think && trained == 0);
        tr_chat_tokens_free(&t);
    }
}

int main(void) {
    tr_err err = {0};
    tr_tokenizer *qwen = load_tok("tests/fixtures/chat/qwen2_tokenizer.json");
    tr_tokenizer *llama = load_tok("tests/fixtures/chat/llama3_tokenizer.json");
    tr_tokenizer *qwen3 = load_tok("tests/fixtures/chat/qwen3_tokenizer.json");
    if (!qwen || !llama || !qwen3) return tr_test_summary("test_chat");
    const tr_tokenizer *toks[4] = {NULL};
    toks[TR_CHAT_CHATML] = qwen;
    toks[TR_CHAT_LLAMA3] = llama;
    toks[TR_CHAT_QWEN3] = qwen3;
    CHECK(run_cases("tests/fixtures/chat/cases.jsonl", toks) == 10);
    CHECK(run_cases("tests/fixtures/chat/qwen3_cases.jsonl", toks) == 13);
    test_qwen3(qwen3, qwen);

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
    tr_tokenizer_free(qwen3);
    return tr_test_summary("test_chat");
}
