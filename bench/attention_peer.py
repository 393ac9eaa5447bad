#!/usr/bin/env python3
"""torch's attention on bench_cuda's attention shapes, timed on the GPU, for the ratio of
issue 13: troupe's flash kernels should reach >= 0.9x torch's best, SDPA's fastest backend on
dense rows and FlexAttention with a document block mask on packed rows.

    python3 bench/attention_peer.py [--troupe build-cuda/bench/bench_cuda]

With --troupe it runs `bench_cuda attention` first and prints both side by side with the
ratio torch_ms / troupe_ms. bf16 q, k, v come from one fused [q;k;v] projection viewed as
[B, H, S, D] (what transformers' Qwen2 does); times are CUDA-event medians after warm-up.
Each backward runs twice on the same inputs and is reported nondeterministic when the two
gradients differ in any bit (FlashAttention-2's dQ is accumulated with atomics).
"""
import argparse
import re
import subprocess
import sys
import warnings

import torch
import torch.nn.functional as F

SHAPES = [  # name, T, dense row length (0: packed documents), H, KVH, D -- as bench_cuda
    ("7b_dense", 4096, 4096, 32, 8, 128),
    ("7b_packed", 16384, 0, 32, 8, 128),
    ("qwen05b_dense", 16384, 2048, 14, 2, 64),
    ("qwen05b_packed", 16384, 0, 14, 2, 64),
    ("qwen15b_dense", 8192, 2048, 12, 2, 128),
    ("qwen15b_packed", 16384, 0, 12, 2, 128),
]


def layout(T, dense):
    """Document starts as bench_cuda's attn_layout draws them (same LCG)."""
    starts, t, s = [0], 0, 20240607
    while t < T:
        length = dense
        if not dense:
            s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
            length = 256 + (s >> 8) % 1793
        t = min(t + length, T)
        starts.append(t)
    return starts


def flops(starts, H, D):
    pairs = sum(0.5 * (b - a) * (b - a + 1) for a, b in zip(starts, starts[1:]))
    return 4.0 * H * D * pairs


