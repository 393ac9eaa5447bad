#!/usr/bin/env python3
"""Writes the checkpoint-I/O test fixtures (tests/fixtures/io/) with the reference tools:
safetensors files by the safetensors library, checkpoints and configs by transformers, and
the values transformers resolves from them (defaults, RoPE inverse frequencies) as JSON.

Usage: python3 tools/make_io_fixtures.py OUTDIR   (OUTDIR is normally tests/fixtures/io)
Needs numpy, torch, safetensors, transformers (5.x). Runs on CPU in a few seconds.
"""
import json
import math
import os
import shutil
import struct
import sys

import numpy as np
import torch
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import save_file as torch_save_file
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", float(x)))[0]


def bits_list(t):
    """fp32 bit patterns of a tensor, as the exact expected values (inf/nan included)."""
    return [int(b) for b in t.to(torch.float32).contiguous().view(torch.int32).flatten().tolist()]


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def dtypes_fixture(out):
    """One file with a tensor of every dtype the loader converts, plus expected fp32 bits."""
    f32 = torch.tensor([[0.0, -1.5, 3.14159265], [1e-30, -2.5e38, 65504.0]], dtype=torch.float32)
    bf16 = torch.tensor([1.0, -0.0, 3.140625, 1e-20, -3.0e38, float("inf"), 0.1], dtype=torch.bfloat16)
    f16 = torch.tensor([1.0, -2.0, 65504.0, 6.1e-5, 5.96e-8, -0.0, float("-inf"), 0.333],
                       dtype=torch.float16)  # incl. the smallest subnormal and normal
    f64 = torch.tensor([1.0 / 3.0, -1e-300, 1e300, 2.5], dtype=torch.float64)  # rounds; overflows
    i32 = torch.tensor([0, -1, 2147483647, -2147483648], dtype=torch.int32)
    i64 = torch.tensor([[9007199254740993, -5], [7, -9223372036854775808]], dtype=torch.int64)
    empty = torch.zeros((0, 3), dtype=torch.float32)
    # fp32 -> bf16 rounding cases: exact ties both ways, just above/below a tie, NaN, inf,
    # the largest float (rounds to inf), subnormals, then random values.
    edge = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7FC00001, 0xFF800000, 0x7F7FFFFF,
            0x00000001, 0x80008000, 0x00018000, 0x7F7F8000, 0xFFFFFFFF]
    src = torch.tensor(edge, dtype=torch.int64).to(torch.int32).view(torch.float32)
    gen = torch.Generator().manual_seed(7)
    src = torch.cat([src, torch.randn(52, generator=gen) * 1000]).contiguous()
    tensors = {"f32": f32, "bf16": bf16, "f16": f16, "f64": f64, "i32": i32, "i64": i64,
               "empty": empty, "bf16_src": src, "bf16_of_src": src.to(torch.bfloat16)}
    torch_save_file(tensors, os.path.join(out, "dtypes.safetensors"),
                    metadata={"format": "pt", "producer": "make_io_fixtures"})
    expected = {}
    for name, t in tensors.items():
        e = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
        if t.is_floating_point():
            e["f32_bits"] = bits_list(t)  # torch's own conversion to fp32 (round to nearest)
        else:
            e["values"] = [str(v) for v in t.flatten().tolist()]  # strings: beyond 2^53
        expected[name] = e
    write_json(os.path.join(out, "dtypes.json"), expected)

    # An F32-only file written by the numpy front end (different writer code path).
    arr = np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.25) - np.float32(1)
    np_save_file({"a": arr, "b": np.array([7.0], dtype=np.float32)},
                 os.path.join(out, "numpy_f32.safetensors"))
    write_json(os.path.join(out, "numpy_f32.json"),
               {"a": [float(v) for v in arr.flatten()], "b": [7.0]})


def tensor_summary(sd):
    """Per tensor: shape, float64 sum and sum of squares of the fp32 values, first values."""
    out = {}
    for name, t in sd.items():
        x = t.detach().to(torch.float64)
        out[name] = {"shape": list(t.shape), "sum": float(x.sum()), "sumsq": float((x * x).sum()),
                     "head_bits": bits_list(t.detach().flatten()[:4])}
    return out


def tiny_model(out, name, cfg, cls, dtype, max_shard_size="50GB", seed=0):
    torch.manual_seed(seed)
    model = cls.from_config(cfg) if hasattr(cls, "from_config") else cls(cfg)
    with torch.no_grad():
        for p in model.parameters():  # distinct non-trivial values, norms included
            p.copy_(torch.randn_like(p) * 0.5)
    model = model.to(dtype)
    d = os.path.join(out, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    model.save_pretrained(d, max_shard_size=max_shard_size)
    for junk in ("generation_config.json",):
        p = os.path.join(d, junk)
        if os.path.exists(p):
            os.remove(p)
    # What a loader must produce: the saved tensors (tied ones once), read back by torch.
    from safetensors.torch import load_file
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, fn)))
    summary = {"tensors": tensor_summary(sd),
               "n_params": int(sum(t.numel() for t in sd.values())),
               "files": sorted(os.listdir(d))}
    write_json(os.path.join(out, name + ".expected.json"), summary)
    return model


def checkpoints(out):
    llama = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=[2, 3],
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 16})
    tiny_model(out, "tiny-llama", llama, AutoModelForCausalLM, torch.float32, seed=1)

    qwen = transformers.Qwen2Config(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        eos_token_id=5)
    tiny_model(out, "tiny-qwen2-sharded", qwen, AutoModelForCausalLM, torch.bfloat16,
               max_shard_size="3KB", seed=2)

    rm = transformers.MistralConfig(
        vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64, num_labels=1,
        pad_token_id=0, architectures=["MistralForSequenceClassification"])
    tiny_model(out, "tiny-mistral-rm", rm, AutoModelForSequenceClassification, torch.float32,
               seed=3)


