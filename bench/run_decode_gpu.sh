#!/usr/bin/env bash
# Decode throughput on the GPU beside the peer, in one invocation: troupe's generator
# (bench_decode_gpu: continuous batching over a paged KV cache, bf16) and HF generate with a
# static KV cache + torch.compile (the peers' `decode_nccl_anchor.py decode SHAPE BATCH`), at the
# Qwen2.5-0.5B and -1.5B shapes (random weights), batch 64 and 256 (troupe: BATCH prompts x 1
# sample), prompts of 256 random tokens + 256 sampled at temperature 1 (no stop token: every
# sequence runs to the end on both sides). Each side makes a warm-up call first (the peer
# compiles there) and times the second. Prints, per shape and batch, tokens/s (sampled tokens
# over the timed call's wall time, prefill included, on both sides), the ratio troupe / peer
# (above 1: troupe is faster) and troupe's fraction of the roofline, then a markdown table.
#
# The roofline of one decode step at batch B, for a shape of hidden size d, L layers, H query
# and K key/value heads of h = d / H, vocabulary V, intermediate size I and N parameters (counted
# from the shape: Qwen2's q/k/v biases and norms included, the tied embedding once):
#   weight bytes  W  = 2 N                        every weight read once a step, in bf16 (the tied
#                                                 embedding as the LM head)
#   KV bytes      KV = B c L 2 K h 2              the keys and values (bf16) of c positions per
#                                                 sequence, c = P + (NEW + 1) / 2: the context
#                                                 averaged over the NEW decode steps, whose
#                                                 contexts are P + 1 .. P + NEW
#   FLOPs         F  = 2 N B + 4 B L d c          every product once per token, plus QK^T and PV
#   step time     t  = max((W + KV) / 4.3 TB/s, F / 790 TFLOP/s)
#   roofline tokens/s = B / t; troupe's fraction = troupe's tokens/s / roofline tokens/s
# (4.3 TB/s and 790 TFLOP/s: an H200's HBM bandwidth and dense bf16 rate as measured). The
# per-run lines also give the fraction for troupe's decode steps alone (its decode_s: prefill,
# whose 256 tokens a sequence the roofline leaves out, excluded).
#
# usage: bench/run_decode_gpu.sh [--tiny] BUILD_DIR ANCHOR_DIR [SHAPE...]
#   SHAPE: qwen2.5-0.5b, qwen2.5-1.5b (default both).
#   BUILD_DIR holds bench/bench_decode_gpu (built with CUDA; the engine layer alone is enough).
#   ANCHOR_DIR holds decode_nccl_anchor.py and torch_anchor.py (the peers' scripts; they are not
#     part of this tree). The peer is skipped (n/a in the table) when they are missing or torch
#     does not import; a peer run that fails is n/a too, and makes the exit status 1.
#   BATCHES (environment): the batch sizes (default "64 256").
#   MODES (environment): troupe's modes, each a column (default "invariant fastest"):
#     invariant is the default batch-invariant arithmetic (generation's logprobs are the
#     training forward's bits); fastest is TROUPE_CUDA_BATCH_INVARIANT=0 (decode products may
#     split their reduction).
#   PEER_TIMEOUT (environment): seconds one peer run may take, compiling included (default 420).
#   OUT (environment): each run's output is kept in $OUT/decode_bench (else a temporary folder,
#     removed at the end).
#   --tiny: a CPU smoke test of the whole path: shape tiny (width 64, 2 layers, the full
#     vocabulary; bench_decode_gpu and the peer build the same), batch 2, TROUPE_BACKEND=cpu;
#     the peer through bench/decode_peer_cpu.py (the anchor on the CPU in fp32, not compiled)
#     when torch imports, else skipped. Its figures measure nothing.
#
# On the GPU machine, from the repository root with the anchors carried in shared/anchors
# (bench_decode_gpu needs only the engine layer: no .debs):
#   { [ -d build-gpu ] || meson setup build-gpu -Dcuda=enabled -Dlayers=engine -Dwerror=false; } &&
#   ninja -C build-gpu bench/bench_decode_gpu && bench/run_decode_gpu.sh build-gpu shared/anchors
# (the peer compiles once per shape and batch, a minute or more each: name one shape per command
# if both do not fit the command's time limit; tools/gpu_suite.sh decode_bench runs it too).
set -u
usage="usage: run_decode_gpu.sh [--tiny] BUILD_DIR ANCHOR_DIR [SHAPE...]"
mode=gpu
if [ "${1:-}" = --tiny ]; then
    mode=tiny
    shift
