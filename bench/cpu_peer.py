"""PyTorch CPU peer of bench_train and bench_generate: the same ~9.7M-parameter Llama model
(hidden 256, 8 layers, 8 heads, 2 KV heads, intermediate 688, vocab 8192, untied head, fp32,
SDPA attention, random weights) built in transformers, timed with the definitions of the two
C benchmarks at torch.set_num_threads(N), N in 1 and 2:

  train:  a full step (forward, next-token cross entropy, backward, clip to norm 1, AdamW) on
          4 x 256 random tokens; eager and torch.compile; tok/s = 1024 / mean s/step over the
          timed steps after the warm-up.
  decode: HF generate, batch 1, 16 and 64, 64-token prompts, sampling at temperature 1 over
          the full vocabulary; decode s = time(1 + 32 new tokens) - time(1 new token), so the
          prompt pass and the first token are not counted; tok/s = batch * 32 / decode s.

Prints one key=value line per result (`peer train eager threads=1 tok/s=...`). With --table
it instead reads such lines, troupe's and the peer's, from files and prints the comparison.

usage: cpu_peer.py [--threads 1,2] [--steps 3] [--only train|decode]
       cpu_peer.py --table FILE...
"""
import argparse
import sys
import time

VOCAB, SEQ, DOCS = 8192, 256, 4
PROMPT, NEW = 64, 32
BATCHES = (1, 16, 64)


def make_model(torch):
    from transformers import LlamaConfig, LlamaForCausalLM

    # bench_train's CONFIG, plus what the C engine implies: no biases, no dropout, and no
    # bos/eos (the benchmarks set no stop ids, so nothing ends a sample early).
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688,
                      num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=500000.0,
                      tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                      attention_dropout=0.0, initializer_range=0.02, hidden_act="silu",
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(7)
    m = LlamaForCausalLM(cfg).to(torch.float32)
    m.generation_config.eos_token_id = None
    m.generation_config.bos_token_id = None
    return m


def emit(line):
    print(line, flush=True)


def train(torch, threads, compiled, steps, adamw):
    torch.set_num_threads(threads)
    torch._dynamo.reset()  # inductor bakes the thread count into its kernels
    m = make_model(torch)
    m.train()
    # bench_train's optimizer: lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on
    # matrices only (decay_all = false leaves 1-D norm weights undecayed), constant rate.
    decay = [p for p in m.parameters() if p.ndim > 1]
    flat = [p for p in m.parameters() if p.ndim <= 1]
    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}}[adamw]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": flat, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, **kind)
    fn = torch.compile(m) if compiled else m
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (DOCS, SEQ), generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        # labels = inputs: the model shifts them, so each 256-token row scores 255 next
        # tokens, as bench_train's targets (-1 at each document's last position) do.
        loss = fn(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0, foreach=True)
        opt.step()
        return loss

    # One warm-up step, as bench_train: it also creates the Adam moments and, compiled,
    # compiles forward and backward (later steps hit the same graphs without recompiling).
    t0 = time.perf_counter()
    step()
    warm_s = time.perf_counter() - t0
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = step()
    wall = (time.perf_counter() - t0) / steps
    cpu = (time.process_time() - c0) / steps
    name = "compile" if compiled else "eager"
    emit(f"peer train {name} threads={threads} tokens={DOCS * SEQ} steps={steps} "
         f"tok/s={DOCS * SEQ / wall:.1f} s/step={wall:.4f} cpu-s/step={cpu:.4f} "
         f"loss={loss.item():.4f} adamw={adamw} warmup_s={warm_s:.1f}")


def decode(torch, threads):
    torch.set_num_threads(threads)
    m = make_model(torch)
    m.eval()
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, VOCAB, (max(BATCHES), PROMPT), generator=g)

    def timed(batch, new):
        x = prompts[:batch]
        torch.manual_seed(batch)
        # top_k=0 and top_p=1 switch both filters off: the full vocabulary is sampled.
        # min_new_tokens pins the length even if an eos id were configured.
        t0, c0 = time.perf_counter(), time.process_time()
        out = m.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True,
                         temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                         min_new_tokens=new, pad_token_id=0)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert out.shape == (batch, PROMPT + new), out.shape
        return wall, cpu

    # One untimed call first: the first generate pays one-off Python setup (lazy imports,
    # config validation) that has no counterpart in the C generator's per-call cost.
    timed(1, 2)
    for b in BATCHES:
        w0, c0 = timed(b, 1)
        w1, c1 = timed(b, 1 + NEW)
        dec, toks = w1 - w0, b * NEW
        emit(f"peer decode hf threads={threads} batch={b} prompt={PROMPT} new={NEW} "
             f"tok/s={toks / dec:.1f} ms/step={1e3 * dec / NEW:.3f} "
             f"cpu-s/tok={(c1 - c0) / toks:.6f} prefill_tok/s={b * PROMPT / w0:.1f}")


