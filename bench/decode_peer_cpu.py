"""The decode peer on the CPU, for bench/run_decode_gpu.sh --tiny: runs the peers' anchor
decode_nccl_anchor.py (not part of this tree) unchanged through runpy, with what it needs to run
without a GPU patched in:
  - torch_anchor.make (which the anchor imports) builds the model on the CPU in fp32 (the CPU's
    bf16 products are many times slower; troupe's CPU backend is fp32 too), and knows the "tiny"
    shape (width 64, 2 layers, 4 heads, 2 key/value heads, the 151,936-id vocabulary: the shape
    bench_decode_gpu calls tiny);
  - torch.randint puts the prompts on the CPU, torch.cuda.synchronize does nothing;
  - torch.compile returns the function as it is: the smoke test checks the path (static cache,
    generate, the anchor's JSON line), not the compiled speed, and compiling on a small CPU
    takes minutes.
It prints what the anchor prints: one JSON line with gen_tokens_per_s.

Usage: python3 bench/decode_peer_cpu.py ANCHOR_DIR SHAPE [BATCH]
  ANCHOR_DIR holds decode_nccl_anchor.py and torch_anchor.py; SHAPE is tiny, qwen2.5-0.5b or
  qwen2.5-1.5b; BATCH as the anchor's (default 64). Prompts are 256 tokens and 256 are sampled,
  as the anchor fixes them.
"""
import os
import runpy
import sys

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True)


def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip().split("Usage: ", 1)[1])
        sys.exit(0 if len(sys.argv) > 1 else 2)
    anchors, shape = sys.argv[1], sys.argv[2]
    batch = sys.argv[3:4]
    anchor = os.path.join(anchors, "decode_nccl_anchor.py")

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, anchors)
    import torch_anchor

    torch_anchor.SHAPES.setdefault("tiny", TINY)

    def make_cpu(name, dtype):  # torch_anchor.make on the CPU, in fp32 whatever dtype asks
        cfg = Qwen2Config(**torch_anchor.SHAPES[name], max_position_embeddings=4096, rope_theta=1e6,
                          attn_implementation="sdpa")
        torch.manual_seed(0)
        return cfg, Qwen2ForCausalLM(cfg).float()

    torch_anchor.make = make_cpu
    randint = torch.randint

    def randint_cpu(*a, **kw):
        if kw.get("device") == "cuda":
            kw["device"] = "cpu"
        return randint(*a, **kw)

    torch.randint = randint_cpu
    torch.cuda.synchronize = lambda *a, **kw: None
    torch.compile = lambda fn=None, **kw: fn if fn is not None else (lambda f: f)
    sys.argv = [anchor, "decode", shape] + batch
    runpy.run_path(anchor, run_name="__main__")


if __name__ == "__main__":
    main()
