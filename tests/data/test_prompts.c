// RL prompt sets: meta is every field but prompt/messages, as JSON text in input order with
// Python json.dumps separators; a prompt rendered with chatml's generation prompt equals the
// reference ids of the published template (tests/fixtures/chat, case 4); raw prompts are
// plain encodings; bad records name file:line.

#include "data/chat.h"
#include "data/jsonl.h"
#include "data/prompts.h"
#include "data/tokenizer.h"
#include "engine/file.h"
#include "tests/json_get.h"
#include "tests/test.h"

int main(void) {
    const char *dir = tr_test_tmpdir();
    tr_err err = {0};
    tr_tokenizer *tok = NULL;
    CHECKF(tr_tokenizer_load(&tok, tr_test_src("tests/fixtures/chat/qwen2_tokenizer.json"), &err) == 0,
           "%s", err.msg);
    if (!tok) return tr_test_summary("test_prompts");
    tr_chat_format chat;
    CHECK(tr_chat_format_init(&chat, "chatml", tok, &err) == 0);

    tr_prompt_set s;
    char path[4096];
    snprintf(path, sizeof path, "%s", tr_test_src("tests/fixtures/data/prompts.jsonl"));
    CHECKF(tr_prompts_load(&s, path, &err) == 0, "%s", err.msg);
    CHECK(s.n == 3);
    if (s.n == 3) {
        CHECK(strcmp(s.items[0].meta, "{\"answer\": \"2\"}") == 0);
        CHECKF(strcmp(s.items[1].meta, "{\"id\": 7, \"answer\": \"42\", \"tags\": [\"math\", \"easy\"], "
                                       "\"score\": {\"max\": 1.5}}") == 0, "%s", s.items[1].meta);
        CHECK(strcmp(s.items[2].meta, "{}") == 0);
        CHECK(s.items[0].line == 1 && s.items[1].line == 3 && s.items[2].line == 4);
        CHECK(strcmp(s.items[1].text, "What is 6*7?") == 0);
        // Meta is valid JSON that parses back to the record's other fields.
        tr_json_doc m;
        CHECK(tj_parse(&m, s.items[1].meta, strlen(s.items[1].meta), "meta", &err) == 0);
        CHECK(tj_int(tr_json_get(m.root, "id")) == 7 && tj_size(m.root) == 4);
        tr_json_free(&m);

        // The rendered prompt equals HF's ids for the published template (case 4 of the chat
        // fixture has the same user message and add_generation_prompt).
        tr_jsonl r;
        tr_json_doc c, ref_doc = {0};
        const tr_json *ref = NULL;
        CHECK(tr_jsonl_open(&r, tr_test_src("tests/fixtures/chat/cases.jsonl"), &err) == 0);
        while (tr_jsonl_next(&r, &c, &err) == 1) {
            if (r.line == 4) {
                ref_doc = c;  // kept: ref points into it
                ref = tr_json_get(c.root, "ids");
            } else {
                tr_json_free(&c);
            }
        }
        tr_jsonl_close(&r);
        tr_chat_tokens t = {0};
        CHECK(tr_prompts_encode(&s, 0, &chat, tok, &t, &err) == 0);
        int same = ref && t.n == tj_size(ref);
        for (size_t i = 0; same && i < t.n; i++)
            same = t.ids[i] == tj_int(tj_at(ref, i)) && t.mask[i] == 0;
        CHECK(same);
        tr_json_free(&ref_doc);
        // The chat record renders system + user + generation prompt: three turn starts, and
        // the text the template gives.
        tr_chat_tokens_free(&t);
        CHECK(tr_prompts_encode(&s, 1, &chat, tok, &t, &err) == 0);
        int starts = 0;
        for (size_t i = 0; i < t.n; i++) starts += t.ids[i] == chat.turn_start;
        CHECK(starts == 3);
        char *txt = NULL;
        size_t tl = 0;
        CHECK(tr_tokenizer_decode(tok, t.ids, t.n, &txt, &tl, &err) == 0);
        CHECK(txt && strcmp(txt, "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n"
                                 "What is 6*7?<|im_end|>\n<|im_start|>assistant\n") == 0);
        free(txt);
        tr_chat_tokens_free(&t);
        // Without a chat format: the raw prompt's encoding; a chat record needs a format.
        CHECK(tr_prompts_encode(&s, 2, NULL, tok, &t, &err) == 0);
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(tr_tokenizer_encode(tok, "no metadata here", 16, &ids, &n, &err) == 0);
        CHECK(n == t.n && memcmp(ids, t.ids, n * sizeof *ids) == 0);
        free(ids);
        tr_chat_tokens_free(&t);
        CHECK(tr_prompts_encode(&s, 1, NULL, tok, &t, &err) == -1 && strstr(err.msg, "line 3"));
        CHECK(tr_prompts_encode(&s, 3, &chat, tok, &t, &err) == -1);
        tr_chat_tokens_free(&t);
    }
    tr_prompts_free(&s);

    struct { const char *body, *want; } bad[] = {
        {"{\"prompt\": 12, \"answer\": \"x\"}\n", "bad.jsonl:1: field 'prompt' must be a string, got number"},
        {"{\"prompt\": \"a\"}\n{\"answer\": \"x\"}\n", "bad.jsonl:2: missing field 'prompt'"},
        {"{\"prompt\": \"a\", \"messages\": []}\n", "bad.jsonl:1: has both"},
        {"{\"messages\": [{\"role\": \"user\"}]}\n", "bad.jsonl:1: messages[0]: missing field 'content'"},
        {"{\"prompt\": \"a\"}\n{\"prompt\": \"b\",\n", "bad.jsonl:2:"},
    };
    char pb[600];
    snprintf(pb, sizeof pb, "%s/bad.jsonl", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(tr_file_write_atomic(pb, bad[i].body, strlen(bad[i].body), &err) == 0);
        CHECK(tr_prompts_load(&s, pb, &err) == -1);
        CHECKF(strstr(err.msg, bad[i].want) != NULL, "'%s' lacks '%s'", err.msg, bad[i].want);
    }
    tr_tokenizer_free(tok);
    return tr_test_summary("test_prompts");
}
