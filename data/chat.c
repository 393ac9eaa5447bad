// Chat templates for chatml, llama3 and qwen3, written out by hand after the published Jinja
// templates (Qwen2.5, Llama-3 and Qwen3 tokenizer_config.json, without tools), with the loss
// mask decided per text piece instead of recovered from offsets afterwards.
#include "data/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tr_chat_kind_parse(const char *name) {
    if (!name) return 0;
    if (strcmp(name, "chatml") == 0) return TR_CHAT_CHATML;
    if (strcmp(name, "llama3") == 0) return TR_CHAT_LLAMA3;
    if (strcmp(name, "qwen3") == 0) return TR_CHAT_QWEN3;
    return 0;
}

const char *tr_chat_kind_name(int kind) {
    return kind == TR_CHAT_CHATML   ? "chatml"
           : kind == TR_CHAT_LLAMA3 ? "llama3"
           : kind == TR_CHAT_QWEN3  ? "qwen3"
                                    : "unknown";
}

int tr_chat_tokens_push(tr_chat_tokens *t, int32_t id, uint8_t mask, tr_err *err) {
    if (t->n == t->cap) {
        size_t c = t->cap ? t->cap * 2 : 256;
        int32_t *ids = realloc(t->ids, c * sizeof *ids);
        if (!ids) return tr_errf(err, TR_ENOMEM, "out of memory for %zu tokens", c);
        t->ids = ids;
        uint8_t *m = realloc(t->mask, c);
        if (!m) return tr_errf(err, TR_ENOMEM, "out of memory for %zu tokens", c);
        t->mask = m;
        t->cap = c;
    }
    t->ids[t->n] = id;
    t->mask[t->n] = mask;
    t->n++;
    return 0;
}

void tr_chat_tokens_free(tr_chat_tokens *t) {
    free(t->ids);
    free(t->mask);
    memset(t, 0, sizeof *t);
}

static int lookup(const tr_tokenizer *tok, const char *s, int32_t *id, tr_err *err) {
    *id = tr_tokenizer_token_id(tok, s);
    if (*id < 0) return tr_errf(err, TR_EINVAL, "the tokenizer has no '%s' token", s);
    return 0;
}

int tr_chat_format_init(tr_chat_format *f, const char *name, const tr_tokenizer *tok, tr_err *err) {
    memset(f, 0, sizeof *f);
    f->kind = tr_chat_kind_parse(name);
    f->tok = tok;
    f->bos = f->header_end = -1;
    f->enable_thinking = true;
    if (f->kind == TR_CHAT_CHATML || f->kind == TR_CHAT_QWEN3) {
        int32_t think;
        if (lookup(tok, "<|im_start|>", &f->turn_start, err) ||
            lookup(tok, "<|im_end|>", &f->turn_end, err) || lookup(tok, "<|endoftext|>", &f->eos, err))
            return tr_err_wrap(err, "chat format %s", tr_chat_kind_name(f->kind));
        // Think blocks are text that the tokenizer turns into its <think> / </think> tokens; a
        // tokenizer without them (Qwen2.5's) would spell them out instead.
        if (f->kind == TR_CHAT_QWEN3 &&
            (lookup(tok, "<think>", &think, err) || lookup(tok, "</think>", &think, err)))
            return tr_err_wrap(err, "chat format qwen3");
    } else if (f->kind == TR_CHAT_LLAMA3) {
        if (lookup(tok, "<|begin_of_text|>", &f->bos, err) ||
            lookup(tok, "<|start_header_id|>", &f->turn_start, err) ||
            lookup(tok, "<|end_header_id|>", &f->header_end, err) ||
            lookup(tok, "<|eot_id|>", &f->turn_end, err) || lookup(tok, "<|end_of_text|>", &f->eos, err))
            return tr_err_wrap(err, "chat format llama3");
    } else {
        return tr_errf(err, TR_EINVAL, "unknown chat format '%s' (chatml, llama3 or qwen3)",
                       name ? name : "(none)");
    }
    f->stop[0] = f->turn_end;
    f->stop[1] = f->eos;
    f->n_stop = 2;
    return 0;
}

