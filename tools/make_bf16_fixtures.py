#!/usr/bin/env python3
# What transformers computes under bf16 autocast (fp32 master weights, torch.autocast on the
# CPU with bfloat16: linear layers and attention read bf16, norms and the residual stream stay
# fp32) on the model fixtures of tools/make_model_fixtures.py, for the mixed-precision test:
# the engine in bf16 must give the same token logprobs within 0.05 at most and 5e-3 on
# average (tests/engine/test_model_bf16.c).
# Usage: python3 tools/make_bf16_fixtures.py [NAME...]   (default: every LM fixture)
#
# Writes tests/fixtures/models/<name>/bf16_autocast.safetensors:
#   logprobs [N]: ln p(ids[i+1] | ids[..i]) within each sequence of the fixture's batch
#   (input_ids, seq_lens of expected.safetensors), 0 at each sequence's last token, from
#   logits cast to fp32 before the log-softmax as transformers' loss does.
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "models")
NAMES = ["llama3", "qwen2", "llama_bias", "qwen3"]


def logprobs(model, ids, lens):
    out = []
    pos = 0
    for n in lens:
        seq = ids[pos:pos + n].unsqueeze(0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(seq).logits
        lp = torch.log_softmax(logits.float()[0], dim=-1)
        row = torch.zeros(n)
        row[:-1] = lp[torch.arange(n - 1), seq[0, 1:]]
        out.append(row)
        pos += n
    return torch.cat(out)


def main():
    names = sys.argv[1:] or NAMES
    torch.manual_seed(0)
    for name in names:
        d = os.path.join(ROOT, name)
        exp = load_file(os.path.join(d, "expected.safetensors"))
        ids, lens = exp["input_ids"].long(), [int(x) for x in exp["seq_lens"]]
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32,
                                                     attn_implementation="sdpa").eval()
        with torch.no_grad():
            lp = logprobs(model, ids, lens)
        diff = (lp - exp["logprobs"].float()).abs()
        print(f"{name}: bf16 autocast vs fp32 logprobs: max {diff.max():.3g}, "
              f"mean {diff.mean():.3g}")
        save_file({"logprobs": lp.contiguous()}, os.path.join(d, "bf16_autocast.safetensors"))


if __name__ == "__main__":
    main()
