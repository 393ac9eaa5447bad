#!/usr/bin/env python3
# Makes the tokenizer fixtures under tests/fixtures/tokenizer/: small byte-level BPE
# tokenizers trained with Hugging Face tokenizers and configured like Qwen2's and Llama 3's
# tokenizer.json (plus GPT-2 style and Split-behaviour variants), test texts, and the ids and
# decoded texts that HF tokenizers produces for them.
#
# usage: python3 tools/make_tokenizer_fixtures.py OUTDIR   (needs the `tokenizers` package)
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, trainers

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Character pools for generated text: well-established code points only, so that every
# Unicode database involved (Rust, Oniguruma, PCRE2, utf8proc) agrees on their properties.
WORDS_EN = ("the of and to in is was for that with as on by at from his her it be this are "
            "which or had not but have an they you one all were we there been their has would "
            "when who will more no if out so said what up its about than into them can only "
            "other new some could time these two may then do first any my now such like our "
            "over man me even most made after also did many before must through back years "
            "where much your way well down should because each just those people how too little "
            "state good very make world still own see men work long get here between both life "
            "being under never day same another know while last might us great old year off "
            "come since against go came right used take three tokenizer merges vocabulary "
            "training reinforcement gradient").split()
WORDS_DE = "über schön Straße Mädchen groß Größe Fußball Bäume Öl Ärger müssen".split()
WORDS_FR = "été déjà où très garçon français naïve cœur Noël élève fenêtre".split()
WORDS_RU = "привет мир это тест русский язык модель данные обучение".split()
WORDS_EL = "γειά σου κόσμε αλφάβητο ελληνικά μοντέλο".split()
WORDS_ZH = "你好 世界 中文 文本 测试 模型 训练 数据 强化 学习 语言 我们 今天".split()
WORDS_JA = "日本語 テキスト です ひらがな カタカナ 東京 こんにちは ありがとう".split()
WORDS_KO = "한국어 텍스트 안녕하세요 세계 모델 학습".split()
WORDS_AR = "مرحبا بالعالم اللغة العربية نموذج".split()
WORDS_HI = "नमस्ते दुनिया हिंदी भाषा मॉडल".split()
EMOJI = ["👋", "😀", "🎉", "🚀", "❤️", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "1️⃣", "🤖", "✨"]
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if x == 10:\n        print(\"ten\")\n",
    "{\"key\": [1, 2, 3], \"ok\": true}",
    "<div class=\"a\">Hello</div>",
    "SELECT * FROM users WHERE id = 42;",
    "    // comment\n    x += 1;\r\n",
]
PUNCT = [".", ",", "!", "?", ";", ":", "...", " -", " (", ")", "\"", "'", " —", "«", "»"]
RAND_CHARS = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
              "  \t\n\r.,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"
              "éÉàçñøßÆœ" "αβγΩ" "абвЖЯ" "你好世界中" "あア" "한글" "مرح" "नम"
              "\u0301\u0308\u0323\u0327\u030a" "\u00a0\u2003\u3000\u200b\u200d\u2028"
              "٣١" "１２" "²½" "€£¥" "😀👍🏽" "\ufe0f" "ſK")


def gen_corpus(rng, n_lines):
    pools = [WORDS_EN] * 6 + [WORDS_DE, WORDS_FR, WORDS_RU, WORDS_EL, WORDS_ZH, WORDS_JA,
                              WORDS_KO, WORDS_AR, WORDS_HI]
    lines = []
    for _ in range(n_lines):
        r = rng.random()
        if r < 0.12:
            lines.append(rng.choice(CODE))
            continue
        pool = rng.choice(pools)
        parts = []
        for _ in range(rng.randint(3, 20)):
            w = rng.choice(pool)
            if rng.random() < 0.1:
                w = w.capitalize()
            if rng.random() < 0.05:
                w = w.upper()
            parts.append(w)
            x = rng.random()
            if x < 0.08:
                parts.append(rng.choice(PUNCT))
            elif x < 0.12:
                parts.append(str(rng.randint(0, 100000)))
            elif x < 0.14:
                parts.append(rng.choice(EMOJI))
            elif x < 0.16:
                parts.append(rng.choice(["'s", "'ll", "'re", "n't", "'ve", "'d", "'m"]))
        sep = "" if pool in (WORDS_ZH, WORDS_JA) else " "
        lines.append(sep.join(parts) + rng.choice(["\n", "\n", " ", "\r\n", "\n\n"]))
    return lines