// ---- content encoding without special-token matching ----

static int is_ascii_punct(unsigned char c) {
    return c > 0x20 && c < 0x7f && !(c >= '0' && c <= '9') && !((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

static int is_word(unsigned char c) {
    return c >= 0x80 || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

// Where to cut a special-token spelling s[0..n) so neither half matches: before its trailing
// punctuation run ("<|im_end" | "|>"), which GPT-style pre-tokenizer regexes split at anyway
// because a letter or digit run ends there.
static size_t cut_point(const char *s, size_t n) {
    size_t k = n;
    while (k > 0 && is_ascii_punct((unsigned char)s[k - 1])) k--;
    if (k > 0 && k < n && is_word((unsigned char)s[k - 1])) return k;
    return n / 2 > 0 ? n / 2 : 1;
}

static int encode_append(const tr_tokenizer *tok, const char *s, size_t n, tr_chat_tokens *out,
                         uint8_t mask, tr_err *err) {
    if (n == 0) return 0;
    int32_t *ids = NULL;
    size_t m = 0;
    if (tr_tokenizer_encode(tok, s, n, &ids, &m, err)) return -1;
    int rc = 0;
    for (size_t i = 0; i < m && !rc; i++) rc = tr_chat_tokens_push(out, ids[i], mask, err);
    free(ids);
    return rc;
}

#define TR_CHAT_MAX_SPECIAL 128

int tr_chat_encode_plain(const tr_tokenizer *tok, const char *text, size_t len,
                         tr_chat_tokens *out, uint8_t mask, tr_err *err) {
    size_t piece = 0;
    char cand[TR_CHAT_MAX_SPECIAL + 1];
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '<') continue;
        // Every "<...>" spelling up to TR_CHAT_MAX_SPECIAL bytes that names a special token is cut.
        size_t cut = 0;
        for (size_t j = i + 1; j < len && j - i < TR_CHAT_MAX_SPECIAL && !cut; j++) {
            if (text[j] != '>') continue;
            size_t n = j - i + 1;
            memcpy(cand, text + i, n);
            cand[n] = '\0';
            if (memchr(cand, '\0', n) != NULL) continue;
            // Only special tokens are kept out, as HF's split_special_tokens does: other added
            // tokens (e.g. <tool_call>) match in content as they do in HF.
            int32_t id = tr_tokenizer_token_id(tok, cand);
            if (id >= 0 && tr_tokenizer_is_special(tok, id)) cut = i + cut_point(cand, n);
        }
        if (cut) {
            if (encode_append(tok, text + piece, cut - piece, out, mask, err)) return -1;
            piece = cut;
        }
    }
    return encode_append(tok, text + piece, len - piece, out, mask, err);
}

// ---- rendering ----

// Python's str.strip() whitespace (what Jinja's trim filter removes): returns its UTF-8
// length at s, or 0.
static size_t space_len(const unsigned char *s, size_t n) {
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20))) return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0)) return 2;
    if (n >= 3) {
        uint32_t c = ((uint32_t)(s[0] & 0x0f) << 12) | ((uint32_t)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
        if ((s[0] & 0xf0) == 0xe0 &&
            (c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
             c == 0x202f || c == 0x205f || c == 0x3000))
            return 3;
    }
    return 0;
}

static void trim(const char **s, size_t *n) {
    const unsigned char *p = (const unsigned char *)*s;
    size_t len = *n, k;
    while (len && (k = space_len(p, len))) {
        p += k;
        len -= k;
    }
    // Trailing: step back over whole UTF-8 sequences of up to 3 bytes.
    for (;;) {
        size_t cut = 0;
        for (size_t w = 1; w <= 3 && w <= len && !cut; w++)
            if (space_len(p + len - w, w) == w) cut = w;
        if (!cut) break;
        len -= cut;
    }
    *s = (const char *)p;
    *n = len;
}

