#!/usr/bin/env bash
# Tensor parallelism on a machine with 2 GPUs, from the repository root with .debs/ carried
# (tools/fetch_gpu_deps.sh): builds with CUDA, then (1) `troupe logprobs` and `generate` at
# --tp 2 (also with --sequence-parallel) against --tp 1 on the fixture models in fp32 and
# bf16, greedy and sampled (top-k with top-p, drawn by the vocab-parallel sampler),
# (2) tests/engine/test_model_tp on CUDA (one rank per GPU), (3) pretraining throughput of the
# Qwen2.5-1.5B shape (random weights, rows of 4096 tokens, micro-batches of one row) at tp 1,
# tp 2 (with and without sequence parallelism) and dp 2. `bench/run_tp_gpu.sh big` instead runs
# two pretraining steps of the Qwen2.5-7B shape with tp 2. Logs and a summary in $OUT.
set -u
export NCCL_NVLS_ENABLE=0   # NVLink multicast stays off on shared machines
out=${OUT:-/tmp/tp-gpu}
mkdir -p "$out"
sum="$out/summary.txt"
say() { echo "$*" | tee -a "$sum"; }
if [ ! -x build-cuda/cli/troupe ]; then
    tools/gpu_deps.sh > "$out/deps.log" 2>&1 || { say "gpu_deps failed"; exit 1; }
fi
. .deps-root/env.sh
# Always through ninja: a build folder left on a warm machine must take the current sources.
([ -d build-cuda ] || meson setup build-cuda -Dcuda=enabled -Dwerror=false) > "$out/setup.log" 2>&1 &&
    ninja -C build-cuda cli/troupe tests/engine/test_model_tp > "$out/build.log" 2>&1 ||
    { say "build failed"; tail -30 "$out/build.log"; exit 1; }
t=$PWD/build-cuda/cli/troupe
fx=tests/fixtures/models
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$sum"

# pretrain NAME CONFIG TP DP STEPS SEQ ROWS [SP]: a run from random weights on the arith token
# data (SP true: sequence parallelism).
pretrain() {
    local name=$1 cfg=$2 tp=$3 dp=$4 steps=$5 seq=$6 rows=$7 sp=${8:-false}
    local devs="[0]"
    [ $((tp * dp)) = 2 ] && devs="[0, 1]"
    "$t" run configs/quickstart-pretrain.yaml --set backend=cuda --set run_dir="$out/$name" \
        --set models.policy.init.config="$cfg" --set data.chat_format=none --set data.seq_len=$seq \
        --set train.batch_size=$rows --set train.micro_batch_tokens=$((seq + 64)) --set train.steps=$steps \
        --set train.eval_every=0 --set train.save_every=0 --set log.progress=false \
        --set models.policy.parallel.tp=$tp --set models.policy.parallel.dp=$dp \
        --set models.policy.parallel.sequence_parallel=$sp \
        --set "models.policy.devices=$devs" > "$out/$name.log" 2>&1
    local st=$?
    [ $st = 0 ] || tail -20 "$out/$name.log" "$out/$name"/logs/* 2>/dev/null | tail -40
    python3 - "$out/$name/metrics.jsonl" "$name" <<'PY' | tee -a "$sum"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
rows = [r for r in rows if "loss" in r]
tail = rows[1:-1] or rows   # the first step warms up, the last also evaluates
if not tail: print(sys.argv[2], "no metrics"); sys.exit(0)
tps = sorted(r["throughput/tokens_per_s"] for r in tail)
print(f"{sys.argv[2]}: {len(rows)} steps, loss {rows[-1]['loss']:.4f}, median tokens/s {tps[len(tps)//2]:.0f}, "
      f"step time {tail[-1]['time/step']:.2f} s")
PY
    return $st
}

if [ "${1:-}" = big ]; then
    mkdir -p "$out/q7b"
    cp tests/fixtures/configs/Qwen2.5-7B/config.json "$out/q7b/"
    pretrain q7b_tp2 "$out/q7b/config.json" 2 1 2 2048 8
    say "7B shape, tp 2: exit $?"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader >> "$sum"
    exit 0
fi

# (1) commands at --tp 2 against --tp 1
close() {  # close A B: max |a - b| over the logprobs of two JSONL outputs
    python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
b = [json.loads(l)["logprobs"] for l in open(sys.argv[2])]
assert len(a) == len(b) and all(len(x) == len(y) for x, y in zip(a, b))
print(max((abs(x - y) for u, v in zip(a, b) for x, y in zip(u, v)), default=0.0))
PY
}
for prec in fp32 bf16; do
    for m in llama3 qwen2 llama_bias qwen3; do
        for tp in 1 2 sp; do
            args="--tp $tp"
            [ $tp = sp ] && args="--tp 2 --sequence-parallel"
            "$t" logprobs --backend cuda --precision $prec --model $fx/$m --data $fx/$m/logprobs_input.jsonl \
                $args > "$out/lp.$m.$prec.$tp" 2> "$out/lp.err" || { say "logprobs $m $prec $args failed"; cat "$out/lp.err"; }
        done
        say "logprobs $m $prec: tp 2 vs tp 1 max |diff| $(close "$out/lp.$m.$prec.2" "$out/lp.$m.$prec.1"), with sequence parallelism $(close "$out/lp.$m.$prec.sp" "$out/lp.$m.$prec.1"), tp 1 vs transformers (fp32) $(close "$out/lp.$m.$prec.1" $fx/$m/logprobs_expected.jsonl)"
    done
    g=tests/fixtures/generate/chat_qwen2
    for mode in greedy sampled; do
        smp="--temperature 0"
        [ $mode = sampled ] && smp="--n 4 --seed 3 --top-k 50 --top-p 0.9"
        for tp in 1 2; do
            "$t" generate --backend cuda --precision $prec --model $g --prompts $g/prompts.jsonl $smp \
                --max-new-tokens 16 --tp $tp > "$out/gen.$prec.$tp" 2> "$out/gen.err" || { say "generate $prec tp $tp failed"; cat "$out/gen.err"; }
        done
        python3 - "$out/gen.$prec.1" "$out/gen.$prec.2" "$mode $prec" <<'PY' | tee -a "$sum"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
same = [x["output_ids"] == y["output_ids"] for x, y in zip(a, b)]
d = max((abs(p - q) for x, y in zip(a, b) if x["output_ids"] == y["output_ids"] for p, q in zip(x["logprobs"], y["logprobs"])), default=0.0)
print(f"generate {sys.argv[3]}: tp 2 tokens equal tp 1's for {sum(same)} of {len(same)} samples, logprobs max |diff| {d:.3g}")
PY
    done
done
# (2) the engine test on CUDA, one rank per GPU (tp 4 and tp 2 x dp 2 need 4 and are skipped)
TROUPE_BACKEND=cuda TROUPE_SOURCE_ROOT=$PWD build-cuda/tests/engine/test_model_tp > "$out/test_model_tp.log" 2>&1
say "test_model_tp on cuda: exit $? ($(tail -1 "$out/test_model_tp.log"))"
grep -E "tp [0-9]|generation" "$out/test_model_tp.log" >> "$sum"
# (3) throughput of the 1.5B shape: one GPU, tp 2, dp 2
q15=tests/fixtures/configs/Qwen2.5-1.5B/config.json
pretrain q15_tp1 $q15 1 1 6 4096 8
pretrain q15_tp2 $q15 2 1 6 4096 8
pretrain q15_tp2sp $q15 2 1 6 4096 8 true
pretrain q15_dp2 $q15 1 2 6 4096 8
exit 0