fi
build=${1:?$usage}
anchors=${2:?$usage}
shift 2
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen2.5-0.5b qwen2.5-1.5b)
read -r -a batches <<<"${BATCHES:-64 256}"
read -r -a modes <<<"${MODES:-invariant fastest}"
for md in "${modes[@]}"; do
    case "$md" in
    invariant | fastest) ;;
    *) echo "run_decode_gpu.sh: unknown mode '$md' in MODES (invariant, fastest)" >&2; exit 2 ;;
    esac
done
plen=256 new=256   # the peer's, fixed in its script
if [ "$mode" = tiny ]; then
    shapes=(tiny)
    batches=(2)
fi
for s in "${shapes[@]}"; do
    case "$s" in
    qwen2.5-0.5b | qwen2.5-1.5b | tiny) ;;
    *) echo "run_decode_gpu.sh: unknown shape '$s' (qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2 ;;
    esac
done
for b in "${batches[@]}"; do
    case "$b" in
    '' | *[!0-9]* | 0) echo "run_decode_gpu.sh: bad batch size '$b' in BATCHES" >&2; exit 2 ;;
    esac
done
here=$(cd "$(dirname "$0")" && pwd)
bench=$build/bench/bench_decode_gpu
[ -x "$bench" ] || { echo "run_decode_gpu.sh: no $bench (build it first)" >&2; exit 1; }
if [ -n "${OUT:-}" ]; then
    logs=$OUT/decode_bench
    mkdir -p "$logs" || { echo "run_decode_gpu.sh: cannot make $logs" >&2; exit 1; }
else
    logs=$(mktemp -d /tmp/troupe-decode-bench-XXXXXX) || { echo "run_decode_gpu.sh: mktemp failed" >&2; exit 1; }
    trap 'rm -rf "$logs"' EXIT
fi
echo "run_decode_gpu.sh: logs in $logs"

backend=cuda
[ "$mode" = gpu ] || backend=cpu
have_peer=0
if [ ! -f "$anchors/decode_nccl_anchor.py" ] || [ ! -f "$anchors/torch_anchor.py" ]; then
    echo "run_decode_gpu.sh: note: no decode_nccl_anchor.py and torch_anchor.py in $anchors; the peer is skipped"
elif ! python3 -c 'import torch, transformers' 2>"$logs/peer_import.err"; then
    echo "run_decode_gpu.sh: note: the peer is skipped (torch or transformers does not import: $(tail -n 1 "$logs/peer_import.err"))"
else
    have_peer=1
fi

status=0
for s in "${shapes[@]}"; do
    for b in "${batches[@]}"; do
        for md in "${modes[@]}"; do
            inv=1
            [ "$md" = fastest ] && inv=0
            f="$logs/troupe_${s}_${b}_$md.txt"
            echo "== troupe $s batch $b ($backend, $md)"
            if ! TROUPE_BACKEND=$backend TROUPE_CUDA_BATCH_INVARIANT=$inv "$bench" "$s" "$b" 1 \
                "$plen" "$new" >"$f" 2>&1; then
                echo "run_decode_gpu.sh: $s batch $b ($md): bench_decode_gpu failed; the end of its output:" >&2
                tail -n 5 "$f" >&2
                status=1
            fi
            cat "$f"
        done
        [ "$have_peer" = 1 ] || continue
        echo "== peer $s batch $b"
        if [ "$mode" = tiny ]; then
            peer=(python3 "$here/decode_peer_cpu.py" "$anchors" "$s" "$b")
        else
            peer=(python3 "$anchors/decode_nccl_anchor.py" decode "$s" "$b")
        fi
        if ! timeout "${PEER_TIMEOUT:-420}" "${peer[@]}" >"$logs/peer_${s}_$b.txt" 2>"$logs/peer_${s}_$b.err"; then
            echo "run_decode_gpu.sh: $s batch $b: the peer failed; the end of $logs/peer_${s}_$b.err:" >&2
            tail -n 10 "$logs/peer_${s}_$b.err" >&2
            status=1
        fi
        grep '^{' "$logs/peer_${s}_$b.txt"
    done
done

# The per-run lines and the table, from the outputs kept in $logs.
python3 - "$logs" "$mode" "${modes[*]}" "${#shapes[@]}" "${shapes[@]}" "${batches[@]}" <<'PY' || status=1
import json, os, sys

