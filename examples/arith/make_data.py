#!/usr/bin/env python3
# Generates the quickstart's synthetic verifiable task: small-integer addition and
# subtraction ("37+25" -> "62"), as RL prompt sets, SFT conversations, a model config and a
# tiny byte-level BPE tokenizer with chatml special tokens. Deterministic in --seed.
#   /opt/refenv/bin/python examples/arith/make_data.py [OUTDIR]   (default: examples/arith)
# Needs the `tokenizers` package (HF) only for tokenizer.json; --no-tokenizer skips it.
import argparse
import json
import os
import random

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2's pre-tokenizer: every digit is its own piece, so numbers are spelled digit by digit
# and the model can learn carrying instead of memorising multi-digit tokens.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def problems(max_operand):
    out = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            out.append((a, "+", b, a + b))
            out.append((a, "-", b, a - b))
    return out


def write_jsonl(path, rows):
    with open(path + ".tmp", "w") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(", ", ": ")) + "\n")
    os.replace(path + ".tmp", path)


def chat(q, ans):
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]}


def make_tokenizer(path, corpus):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, normalizers, Regex
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(path + ".tmp")
    os.replace(path + ".tmp", path)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-operand", type=int, default=49)
    ap.add_argument("--eval", type=int, default=200, help="held-out problems")
    ap.add_argument("--sft-eval", type=int, default=100)
    ap.add_argument("--no-tokenizer", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    rng = random.Random(args.seed)

    probs = problems(args.max_operand)
    rng.shuffle(probs)
    held = probs[:args.eval]
    rest = probs[args.eval:]
    q = lambda p: "%d%s%d" % (p[0], p[1], p[2])

    # RL prompts: the answer travels to the reward as meta.
    write_jsonl(os.path.join(args.outdir, "train.jsonl"),
                [{"prompt": q(p), "answer": str(p[3])} for p in rest])
    write_jsonl(os.path.join(args.outdir, "eval.jsonl"),
                [{"prompt": q(p), "answer": str(p[3])} for p in held])
    # SFT: the same training problems with worked answers; its eval split is cut from them
    # (the RL eval set stays unseen by both stages).
    write_jsonl(os.path.join(args.outdir, "sft.jsonl"),
                [chat(q(p), str(p[3])) for p in rest[args.sft_eval:]])
    write_jsonl(os.path.join(args.outdir, "sft-eval.jsonl"),
                [chat(q(p), str(p[3])) for p in rest[:args.sft_eval]])

    if not args.no_tokenizer:
        # Only the text between special tokens: chatml's role lines and the problems.
        corpus = ["system\n", "user\n", "assistant\n"] * 4
        for p in probs:
            corpus += [q(p), str(p[3])]
        make_tokenizer(os.path.join(args.outdir, "tokenizer.json"), corpus)


if __name__ == "__main__":
    main()
