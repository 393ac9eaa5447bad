// Fuzz target for tokenizer.json loading: any input either loads or fails with a message;
// a tokenizer that loads must encode fixed texts and a slice of the input itself to ids
// inside its vocabulary, and decode those ids back to valid UTF-8.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokenizer.h"

static int valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = (uint8_t)s[i];
        size_t k;
        if (b < 0x80) k = 0;
        else if (b >= 0xC2 && b <= 0xDF) k = 1;
        else if (b >= 0xE0 && b <= 0xEF) k = 2;
        else if (b >= 0xF0 && b <= 0xF4) k = 3;
        else return 0;
        if (i + k >= n && k) return 0;
        for (size_t j = 1; j <= k; j++)
            if (((uint8_t)s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

static void check_text(const tr_tokenizer *tok, const char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0;
    tr_err err = {0};
    if (tr_tokenizer_encode(tok, text, len, &ids, &n, &err)) {
        if (!err.msg[0]) __builtin_trap();
        return;
    }
    int32_t vs = tr_tokenizer_vocab_size(tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vs) __builtin_trap();
    char *back = NULL;
    size_t blen = 0;
    if (tr_tokenizer_decode(tok, ids, n, &back, &blen, &err) != 0) __builtin_trap();
    if (!valid_utf8(back, blen) || back[blen] != '\0') __builtin_trap();
    free(back);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tr_tokenizer *tok = NULL;
    tr_err err = {0};
    if (tr_tokenizer_load_json(&tok, (const char *)data, size, "fuzz.json", &err)) {
        if (err.code == 0 || !err.msg[0] || tok) __builtin_trap();
        return 0;
    }
    static const char *texts[] = {
        "Hello world, it's 2024!\n\tcode: x = f(y);",
        "<|im_start|>user\nhi<|im_end|> <|endoftext|>",
        "caf\xc3\xa9 e\xcc\x81 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b\xf0\x9f\x8f\xbd  \xc2\xa0 end",
        "",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) check_text(tok, texts[i], strlen(texts[i]));
    check_text(tok, (const char *)data, size < 256 ? size : 256);  // invalid UTF-8 must fail cleanly
    tr_tokenizer_free(tok);
    return 0;
}
