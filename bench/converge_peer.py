#!/usr/bin/env python3
"""The torch side of the convergence check (issue 13, item 7): transformers' Qwen2ForCausalLM
trained on a flat int32 token file, printing one JSON line per step. bench/converge_gpu.c is
troupe's side, on the same windows with the same optimizer; bench/run_converge_gpu.sh runs both.

    python3 bench/converge_peer.py --tokens tokens.i32 --tokenizer tokenizer.json --seed 0 \
        [--save-init DIR] [--shape 0.5b|tiny] [--steps 200] [--device cuda|cpu]

Model: the Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 24 layers, 14 heads, 2 KV heads,
rope_theta 1e6, rms_norm_eps 1e-6, tied embeddings) with the tokenizer's vocabulary (or
--vocab), SDPA attention, fp32 weights under bf16 autocast (--precision fp32: no autocast).
torch.manual_seed(seed) comes right before the model is built on the CPU, so the seed picks the
initialisation and nothing else; --save-init writes that initialisation as an HF checkpoint
(config.json + model.safetensors, fp32) before the first step, for troupe to load.

Data (both sides compute it so): row r of step s (both from 0) is window
k = (s * mb + r) mod (N div seq) of the N tokens, window k being tokens[k*seq, (k+1)*seq).
Labels are the row itself: transformers shifts them, so the loss is the mean over the
mb * (seq - 1) predicted tokens, each row one causal sequence.

Optimizer: AdamW(fused on CUDA), betas (0.9, 0.95), eps 1e-8, weight decay on tensors of two
or more dimensions only (troupe's default: norms and biases do not decay), gradients clipped
to global norm 1.0, learning rate rising linearly from 0 over --warmup steps and then constant
(troupe's TR_LR_CONSTANT with warmup: step s runs at lr * s / warmup while s < warmup).
"""
import argparse
import json
import os
import sys
import time

SHAPES = {
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", required=True, help="flat little-endian int32 token file")
    p.add_argument("--tokenizer", help="tokenizer.json: the model's vocabulary is its size")
    p.add_argument("--vocab", type=int, default=0, help="vocabulary size (overrides --tokenizer)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--mb", type=int, default=8, help="sequences per step")
    p.add_argument("--seq", type=int, default=2048, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--device", default="cuda")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    p.add_argument("--save-init", metavar="DIR", help="write the initial weights here first")
    return p.parse_args()


def lr_at(lr, warmup, step):
    """troupe's constant schedule with warmup (engine/schedule.c), step = updates done."""
    return lr * step / warmup if step < warmup else lr


def load_tokens(path):
    import torch
    if sys.byteorder != "little":
        sys.exit("converge_peer: the token file is little-endian; this host is not")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    if len(raw) % 4:
        sys.exit(f"converge_peer: {path}: {len(raw)} bytes is not a whole number of int32")
    return torch.frombuffer(raw, dtype=torch.int32)


def main():
    a = parse_args()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    vocab = a.vocab
    vocab_from = "--vocab"
    if vocab <= 0:
        if not a.tokenizer:
            sys.exit("converge_peer: give --tokenizer or --vocab")
        from tokenizers import Tokenizer
        vocab = Tokenizer.from_file(a.tokenizer).get_vocab_size()
        vocab_from = a.tokenizer
    if a.steps < 1 or a.mb < 1 or a.seq < 2 or a.warmup < 0:
        sys.exit("converge_peer: need steps >= 1, mb >= 1, seq >= 2, warmup >= 0")

    tokens = load_tokens(a.tokens)
    n_windows = tokens.numel() // a.seq
    if n_windows < 1:
        sys.exit(f"converge_peer: {tokens.numel()} tokens hold no window of {a.seq}")
    used = min(a.steps * a.mb, n_windows) * a.seq
    lo, hi = int(tokens[:used].min()), int(tokens[:used].max())
    if lo < 0 or hi >= vocab:
        sys.exit(f"converge_peer: token ids span [{lo}, {hi}], outside the vocabulary of {vocab}")

    cfg = Qwen2Config(**SHAPES[a.shape], vocab_size=vocab, max_position_embeddings=max(a.seq, 4096),
                      rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      attn_implementation="sdpa")
    # The seed decides the initialisation only: the model is drawn on the CPU (the same
    # weights whatever device trains it) and the data order does not depend on it.
    torch.manual_seed(a.seed)
    model = Qwen2ForCausalLM(cfg)
    # The RoPE base and attention kernel as this transformers version resolved them (both
    # have moved between versions' config keys).
    rot = getattr(model.model, "rotary_emb", None)
    if rot is not None and hasattr(rot, "inv_freq"):
        want = 1e6 ** (-2 / (cfg.hidden_size // cfg.num_attention_heads))
        if abs(float(rot.inv_freq[1]) - want) > 1e-6 * want:
            sys.exit(f"converge_peer: RoPE inv_freq[1] is {float(rot.inv_freq[1])}, "
                     f"not theta 1e6's {want}")
    attn = getattr(model.config, "_attn_implementation", None)
    if a.save_init:
        model.save_pretrained(a.save_init)
    dev = torch.device(a.device)
    model.to(dev)
    model.train()

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr_at(a.lr, a.warmup, 0), betas=(0.9, 0.95), eps=1e-8,
                            fused=dev.type == "cuda")
    n_params = sum(p.numel() for p in model.parameters())
    print(json.dumps({"kind": "config", "side": "torch", "seed": a.seed, "shape": a.shape,
                      "vocab": vocab, "vocab_from": vocab_from, "params": n_params,
                      "tokens": tokens.numel(), "windows": n_windows,
                      "windows_wrap": a.steps * a.mb > n_windows, "mb": a.mb, "seq": a.seq,
                      "lr": a.lr, "warmup": a.warmup, "weight_decay": a.weight_decay,
                      "device": a.device, "precision": a.precision, "attention": attn,
                      "torch": torch.__version__}), flush=True)

    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16")
    t_start = time.perf_counter()
    for step in range(a.steps):
        rows = [(step * a.mb + r) % n_windows for r in range(a.mb)]
        x = torch.stack([tokens[k * a.seq:(k + 1) * a.seq] for k in rows]).long().to(dev)
        lr = lr_at(a.lr, a.warmup, step)
        for g in opt.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        with autocast:
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v, norm_v = loss.item(), norm.item()   # waits for the step
        print(json.dumps({"step": step + 1, "loss": loss_v, "grad_norm": norm_v, "lr": lr,
                          "time_s": round(time.perf_counter() - t0, 4)}), flush=True)
    print(json.dumps({"kind": "done", "side": "torch", "seed": a.seed, "steps": a.steps,
                      "seconds": round(time.perf_counter() - t_start, 2)}), flush=True)


if __name__ == "__main__":
    main()
