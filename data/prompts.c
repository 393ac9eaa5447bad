// Prompt records keep their chat as messages with copied contents (the parsed record is
// freed after each line) and their metadata as JSON text, ready to travel to a reward
// service unchanged.
#include "data/prompts.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "data/jsonl.h"
#include "data/sft.h"

void tr_prompts_free(tr_prompt_set *s) {
    for (int64_t i = 0; i < s->n; i++) {
        free(s->items[i].text);
        free(s->items[i].meta);
        free(s->items[i].msgs);
    }
    free(s->items);
    memset(s, 0, sizeof *s);
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

// The chat of a `messages` record, checked, as one allocation: the messages, then their
// contents (NUL-terminated).
static int copy_chat(const char *path, int64_t line, const tr_json *obj, tr_prompt *p,
                     tr_err *err) {
    tr_chat_msg *m;
    size_t n;
    if (tr_sft_parse_messages(path, line, obj, &m, &n, err)) return -1;
    size_t bytes = n * sizeof *m;
    for (size_t i = 0; i < n; i++) bytes += m[i].content_len + 1;
    p->msgs = malloc(bytes);
    if (!p->msgs) {
        free(m);
        return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
    }
    char *text = (char *)(p->msgs + n);
    for (size_t i = 0; i < n; i++) {
        memcpy(text, m[i].content, m[i].content_len);
        text[m[i].content_len] = '\0';
        p->msgs[i] = (tr_chat_msg){m[i].role, text, m[i].content_len};
        text += m[i].content_len + 1;
    }
    p->n_msgs = n;
    free(m);
    return 0;
}

// Every member but prompt and messages, in input order with Python json.dumps separators:
// {"a": 1, "b": 2}.
static char *meta_text(const tr_json *obj) {
    tr_json_writer w;
    tr_json_writer_init(&w, 0);
    w.flags = TR_JSON_W_DATA | TR_JSON_W_SPACED;
    tr_json_begin_object(&w);
    for (const tr_json *m = obj->child; m; m = m->next) {
        if (strcmp(m->key, "prompt") == 0 || strcmp(m->key, "messages") == 0) continue;
        tr_json_key_n(&w, m->key, m->key_len);
        tr_json_value(&w, m);
    }
    tr_json_end_object(&w);
    const char *out;
    size_t len;
    char *mt = tr_json_writer_finish(&w, &out, &len, NULL) ? NULL : dup_n(out, len);
    tr_json_writer_free(&w);
    return mt;
}

int tr_prompts_add(tr_prompt_set *s, const char *path, int64_t line, const tr_json *obj, tr_err *err) {
    const char *text;
    size_t tlen;
    const tr_json *msgs;
    if (tr_jsonl_get_string(path, line, obj, "prompt", false, &text, &tlen, err) ||
        tr_jsonl_get_array(path, line, obj, "messages", false, &msgs, err))
        return -1;
    if (text && msgs)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: has both 'prompt' and 'messages'; give one",
                       path, (long long)line);
    if (!text && !msgs)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field 'prompt' (or 'messages')", path,
                       (long long)line);
    if (s->n == s->cap) {
        int64_t c = s->cap ? s->cap * 2 : 256;
        tr_prompt *it = realloc(s->items, (size_t)c * sizeof *it);
        if (!it) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " prompts", c);
        s->items = it;
        s->cap = c;
    }
    tr_prompt p = {.line = line};
    // Check the chat now, so a bad record fails at load and names its line.
    if (msgs && copy_chat(path, line, obj, &p, err)) return -1;
    if (msgs) {
        text = p.msgs[p.n_msgs - 1].content;
        tlen = p.msgs[p.n_msgs - 1].content_len;
    }
    p.text = dup_n(text, tlen);
    p.meta = meta_text(obj);
    if (!p.text || !p.meta) {
        free(p.text);
        free(p.meta);
        free(p.msgs);
        return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
    }
    s->items[s->n++] = p;
    return 0;
}

int tr_prompts_load(tr_prompt_set *s, const char *path, tr_err *err) {
    memset(s, 0, sizeof *s);
    tr_jsonl r;
    if (tr_jsonl_open(&r, path, err)) return -1;
    int rc;
    for (;;) {
        tr_json_doc doc;
        rc = tr_jsonl_next(&r, &doc, err);
        if (rc <= 0) break;
        rc = tr_prompts_add(s, path, r.line, doc.root, err);
        tr_json_free(&doc);
        if (rc) break;
    }
    tr_jsonl_close(&r);
    if (rc) tr_prompts_free(s);
    return rc;
}

int tr_prompts_encode(const tr_prompt_set *s, int64_t i, const tr_chat_format *chat,
                      const tr_tokenizer *tok, tr_chat_tokens *out, tr_err *err) {
    if (i < 0 || i >= s->n) return tr_errf(err, TR_ERANGE, "prompt %" PRId64 " of %" PRId64, i, s->n);
    const tr_prompt *p = &s->items[i];
    if (!chat) {
        if (p->msgs)
            return tr_errf(err, TR_EINVAL, "prompt from line %" PRId64 " has 'messages': a chat "
                           "format is needed to render it", p->line);
        return tr_chat_encode_plain(tok, p->text, strlen(p->text), out, 0, err);
    }
    if (!p->msgs) {
        tr_chat_msg m = {"user", p->text, strlen(p->text)};
        return tr_chat_render(chat, &m, 1, true, out, err);
    }
    return tr_chat_render(chat, p->msgs, p->n_msgs, true, out, err);
}
