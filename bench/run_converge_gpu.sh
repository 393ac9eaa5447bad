#!/usr/bin/env bash
# The convergence check of issue 13 (item 7), in one invocation on the GPU machine: 200 steps
# of the Qwen2.5-0.5B shape (micro-batch 8 x 2048) trained by troupe from the initialisation of
# torch's seed-0 run, on the same real text, beside torch runs of seeds 0, 1 and 2; troupe
# tracks torch when |troupe - torch seed 0| stays within the spread of the three seeds.
#   1. bench/converge_data.py gathers text the machine holds offline (/usr/share/doc,
#      /usr/share/common-licenses, the docs of Python's site-packages), trains a byte-level BPE
#      tokenizer on it (16384 ids) and writes the corpus as one int32 token stream;
#   2. bench/converge_peer.py trains transformers' Qwen2 (bf16 autocast over fp32, fused AdamW)
#      for seeds 0, 1, 2; seed 0 first saves its initialisation as an HF checkpoint;
#   3. BUILD_DIR/bench/converge_gpu (troupe, cuda, the backend's precision) trains that
#      checkpoint on the same windows with the same optimizer;
#   4. bench/converge_table.py prints the table and the verdict line.
# usage: bench/run_converge_gpu.sh [--tiny] BUILD_DIR [STEPS]
#   --tiny: a 2-layer model of width 64, 20 steps of 2 x 128 tokens, 400 KB of text and 1024
#   ids, on the CPU backend in fp32 and torch on the CPU: the whole pipeline in a minute on a
#   laptop, e.g. PYTHON=.venv/bin/python bench/run_converge_gpu.sh --tiny build
# Needs python3 (or $PYTHON) with torch, transformers and tokenizers; no network (every input is
# made on the fly in a temporary folder, removed at the end unless CONVERGE_KEEP=1). Results go
# to $CONVERGE_OUT, else $OUT/converge when $OUT is set, else /tmp/troupe-converge-DATE: the
# table, each run's losses as JSON lines (troupe.jsonl, torch_seed{0,1,2}.jsonl, merged.jsonl),
# their logs, tokenizer.json and corpus.json. The whole run stays within CONVERGE_BUDGET_S
# seconds (default 540): the torch runs go first, troupe gets what is left, and a run cut short
# still reports the steps it made. On the GPU machine, building in the same command (the
# budget is what the 600 s limit leaves after the build; bash's SECONDS counts from its start):
#   { [ -d build-cuda ] || meson setup build-cuda -Dcuda=enabled -Dlayers=engine; } &&
#   ninja -C build-cuda && CONVERGE_BUDGET_S=$((570 - SECONDS)) bench/run_converge_gpu.sh build-cuda
# troupe's attention kernel is the backend's default unless TROUPE_CUDA_FLASH_ATTENTION=1 is
# set; the run prints which.
set -u
tiny=0
if [ "${1:-}" = "--tiny" ]; then
    tiny=1
    shift
fi
build=${1:?usage: run_converge_gpu.sh [--tiny] BUILD_DIR [STEPS]}
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python3}
budget=${CONVERGE_BUDGET_S:-540}
t_start=$SECONDS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=true

# Every setting both sides share is set here once and passed to both.
if [ $tiny = 1 ]; then
    steps=${2:-20} shape=tiny mb=2 seq=128 lr=1e-3 warmup=5 wd=0.01 window=5
    max_bytes=400000 vocab=1024 device=cpu precision=fp32
    export TROUPE_BACKEND=cpu TROUPE_PRECISION=fp32
else
    steps=${2:-200} shape=0.5b mb=8 seq=2048 lr=3e-4 warmup=20 wd=0.01 window=10
    max_bytes=32000000 vocab=16384 device=cuda precision=bf16
    export TROUPE_BACKEND=${TROUPE_BACKEND:-cuda}
fi
case $steps in '' | *[!0-9]* | 0) echo "run_converge_gpu: STEPS must be a positive integer" >&2; exit 2 ;; esac
case $budget in '' | *[!0-9]*) echo "run_converge_gpu: CONVERGE_BUDGET_S must be a number of seconds" >&2; exit 2 ;; esac

if [ -n "${CONVERGE_OUT:-}" ]; then
    out=$CONVERGE_OUT
elif [ -n "${OUT:-}" ]; then
    out=$OUT/converge
else
    out=/tmp/troupe-converge-$(date +%Y%m%d-%H%M%S)
fi
if ! mkdir -p "$out"; then
    echo "run_converge_gpu: cannot create the results folder $out" >&2
    exit 1
fi
if ! work=$(mktemp -d /tmp/troupe-converge-work-XXXXXX); then
    echo "run_converge_gpu: cannot create a temporary folder under /tmp" >&2
    exit 1
fi
if [ "${CONVERGE_KEEP:-0}" = 1 ]; then
    echo "inputs kept in $work"
else
    trap 'rm -rf "$work"' EXIT
fi
status=0

left() { echo $((budget - (SECONDS - t_start))); }

# report NAME RC LOG: a failed or cut step, named with the end of its log.
report() {
    local name=$1 rc=$2 log=$3
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "CUT: $name ran out of its time (the time budget is $budget s); its steps so far count"
    else
        echo "FAILED: $name (exit $rc); the end of $log:"
        tail -n 15 "$log" | sed 's/^/    /'
    fi
    status=1
}

