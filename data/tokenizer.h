// Hugging Face tokenizer.json byte-level BPE (Qwen2, Llama 3 and alike): load, encode to the
// same ids as HF tokenizers' encode(text, add_special_tokens=False), decode back to text.
// A loaded tokenizer is read-only: encode and decode may run on many threads at once.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

typedef struct tr_tokenizer tr_tokenizer;

// Loads tokenizer.json; errors name the file and the JSON key that is wrong.
int tr_tokenizer_load(tr_tokenizer **tok, const char *path, tr_err *err);
// Same from tokenizer.json text already in memory; name stands for the file in messages.
int tr_tokenizer_load_json(tr_tokenizer **tok, const char *json, size_t len, const char *name,
                           tr_err *err);
void tr_tokenizer_free(tr_tokenizer *tok);

// Encodes len bytes of UTF-8 text; added/special tokens that appear in the text are matched
// first, as HF does. *ids is malloc'd (caller frees), *n its length. Text that is not valid
// UTF-8 is an error naming the byte offset (HF only takes valid strings).
int tr_tokenizer_encode(const tr_tokenizer *tok, const char *text, size_t len, int32_t **ids,
                        size_t *n, tr_err *err);
// Decodes ids to UTF-8 text (malloc'd, NUL-terminated); special tokens are kept as text.
// Byte sequences that are not valid UTF-8 become U+FFFD as in HF; an id that names no token
// is an error (HF would drop it silently).
int tr_tokenizer_decode(const tr_tokenizer *tok, const int32_t *ids, size_t n, char **text,
                        size_t *len, tr_err *err);
// Id of a token given by its exact content (vocab or added token), or -1.
int32_t tr_tokenizer_token_id(const tr_tokenizer *tok, const char *token);
// Number of ids: max id + 1 over vocab and added tokens.
int32_t tr_tokenizer_vocab_size(const tr_tokenizer *tok);
// The token string of an id as tokenizer.json writes it (byte-level form for vocabulary
// entries, content for added tokens), not NUL-terminated; NULL when the id names no token.
const char *tr_tokenizer_id_to_token(const tr_tokenizer *tok, int32_t id, size_t *len);
// Whether id is an added token marked special (HF's skip_special_tokens would drop it).
bool tr_tokenizer_is_special(const tr_tokenizer *tok, int32_t id);
