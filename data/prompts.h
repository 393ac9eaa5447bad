// RL prompt sets: JSONL records with `prompt` (a string) or `messages` (a chat), every other
// field handed to the reward as `meta`, kept as JSON object text ({"answer": "42"}).
// Prompts are rendered with the chat format's generation prompt, or encoded as raw text.
#pragma once
#include <stdint.h>

#include "data/chat.h"
#include "data/tokenizer.h"
#include "engine/err.h"
#include "engine/json.h"

typedef struct tr_prompt {
    char *text;         // the `prompt` string, or the last message's content for `messages`
    tr_chat_msg *msgs;  // the `messages` chat (contents owned here), NULL for `prompt` records
    size_t n_msgs;
    char *meta;         // JSON object text of the other fields, "{}" when there are none
    int64_t line;       // source line
} tr_prompt;

typedef struct tr_prompt_set {
    tr_prompt *items;
    int64_t n, cap;
} tr_prompt_set;

// Reads path; errors name path:line (malformed JSON, `prompt` not a string, neither field).
int tr_prompts_load(tr_prompt_set *s, const char *path, tr_err *err);
// Adds one parsed record.
int tr_prompts_add(tr_prompt_set *s, const char *path, int64_t line, const tr_json *obj, tr_err *err);
void tr_prompts_free(tr_prompt_set *s);

// Ids of prompt i, appended to out (mask all 0). With chat: a `prompt` string becomes one user
// message (after chat->default_system, if set) and the generation prompt follows. Without
// chat (NULL): the `prompt` text encoded as plain text (special-token spellings stay text);
// `messages` records then need a chat format.
int tr_prompts_encode(const tr_prompt_set *s, int64_t i, const tr_chat_format *chat,
                      const tr_tokenizer *tok, tr_chat_tokens *out, tr_err *err);