def fixed_texts():
    t = [
        "", " ", "  ", "\t", "\n", "\r\n", "hello", "Hello world", " leading space",
        "trailing space ", "multiple   spaces   here", "tabs\tand\t\ttabs",
        "line1\nline2\r\nline3\rline4", "\n\n\n", "  \n  \n", "a \n b", "end\n",
        "mixed \t\n whitespace", "   indented\n      more\n\tand tab",
        # digits
        "12345678901234567890", "3.14159", "1,000,000", "x = 42; y = 007", "2024-01-31T12:00:00Z",
        "٣٤٥ Arabic-Indic digits", "full width １２３ digits", "superscript x² and ½",
        # contractions and case-insensitive suffixes
        "it's", "IT'S", "we'll", "WE'LL", "We'Ll", "I'm", "you're", "they've", "she'd", "don't",
        "'s", "'S", "'LL and 'Ll", "O'Neil's car", "rock'n'roll", "the 'ſ long s", "'K kelvin",
        # code
        "def f(x):\n    return x * 2\n", "int main(void) {\n\treturn 0;\n}\n",
        "if (a && b || !c) { x->y = z[0]; }", "{\"a\": [1, 2.5e-3, null], \"b\": \"c\"}",
        "<a href=\"https://example.com/x?y=1&z=2\">link</a>", "user@example.org",
        "    # comment\r\n    pass\r\n", "s/\\s+$//g", "``` python\nprint('hi')\n```",
        # CJK, other scripts
        "你好，世界！", "日本語のテキストです。", "한국어 텍스트입니다", "Hello世界123abc",
        "Ελληνικά κείμενο", "Русский текст, ещё.", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
        "ภาษาไทย", "Tiếng Việt có dấu",
        # emoji
        "👋", "👨‍👩‍👧‍👦 family", "🏳️‍🌈 flag", "👍🏽👍🏿", "❤️", "🇫🇷🇩🇪🇯🇵", "1️⃣ keycap", "a😀b",
        "👩🏽‍💻 coder",
        # combining marks: NFC-composable and not
        "e\u0301", "cafe\u0301", "A\u030Angstrom", "\u212Bngstrom sign", "\u1E0B\u0323",
        "q\u0307\u0323", "x\u0301\u0302", "\u1100\u1161\u11A8 jamo", "\uF900 compat",
        "\u0958 qa", "Tie\u0302\u0301ng Vie\u0323\u0302t", "n\u0303 vs ñ", "\u0301 leading mark",
        "a\u0308\u0301\u0323\u0302 stack",
        # spaces of many kinds
        "\u00a0", "a\u00a0b", "nbsp \u00a0 run", "\u2003em space", "\u3000ideographic",
        "zero\u200bwidth", "\u0085NEL", "a\u180eb", "\u2028\u2029", "narrow\u202fnbsp",
        "\ufeffBOM", "   \u00a0  x", "x \u2003\u2003 y",
        # control characters
        "\x00nul", "\x01\x07\x1b[31mred\x1b[0m", "del\x7f", "\x0b\x0c vt ff", "a\x01\x02\x03b\x04",
        "\x05", "\x01 \x02x\x03\x03",
        # punctuation runs
        "!!!???...", "...\n\n", "---> <=>", "a.b.c", ":: ;;", "<<EOF", "“quotes” ‘single’",
        "\u00ab guillemets \u00bb", "...\r\n\r\n", " ?!\n",
        # special tokens inside text
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<|endoftext|><|endoftext|>", "text<|endoftext|>text", "<|im_start|", "<|im_", "<|end",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "a<|eot_id|>b<|reserved_special_token_3|>c", "<|reserved_special_token_10|>",
        "<tool_call>{\"name\": \"f\"}</tool_call>", "x <tool_call> y",
        "  <mask>  x", "a<mask>b", "<mask>\t\n", "\u3000<mask>\u3000",
        "\u0085<mask>\u0085", "x\u180e<mask>\u180ey", "\u2029<mask>\u00a0z", "[[w]]", "a[[w]]b", " [[w]] ", "x[[w]]", "[[w]]_", "é[[w]]", "[[w]]\u0301", "-[[w]]-",
        "Ångström", "A\u030Ang", "xÅngy", "<|im_start|>A\u030Ang",
        "ĠTroupe", " Troupe", "Troupe troupe TROUPE",
        # character classes
        "Ⓐⓑ ² ½ x\u200cy \u0663 deadbeef 0xCAFE ab12 zz", "e\u0301\u0302-mark \u0903x",
        "a\u180eb\u0085c\u00a0d\u2007e\u200bf", "_under_score_ \u203fconn",
        # long words
        "a" * 1000, "supercalifragilistic" * 40, "ab" * 300, "1" * 200, " " * 300,
        "\n" * 100, "你好" * 80, "😀" * 40, "x" + "\u0301" * 60, "-" * 200,
        " \t" * 60 + "end",
    ]
    return t


