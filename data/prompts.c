// Prompt records keep their chat as the parsed JSON array (shared with jansson, not copied)
// and their metadata as compact JSON text, ready to travel to a reward service unchanged.
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
        json_decref(s->items[i].messages);
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

int tr_prompts_add(tr_prompt_set *s, const char *path, int64_t line, const json_t *obj, tr_err *err) {
    const char *text;
    size_t tlen;
    json_t *msgs;
    if (tr_jsonl_get_string(path, line, obj, "prompt", false, &text, &tlen, err) ||
        tr_jsonl_get_array(path, line, obj, "messages", false, &msgs, err))
        return -1;
    if (text && msgs)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: has both 'prompt' and 'messages'; give one",
                       path, (long long)line);
    if (!text && !msgs)
        return tr_errf(err, TR_EFORMAT, "%s:%lld: missing field 'prompt' (or 'messages')", path,
                       (long long)line);
    if (msgs) {
        // Check the chat now, so a bad record fails at load and names its line.
        tr_chat_msg *m;
        size_t n;
        json_t *wrap = json_object();
        if (!wrap || json_object_set(wrap, "messages", msgs)) {
            json_decref(wrap);
            return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
        }
        int rc = tr_sft_parse_messages(path, line, wrap, &m, &n, err);
        if (!rc) {
            text = m[n - 1].content;
            tlen = m[n - 1].content_len;
            free(m);
        }
        json_decref(wrap);
        if (rc) return -1;
    }
    if (s->n == s->cap) {
        int64_t c = s->cap ? s->cap * 2 : 256;
        tr_prompt *it = realloc(s->items, (size_t)c * sizeof *it);
        if (!it) return tr_errf(err, TR_ENOMEM, "out of memory for %" PRId64 " prompts", c);
        s->items = it;
        s->cap = c;
    }
    json_t *meta = json_object();
    if (!meta) return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        if (strcmp(key, "prompt") == 0 || strcmp(key, "messages") == 0) continue;
        if (json_object_set(meta, key, val)) {
            json_decref(meta);
            return tr_errf(err, TR_ENOMEM, "%s:%lld: out of memory", path, (long long)line);
        }
    }
    // Indent 0 without JSON_COMPACT gives Python's json.dumps separators: {"a": 1, "b": 2}.
    char *mt = json_dumps(meta, JSON_PRESERVE_ORDER);
    json_decref(meta);
    tr_prompt p = {dup_n(text, tlen), msgs ? json_incref(msgs) : NULL, mt, line};
    if (!p.text || !p.meta) {
        free(p.text);
        free(p.meta);
        json_decref(p.messages);
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
        json_t *obj;
        rc = tr_jsonl_next(&r, &obj, err);
        if (rc <= 0) break;
        rc = tr_prompts_add(s, path, r.line, obj, err);
        json_decref(obj);
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
        if (p->messages)
            return tr_errf(err, TR_EINVAL, "prompt from line %" PRId64 " has 'messages': a chat "
                           "format is needed to render it", p->line);
        return tr_chat_encode_plain(tok, p->text, strlen(p->text), out, 0, err);
    }
    if (!p->messages) {
        tr_chat_msg m = {"user", p->text, strlen(p->text)};
        return tr_chat_render(chat, &m, 1, true, out, err);
    }
    json_t *wrap = json_object();
    if (!wrap || json_object_set(wrap, "messages", p->messages)) {
        json_decref(wrap);
        return tr_errf(err, TR_ENOMEM, "out of memory");
    }
    tr_chat_msg *m;
    size_t n;
    int rc = tr_sft_parse_messages("prompt", p->line, wrap, &m, &n, err);
    if (!rc) {
        rc = tr_chat_render(chat, m, n, true, out, err);
        free(m);
    }
    json_decref(wrap);
    return rc;
}
