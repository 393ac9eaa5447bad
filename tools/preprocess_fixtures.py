#!/usr/bin/env python3
"""Reference ids for the `troupe preprocess` end-to-end test:
python3 tools/preprocess_fixtures.py OUTDIR

Writes OUTDIR/docs.jsonl (documents with the quirks preprocessing must handle: empty text,
blank lines, CRLF, extra fields, Unicode, special-token text) and OUTDIR/docs.qwen2.ids.jsonl:
for every record, {"ids": HF tokenizers' encode(text, add_special_tokens=False).ids}
with <|endoftext|> appended to non-empty documents, as Megatron's preprocess_data.py does
with --append-eod, on tests/fixtures/chat/qwen2_tokenizer.json.
"""
import json
import os
import sys

from tokenizers import Tokenizer

TEXTS = [
    "Hello world",
    "",
    "The quick brown fox jumps over the lazy dog. " * 20,
    "ünïcödé ✓ 漢字 and emoji 🎉",
    "numbers 1234567890 and 3.14159",
    "special text <|endoftext|> inside a document",
    "  leading and trailing spaces  ",
    "line one\nline two\r\nline three",
    "tabs\tand\t\ttabs",
    "x",
] + [f"document number {i}: " + "word " * (i % 17) for i in range(40)]


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(root, "tests/fixtures/chat/qwen2_tokenizer.json"))
    eod = tok.token_to_id("<|endoftext|>")
    with open(os.path.join(out, "docs.jsonl"), "w", newline="") as f, \
            open(os.path.join(out, "docs.qwen2.ids.jsonl"), "w") as g:
        for i, t in enumerate(TEXTS):
            rec = {"id": i, "text": t} if i % 3 else {"text": t, "meta": {"src": "fixture"}}
            f.write(json.dumps(rec, ensure_ascii=(i % 2 == 0)) + ("\r\n" if i % 5 == 1 else "\n"))
            if i % 7 == 3:
                f.write("\n")  # blank lines are skipped
            ids = tok.encode(t, add_special_tokens=False).ids
            g.write(json.dumps({"ids": ids + [eod] if ids else []}) + "\n")
    print(f"wrote {len(TEXTS)} documents to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
