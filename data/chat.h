// Chat formats: a conversation rendered to token ids with a per-token loss mask, and the
// generation prompt that RL rollouts continue from.
//
//   chatml (Qwen2/2.5):  <|im_start|>{role}\n{content}<|im_end|>\n ... ; prompt
//                        "<|im_start|>assistant\n"; stops <|im_end|>, <|endoftext|>
//   llama3 (Llama 3):    <|begin_of_text|> then <|start_header_id|>{role}<|end_header_id|>\n\n
//                        {content, whitespace-trimmed}<|eot_id|> ... ; prompt
//                        "<|start_header_id|>assistant<|end_header_id|>\n\n"; stops <|eot_id|>,
//                        <|end_of_text|>
//   qwen3 (Qwen3):       chatml turns, but an assistant message is split at "</think>" into
//                        reasoning and answer. Assistant turns after the last user query keep
//                        "<think>\n{reasoning}\n</think>\n\n{answer}" when they are the last
//                        message or have reasoning (an empty block for a last message without
//                        any); earlier turns keep only the answer. Prompt "<|im_start|>assistant\n",
//                        plus "<think>\n\n</think>\n\n" when enable_thinking is false; stops as
//                        chatml. <think> and </think> are the tokenizer's own (added) tokens.
//
// Trained tokens (mask 1): exactly the tokens of every assistant turn's text as the template
// emits it (qwen3: its think block too) and the end-of-turn token that closes it (<|im_end|> /
// <|eot_id|>). Role headers, system and user turns, the "\n" after <|im_end|>,
// <|begin_of_text|> and the generation prompt are 0.
// No system prompt is added unless the format is given one (Qwen2.5's own template adds
// "You are Qwen, created by Alibaba Cloud. You are a helpful assistant." when none is given).
//
// Structure tokens are emitted by id; message content is encoded so that special-token text
// inside it ("<|im_end|>" typed by a user) stays ordinary text and cannot end a turn.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokenizer.h"
#include "engine/err.h"

enum tr_chat_kind { TR_CHAT_CHATML = 1, TR_CHAT_LLAMA3 = 2, TR_CHAT_QWEN3 = 3 };

typedef struct tr_chat_msg {
    const char *role;        // "system", "user" or "assistant"
    const char *content;
    size_t content_len;
} tr_chat_msg;

typedef struct tr_chat_format {
    int kind;
    const tr_tokenizer *tok;
    const char *default_system;   // system prompt used when the conversation has none; NULL
    int32_t bos;                  // <|begin_of_text|> (llama3), else -1
    int32_t turn_start;           // <|im_start|> / <|start_header_id|>
    int32_t header_end;           // -1 / <|end_header_id|>
    int32_t turn_end;             // <|im_end|> / <|eot_id|>
    int32_t stop[2];              // stop tokens for generation
    int32_t n_stop;
    int32_t eos;                  // the tokenizer's end of text (<|endoftext|> / <|end_of_text|>)
    bool enable_thinking;         // qwen3: true (init's value) lets the model open its own think
                                  // block; false closes an empty one in the generation prompt
} tr_chat_format;

// Ids plus a loss mask of the same length (malloc'd, grown as needed).
typedef struct tr_chat_tokens {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap;
} tr_chat_tokens;

// "chatml", "llama3" or "qwen3" -> TR_CHAT_*, 0 for an unknown name.
int tr_chat_kind_parse(const char *name);
const char *tr_chat_kind_name(int kind);

// Resolves the format's special tokens in tok; an error names any that the tokenizer lacks.
int tr_chat_format_init(tr_chat_format *f, const char *name, const tr_tokenizer *tok, tr_err *err);

// Appends the rendering of msgs (plus the generation prompt when asked) to out.
int tr_chat_render(const tr_chat_format *f, const tr_chat_msg *msgs, size_t n,
                   bool add_generation_prompt, tr_chat_tokens *out, tr_err *err);
// The same rendering as text (what the published Jinja templates produce), malloc'd;
// enable_thinking matters to qwen3 only.
int tr_chat_render_text(int kind, const char *default_system, const tr_chat_msg *msgs, size_t n,
                        bool add_generation_prompt, bool enable_thinking, char **text,
                        size_t *len, tr_err *err);

// Encodes text without matching special tokens (HF's split_special_tokens=True): text that
// spells a special token is cut where GPT-style pre-tokenizer regexes split it anyway (before
// its closing punctuation, "<|im_end" | "|>") and encoded as ordinary text. Non-special added
// tokens still match, as in HF.
int tr_chat_encode_plain(const tr_tokenizer *tok, const char *text, size_t len,
                         tr_chat_tokens *out, uint8_t mask, tr_err *err);

int tr_chat_tokens_push(tr_chat_tokens *t, int32_t id, uint8_t mask, tr_err *err);
void tr_chat_tokens_free(tr_chat_tokens *t);
