#!/usr/bin/env python3
"""Checks that a checkpoint directory written by troupe loads in transformers and computes the
same outputs as a reference checkpoint (e.g. the one it was loaded from).

Usage: python3 tools/check_hf_checkpoint.py SAVED_DIR REFERENCE_DIR [--bf16]
Loads both with the class named in config.json "architectures", in float32, runs the same
token ids through both, and compares every state-dict tensor and the outputs: exactly for an
F32 save; for --bf16, against the reference rounded to bfloat16. When SAVED_DIR holds a value
head (*ForTokenClassification) on REFERENCE_DIR's trunk, the trunks are compared and the
saved model's outputs against score(reference trunk). The settings that shape the model
(sizes, head_dim, biases, QK-norm's presence through the state dict, RoPE, the attention
window where it is shorter than the context) must match too: a few tokens of output would not
show a sliding window or a RoPE scaling that only long inputs reach. Exit status 0 = same.
"""
import json
import os
import sys

import torch
import transformers


def load(d):
    arch = json.load(open(os.path.join(d, "config.json")))["architectures"][0]
    cls = getattr(transformers, arch)
    return cls.from_pretrained(d, dtype=torch.float32).eval()


SHAPE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "rms_norm_eps",
              "attention_bias", "max_position_embeddings", "rope_parameters")


def window(cfg):
    # The window only matters where it is shorter than the context.
    w = getattr(cfg, "sliding_window", None)
    if getattr(cfg, "use_sliding_window", True) is False:
        w = None
    return None if w is None or w >= cfg.max_position_embeddings else w


def head_dim(cfg):
    # Qwen2's config has none when it is hidden / heads; Qwen3's default is 128.
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def config_diffs(a, b):
    out = [k for k in SHAPE_KEYS if getattr(a, k, None) != getattr(b, k, None)]
    if head_dim(a) != head_dim(b):
        out.append("head_dim")
    if window(a) != window(b):
        out.append("sliding_window")
    if [t for t in (getattr(a, "layer_types", None) or []) if t != "full_attention"] != \
            [t for t in (getattr(b, "layer_types", None) or []) if t != "full_attention"]:
        out.append("layer_types")
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    saved, ref = load(sys.argv[1]), load(sys.argv[2])
    bf16 = "--bf16" in sys.argv
    if bf16:  # round the weights only: buffers such as rotary inv_freq stay fp32
        with torch.no_grad():
            for p in ref.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
    bad = 0
    rs = ref.state_dict()
    value = type(saved).__name__.endswith("ForTokenClassification") and \
        not type(ref).__name__.endswith("ForTokenClassification")
    for name, t in saved.state_dict().items():
        if value and not name.startswith("model."):
            continue
        if not torch.equal(t, rs[name]):
            print(f"tensor {name} differs: max abs {float((t - rs[name]).abs().max()):.3g}")
            bad += 1
    for k in config_diffs(saved.config, ref.config):
        print(f"config {k} differs: {getattr(saved.config, k, None)!r} vs "
              f"{getattr(ref.config, k, None)!r}")
        bad += 1
    ids = torch.arange(12).remainder(saved.config.vocab_size).reshape(2, 6)
    with torch.no_grad():
        a = saved(ids).logits
        if value:
            if tuple(saved.score.weight.shape) != (1, saved.config.hidden_size) or \
                    saved.score.bias is None:
                print("value head: score must be Linear(hidden, 1) with a bias")
                bad += 1
            b = torch.nn.functional.linear(ref.model(ids).last_hidden_state, saved.score.weight,
                                           saved.score.bias)
        else:
            b = ref(ids).logits
    if not torch.equal(a, b):
        print(f"outputs differ: max abs {float((a - b).abs().max()):.3g}")
        bad += 1
    print(f"{sys.argv[1]}: {len(rs)} tensors, outputs {tuple(a.shape)}: "
          f"{'identical' if not bad else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
