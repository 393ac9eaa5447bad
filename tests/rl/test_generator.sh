#!/usr/bin/env bash
# Generation on a generator group of its own (`troupe run`, GRPO on the quickstart model,
# worker processes on one machine): with 1 and with 2 replicas, and the weights synced after
# every optimizer step (checksums compared on every sync), the run equals the colocated one
# bit for bit -- its metrics and its final weights; a generator of another tensor-parallel
# layout than the policy's gets its part of the weights and the run logs how far sampling's
# logprobs are from training's; the one-step-off pipeline runs, logs staleness 1 and the
# truncated importance weights; a generator reading the policy's weights in place (shared
# memory, double-buffered one step off) equals the copying runs; a generator rank killed
# mid-run stops the run with an error naming it, leaves no worker behind, and the last
# checkpoint resumes.
set -u
troupe="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
src="$(cd "${TROUPE_SOURCE_ROOT:-.}" && pwd)"
check="$src/tests/rl/check_generator.py"
same="$src/tests/rl/check_dp.py"
tmp=$(mktemp -d /tmp/troupe-gen-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
run() {  # run NAME [--set ...]
    local name=$1
    shift
    (cd "$src" && "$troupe" run configs/quickstart.yaml --set run_dir="$tmp/$name" "${base[@]}" "$@") 2> "$tmp/$name.err"
    local st=$?
    [ $st = 0 ] || tail -n 20 "$tmp/$name.err"
    return $st
}
now_ms() { date +%s%3N; }

# 4 steps of 16 prompts x 8 samples, 2 mini-batches, dynamic sampling as shipped (a second
# round of generation in some steps), eval at steps 0 and 4.
base=(--set train.steps=4 --set threads=1 --set train.save_every=4 --set train.eval_every=0
      --set algorithm.mini_batches=2 --set log.progress=false --set log.tensorboard=false --set log.samples_every=0)
ck=checkpoints/step_4/policy/model.safetensors

run colo
check "colocated run exits 0" $?
for n in 1 2; do
    run gen$n --set "models.generator={replicas: $n, verify_sync: true, sync_bucket_mb: 1}"
    check "run with a $n-replica generator exits 0 (every sync's checksums equal)" $?
    python3 "$same" same "$tmp/gen$n/$ck" "$tmp/colo/$ck"
    check "$n replica(s): final weights bit for bit the colocated run's" $?
    python3 "$check" same "$tmp/colo" "$tmp/gen$n"
    check "$n replica(s): every metric of every step equals the colocated run's" $?
    python3 "$check" sync "$tmp/gen$n" 4
    check "$n replica(s): sync time and GB/s logged every step, staleness 0" $?
done
grep -q "generator/1\] generate: 8 prompts x 8 samples" "$tmp/gen2/logs/generator-1.log"
check "2 replicas: each samples half of the prompts" $?
grep -q "sync_weights: sent weights of step 8" "$tmp/gen2/logs/policy-0.log"
check "the policy sent the weights of its 8th optimizer step" $?

# Another tensor-parallel layout: the sync reshards (the policy at tp 1 to a generator of tp 2,
# the policy at tp 2 to two replicas of tp 1), every sync's checksums agree, and sampling's
# logprobs, now of another layout, differ from training's by rounding, measured every step.
for lay in "tp12|models.policy.parallel.tp=1|{parallel: {tp: 2}, verify_sync: true, sync_bucket_mb: 1}" \
           "tp21|models.policy.parallel.tp=2|{replicas: 2, verify_sync: true, sync_bucket_mb: 1}"; do
    IFS='|' read -r name pol gen <<< "$lay"
    run $name --set $pol --set "models.generator=$gen" --set train.steps=2 --set train.save_every=2
    check "$name: the run exits 0 (every sync's checksums equal)" $?
    python3 "$check" sync "$tmp/$name" 2 1e-3
    check "$name: logprob_diff/max logged every step, finite and below 1e-3" $?
done

# One step off: the generator samples step k+1 while the policy trains step k.
run pipe --set "models.generator={replicas: 2, one_step_off: true}" --set rollout.dynamic_sampling=false
check "one-step-off run exits 0" $?
python3 "$check" pipeline "$tmp/pipe" 4 2
check "one-step-off: staleness 1 (2 optimizer steps) after step 1, truncated-IS metrics every step" $?

# Shared weights (share_weights: yes; the CPU's shared memory stands in for CUDA IPC on one
# GPU): the generator reads the policy's working weights in place. One step off they live in
# two buffers, the policy writing the one not published, and the run equals the copying
# pipeline's bit for bit; without the pipeline one buffer serves, and the run equals the
# colocated one.
run share2 --set "models.generator={one_step_off: true, share_weights: yes, verify_sync: true}" \
    --set rollout.dynamic_sampling=false
check "shared weights, one step off: the run exits 0 (every sync's checksums equal)" $?
python3 "$check" same "$tmp/pipe" "$tmp/share2" && python3 "$same" same "$tmp/share2/$ck" "$tmp/pipe/$ck"
check "shared weights, one step off: every metric and the final weights equal the copying pipeline's" $?
flips=$(grep -c "is published; writing buffer" "$tmp/share2/logs/policy-0.log")
reads=$(grep -o "reading shared buffer [01]" "$tmp/share2/logs/generator-0.log" | awk '{print $4}' | tr -d '\n')
[ "$flips" = 4 ] && [ "$reads" = 01010 ]
check "shared weights, one step off: each train writes the other buffer ($flips flips), syncs alternate ($reads)" $?
run share1 --set "models.generator={share_weights: yes, verify_sync: true}"
check "shared weights, one buffer: the run exits 0" $?
python3 "$check" same "$tmp/colo" "$tmp/share1" && python3 "$same" same "$tmp/share1/$ck" "$tmp/colo/$ck"
check "shared weights, one buffer: every metric and the final weights equal the colocated run's" $?
! grep -q "writing buffer" "$tmp/share1/logs/policy-0.log"
check "shared weights, one buffer: never moved" $?

# A generator rank killed mid-run.
run kill --set "models.generator={replicas: 2, one_step_off: true}" --set rollout.dynamic_sampling=false \
    --set train.steps=100000 --set train.save_every=2 --set train.eval_every=0 --set data.eval= &
ctl=$!
for _ in $(seq 1200); do
    [ -f "$tmp/kill/checkpoints/step_2/run_state.json" ] && break
    sleep 0.05
done
# The controller is the subshell's child; its workers are its children.
victim=""
workers=""
for c in $(pgrep -P $ctl); do
    for p in $(pgrep -P $c); do
        workers="$workers $p"
        tr '\0' ' ' < /proc/$p/cmdline | grep -q -- "--role generator .*--rank 1 " && victim=$p
    done
done
[ -n "$victim" ]
check "found the worker of generator/1 ($workers)" $?
t0=$(now_ms)
kill -9 $victim
wait $ctl
st=$?
dt=$(( $(now_ms) - t0 ))
echo "the run stopped $dt ms after generator/1 was killed"
[ $st = 1 ]
check "the run exits 1 (got $st)" $?
grep -q "generator/1 (pid $victim) was killed by signal 9" "$tmp/kill.err"
check "the error names the killed generator rank" $?
[ $dt -lt 15000 ]
check "the run stops within 15 s of the kill ($dt ms)" $?
left=0
for p in $workers; do
    [ -d /proc/$p ] && ! grep -q '^State:.*Z' /proc/$p/status 2> /dev/null && left=1
done
[ $left = 0 ]
check "no worker process outlives the run" $?
last=$(ls "$tmp/kill/checkpoints" | grep '^step_[0-9]*$' | sort -t_ -k2 -n | tail -n1)
steps=$(( ${last#step_} + 1 ))
run kill --resume --set "models.generator={replicas: 1, one_step_off: true}" --set rollout.dynamic_sampling=false \
    --set train.steps=$steps --set train.save_every=2 --set data.eval=
check "the run resumes from $last on one generator replica and completes step $steps" $?

[ $fail = 0 ] && rm -rf "$tmp"
exit $fail