def random_texts(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(1, 60)
        out.append("".join(rng.choice(RAND_CHARS) for _ in range(k)))
    corpus = gen_corpus(rng, n)
    for i in range(n):
        out.append(corpus[i] + corpus[(i + 7) % n])
    return out


def train(corpus, vocab_size, normalizer, pre_tok, specials):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tok
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=specials,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train_from_iterator(corpus, trainer=tr)
    return tok


def edit_json(tok, fn):
    j = json.loads(tok.to_str())
    fn(j)
    return j


def merges_as_strings(j):
    j["model"]["merges"] = [m if isinstance(m, str) else m[0] + " " + m[1]
                            for m in j["model"]["merges"]]


def merges_as_pairs(j):
    j["model"]["merges"] = [m.split(" ") if isinstance(m, str) else m
                            for m in j["model"]["merges"]]


def main():
    if len(sys.argv) != 2:
        print("usage: make_tokenizer_fixtures.py OUTDIR", file=sys.stderr)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    corpus = gen_corpus(rng, 6000)
    texts = fixed_texts() + random_texts(rng, 30)
    tokenizers = {}

    # Qwen2-like: NFC, Split(Qwen2 regex) + ByteLevel(use_regex=false), merges as strings.
    q = train(corpus, 3000, normalizers.NFC(),
              pre_tokenizers.Sequence([
                  pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                           use_regex=False)]),
              ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    q.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                  AddedToken("</tool_call>", special=False, normalized=False),
                  AddedToken("A\u030Ang", special=False, normalized=True),
                  AddedToken("[[w]]", special=False, normalized=False, single_word=True)])
    q.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True)])
    tokenizers["qwen2"] = edit_json(q, merges_as_strings)

    # Llama-3-like: no normalizer, Split(Llama-3 regex) + ByteLevel, ignore_merges, merges as
    # [a, b] pairs, plus vocab entries that no merge reaches (only ignore_merges finds them).
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"] + \
               ["<|reserved_special_token_%d|>" % i for i in range(12)]
    l3 = train(corpus, 3000, None,
               pre_tokenizers.Sequence([
                   pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
                   pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True,
                                            use_regex=False)]),
               specials)

    def llama_edit(j):
        merges_as_pairs(j)
        j["model"]["ignore_merges"] = True
        vocab = j["model"]["vocab"]
        next_id = max(max(vocab.values()), max(t["id"] for t in j["added_tokens"])) + 1
        for w in ["ĠTroupe", "Troupe", "TROUPE", "ĠĠĠĠĠĠĠĠ", "ĠsupercalifragilisticĠ"]:
            if w not in vocab:
                vocab[w] = next_id
                next_id += 1
    tokenizers["llama3"] = edit_json(l3, llama_edit)

    # Small tokenizers for the other configurations: GPT-2 style ByteLevel with its own regex
    # and prefix space, and each Split behaviour.
    small = train(corpus[:2000], 450, None,
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                  ["<|endoftext|>"])
    small_json = json.loads(small.to_str())

    def variant(normalizer, pre_tok, strings=False):
        j = json.loads(json.dumps(small_json))
        j["normalizer"] = normalizer
        j["pre_tokenizer"] = pre_tok
        if strings:
            merges_as_strings(j)
        return j

    def bl(prefix=False, regex=False):
        return {"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": True,
                "use_regex": regex}

    def split(pattern, behavior, invert=False, string=False):
        return {"type": "Split", "pattern": {"String" if string else "Regex": pattern},
                "behavior": behavior, "invert": invert}

    def seq(*steps):
        return {"type": "Sequence", "pretokenizers": list(steps)}

    tokenizers["gpt2"] = variant({"type": "Sequence", "normalizers": [{"type": "NFKC"}]},
                                 bl(prefix=True, regex=True), strings=True)
    tokenizers["split_removed"] = variant(None, seq(split(r"\s+", "Removed"), bl()))
    tokenizers["split_prev"] = variant({"type": "NFD"},
                                       seq(split(r"[.,!?;:]+", "MergedWithPrevious"), bl()))
    tokenizers["split_next"] = variant(None, seq(split(" ", "MergedWithNext", string=True),
                                                 bl(prefix=True)))
    tokenizers["split_contiguous"] = variant(None, seq(split(r"\p{N}", "Contiguous"),
                                                       bl(regex=True)))
    tokenizers["split_invert"] = variant(None, seq(split(r"\p{L}+", "Removed", invert=True),
                                                   bl()))
    tokenizers["split_empty"] = variant(None, seq(split(r"\b|x*", "Isolated"), bl()))
    # Oniguruma's classes where PCRE2's differ: \h is a hex digit, \w takes marks and all
    # numbers, \s is White_Space; Removed makes any difference show in the ids.
    tokenizers["onig_classes"] = variant(None, seq(split(r"\h{2,}", "Removed"),
                                                   split(r"\w+", "Removed"),
                                                   split(r"\s", "Isolated"), bl()))

    # Byte tokens 0x00..0x08 taken out of the vocabulary (and the merges that use them): those
    # bytes become unk_token, or vanish when there is none.
    def without_low_bytes(unk, fuse):
        j = variant(None, bl(regex=True))
        gone = {chr(0x100 + b) for b in range(9)}
        vocab = j["model"]["vocab"]
        for t in list(vocab):
            if any(ch in gone for ch in t):
                del vocab[t]
        j["model"]["merges"] = [m for m in j["model"]["merges"]
                                if not any(ch in gone for ch in m[0] + m[1])]
        j["model"]["unk_token"] = unk
        j["model"]["fuse_unk"] = fuse
        return j

    tokenizers["unk"] = without_low_bytes("<|endoftext|>", False)
    tokenizers["unk_fused"] = without_low_bytes("<|endoftext|>", True)
    tokenizers["no_unk"] = without_low_bytes(None, False)

    names = sorted(tokenizers)
    for name in names:
        path = os.path.join(out, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(tokenizers[name], f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")

    with open(os.path.join(out, "texts.jsonl"), "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}, ensure_ascii=False, separators=(",", ":")) + "\n")

    drng = random.Random(99)
    for name in names:
        tok = Tokenizer.from_file(os.path.join(out, name + ".json"))
        # Ids that name a token (HF drops the others when decoding; troupe refuses them).
        valid = [i for i in range(tok.get_vocab_size(with_added_tokens=True) + 64)
                 if tok.id_to_token(i) is not None]
        id_lines, dec_lines = [], []
        for i, t in enumerate(texts):
            ids = tok.encode(t, add_special_tokens=False).ids
            id_lines.append(json.dumps({"ids": ids}, separators=(",", ":")))
            back = tok.decode(ids, skip_special_tokens=False)
            if back != t:
                dec_lines.append({"line": i, "text": back})
        # Random id sequences: single bytes of multi-byte characters make invalid UTF-8,
        # which HF decodes lossily.
        for _ in range(40):
            ids = [drng.choice(valid) for _ in range(drng.randint(0, 12))]
            dec_lines.append({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)})
        with open(os.path.join(out, name + ".ids.jsonl"), "w", encoding="utf-8") as f:
            f.write("\n".join(id_lines) + "\n")
        with open(os.path.join(out, name + ".decode.jsonl"), "w", encoding="utf-8") as f:
            for d in dec_lines:
                f.write(json.dumps(d, ensure_ascii=False, separators=(",", ":")) + "\n")

    # Decode-only fixture: no decoder, so HF joins the token strings with spaces.
    nd = variant(None, bl(regex=True))
    nd["decoder"] = None
    with open(os.path.join(out, "no_decoder.json"), "w", encoding="utf-8") as f:
        json.dump(nd, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    tok = Tokenizer.from_file(os.path.join(out, "no_decoder.json"))
    nrng = random.Random(5)
    with open(os.path.join(out, "no_decoder.decode.jsonl"), "w", encoding="utf-8") as f:
        for t in texts[:40]:
            ids = tok.encode(t, add_special_tokens=False).ids
            f.write(json.dumps({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
        for _ in range(20):
            ids = [nrng.randrange(tok.get_vocab_size()) for _ in range(nrng.randint(0, 8))]
            f.write(json.dumps({"ids": ids, "text": tok.decode(ids, skip_special_tokens=False)},
                               ensure_ascii=False, separators=(",", ":")) + "\n")
    print("wrote %d tokenizers and %d texts to %s" % (len(names) + 1, len(texts), out))


if __name__ == "__main__":
    main()
