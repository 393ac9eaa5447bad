#!/usr/bin/env bash
# Training throughput on the GPU beside the peer, in one invocation: bench_train_gpu (troupe,
# bf16 over fp32 masters) and the PyTorch anchor (transformers Qwen2, SDPA, bf16 autocast over
# fp32 masters, fused AdamW; eager and torch.compile) on the Qwen2.5-0.5B and -1.5B shapes, then
# one table with tokens/s, MFU, peak memory and troupe's ratio to torch.compile. troupe also
# trains each shape on the same tokens packed as RL rollouts come (BENCH_PACKED=1: documents
# of 256 to 2,048 tokens, attention FLOPs counted per document), a row of its own with its MFU
# against the dense run's.
# usage: bench/run_gpu_train.sh BUILD_DIR ANCHOR_DIR [SHAPE...]
#   ANCHOR_DIR holds torch_anchor.py (the peers' scripts; they are not part of this tree).
#   PEER_COMPILE_ONLY=1 runs the anchor's torch.compile measurement alone (its own train()
#   function, the micro-batch its main picks), without the eager one, so that both shapes fit
#   in one call of a limited length; the table's eager column then reads n/a.
set -u
build=${1:?usage: run_gpu_train.sh BUILD_DIR ANCHOR_DIR [SHAPE...]}
anchors=${2:?usage: run_gpu_train.sh BUILD_DIR ANCHOR_DIR [SHAPE...]}
shift 2
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen2.5-0.5b qwen2.5-1.5b)
out=$(mktemp -d /tmp/troupe-train-bench-XXXXXX)
for s in "${shapes[@]}"; do
    echo "== troupe $s"
    TROUPE_BACKEND=cuda "$build/bench/bench_train_gpu" "$s" | tee -a "$out/troupe.txt"
    echo "== troupe $s, packed"
    BENCH_PACKED=1 TROUPE_BACKEND=cuda "$build/bench/bench_train_gpu" "$s" | tee -a "$out/troupe.txt"
    echo "== torch $s"
    if [ "${PEER_COMPILE_ONLY:-0}" = 1 ]; then
        python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import torch_anchor as a
s = sys.argv[2]; a.train(s, True, mb=8 if "0.5b" in s else 4)' "$anchors" "$s" \
            2>"$out/torch_$s.err" | tee -a "$out/torch.jsonl"
    else
        python3 "$anchors/torch_anchor.py" train "$s" 2>"$out/torch_$s.err" | tee -a "$out/torch.jsonl"
    fi
done
python3 - "$out/troupe.txt" "$out/torch.jsonl" <<'PY'
import json, sys
troupe = {}
for line in open(sys.argv[1]):
    if line.startswith("troupe train "):
        kv = dict(f.split("=", 1) for f in line.split()[2:])
        troupe[(kv["shape"], kv.get("packed") == "1")] = kv
peer = {}
for line in open(sys.argv[2]):
    line = line.strip()
    if line.startswith("{"):
        r = json.loads(line)
        peer[(r["shape"], r["compile"])] = r
print("\n| shape | troupe tok/s (MFU, peak GiB) | torch eager | torch.compile | troupe / compile |")
print("|---|---|---|---|---|")
fmt = lambda r: f"{r['tokens_per_s']:,} ({100 * r['mfu']:.1f}%, {r['peak_mem_gib']})" if r else "n/a"
for (s, packed), t in troupe.items():
    if packed:
        continue
    e, c = peer.get((s, False)), peer.get((s, True))
    ratio = f"{float(t['tok/s']) / c['tokens_per_s']:.2f}x" if c else "n/a"
    print(f"| {s} | {float(t['tok/s']):,.0f} ({100 * float(t['mfu']):.1f}%, {float(t['peak_gib']):.1f}) "
          f"| {fmt(e)} | {fmt(c)} | {ratio} |")
print("\n| shape, RL-packed (documents of 256 to 2,048 tokens) | troupe tok/s (MFU, peak GiB) | MFU / dense MFU |")
print("|---|---|---|")
for (s, packed), t in troupe.items():
    d = troupe.get((s, False))
    if not packed or not d:
        continue
    print(f"| {s} | {float(t['tok/s']):,.0f} ({100 * float(t['mfu']):.1f}%, {float(t['peak_gib']):.1f}) "
          f"| {float(t['mfu']) / float(d['mfu']):.3f} |")
PY