# config.json files (classic and rope_parameters forms, minimal ones that lean on defaults);
# the expected values are what transformers resolves when it builds the model.
CONFIGS = {
    "llama3_classic": {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256,
        "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009], "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
    "llama3_headdim": {  # head_dim given explicitly, not hidden_size / heads
        "model_type": "llama", "vocab_size": 64, "hidden_size": 96, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 3, "head_dim": 128,
        "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "rope_theta": 500000.0, "max_position_embeddings": 131072},
    "llama_linear_v5": None,  # written by transformers itself below
    "llama_minimal": {"model_type": "llama", "vocab_size": 64, "hidden_size": 32,
                      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                      "attention_bias": True},
    "qwen2_minimal": {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 64,
                      "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 32,
                      "rope_theta": 1000000.0, "tie_word_embeddings": True},
    "qwen2_v5": None,
    "mistral_minimal": {"model_type": "mistral", "vocab_size": 64, "hidden_size": 64,
                        "intermediate_size": 48, "num_hidden_layers": 1,
                        "num_attention_heads": 8, "sliding_window": None,
                        "rope_parameters": {"rope_type": "linear", "factor": 2.0}},
    # Mistral's attention has no bias switch: a stray attention_bias key changes nothing.
    # (Mistral configs set sliding_window null: the class default of 4096 with the default
    # context of 131072 is sliding-window attention, which troupe refuses.)
    "mistral_bias_key": {"model_type": "mistral", "vocab_size": 64, "hidden_size": 32,
                         "intermediate_size": 48, "num_hidden_layers": 1,
                         "num_attention_heads": 4, "num_key_value_heads": 2,
                         "attention_bias": True, "sliding_window": None},
    "mistral_valuehead": {"model_type": "mistral", "architectures": ["MistralForTokenClassification"],
                          "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                          "num_hidden_layers": 1, "num_attention_heads": 4,
                          "num_key_value_heads": 4, "id2label": {"0": "LABEL_0"},
                          "label2id": {"LABEL_0": 0}, "sliding_window": None},
}


def configs(out):
    cdir = os.path.join(out, "configs")
    os.makedirs(cdir, exist_ok=True)
    v5 = transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=4096,
        rope_parameters={"rope_type": "linear", "rope_theta": 250000.0, "factor": 4.0},
        architectures=["LlamaForCausalLM"])
    CONFIGS["llama_linear_v5"] = json.loads(v5.to_json_string(use_diff=False))
    q5 = transformers.Qwen2Config(
        vocab_size=64, hidden_size=56, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=7, num_key_value_heads=1, max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        architectures=["Qwen2ForSequenceClassification"], num_labels=1, pad_token_id=3)
    CONFIGS["qwen2_v5"] = json.loads(q5.to_json_string(use_diff=False))
    expected = {}
    for name, c in CONFIGS.items():
        path = os.path.join(cdir, name + ".json")
        write_json(path, c)
        cfg = AutoConfig.from_pretrained(path)
        arch = (cfg.architectures or [""])[0]
        if arch.endswith("ForTokenClassification"):
            from transformers import AutoModelForTokenClassification as Auto
        elif arch.endswith("ForSequenceClassification"):
            Auto = AutoModelForSequenceClassification
        else:
            Auto = AutoModelForCausalLM
        torch.manual_seed(0)
        model = Auto.from_config(cfg)
        base = model.model
        attn = base.layers[0].self_attn
        inv = base.rotary_emb.inv_freq
        eos = cfg.eos_token_id
        rp = cfg.rope_parameters
        expected[name] = {
            "n_kv_heads": attn.k_proj.weight.shape[0] // attn.head_dim,
            "head_dim": attn.head_dim,
            "attention_bias": attn.q_proj.bias is not None,
            "o_proj_bias": attn.o_proj.bias is not None,
            "rms_norm_eps": float(base.norm.variance_epsilon),
            "max_position_embeddings": cfg.max_position_embeddings,
            "tie_word_embeddings": bool(cfg.tie_word_embeddings),
            "bos_token_id": -1 if cfg.bos_token_id is None else cfg.bos_token_id,
            "pad_token_id": -1 if cfg.pad_token_id is None else cfg.pad_token_id,
            "eos_token_ids": [] if eos is None else (eos if isinstance(eos, list) else [eos]),
            "num_labels": cfg.num_labels,
            "rope_type": rp["rope_type"],
            "rope_theta": float(rp["rope_theta"]),
            "inv_freq": [float(v) for v in inv.tolist()],
            # The same frequencies by the published formula in float64, for a second opinion.
            "inv_freq_f64": rope_f64(rp, attn.head_dim),
        }
    write_json(os.path.join(out, "configs_expected.json"), expected)


def rope_f64(rp, dim):
    base = rp["rope_theta"]
    inv = [1.0 / base ** (i / dim) for i in range(0, dim, 2)]
    if rp["rope_type"] == "linear":
        return [v / rp["factor"] for v in inv]
    if rp["rope_type"] != "llama3":
        return inv
    f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old = rp["original_max_position_embeddings"]
    out = []
    for v in inv:
        wavelen = 2 * math.pi / v
        if wavelen < old / hi:
            out.append(v)
        elif wavelen > old / lo:
            out.append(v / f)
        else:
            s = (old / wavelen - lo) / (hi - lo)
            out.append((1 - s) * v / f + s * v)
    return out


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    dtypes_fixture(out)
    checkpoints(out)
    configs(out)


if __name__ == "__main__":
    main()