def cuda_time(fn, warmup=3, iters=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def qkv_views(B, S, H, KVH, D, gen):
    """q [B,H,S,D], k, v [B,KVH,S,D]: views of one fused projection, leaves for autograd."""
    fused = torch.randn(B, S, (H + 2 * KVH) * D, device="cuda", dtype=torch.bfloat16,
                        generator=gen)
    fused.requires_grad_(True)
    q = fused[..., : H * D].view(B, S, H, D).transpose(1, 2)
    k = fused[..., H * D: (H + KVH) * D].view(B, S, KVH, D).transpose(1, 2)
    v = fused[..., (H + KVH) * D:].view(B, S, KVH, D).transpose(1, 2)
    return fused, q, k, v


def time_fwd_bwd(forward, fused, dout):
    """(fwd ms, bwd ms, deterministic) of out = forward(); grads into the fused leaf."""
    with torch.no_grad():
        fwd = cuda_time(forward)
    out = forward()
    bwd = cuda_time(lambda: torch.autograd.grad(out, fused, dout, retain_graph=True))
    g1 = torch.autograd.grad(out, fused, dout, retain_graph=True)[0]
    g2 = torch.autograd.grad(out, fused, dout, retain_graph=True)[0]
    same = torch.equal(g1.view(torch.int16), g2.view(torch.int16))
    return fwd, bwd, same


def sdpa_backends():
    from torch.nn.attention import SDPBackend
    names = [("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"),
             ("efficient", "EFFICIENT_ATTENTION")]
    return [(n, getattr(SDPBackend, b)) for n, b in names if hasattr(SDPBackend, b)]


def run_sdpa(name, T, S, H, KVH, D, gen):
    """Every SDPA backend on dense causal rows of S tokens; K and V are expanded to H heads
    (outside the timing) for a backend that refuses enable_gqa."""
    from torch.nn.attention import sdpa_kernel
    B = T // S
    fused, q, k, v = qkv_views(B, S, H, KVH, D, gen)
    dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    results = []
    for bname, backend in sdpa_backends():
        for expand in (False, True):
            kk, vv = k, v
            if expand:
                kk = k.repeat_interleave(H // KVH, dim=1)
                vv = v.repeat_interleave(H // KVH, dim=1)

            def fwd(kk=kk, vv=vv, expand=expand, backend=backend):
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=True,
                                                          enable_gqa=not expand)
            try:
                f, b, det = time_fwd_bwd(fwd, fused, dout)
            except RuntimeError as e:
                if expand or H == KVH:
                    print(f"#   {name}: sdpa {bname} unavailable: {str(e).splitlines()[0][:100]}")
                    break
                continue
            results.append((f"sdpa-{bname}" + ("(kv expanded)" if expand else ""), f, b, det))
            break
    return results


def run_flex(name, starts, H, KVH, D, gen):
    """FlexAttention (compiled) over one row of T tokens with a causal document block mask."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        print(f"#   {name}: FlexAttention not in this torch")
        return []
    T = starts[-1]
    doc = torch.zeros(T, dtype=torch.int32, device="cuda")
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        doc[a:b] = i

    def mask_mod(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    try:
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T,
                                       device="cuda", _compile=True)
    except TypeError:   # a torch without _compile
        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=T, KV_LEN=T,
                                       device="cuda")
    # Every shape and both grad modes (the forward is timed without autograd) are graphs of
    # their own: past dynamo's default cache of 8, flex would fall back to its unfused eager
    # path and time a hundred times slower. The backward runs several times on one graph
    # (retain_graph), which buffers donated to the backward do not allow.
    import torch._dynamo.config as dconfig   # binds dconfig only: torch stays the module's
    for knob in ("cache_size_limit", "recompile_limit"):
        if hasattr(dconfig, knob):
            setattr(dconfig, knob, 64)
    try:
        import torch._functorch.config as fconfig
        if hasattr(fconfig, "donated_buffer"):
            fconfig.donated_buffer = False
    except ImportError:
        pass
    flex = torch.compile(flex_attention, dynamic=False)
    fused, q, k, v = qkv_views(1, T, H, KVH, D, gen)
    dout = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    try:
        f, b, det = time_fwd_bwd(lambda: flex(q, k, v, block_mask=block_mask, enable_gqa=True),
                                 fused, dout)
    except Exception as e:  # compile failures surface as assorted exception types
        print(f"#   {name}: flex failed: {str(e).splitlines()[0][:100]}")
        return []
    return [("flex-docmask", f, b, det)]


def troupe_numbers(binary):
    out = subprocess.run([binary, "attention"], check=True, capture_output=True, text=True).stdout
    sys.stdout.write("".join("# troupe: " + l + "\n" for l in out.splitlines()))
    res = {}
    for line in out.splitlines():
        if line.startswith("attn "):
            kv = dict(re.findall(r"(\w+)=([\w.]+)", line))
            res[kv["shape"]] = (float(kv["fwd_ms"]), float(kv["bwd_ms"]))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--troupe", help="bench_cuda binary, run with `attention` for the ratio")
    ap.add_argument("--only", help="comma-separated shape names")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")   # SDPA explains at length why a backend declines
    if not torch.cuda.is_available():
        print("attention_peer: no CUDA device")
        return 1
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    ours = troupe_numbers(args.troupe) if args.troupe else {}
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    rows = []
    for name, T, dense, H, KVH, D in SHAPES:
        if args.only and name not in args.only.split(","):
            continue
        starts = layout(T, dense)
        fl = flops(starts, H, D)
        cands = run_sdpa(name, T, dense, H, KVH, D, gen) if dense else []
        # flex on dense rows too, for the record; packed rows have only flex as the peer
        flex = run_flex(name, starts, H, KVH, D, gen)
        for impl, f, b, det in cands + flex:
            print(f"peer shape={name} impl={impl} fwd_ms={f:.3f} bwd_ms={b:.3f} "
                  f"fwd_tflops={fl / f * 1e-9:.1f} bwd_tflops={2.5 * fl / b * 1e-9:.1f} "
                  f"bwd_deterministic={'yes' if det else 'NO'}")
        peers = cands if dense else flex   # issue 13's peer per kind of row
        if not peers:
            continue
        bf = min(peers, key=lambda r: r[1])
        bb = min(peers, key=lambda r: r[2])
        rows.append((name, len(starts) - 1, fl, bf, bb, ours.get(name)))

    print()
    print("| shape | docs | torch fwd ms (impl) | troupe fwd ms | ratio | torch bwd ms (impl) "
          "| troupe bwd ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, nd, fl, bf, bb, tr in rows:
        nondet = "" if bb[3] else ", nondeterministic"
        tf = f"{tr[0]:.3f}" if tr else "-"
        tb = f"{tr[1]:.3f}" if tr else "-"
        rf = f"{bf[1] / tr[0]:.2f}x" if tr else "-"
        rb = f"{bb[2] / tr[1]:.2f}x" if tr else "-"
        print(f"| {name} | {nd} | {bf[1]:.3f} ({bf[0]}) | {tf} | {rf} | "
              f"{bb[2]:.3f} ({bb[0]}{nondet}) | {tb} | {rb} |")
    print("\nratio = torch ms / troupe ms (goal >= 0.9x); troupe's backward is deterministic.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
