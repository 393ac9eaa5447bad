#!/usr/bin/env python3
# Fixture for `troupe generate` end to end: a tiny random-weight Qwen2 causal LM whose
# vocabulary is the Qwen2-style test tokenizer's (tests/fixtures/tokenizer/qwen2.json), saved
# as a Hugging Face directory with that tokenizer.json, and what transformers' greedy
# generate(do_sample=False) produces for JSONL prompts given as ids, as text and as chatml
# messages. Usage: python3 tools/make_generate_fixtures.py OUTDIR
#
# OUTDIR/chat_qwen2/: config.json, generation_config.json, model.safetensors, tokenizer.json,
#   prompts.jsonl   the `troupe generate` input (input_ids, prompt or messages lines);
#   expected.jsonl  per line: output_ids (the stop token included when one ended it),
#                   logprobs (log_softmax of the raw logits at each step), finish_reason,
#                   text (decode of output_ids without a final stop token, special tokens kept).
# Chat lines are rendered as data/chat.h documents chatml (no default system prompt) and stop
# at <|im_end|> or <|endoftext|>; every line stops at config eos (<|endoftext|>).
import json
import math
import os
import shutil
import sys

import torch
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

MAX_NEW = 12
ENDOFTEXT, IM_START, IM_END = 0, 1, 2


def chatml(messages):
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def greedy(model, ids, stops):
    x = torch.tensor([ids])
    out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                         max_new_tokens=MAX_NEW, eos_token_id=stops, pad_token_id=ENDOFTEXT,
                         output_logits=True, return_dict_in_generate=True)
    new = out.sequences[0, len(ids):].tolist()
    lps = [float(torch.log_softmax(lg[0].double(), -1)[t]) for lg, t in zip(out.logits, new)]
    stopped = new[-1] in stops
    return new, lps, stopped


def main():
    if len(sys.argv) != 2:
        print("usage: make_generate_fixtures.py OUTDIR", file=sys.stderr)
        sys.exit(2)
    here = os.path.dirname(os.path.abspath(__file__))
    tok_path = os.path.join(here, "..", "tests", "fixtures", "tokenizer", "qwen2.json")
    tok = Tokenizer.from_file(tok_path)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    d = os.path.join(sys.argv[1], "chat_qwen2")
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(5)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(5)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=ENDOFTEXT,
                      pad_token_id=None)
    model = Qwen2ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
                # Larger stop-token rows make stops likely enough that some lines end on one.
                p[[ENDOFTEXT, IM_END]] *= 2.0
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(p.shape[1])))
    model.save_pretrained(d, safe_serialization=True)
    shutil.copyfile(tok_path, os.path.join(d, "tokenizer.json"))

    lines = [
        {"input_ids": [5, 17, 42, 99, 250]},
        {"prompt": "Hello world, this is a test of generation."},
        {"messages": [{"role": "user", "content": "What is two plus two?"}]},
        {"messages": [{"role": "system", "content": "Answer briefly."},
                      {"role": "user", "content": "Name a colour."}]},
        {"input_ids": [7]},
        {"prompt": "The quick brown fox"},
    ]
    # More id prompts until one line stops early and one runs to the length limit.
    rng = torch.Generator().manual_seed(9)
    results = []
    for line in lines:
        if "input_ids" in line:
            ids, stops = line["input_ids"], [ENDOFTEXT]
        elif "prompt" in line:
            ids, stops = tok.encode(line["prompt"], add_special_tokens=False).ids, [ENDOFTEXT]
        else:
            ids = tok.encode(chatml(line["messages"]), add_special_tokens=False).ids
            stops = [IM_END, ENDOFTEXT]
        results.append(greedy(model, ids, stops))
    for _ in range(200):
        if any(r[2] for r in results) and not all(r[2] for r in results):
            break
        ids = torch.randint(3, vocab, (6,), generator=rng).tolist()
        r = greedy(model, ids, [ENDOFTEXT])
        if r[2] and len(r[0]) >= 2:
            lines.append({"input_ids": ids})
            results.append(r)
    with open(os.path.join(d, "prompts.jsonl"), "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    with open(os.path.join(d, "expected.jsonl"), "w") as f:
        for i, (new, lps, stopped) in enumerate(results):
            body = new[:-1] if stopped else new
            f.write(json.dumps({"index": i, "sample": 0, "output_ids": new, "logprobs": lps,
                                "finish_reason": "stop" if stopped else "length",
                                "text": tok.decode(body, skip_special_tokens=False)}) + "\n")
    print(d, len(lines), "prompts,", sum(r[2] for r in results), "stopped")


if __name__ == "__main__":
    main()
