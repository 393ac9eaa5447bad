// `troupe tokenize`: JSONL on stdin to JSONL on stdout, one output line per input line:
// {"text": ...} -> {"ids": [...]}, or with --decode {"ids": [...]} -> {"text": ...}.
// Output JSON is compact with the escapes Python's json.dumps(ensure_ascii=False) uses, so
// results compare byte for byte with files written by Python.
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "data/jsonl.h"
#include "data/tokenizer.h"
#include "engine/err.h"

#define NAME "<stdin>"

static void write_ids(FILE *out, const int32_t *ids, size_t n) {
    fputs("{\"ids\":[", out);
    for (size_t i = 0; i < n; i++) fprintf(out, i ? ",%" PRId32 : "%" PRId32, ids[i]);
    fputs("]}\n", out);
}

static void write_text(FILE *out, const char *s, size_t n) {
    fputs("{\"text\":\"", out);
    size_t run = 0;  // start of the stretch that needs no escaping
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        fwrite(s + run, 1, i - run, out);
        run = i + 1;
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        case '\b': fputs("\\b", out); break;
        case '\f': fputs("\\f", out); break;
        default: fprintf(out, "\\u%04x", c);
        }
    }
    fwrite(s + run, 1, n - run, out);
    fputs("\"}\n", out);
}

static int encode_line(const tr_tokenizer *tok, int64_t line, const tr_json *obj, FILE *out,
                       tr_err *err) {
    const char *text;
    size_t len;
    if (tr_jsonl_get_string(NAME, line, obj, "text", true, &text, &len, err)) return -1;
    int32_t *ids;
    size_t n;
    if (tr_tokenizer_encode(tok, text, len, &ids, &n, err))
        return tr_err_wrap(err, "%s:%" PRId64, NAME, line);
    write_ids(out, ids, n);
    free(ids);
    return 0;
}

static int decode_line(const tr_tokenizer *tok, int64_t line, const tr_json *obj, FILE *out,
                       tr_err *err) {
    const tr_json *arr;
    if (tr_jsonl_get_array(NAME, line, obj, "ids", true, &arr, err)) return -1;
    size_t n = (size_t)arr->count;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    if (!ids) return tr_errf(err, TR_ENOMEM, "%s:%" PRId64 ": out of memory for %zu ids", NAME, line, n);
    size_t i = 0;
    for (const tr_json *v = arr->child; v; v = v->next, i++) {
        if (!tr_json_is_int(v) || v->inum < INT32_MIN || v->inum > INT32_MAX) {
            free(ids);
            return tr_errf(err, TR_EINVAL, "%s:%" PRId64 ": ids[%zu] must be a 32-bit integer, got %s",
                           NAME, line, i, tr_json_is_int(v) ? "a larger number" : tr_jsonl_type_name(v));
        }
        ids[i] = (int32_t)v->inum;
    }
    char *text;
    size_t len;
    int rc = tr_tokenizer_decode(tok, ids, n, &text, &len, err);
    free(ids);
    if (rc) return tr_err_wrap(err, "%s:%" PRId64, NAME, line);
    write_text(out, text, len);
    free(text);
    return 0;
}

int tr_cmd_tokenize(int argc, char **argv) {
    const char *tok_path = NULL;
    bool decode = false, help = false;
    tr_arg table[] = {
        {"tokenizer", TR_ARG_STR, &tok_path, "FILE", "Hugging Face tokenizer.json", true, false},
        {"decode", TR_ARG_FLAG, &decode, NULL, "read {\"ids\": [...]} lines and write {\"text\": ...}",
         false, false},
        {NULL, 0, NULL, NULL, NULL, false, false},
    };
    int rc = tr_args_parse("tokenize", argc, argv, table, NULL, 0, NULL, &help);
    if (rc) return rc;
    if (help) {
        tr_args_usage("tokenize", "--tokenizer tokenizer.json [--decode] < IN.jsonl > OUT.jsonl",
                      "Reads JSON lines {\"text\": ...} on standard input and writes {\"ids\": [...]}\n"
                      "per line (the ids of Hugging Face's encode(text, add_special_tokens=False));\n"
                      "with --decode, reads {\"ids\": [...]} and writes {\"text\": ...}. Blank lines\n"
                      "are skipped; a malformed line stops with an error naming its number.",
                      table);
        return 0;
    }
    tr_err err = {0};
    tr_tokenizer *tok = NULL;
    if (tr_tokenizer_load(&tok, tok_path, &err)) return tr_cli_fail("tokenize", &err);
    tr_jsonl r;
    if (tr_jsonl_open_stream(&r, stdin, NAME, &err)) {
        tr_tokenizer_free(tok);
        return tr_cli_fail("tokenize", &err);
    }
    tr_json_doc doc = {0};
    int status = 0;
    for (;;) {
        int got = tr_jsonl_next(&r, &doc, &err);
        if (got == 0) break;
        if (got < 0 || (decode ? decode_line(tok, r.line, doc.root, stdout, &err)
                               : encode_line(tok, r.line, doc.root, stdout, &err))) {
            status = 1;
            break;
        }
        tr_json_free(&doc);
    }
    tr_json_free(&doc);
    tr_jsonl_close(&r);
    tr_tokenizer_free(tok);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (!status) tr_errf(&err, TR_EIO, "writing standard output failed");
        status = 1;
    }
    return status ? tr_cli_fail("tokenize", &err) : 0;
}
