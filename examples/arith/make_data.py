#!/usr/bin/env python3
# Generates the quickstart's synthetic verifiable task: small-integer addition and
# subtraction ("37+25" -> "62"), as RL prompt sets (with the true answers), SFT conversations,
# and under init/ the config.json of a tiny Llama to train from scratch beside a byte-level
# BPE tokenizer.json with chatml special tokens. Deterministic in --seed.
#
# The SFT answers come from a careless teacher: when a difference is negative it mostly
# forgets the minus sign ("7-12" -> "5"), as students do. A model imitating it answers in the
# right format, gets the digits right as often as it can, and mostly drops the sign; the
# verifier's reward in GRPO (configs/quickstart.yaml) is what teaches it the sign, while it
# also sharpens the digits.
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
    ap.add_argument("--eval", type=int, default=400, help="held-out problems")
    ap.add_argument("--careless", type=float, default=0.7,
                    help="share of negative differences whose sign the SFT teacher drops")
    ap.add_argument("--sft-eval", type=int, default=100)
    ap.add_argument("--no-tokenizer", action="store_true")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=384)
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
    # SFT: the training problems answered by the careless teacher; its eval split is cut from
    # them (the RL eval set stays unseen by both stages).
    def teacher(p):
        if p[3] < 0 and rng.random() < args.careless:
            return str(-p[3])
        return str(p[3])
    sft = [chat(q(p), teacher(p)) for p in rest]
    write_jsonl(os.path.join(args.outdir, "sft.jsonl"), sft[args.sft_eval:])
    write_jsonl(os.path.join(args.outdir, "sft-eval.jsonl"), sft[:args.sft_eval])

    if not args.no_tokenizer:
        # Only the text between special tokens: chatml's role lines and the problems.
        corpus = ["system\n", "user\n", "assistant\n"] * 4
        for p in probs:
            corpus += [q(p), str(p[3])]
        init = os.path.join(args.outdir, "init")
        os.makedirs(init, exist_ok=True)
        tok = make_tokenizer(os.path.join(init, "tokenizer.json"), corpus)
        ids = {t: tok.token_to_id(t) for t in SPECIALS}
        config = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": tok.get_vocab_size(),
            "hidden_size": args.hidden,
            "intermediate_size": args.intermediate,
            "num_hidden_layers": args.layers,
            "num_attention_heads": args.heads,
            "num_key_value_heads": args.heads,
            "max_position_embeddings": 64,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "initializer_range": 0.02,
            "bos_token_id": None,
            "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
            "pad_token_id": ids["<|endoftext|>"],
            "torch_dtype": "float32",
        }
        with open(os.path.join(init, "config.json.tmp"), "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
        os.replace(os.path.join(init, "config.json.tmp"), os.path.join(init, "config.json"))


if __name__ == "__main__":
    main()