logs, mode, modes, ns = sys.argv[1], sys.argv[2], sys.argv[3].split(), int(sys.argv[4])
shapes, batches = sys.argv[5:5 + ns], [int(b) for b in sys.argv[5 + ns:]]
BW, PEAK = 4.3e12, 790e12
DIMS = {  # hidden, intermediate, layers, heads, kv heads, vocabulary (bench/gpu_shape.h)
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936),
    "tiny": (64, 128, 2, 4, 2, 151936),
}


def params(shape):
    d, i, L, H, K, V = DIMS[shape]
    h = d // H
    q, kv = H * h, K * h
    layer = d * (q + 2 * kv) + (q + 2 * kv) + q * d + 3 * d * i + 2 * d
    return V * d + L * layer + d


def roofline_step(shape, B, P, N):
    """Seconds of one decode step at the roofline, the context averaged over the N steps."""
    d, _, L, H, K, _ = DIMS[shape]
    n, c = params(shape), P + (N + 1) / 2
    weights = 2 * n
    kv = B * c * L * 2 * K * (d // H) * 2
    flops = 2 * n * B + 4 * B * L * d * c
    return max((weights + kv) / BW, flops / PEAK)


def troupe(path):
    if not os.path.exists(path):
        return None
    for line in reversed(open(path).read().splitlines()):
        if line.startswith("troupe decode "):
            return dict(f.split("=", 1) for f in line.split()[2:])
    return None


def peer(path):
    if not os.path.exists(path):
        return None
    for line in reversed(open(path).read().splitlines()):
        if line.startswith("{"):
            r = json.loads(line)
            if r.get("kind") == "generate":
                return r
    return None


rows, failed = [], False
for s in shapes:
    for b in batches:
        p = peer(os.path.join(logs, f"peer_{s}_{b}.txt"))
        pt = float(p["gen_tokens_per_s"]) if p else None
        ts = {md: troupe(os.path.join(logs, f"troupe_{s}_{b}_{md}.txt")) for md in modes}
        failed = failed or any(t is None for t in ts.values())
        any_t = next((t for t in ts.values() if t), None)
        step = roofline_step(s, b, int(any_t["plen"]) if any_t else 256,
                             int(any_t["new"]) if any_t else 256)
        roof = b / step
        cells = {}
        for md, t in ts.items():
            if not t:
                cells[md] = None
                continue
            tt = float(t["tok/s"])
            steps, ds = int(t["decode_steps"]), float(t["decode_s"])
            dfrac = step / (ds / steps) if steps and ds > 0 else 0.0
            print(f"{s} batch {b} {md}: troupe {tt:,.0f} tok/s ({float(t['s']):.3f} s, prefill "
                  f"{float(t['s']) - ds:.3f} s), decode steps {1e3 * ds / max(steps, 1):.3f} ms each; "
                  f"roofline {1e3 * step:.3f} ms a step, {roof:,.0f} tok/s (weights "
                  f"{2 * params(s) / 1e9:.2f} GB); fraction {100 * tt / roof:.1f}% (decode steps "
                  f"alone {100 * dfrac:.1f}%)")
            cells[md] = (tt, tt / roof, dfrac)
        if p:
            print(f"{s} batch {b}: peer {pt:,.0f} tok/s ({p['s']} s timed, first call {p['first_call_s']} s)")
        rows.append((s, b, cells, pt))

fmt = lambda v: f"{v:,.0f}" if v is not None else "n/a"
title = "decode, prompt 256 + 256 new, random weights"
if mode == "tiny":
    title += " (CPU smoke test: the figures measure nothing)"
print(f"\n{title}\n")
head = "| shape | batch | peer tok/s (HF static cache + compile) |"
for md in modes:
    head += f" troupe {md} tok/s | / peer | % of roofline (decode steps) |"
print(head)
print("|---|---|---|" + "---|---|---|" * len(modes))
for s, b, cells, pt in rows:
    line = f"| {s} | {b} | {fmt(pt)} |"
    for md in modes:
        c = cells.get(md)
        if not c:
            line += " n/a | n/a | n/a |"
            continue
        tt, frac, dfrac = c
        ratio = f"{tt / pt:.2f}x" if pt else "n/a"
        line += f" {fmt(tt)} | {ratio} | {100 * frac:.1f}% ({100 * dfrac:.1f}%) |"
    print(line)
sys.exit(1 if failed else 0)
PY
exit "$status"