# run_logged NAME LIMIT_S LOG OUTFILE CMD...: stdout to OUTFILE, stderr to LOG.
run_logged() {
    local name=$1 limit=$2 log=$3 dest=$4
    shift 4
    if [ "$limit" -lt 10 ]; then
        echo "SKIPPED: $name (the time budget of $budget s is spent)" | tee "$log"
        status=1
        return 1
    fi
    timeout -k 10 "$limit" "$@" >"$dest" 2>"$log"
    local rc=$?
    [ "$rc" = 0 ] || report "$name" "$rc" "$log"
    return "$rc"
}

# summary NAME FILE: one line on a run's steps, its last loss and its time.
summary() {
    "$py" - "$1" "$2" <<'PY'
import json, sys
steps, done = [], None
try:
    lines = open(sys.argv[2]).readlines()
except OSError:
    lines = []
for line in lines:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    if "step" in r: steps.append(r)
    if r.get("kind") == "done": done = r
if steps:
    t = sorted(s["time_s"] for s in steps[1:] or steps)[len(steps[1:] or steps) // 2]
    print(f"{sys.argv[1]}: {len(steps)} steps, loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}, "
          f"median step {t:.3f} s" + (f", {done['seconds']} s in all" if done else ""))
else:
    print(f"{sys.argv[1]}: no steps")
PY
}

{
    echo "run_converge_gpu: $(date -u +%Y-%m-%dT%H:%M:%SZ), $( (git -C "$here" rev-parse --short HEAD || echo no git) 2>/dev/null)"
    echo "shape $shape, $steps steps of $mb x $seq, lr $lr (warmup $warmup, then constant), wd $wd"
    echo "troupe: backend $TROUPE_BACKEND, precision ${TROUPE_PRECISION:-the backend default}," \
         "TROUPE_CUDA_FLASH_ATTENTION=${TROUPE_CUDA_FLASH_ATTENTION:-unset}; torch: $device $precision"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
} | tee "$out/summary.txt"
echo "results in $out"

# 0. Tools: the troupe target (built now if the folder is a meson build) and the Python packages.
if [ -f "$build/build.ninja" ] && command -v ninja >/dev/null && ! ninja -C "$build" bench/converge_gpu >"$out/build.log" 2>&1; then
    report "building $build/bench/converge_gpu" 1 "$out/build.log"
    exit 1
fi
if [ ! -x "$build/bench/converge_gpu" ]; then
    echo "FAILED: $build/bench/converge_gpu does not exist (build $build first)"
    exit 1
fi
if ! "$py" -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)' \
    >"$out/python.log" 2>&1; then
    report "importing torch, transformers and tokenizers with $py" 1 "$out/python.log"
    exit 1
fi
tee -a "$out/summary.txt" <"$out/python.log"

# 1. Corpus, tokenizer, token stream.
echo "== data: corpus up to $max_bytes bytes, tokenizer of $vocab ids"
if ! run_logged "data (converge_data.py)" "$(left)" "$out/data.log" "$out/data.txt" \
    "$py" "$here/converge_data.py" --out "$work/data" --max-bytes "$max_bytes" --vocab "$vocab"; then
    exit 1
fi
tee -a "$out/summary.txt" <"$out/data.txt"
cp "$work/data/tokenizer.json" "$work/data/corpus.json" "$out/" || status=1

# 2. torch: seed 0 saves the initialisation troupe starts from; then seeds 1 and 2.
peer=("$py" "$here/converge_peer.py" --tokens "$work/data/tokens.i32"
      --tokenizer "$work/data/tokenizer.json" --shape "$shape" --steps "$steps" --mb "$mb"
      --seq "$seq" --lr "$lr" --warmup "$warmup" --weight-decay "$wd" --device "$device"
      --precision "$precision")
for seed in 0 1 2; do
    echo "== torch seed $seed"
    extra=()
    [ "$seed" = 0 ] && extra=(--save-init "$work/init")
    # Leave troupe at least a minute of the budget.
    run_logged "torch seed $seed" $(($(left) - 60)) "$out/torch_seed$seed.log" \
        "$out/torch_seed$seed.jsonl" "${peer[@]}" --seed "$seed" "${extra[@]}"
    summary "torch seed $seed" "$out/torch_seed$seed.jsonl" | tee -a "$out/summary.txt"
done
if [ ! -f "$work/init/config.json" ]; then
    echo "FAILED: torch seed 0 saved no initialisation ($work/init), so troupe cannot run"
    exit 1
fi

# 3. troupe from that initialisation, with the time that is left.
echo "== troupe"
run_logged "troupe (converge_gpu)" $(($(left) - 15)) "$out/troupe.log" "$out/troupe.jsonl" \
    "$build/bench/converge_gpu" "$work/init" "$work/data/tokens.i32" --steps "$steps" --mb "$mb" \
    --seq "$seq" --lr "$lr" --warmup "$warmup" --weight-decay "$wd"
summary "troupe" "$out/troupe.jsonl" | tee -a "$out/summary.txt"

# 4. The table and the verdict.
"$py" "$here/converge_table.py" "$out/troupe.jsonl" "$out/torch_seed0.jsonl" \
    "$out/torch_seed1.jsonl" "$out/torch_seed2.jsonl" --window "$window" --steps "$steps" \
    --merged "$out/merged.jsonl" 2>"$out/table.log" | tee "$out/table.md"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || report "the table (converge_table.py)" "$rc" "$out/table.log"
tee -a "$out/summary.txt" <"$out/table.md" >/dev/null
echo "results in $out ($((SECONDS - t_start)) s)"
exit $status
