#!/usr/bin/env python3
# Makes tests/fixtures/unicode/: the expected ids of HF tokenizers for every code point
# (U+0000..U+10FFFF but surrogates), alone and in contexts, under tokenizers configured as
# Llama 3.2's and Qwen3's released tokenizer.json (their Split regexes, ByteLevel settings and
# normalizers; the real files cannot be downloaded here). tests/data/test_unicode.c checks
# troupe against it.
#
# The vocabulary is trained by HF tokenizers on the test contexts, then extended with merges
# ranked first that join the bytes on either side of every place the contexts can split: a
# piece boundary that troupe draws where HF does not (or the reverse) then changes the ids,
# and so does any normalization difference, since ids decode to the normalized bytes.
#
# For each tokenizer and context, the texts of the code points of a block of 4096 are joined
# with a special token (special tokens cut the text first, so each code point is encoded on
# its own) and the CRC-32 of the ids is stored per block. A few code points whose
# properties differ between Unicode versions also keep their full ids, for readable failures.
#
# usage: python3 tools/make_unicode_fixtures.py OUTDIR   (needs tokenizers==0.23.3)
import array
import json
import os
import random
import sys
import zlib

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

QWEN3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA32_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

DEEPSEEK_PATTERNS = [
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
]
# Unicode classes next to a non-ASCII literal: troupe runs this one on the text itself.
MIXED_PATTERN = "[\u4e00-\u9fa5]+|\\p{Lu}+|\\p{Ll}+|\\p{M}+|\\d+|\\s+|\\W"

BLOCK = 4096
# A context is a list of parts; the text is the parts joined by the code point. Under the
# Llama 3.2 regex, " c", "c's" and "acl" tell letters, numbers, spaces and the rest apart;
# the Qwen3 contexts add NFC around the code point: after a letter, between combining marks
# (composition, reordering, blocking) and between Hangul jamo (L + V, LV + T). The last two
# tokenizers cover code paths rather than released configurations, on the first planes only.
CONTEXTS = {
    "llama32": [[" ", ""], ["", "'s"], ["a", "1"]],
    "qwen3": [["a", "1"], ["a\u0301", "\u0301"], ["\u1100", "\u11a8"]],
    # Letters and marks against punctuation and symbols (DeepSeek-V3-style Splits).
    "deepseek3": [["a", " ", ""]],
    # Each class of MIXED_PATTERN, then NFKC with a combining mark after the code point.
    "mixed": [["a", "A", "1", " ", "\u0301"]],
}
END = {"llama32": 0x110000, "qwen3": 0x110000, "deepseek3": 0x20000, "mixed": 0x10000}

# Code points whose class or normal form differs between the Unicode versions HF uses and
# those of common PCRE2 and utf8proc builds (14.0, 15.x, 17.0, 18.0), plus composition and
# case-folding corner cases: their ids are stored in full.
SAMPLES = [
    0x0085, 0x00B2, 0x017F, 0x0301, 0x0323, 0x0344, 0x0558, 0x05C8, 0x088F, 0x0897, 0x0958,
    0x0B3E, 0x0C5C, 0x0CCB, 0x0D3B, 0x1161, 0x11A8, 0x180E, 0x1ACF, 0x1C89, 0x1DF6, 0x1E9B,
    0x200C, 0x2028, 0x212A, 0x212B, 0x32FF, 0xA7CB, 0xA7F2, 0xAB69, 0xAC00, 0x105C0, 0x105C9,
    0x10940, 0x10D40, 0x10D4A, 0x10D69, 0x116D0, 0x11938, 0x11BF0, 0x11DE0, 0x1246F, 0x13460,
    0x16100, 0x16130, 0x16D40, 0x16D70, 0x1CCF0, 0x1D250, 0x1E5D0, 0x1E6C0, 0x1F16C, 0x2B73A,
    0x2EBF0, 0x323B0,
]


