#!/usr/bin/env python3
"""What transformers builds from the released configurations: python3 tools/make_config_fixtures.py

tests/fixtures/configs/<name>/config.json are the config.json files of released models
(Qwen3, Qwen2.5, Llama 3.1/3.2, Mistral), written out from their published values. For each,
transformers builds the model on the meta device (no weights, no memory) and this records
in tests/fixtures/configs/expected.json what it resolved: the parameter count (tied
embeddings counted once, as model.parameters() lists them), the head sizes, biases, QK-norm,
tying, RoPE and token ids. `troupe info` and the config parser are checked against it.
"""
import json
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def resolved(d):
    cfg = AutoConfig.from_pretrained(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    attn = model.model.layers[0].self_attn
    eos = cfg.eos_token_id
    rp = cfg.rope_parameters
    return {
        "architecture": cfg.architectures[0],
        "n_params": sum(p.numel() for p in model.parameters()),
        "n_layers": len(model.model.layers),
        "n_heads": attn.q_proj.weight.shape[0] // attn.head_dim,
        "n_kv_heads": attn.k_proj.weight.shape[0] // attn.head_dim,
        "head_dim": attn.head_dim,
        "attention_bias": attn.q_proj.bias is not None,
        "o_proj_bias": attn.o_proj.bias is not None,
        "qk_norm": hasattr(attn, "q_norm"),
        "tie_word_embeddings": model.lm_head.weight is model.model.embed_tokens.weight,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": float(model.model.norm.variance_epsilon),
        "rope_type": rp["rope_type"],
        "rope_theta": float(rp["rope_theta"]),
        "rope_factor": float(rp.get("factor", 1.0)),
        "bos_token_id": -1 if cfg.bos_token_id is None else cfg.bos_token_id,
        "eos_token_ids": [] if eos is None else (eos if isinstance(eos, list) else [eos]),
    }


def main():
    if len(sys.argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures",
                        "configs")
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "config.json")))
    expected = {}
    for n in names:
        expected[n] = resolved(os.path.join(root, n))
        print(f"{n:18s} {expected[n]['n_params']:>14,d} parameters")
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
