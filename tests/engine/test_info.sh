#!/usr/bin/env bash
# `troupe info` on the fixture checkpoints: the parameter count it prints must equal the sum
# of the tensor sizes that torch read from the same files (n_params in *.expected.json, made
# by tools/make_io_fixtures.py), and on the released configurations of tests/fixtures/configs
# the count transformers gives; unsupported architectures and attention windows are refused
# by name; bad directories fail with exit 1 naming the file, and a missing --model is a usage
# error (exit 2).
set -u
troupe="$1"
fix="$2"
fail=0
out=$(mktemp -d /tmp/troupe-info-XXXXXX)
for m in tiny-llama tiny-qwen2-sharded tiny-mistral-rm; do
    want=$(grep -o '"n_params": *[0-9]*' "$fix/$m.expected.json" | grep -o '[0-9]*$')
    if ! "$troupe" info --model "$fix/$m" --tokens 64 >"$out/$m.txt" 2>&1; then
        echo "FAIL: $m: exit $?"; cat "$out/$m.txt"; fail=1; continue
    fi
    got=$(awk '/^parameters / {print $2}' "$out/$m.txt")
    if [ -z "$want" ] || [ "$got" != "$want" ]; then
        echo "FAIL: $m: parameters '$got', torch counted '$want'"; fail=1
    fi
    arch=$(tr -d ' \n' <"$fix/$m/config.json" | grep -o '"architectures":\["[A-Za-z0-9]*"' | grep -o '"[A-Za-z0-9]*"$' | tr -d '"')
    grep -q "^architecture  $arch " "$out/$m.txt" || { echo "FAIL: $m: architecture $arch not shown"; fail=1; }
done
# Released configurations (config.json only): the count equals what transformers builds from
# the same file (tests/fixtures/configs/expected.json, tools/make_config_fixtures.py). The
# plan gets a budget no model here exceeds, so only the count and shape are under test.
configs="$fix/../configs"
n_released=0
for d in "$configs"/*/; do
    m=$(basename "$d")
    want=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["n_params"])' \
        "$configs/expected.json" "$m" 2>/dev/null)
    if ! "$troupe" info --model "$d" --backend cpu --memory-gb 4096 --tokens 512 >"$out/$m.txt" 2>&1; then
        echo "FAIL: $m: exit $?"; cat "$out/$m.txt"; fail=1; continue
    fi
    got=$(awk '/^parameters / {print $2}' "$out/$m.txt")
    if [ -z "$want" ] || [ "$got" != "$want" ]; then
        echo "FAIL: $m: parameters '$got', transformers counted '$want'"; fail=1
    else
        printf '%-16s %14s parameters, as transformers\n' "$m" "$got"
    fi
    n_released=$((n_released + 1))
done
[ "$n_released" = 11 ] || { echo "FAIL: $n_released released configs, want 11"; fail=1; }
grep -q "^qk norm       yes" "$out/Qwen3-0.6B.txt" || { echo "FAIL: Qwen3 qk norm not shown"; fail=1; }
# Bytes per parameter by precision: a trained role keeps fp32 masters, gradients and two Adam
# moments (16 bytes) plus a bf16 working copy (2) in bf16; a frozen role keeps the working copy.
grep -q "^bytes/param   16 trained (policy, critic), 4 frozen" "$out/Qwen3-0.6B.txt" ||
    { echo "FAIL: fp32 bytes per parameter"; fail=1; }
"$troupe" info --model "$configs/Qwen3-0.6B" --backend cpu --precision bf16 --memory-gb 4096 \
    --tokens 512 >"$out/bf16.txt" 2>&1
grep -q "^precision     bf16 weights, bf16 activations" "$out/bf16.txt" &&
    grep -q "^bytes/param   18 trained (policy, critic), 2 frozen" "$out/bf16.txt" &&
    grep -q "fp32 masters .*working copy" "$out/bf16.txt" ||
    { echo "FAIL: bf16 memory plan"; cat "$out/bf16.txt"; fail=1; }
"$troupe" info --model "$configs/Qwen3-0.6B" --precision fp16 >/dev/null 2>&1
[ $? = 2 ] || { echo "FAIL: --precision fp16 accepted"; fail=1; }
grep -q "head_dim 128" "$out/Qwen3-0.6B.txt" || { echo "FAIL: Qwen3-0.6B head_dim"; fail=1; }
# --tp: one rank's shard (Qwen2.5-7B at tp 4: 7 query heads and its key/value head each; the
# weights a quarter of tp 1's and more than a fifth), and a tp that splits 28 heads unevenly.
for tp in 1 4; do
    "$troupe" info --model "$configs/Qwen2.5-7B" --backend cpu --memory-gb 4096 --tokens 512 --tp $tp \
        >"$out/q7b.$tp.txt" 2>&1 || { echo "FAIL: --tp $tp"; cat "$out/q7b.$tp.txt"; fail=1; }
done
grep -q "^tensor par.   tp 4: 7 query and 1 key/value heads, 4736 intermediate" "$out/q7b.4.txt" ||
    { echo "FAIL: --tp 4 shape"; cat "$out/q7b.4.txt"; fail=1; }
w1=$(awk '/^  weights/ {print $2}' "$out/q7b.1.txt")
w4=$(awk '/^  weights/ {print $2}' "$out/q7b.4.txt")
awk -v a="$w1" -v b="$w4" 'BEGIN {exit !(b < a / 3.9 && b > a / 5)}' ||
    { echo "FAIL: --tp 4 weights $w4 MiB against $w1"; fail=1; }
# Sequence parallelism: --tp shows the training activations with and without it (less with),
# --sequence-parallel plans with it (the arena's train part is the smaller number), and asks
# for --tp 2 or more.
grep -q "^sequence par. off (--sequence-parallel): training activations .* MiB per rank with it" "$out/q7b.4.txt" ||
    { echo "FAIL: --tp 4 sequence parallelism line"; cat "$out/q7b.4.txt"; fail=1; }
"$troupe" info --model "$configs/Qwen2.5-7B" --backend cpu --memory-gb 4096 --tokens 512 --tp 4 \
    --sequence-parallel >"$out/q7b.sp.txt" 2>&1 || { echo "FAIL: --sequence-parallel"; cat "$out/q7b.sp.txt"; fail=1; }
with=$(sed -n 's/^sequence par. on: training activations \([0-9.]*\) MiB per rank with it, \([0-9.]*\) MiB without.*/\1 \2/p' "$out/q7b.sp.txt")
train=$(sed -n 's/^  arena .*max(train \([0-9.]*\),.*/\1/p' "$out/q7b.sp.txt")
train_off=$(sed -n 's/^  arena .*max(train \([0-9.]*\),.*/\1/p' "$out/q7b.4.txt")
set -- $with
awk -v w="${1:-0}" -v wo="${2:-0}" -v t="$train" -v t0="$train_off" \
    'BEGIN {exit !(w > 0 && w < wo && t == w && t0 == wo)}' ||
    { echo "FAIL: sequence-parallel activations '$with', arena train $train (without: $train_off)"; fail=1; }