def code_points():
    return [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def byte_char():
    # GPT-2's byte -> printable character table, as ByteLevel writes vocabularies.
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def boundary_merges(contexts):
    # Bytes that can meet across a split: the last byte of a part with any first byte of a
    # code point after it, any last byte of a code point with the first byte of the next part.
    bc = byte_char()
    firsts = list(range(0x80)) + list(range(0xC2, 0xF5))
    lasts = list(range(0xC0))
    pairs = []
    for parts in contexts:
        for k, part in enumerate(parts):
            if part and k + 1 < len(parts):
                pairs += [(part.encode()[-1], f) for f in firsts]
            if part and k > 0:
                pairs += [(t, part.encode()[0]) for t in lasts]
    seen, out = set(), []
    for a, b in pairs:
        if (a, b) not in seen:
            seen.add((a, b))
            out.append((bc[a], bc[b]))
    return out


def training_corpus(contexts, rng):
    sample = rng.sample(code_points(), 60000) + list(range(0x20, 0x3000))
    return [chr(c).join(parts) for c in sample for parts in contexts]


def split(pattern):
    return pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)


def make_tokenizer(kind, merges_first, corpus):
    # Settings of the released tokenizer.json files (Llama 3.2, Qwen3) where kind names one.
    norm, ignore_merges = None, False
    if kind == "qwen3":
        norm = normalizers.NFC()
        steps = [split(QWEN3_PATTERN), pre_tokenizers.ByteLevel(
            add_prefix_space=False, trim_offsets=False, use_regex=False)]
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    elif kind == "llama32":
        ignore_merges = True
        steps = [split(LLAMA32_PATTERN), pre_tokenizers.ByteLevel(
            add_prefix_space=False, trim_offsets=True, use_regex=False)]
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    elif kind == "deepseek3":
        steps = [split(p) for p in DEEPSEEK_PATTERNS] + [pre_tokenizers.ByteLevel(
            add_prefix_space=False, trim_offsets=True, use_regex=False)]
        specials = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    else:
        norm = normalizers.Sequence([normalizers.NFKC()])
        steps = [split(MIXED_PATTERN), pre_tokenizers.ByteLevel(
            add_prefix_space=True, trim_offsets=True, use_regex=True)]
        specials = ["<|endoftext|>"]
    tok = Tokenizer(models.BPE())
    if norm is not None:
        tok.normalizer = norm
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tr = trainers.BpeTrainer(vocab_size=600, min_frequency=2, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=tr)
    j = json.loads(tok.to_str())
    vocab, merges = j["model"]["vocab"], j["model"]["merges"]
    merges = [m.split(" ") if isinstance(m, str) else m for m in merges]
    next_id = max(vocab.values()) + 1
    first = []
    for a, b in merges_first:
        if a + b not in vocab:
            vocab[a + b] = next_id
            next_id += 1
        first.append([a, b])
    taken = {tuple(m) for m in first}
    j["model"]["merges"] = first + [m for m in merges if tuple(m) not in taken]
    j["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.decoder = decoders.ByteLevel()
    if kind == "llama32":
        tok.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok, specials[-1]


def ids_crc(ids):
    # CRC-32 of the ids as little-endian uint32 (what test_unicode.c computes).
    return zlib.crc32(array.array("I", ids).tobytes()) if sys.byteorder == "little" else \
        zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids))


def block_texts(parts, sep, end):
    out = []
    for start in range(0, end, BLOCK):
        out.append("".join(chr(c).join(parts) + sep for c in range(start, start + BLOCK)
                           if not 0xD800 <= c <= 0xDFFF))
    return out


def main():
    if len(sys.argv) != 2:
        print("usage: make_unicode_fixtures.py OUTDIR", file=sys.stderr)
        sys.exit(2)
    import tokenizers
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(2024)
    meta = {"hf_tokenizers": tokenizers.__version__, "block": BLOCK, "tokenizers": []}
    for kind, contexts in CONTEXTS.items():
        tok, sep = make_tokenizer(kind, boundary_merges(contexts),
                                  training_corpus(contexts, rng))
        path = os.path.join(out, kind + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(json.loads(tok.to_str()), f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        tok = Tokenizer.from_file(path)
        entry = {"name": kind, "file": kind + ".json", "separator": sep, "contexts": []}
        for parts in contexts:
            texts = block_texts(parts, sep, END[kind])
            hashes = []
            for k in range(0, len(texts), 16):
                for e in tok.encode_batch(texts[k:k + 16], add_special_tokens=False):
                    hashes.append("%08x" % ids_crc(e.ids))
            samples = {"%X" % c: tok.encode(chr(c).join(parts), add_special_tokens=False).ids
                       for c in SAMPLES}
            entry["contexts"].append({"parts": parts, "end": END[kind], "hashes": "".join(hashes),
                                      "samples": samples})
            print("%s %r done" % (kind, parts), file=sys.stderr)
        meta["tokenizers"].append(entry)
    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
