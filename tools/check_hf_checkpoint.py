#!/usr/bin/env python3
"""Checks that a checkpoint directory written by troupe loads in transformers and computes the
same outputs as a reference checkpoint (e.g. the one it was loaded from).

Usage: python3 tools/check_hf_checkpoint.py SAVED_DIR REFERENCE_DIR [--bf16]
Loads both with AutoModelFor<head> (from config.json "architectures"), in float32, runs the
same token ids through both, and compares every state-dict tensor and the outputs: exactly
for an F32 save; for --bf16, against the reference rounded to bfloat16. Exit status 0 = same.
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
    for name, t in saved.state_dict().items():
        if not torch.equal(t, rs[name]):
            print(f"tensor {name} differs: max abs {float((t - rs[name]).abs().max()):.3g}")
            bad += 1
    ids = torch.arange(12).remainder(saved.config.vocab_size).reshape(2, 6)
    with torch.no_grad():
        a, b = saved(ids).logits, ref(ids).logits
    if not torch.equal(a, b):
        print(f"outputs differ: max abs {float((a - b).abs().max()):.3g}")
        bad += 1
    print(f"{sys.argv[1]}: {len(rs)} tensors, outputs {tuple(a.shape)}: "
          f"{'identical' if not bad else 'DIFFERENT'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