static int known_role(const char *r) {
    return r && (strcmp(r, "system") == 0 || strcmp(r, "user") == 0 || strcmp(r, "assistant") == 0);
}

// Appends one text piece "head + body": the head is never trained, the body is trained when
// mask is 1. Encoded together when the joint encoding starts with the head's own encoding,
// so the ids equal those of the whole rendered string; otherwise encoded apart.
static int append_piece(const tr_tokenizer *tok, const char *head, size_t hn, const char *body,
                        size_t bn, uint8_t mask, tr_chat_tokens *out, tr_err *err) {
    size_t jn = hn + bn;
    char *joint = malloc(jn ? jn : 1);
    if (!joint) return tr_errf(err, TR_ENOMEM, "out of memory for a %zu-byte message", jn);
    memcpy(joint, head, hn);
    if (bn) memcpy(joint + hn, body, bn);
    tr_chat_tokens j = {0}, h = {0};
    int rc = tr_chat_encode_plain(tok, joint, jn, &j, 0, err);
    if (!rc && mask && bn) rc = encode_append(tok, head, hn, &h, 0, err);
    if (!rc) {
        int prefix = !mask || !bn || (h.n <= j.n && memcmp(h.ids, j.ids, h.n * sizeof *h.ids) == 0);
        if (prefix) {
            for (size_t i = 0; i < j.n && !rc; i++)
                rc = tr_chat_tokens_push(out, j.ids[i], (mask && bn && i >= h.n) ? 1 : 0, err);
        } else {
            for (size_t i = 0; i < h.n && !rc; i++) rc = tr_chat_tokens_push(out, h.ids[i], 0, err);
            if (!rc) rc = tr_chat_encode_plain(tok, body, bn, out, mask, err);
        }
    }
    free(joint);
    tr_chat_tokens_free(&j);
    tr_chat_tokens_free(&h);
    return rc;
}

// One renderer for both outputs: with tok == NULL it writes text to *buf instead of ids.
typedef struct emitter {
    const tr_chat_format *f;
    tr_chat_tokens *out;
    char *buf;
    size_t len, cap;
    bool thinking;   // qwen3's enable_thinking
} emitter;

static int emit_text(emitter *e, const char *s, size_t n, tr_err *err) {
    if (e->len + n + 1 > e->cap) {
        size_t c = e->cap ? e->cap : 256;
        while (c < e->len + n + 1) c *= 2;
        char *b = realloc(e->buf, c);
        if (!b) return tr_errf(err, TR_ENOMEM, "out of memory for %zu bytes of text", c);
        e->buf = b;
        e->cap = c;
    }
    memcpy(e->buf + e->len, s, n);
    e->len += n;
    e->buf[e->len] = '\0';
    return 0;
}

static int emit_special(emitter *e, const char *text, int32_t id, uint8_t mask, tr_err *err) {
    if (!e->out) return emit_text(e, text, strlen(text), err);
    return tr_chat_tokens_push(e->out, id, mask, err);
}

static int emit_piece(emitter *e, const char *head, size_t hn, const char *body, size_t bn,
                      uint8_t mask, tr_err *err) {
    if (!e->out) return emit_text(e, head, hn, err) || emit_text(e, body, bn, err) ? -1 : 0;
    return append_piece(e->f->tok, head, hn, body, bn, mask, e->out, err);
}

// ---- qwen3: think blocks ----

typedef struct span {
    const char *p;
    size_t n;
} span;

// Python's str.find (last == false) or str.rfind of sub in s; NULL when absent.
static const char *find_sub(span s, const char *sub, bool last) {
    size_t m = strlen(sub);
    const char *hit = NULL;
    for (size_t i = 0; m <= s.n && i <= s.n - m; i++)
        if (memcmp(s.p + i, sub, m) == 0) {
            hit = s.p + i;
            if (!last) break;
        }
    return hit;
}