"$troupe" info --model "$configs/Qwen2.5-7B" --sequence-parallel >/dev/null 2>&1
[ $? = 2 ] || { echo "FAIL: --sequence-parallel without --tp accepted"; fail=1; }
"$troupe" info --model "$configs/Qwen2.5-7B" --tp 3 >"$out/tp3.txt" 2>&1
[ $? = 1 ] && grep -q "tp 3 does not divide the 28 query heads" "$out/tp3.txt" ||
    { echo "FAIL: --tp 3"; cat "$out/tp3.txt"; fail=1; }

# Refused by name: a mixture-of-experts class, and Mistral-7B-v0.1's 4096-token window over
# a 32768-token context.
mkdir -p "$out/moe" "$out/window"
sed -e 's/"Qwen3ForCausalLM"/"Qwen3MoeForCausalLM"/' -e 's/"qwen3"/"qwen3_moe"/' \
    "$configs/Qwen3-0.6B/config.json" >"$out/moe/config.json"
"$troupe" info --model "$out/moe" >"$out/moe.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "Qwen3MoeForCausalLM.*mixture-of-experts" "$out/moe.txt" ||
    { echo "FAIL: MoE config: exit $rc"; cat "$out/moe.txt"; fail=1; }
sed -e 's/"sliding_window": null/"sliding_window": 4096/' \
    "$configs/Mistral-7B-v0.3/config.json" >"$out/window/config.json"
"$troupe" info --model "$out/window" >"$out/window.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "sliding_window 4096 is shorter than the context" "$out/window.txt" ||
    { echo "FAIL: sliding window: exit $rc"; cat "$out/window.txt"; fail=1; }

grep -q "^weights       sharded safetensors with index, checked" "$out/tiny-qwen2-sharded.txt" || { echo "FAIL: shards"; fail=1; }
grep -q "^tied embed    yes" "$out/tiny-qwen2-sharded.txt" || { echo "FAIL: tied"; fail=1; }

# Broken: a truncated weights file, a missing directory, no --model.
cp -r "$fix/tiny-llama" "$out/broken"
truncate -s 5000 "$out/broken/model.safetensors"
"$troupe" info --model "$out/broken" >"$out/broken.txt" 2>&1
rc=$?
[ $rc = 1 ] || { echo "FAIL: truncated weights: exit $rc"; fail=1; }
grep -q "broken/model.safetensors" "$out/broken.txt" || { echo "FAIL: file not named"; cat "$out/broken.txt"; fail=1; }
"$troupe" info --model "$out/nowhere" >"$out/nowhere.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "nowhere/config.json" "$out/nowhere.txt" || { echo "FAIL: missing dir: exit $rc"; fail=1; }
"$troupe" info >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: no --model: exit $rc"; fail=1; }
"$troupe" info --model "$fix/tiny-llama" --tokens -1 >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: --tokens -1: exit $rc"; fail=1; }
"$troupe" info --model "$fix/tiny-llama" --recompute maybe >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: --recompute maybe: exit $rc"; fail=1; }
# Without --tokens the plan chooses, as a run's train.micro_batch_tokens 0 does: with memory
# to spare, its largest micro-batch (16384 tokens); --recompute on keeps one layer set.
"$troupe" info --model "$configs/Qwen3-0.6B" --backend cpu --memory-gb 4096 >"$out/plan.txt" 2>&1 &&
    grep -q "16384 tokens per micro-batch (the plan's choice)" "$out/plan.txt" ||
    { echo "FAIL: the plan's micro-batch"; cat "$out/plan.txt"; fail=1; }
"$troupe" info --model "$configs/Qwen3-0.6B" --backend cpu --memory-gb 4096 --recompute on >"$out/rec.txt" 2>&1 &&
    grep -q "activations recomputed in backward" "$out/rec.txt" ||
    { echo "FAIL: --recompute on"; cat "$out/rec.txt"; fail=1; }
[ $fail = 0 ] && rm -rf "$out"
exit $fail