def fastest_adamw(torch, threads):
    """Times one fused and one foreach AdamW step on the model's parameters and returns the
    faster; which wins depends on the CPU and the torch build."""
    torch.set_num_threads(threads)
    best = None
    for kind in ("fused", "foreach"):
        m = make_model(torch)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, **{kind: True})
        opt.step()
        t0 = time.perf_counter()
        for _ in range(5):
            opt.step()
        dt = time.perf_counter() - t0
        if best is None or dt < best[1]:
            best = (kind, dt)
    return best[0]


def parse(path):
    """Reads key=value result lines: returns {(who, what, kind, threads, batch): fields}."""
    rows = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if len(words) < 3 or words[0] not in ("troupe", "peer"):
                continue
            if words[1] == "versions":
                rows["versions"] = " ".join(words[2:])
                continue
            head = [w for w in words if "=" not in w]
            kv = dict(w.split("=", 1) for w in words if "=" in w)
            who, what = head[0], head[1]
            kind = head[2] if len(head) > 2 else "troupe"
            rows[(who, what, kind, int(kv["threads"]), int(kv.get("batch", 0)))] = kv
    return rows


def table(paths):
    rows = {}
    for p in paths:
        rows.update(parse(p))

    def tps(key):
        kv = rows.get(key)
        return float(kv["tok/s"]) if kv else None

    def fmt(v, spec):
        return format(v, spec) if v is not None else "-"

    threads = sorted({k[3] for k in rows if k != "versions"})
    print(f"tok/s, fp32 CPU, same model and work; peer: {rows.get('versions', '?')}")
    print("troupe/peer > 1: troupe is faster")
    print(f"{'threads':<8} {'workload':<16} {'troupe':>8} {'peer':>8}  {'peer is':<22} "
          f"{'troupe/peer':>11}")
    peers = [("train", 0, "eager", "PyTorch eager"),
             ("train", 0, "compile", "PyTorch torch.compile")]
    peers += [("decode", b, "hf", "HF generate") for b in BATCHES]
    for n in threads:
        for what, b, kind, label in peers:
            ours = tps(("troupe", what, "troupe", n, b))
            theirs = tps(("peer", what, kind, n, b))
            if ours is None and theirs is None:
                continue
            work = "train step" if what == "train" else f"decode batch {b}"
            ratio = f"{ours / theirs:.2f}x" if ours and theirs else "-"
            # A ratio only means something if both sides did the same work per token.
            a = rows.get(("troupe", what, "troupe", n, b), {})
            z = rows.get(("peer", what, kind, n, b), {})
            if any(f in a and f in z and a[f] != z[f] for f in ("tokens", "prompt", "new")):
                ratio = "mismatch"
            print(f"{n:<8} {work:<16} {fmt(ours, '.0f'):>8} {fmt(theirs, '.0f'):>8}  "
                  f"{label:<22} {ratio:>11}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=3, help="timed train steps (bench_train: 3)")
    ap.add_argument("--only", choices=("train", "decode"))
    ap.add_argument("--adamw", choices=("fused", "foreach"),
                    help="AdamW implementation (default: the faster of the two here)")
    ap.add_argument("--table", nargs="+", metavar="FILE")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    import torch
    import transformers

    emit(f"peer versions torch {torch.__version__}, transformers {transformers.__version__}")
    counts = [int(t) for t in a.threads.split(",")]
    adamw = a.adamw or fastest_adamw(torch, max(counts))
    for n in counts:
        if a.only in (None, "train"):
            train(torch, n, False, a.steps, adamw)
            train(torch, n, True, a.steps, adamw)
        if a.only in (None, "decode"):
            with torch.inference_mode():
                decode(torch, n)


if __name__ == "__main__":
    sys.exit(main())
