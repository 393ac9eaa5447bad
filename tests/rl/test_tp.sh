#!/usr/bin/env bash
# Tensor-parallel runs end to end (`troupe run`, worker processes on one machine, the CPU's
# shared-memory communicators formed through the controller's bootstrap): SFT, GRPO (the
# policy generating on its shards) and PPO (policy, reference and critic split) with tp 2,
# and GRPO with tp 2 x dp 2 and with sequence parallelism, against tp 1 -- the same rollouts
# and rewards, parameters after the steps within 1e-6 relative (PPO's reference and critic
# are sequence-parallel); a tp 2 checkpoint resumes at tp 1 and a tp 1 one at tp 2 with
# sequence parallelism; recipes that cannot be split (tp not dividing the query heads, of the
# policy or of a generator; sequence parallelism at tp 1) fail with a message naming the key,
# the role or the numbers.
set -u
troupe="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
src="$(cd "${TROUPE_SOURCE_ROOT:-.}" && pwd)"
check="$src/tests/rl/check_dp.py"
tmp=$(mktemp -d /tmp/troupe-tp-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
run() {  # run NAME RECIPE [--set ...]
    local name=$1 recipe=$2
    shift 2
    (cd "$src" && "$troupe" run "$recipe" --set run_dir="$tmp/$name" "$@" 2> "$tmp/$name.err")
    local st=$?
    [ $st = 0 ] || tail -n 20 "$tmp/$name.err"
    return $st
}

# --- SFT, and resuming across tensor-parallel sizes ---
cat > "$tmp/sft.yaml" <<EOF2
workflow: sft
backend: cpu
seed: 2
run_dir: unused
threads: 1
models:
  policy:
    path: $src/examples/arith/model
    optim: {lr: 3.0e-4, eps: 1.0e-4, schedule: cosine, warmup_steps: 1, grad_clip: 1.0}
data: {train: $src/examples/arith/sft.jsonl, chat_format: chatml, max_len: 64}
train: {steps: 4, batch_size: 5, micro_batch_tokens: 128, save_every: 2}
log: {progress: false}
EOF2
ck4=checkpoints/step_4/policy/model.safetensors
for tp in 1 2; do
    run sft$tp "$tmp/sft.yaml" --set models.policy.parallel.tp=$tp
    check "sft with tp $tp exits 0" $?
done
python3 "$check" close "$tmp/sft2/$ck4" "$tmp/sft1/$ck4" 1e-6
check "sft: tp 2 parameters after 4 steps within 1e-6 of tp 1" $?
python3 "$check" metrics "$tmp/sft1" "$tmp/sft2" tokens lr
check "sft: tp 2 trains on tp 1's tokens at its learning rates" $?
ls "$tmp/sft2/checkpoints/step_4/policy"/optim_exp_avg{,_sq}.safetensors > /dev/null
check "sft: tp 2 saves the Adam moments as whole tensors" $?
# Checkpoints at step 2 of tp 2 and tp 1 runs resume at the other size.
for name in rs21:2 rs12:1; do
    run ${name%:*} "$tmp/sft.yaml" --set models.policy.parallel.tp=${name#*:} --set train.steps=2
    check "sft ${name%:*}: 2 steps with tp ${name#*:}" $?
done
run rs21 "$tmp/sft.yaml" --set models.policy.parallel.tp=1 --resume
check "sft: a tp 2 checkpoint resumes with tp 1" $?
run rs12 "$tmp/sft.yaml" --set models.policy.parallel.tp=2 --set models.policy.parallel.sequence_parallel=true \
    --resume
check "sft: a tp 1 checkpoint resumes with tp 2 and sequence parallelism" $?
for name in rs21 rs12; do
    python3 "$check" close "$tmp/$name/$ck4" "$tmp/sft1/$ck4" 1e-6
    check "sft $name: after 4 steps within 1e-6 of the uninterrupted tp 1 run" $?
done

# --- GRPO: the policy samples on its shards; tp 2 and tp 2 x dp 2 against tp 1 ---
grpo="$src/configs/quickstart.yaml"
gset=(--set train.steps=3 --set threads=1 --set train.save_every=3 --set train.eval_every=0 --set data.eval=
      --set algorithm.mini_batches=2 --set models.policy.optim.eps=1e-6 --set log.progress=false)
ck3=checkpoints/step_3/policy/model.safetensors
run grpo1 "$grpo" "${gset[@]}"
check "grpo with tp 1 exits 0" $?
for layout in "2 1 false" "2 2 false" "2 1 true"; do
    read -r tp dp sp <<<"$layout"
    name=grpo$tp$dp at="tp $tp x dp $dp"
    [ "$sp" = true ] && name=${name}sp at="$at sequence-parallel"
    run $name "$grpo" --set models.policy.parallel.tp=$tp --set models.policy.parallel.dp=$dp \
        --set models.policy.parallel.sequence_parallel=$sp "${gset[@]}"
    check "grpo with $at exits 0" $?
    python3 "$check" close "$tmp/$name/$ck3" "$tmp/grpo1/$ck3" 1e-6
    check "grpo: $at parameters after 3 steps within 1e-6 of tp 1" $?
    python3 "$check" metrics "$tmp/grpo1" "$tmp/$name" reward/mean response_len/mean dynamic/groups lr
    check "grpo: $at samples tp 1's rollouts and rewards" $?
done

# --- PPO: policy, reference and critic each split over 2 ranks ---
ppo="$src/configs/quickstart-ppo.yaml"
pset=(--set train.steps=2 --set threads=1 --set train.save_every=2 --set train.eval_every=0 --set data.eval=
      --set models.policy.optim.eps=1e-6 --set models.critic.optim.eps=1e-4 --set log.progress=false)
run ppo1 "$ppo" "${pset[@]}"
check "ppo with tp 1 exits 0" $?
run ppo2 "$ppo" --set models.policy.parallel.tp=2 --set models.reference.parallel.tp=2 \
    --set models.critic.parallel.tp=2 --set models.reference.parallel.sequence_parallel=true \
    --set models.critic.parallel.sequence_parallel=true "${pset[@]}"
check "ppo with tp 2 policy, reference and critic (the last two sequence-parallel) exits 0" $?
for role in policy critic; do
    python3 "$check" close "$tmp/ppo2/checkpoints/step_2/$role/model.safetensors" \
        "$tmp/ppo1/checkpoints/step_2/$role/model.safetensors" 1e-6
    check "ppo: tp 2 $role after 2 steps within 1e-6 of tp 1" $?
done
python3 "$check" metrics "$tmp/ppo1" "$tmp/ppo2" reward/mean response_len/mean
check "ppo: tp 2 samples tp 1's rollouts" $?

# --- recipes that cannot be split ---
expect_error() {  # expect_error NAME PATTERN ARGS...
    local name=$1 pat=$2
    shift 2
    (cd "$src" && "$troupe" run "$grpo" --set run_dir="$tmp/$name" "${gset[@]}" "$@" > /dev/null 2> "$tmp/$name.err")
    local st=$?
    [ $st != 0 ] && grep -q -- "$pat" "$tmp/$name.err"
    check "$name: fails naming '$pat'" $?
    [ $st != 0 ] || true
}
expect_error heads3 "tp 3 does not divide the 4 query heads" --set models.policy.parallel.tp=3
expect_error gentp3 "generator/[0-9].*tp 3 does not divide the 4 query heads" --set models.generator.replicas=1 \
    --set models.generator.parallel.tp=3
expect_error sp1 "models.policy.parallel.sequence_parallel: true needs parallel.tp 2 or more" \
    --set models.policy.parallel.sequence_parallel=true

[ $fail = 0 ] && rm -rf "$tmp"
exit $fail
