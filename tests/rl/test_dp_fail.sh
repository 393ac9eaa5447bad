#!/usr/bin/env bash
# A data-parallel rank killed in the middle of training (`troupe run`, SFT with dp 3 on the
# quickstart model): its peers, waiting for it in a collective, fail within 10 s; the run
# stops with an error naming the killed rank; no worker outlives it; the last checkpoint is
# intact and the run resumes from it on 2 ranks.
set -u
troupe="$1"
src="$(cd "${TROUPE_SOURCE_ROOT:-.}" && pwd)"
tmp=$(mktemp -d /tmp/troupe-dpfail-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
now_ms() { date +%s%3N; }

cat > "$tmp/sft.yaml" <<EOF
workflow: sft
backend: cpu
seed: 2
run_dir: $tmp/run
threads: 1
models:
  policy:
    path: $src/examples/arith/model
    parallel: {dp: 3}
    optim: {lr: 3.0e-4}
data: {train: $src/examples/arith/sft.jsonl, chat_format: chatml, max_len: 64}
train: {steps: 100000, batch_size: 6, micro_batch_tokens: 128, save_every: 3}
log: {progress: false}
EOF
"$troupe" run "$tmp/sft.yaml" 2> "$tmp/run.err" &
ctl=$!
for _ in $(seq 1200); do
    [ -f "$tmp/run/checkpoints/step_6/run_state.json" ] && break
    sleep 0.05
done
# The worker processes are the controller's children; rank 1 is the one to kill.
victim=""
workers=""
for p in $(pgrep -P $ctl); do
    workers="$workers $p"
    tr '\0' ' ' < /proc/$p/cmdline | grep -q -- "--rank 1 " && victim=$p
done
[ -n "$victim" ]
check "found the worker of policy/1 among the controller's children ($workers)" $?
t0=$(now_ms)
kill -9 $victim
wait $ctl
st=$?
dt=$(( $(now_ms) - t0 ))
echo "the run stopped $dt ms after policy/1 was killed"
[ $st = 1 ]
check "the run exits 1 (got $st)" $?
grep -q "policy/1 (pid $victim) was killed by signal 9" "$tmp/run.err"
check "the error names the killed rank" $?
[ $dt -lt 15000 ]
check "the run stops within 15 s of the kill ($dt ms)" $?
left=0
for p in $workers; do
    [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status 2> /dev/null && left=1
done
[ $left = 0 ]
check "no worker process outlives the run" $?
# The survivors were waiting for rank 1 inside a collective (or met its absence in the next
# one): either they failed on their own once its heartbeat stopped (5 s), or the controller,
# which saw its worker die, stopped the run first. A run that lasted past the heartbeat timeout
# must show the survivors' own failure (test_comm checks that timeout itself).
for r in 0 2; do
    log="$tmp/run/logs/policy-$r.log"
    line=$(grep -m1 -E "stopped responding|aborted by rank" "$log")
    if [ $dt -lt 5000 ] && [ -z "$line" ]; then
        echo "ok: policy/$r was stopped by the controller ($dt ms) before its peer timeout"
        continue
    fi
    [ -n "$line" ]
    check "policy/$r failed its collective once rank 1 was gone" $?
    echo "  $line" | cut -c1-200
done
ls "$tmp/run/checkpoints" | grep -q '^step_[0-9]*$'
check "a complete checkpoint is left" $?
last=$(ls "$tmp/run/checkpoints" | grep '^step_[0-9]*$' | sort -t_ -k2 -n | tail -n1)
for f in run_state.json policy/model.safetensors policy/optim_shards.json policy/trainer_state.json \
         policy/optim_shard_0.safetensors policy/optim_shard_1.safetensors policy/optim_shard_2.safetensors; do
    [ -s "$tmp/run/checkpoints/$last/$f" ] || { echo "missing $last/$f"; false; }
done
check "the last checkpoint ($last) has its weights, every optimizer shard and the manifest" $?
steps=$(( ${last#step_} + 2 ))
"$troupe" run "$tmp/sft.yaml" --resume --set train.steps=$steps --set models.policy.parallel.dp=2 2> "$tmp/resume.err"
check "the run resumes from $last on 2 ranks and completes step $steps" $?
[ -f "$tmp/run/checkpoints/step_$steps/run_state.json" ]
check "the resumed run saved its last step" $?

[ $fail = 0 ] && rm -rf "$tmp"
exit $fail