// str.lstrip('\n') / rstrip('\n'): only newlines, as the template strips.
static span strip_nl(span s, bool left, bool right) {
    while (left && s.n && s.p[0] == '\n') s.p++, s.n--;
    while (right && s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

// An assistant message as Qwen3's template splits it when its content holds "</think>":
// reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n'),
// answer = content.split('</think>')[-1].lstrip('\n'); otherwise no reasoning and the
// content untouched.
static void split_think(span c, span *reasoning, span *answer) {
    const char *first = find_sub(c, "</think>", false);
    *reasoning = (span){c.p, 0};
    *answer = c;
    if (!first) return;
    const char *after = find_sub(c, "</think>", true) + 8;
    span r = strip_nl((span){c.p, (size_t)(first - c.p)}, false, true);
    const char *open = find_sub(r, "<think>", true);
    if (open) r = (span){open + 7, r.n - (size_t)(open + 7 - r.p)};
    *reasoning = strip_nl(r, true, false);
    *answer = strip_nl((span){after, (size_t)(c.p + c.n - after)}, true, false);
}

// The user message the template calls the last query: the last one that is not a tool
// response wrapped in <tool_response> tags; with none, the last message.
static size_t qwen3_last_query(const tr_chat_msg *msgs, const tr_chat_msg *sys, size_t total) {
    for (size_t k = total; k-- > 0;) {
        const tr_chat_msg *m = sys ? (k == 0 ? sys : &msgs[k - 1]) : &msgs[k];
        if (!m->role || strcmp(m->role, "user") != 0 || !m->content) continue;
        span c = {m->content, m->content_len};
        static const char open[] = "<tool_response>", close[] = "</tool_response>";
        bool wrapped = c.n >= sizeof open - 1 && memcmp(c.p, open, sizeof open - 1) == 0 &&
                       c.n >= sizeof close - 1 &&
                       memcmp(c.p + c.n - (sizeof close - 1), close, sizeof close - 1) == 0;
        if (!wrapped) return k;
    }
    return total - 1;
}

// One assistant turn of Qwen3's template: after the last query, the last message and any
// message with reasoning keep a think block (an empty one when there is no reasoning);
// earlier turns keep only their answer. Everything after "assistant\n" is trained.
static int emit_qwen3_assistant(emitter *e, const tr_chat_msg *m, bool after_query,
                                bool is_last, tr_err *err) {
    const tr_chat_format *f = e->f;
    span c = {m->content ? m->content : "", m->content ? m->content_len : 0}, r, a;
    split_think(c, &r, &a);
    bool keep_think = after_query && (is_last || r.n > 0);
    char *body = NULL;
    size_t bn = a.n;
    if (keep_think) {
        r = strip_nl(r, true, true);
        a = strip_nl(a, true, false);
        bn = 8 + r.n + 11 + a.n;
        body = malloc(bn);
        if (!body) return tr_errf(err, TR_ENOMEM, "out of memory for a %zu-byte message", bn);
        memcpy(body, "<think>\n", 8);
        memcpy(body + 8, r.p, r.n);
        memcpy(body + 8 + r.n, "\n</think>\n\n", 11);
        memcpy(body + 19 + r.n, a.p, a.n);
    }
    int rc = emit_special(e, "<|im_start|>", f ? f->turn_start : 0, 0, err) ||
             emit_piece(e, "assistant\n", 10, body ? body : a.p, bn, 1, err) ||
             emit_special(e, "<|im_end|>", f ? f->turn_end : 0, 1, err) ||
             emit_piece(e, "\n", 1, "", 0, 0, err);
    free(body);
    return rc ? -1 : 0;
}

static int render(emitter *e, int kind, const char *default_system, const tr_chat_msg *msgs,
                  size_t n, bool gen, tr_err *err) {
    const tr_chat_format *f = e->f;
    int32_t ts = f ? f->turn_start : 0, he = f ? f->header_end : 0, te = f ? f->turn_end : 0;
    tr_chat_msg sys = {"system", default_system, default_system ? strlen(default_system) : 0};
    bool add_sys = default_system && (n == 0 || !msgs[0].role || strcmp(msgs[0].role, "system") != 0);
    size_t total = n + (add_sys ? 1 : 0);
    size_t last_query = 0;
    if (kind == TR_CHAT_QWEN3 && total) last_query = qwen3_last_query(msgs, add_sys ? &sys : NULL, total);
    for (size_t k = 0; k < total; k++) {
        const tr_chat_msg *m = add_sys ? (k == 0 ? &sys : &msgs[k - 1]) : &msgs[k];
        if (!known_role(m->role))
            return tr_errf(err, TR_EINVAL, "message %zu: role '%s' is not system, user or assistant",
                           add_sys ? k - 1 : k, m->role ? m->role : "(null)");
        const char *c = m->content ? m->content : "";
        size_t cn = m->content ? m->content_len : 0;
        uint8_t train = strcmp(m->role, "assistant") == 0;
        char head[64];
        if (kind == TR_CHAT_QWEN3 && train) {
            if (emit_qwen3_assistant(e, m, k > last_query, k + 1 == total, err)) return -1;
        } else if (kind == TR_CHAT_CHATML || kind == TR_CHAT_QWEN3) {
            int hn = snprintf(head, sizeof head, "%s\n", m->role);
            if (emit_special(e, "<|im_start|>", ts, 0, err) ||
                emit_piece(e, head, (size_t)hn, c, cn, train, err) ||
                emit_special(e, "<|im_end|>", te, train, err) || emit_piece(e, "\n", 1, "", 0, 0, err))
                return -1;
        } else {
            trim(&c, &cn);
            if (k == 0 && emit_special(e, "<|begin_of_text|>", f ? f->bos : 0, 0, err)) return -1;
            if (emit_special(e, "<|start_header_id|>", ts, 0, err) ||
                emit_piece(e, m->role, strlen(m->role), "", 0, 0, err) ||
                emit_special(e, "<|end_header_id|>", he, 0, err) ||
                emit_piece(e, "\n\n", 2, c, cn, train, err) ||
                emit_special(e, "<|eot_id|>", te, train, err))
                return -1;
        }
    }
    if (gen) {
        if (kind == TR_CHAT_CHATML || kind == TR_CHAT_QWEN3) {
            // enable_thinking=False: the prompt closes an empty think block itself.
            bool no_think = kind == TR_CHAT_QWEN3 && !e->thinking;
            const char *head = no_think ? "assistant\n<think>\n\n</think>\n\n" : "assistant\n";
            if (emit_special(e, "<|im_start|>", ts, 0, err) ||
                emit_piece(e, head, strlen(head), "", 0, 0, err))
                return -1;
        } else {
            if (emit_special(e, "<|start_header_id|>", ts, 0, err) ||
                emit_piece(e, "assistant", 9, "", 0, 0, err) ||
                emit_special(e, "<|end_header_id|>", he, 0, err) || emit_piece(e, "\n\n", 2, "", 0, 0, err))
                return -1;
        }
    }
    return 0;
}

int tr_chat_render(const tr_chat_format *f, const tr_chat_msg *msgs, size_t n,
                   bool add_generation_prompt, tr_chat_tokens *out, tr_err *err) {
    emitter e = {f, out, NULL, 0, 0, f->enable_thinking};
    return render(&e, f->kind, f->default_system, msgs, n, add_generation_prompt, err);
}

int tr_chat_render_text(int kind, const char *default_system, const tr_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, bool enable_thinking, char **text,
                        size_t *len, tr_err *err) {
    *text = NULL;
    *len = 0;
    if (kind != TR_CHAT_CHATML && kind != TR_CHAT_LLAMA3 && kind != TR_CHAT_QWEN3)
        return tr_errf(err, TR_EINVAL, "unknown chat format %d", kind);
    emitter e = {NULL, NULL, NULL, 0, 0, enable_thinking};
    if (render(&e, kind, default_system, msgs, n, add_generation_prompt, err) ||
        emit_text(&e, "", 0, err)) {
        free(e.buf);
        return -1;
    }
    *text = e.buf;
    *len = e.len;
    return 0;
}
