#!/usr/bin/env bash
# A GRPO run scored by a misbehaving reward service (tests/roles/fake_reward_service.c), with
# an eval set larger than one evaluation chunk (256 prompts): reward/failures adds up every
# item a step zeroed (its training rounds and every eval chunk); a failure in the step-0
# evaluation is labelled as that evaluation, with the item range counted over the eval set.
set -u
troupe="$1"
fake="$2"
src="${TROUPE_SOURCE_ROOT:-.}"
tmp=$(mktemp -d /tmp/troupe-reward-errors-XXXXXX)
fail=0
svc=
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
stop_service() {
    if [ -n "$svc" ]; then kill "$svc" 2>/dev/null; wait "$svc" 2>/dev/null; fi
    svc=
}
trap 'stop_service; rm -rf "$tmp"' EXIT
start_service() {  # start_service MODE: the fake on ipc://$tmp/svc, once it is bound
    rm -f "$tmp/svc" "$tmp/svc.out"
    "$fake" "ipc://$tmp/svc" "$1" > "$tmp/svc.out" 2>&1 &
    svc=$!
    for _ in $(seq 100); do grep -q listening "$tmp/svc.out" 2>/dev/null && return 0; sleep 0.05; done
    echo "the fake service did not start"; return 1
}

mkdir -p "$tmp/init"
cp "$src/examples/arith/init/tokenizer.json" "$tmp/init/"
python3 - "$src/examples/arith/init/config.json" "$tmp/init/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
         num_key_value_heads=2)
json.dump(c, open(sys.argv[2], "w"))
PY
head -n 300 "$src/examples/arith/eval.jsonl" > "$tmp/eval.jsonl"

recipe() {  # recipe RUN_DIR ON_FAILURE TIMEOUT_MS
    cat <<YAML
workflow: grpo
seed: 3
run_dir: $1
threads: 1
models:
  policy:
    init: {config: $tmp/init/config.json, seed: 5}
    optim: {lr: 1.0e-3, schedule: constant}
  reward: {kind: service, endpoint: "ipc://$tmp/svc", timeout_ms: $3, retries: 0, max_batch: 64,
           on_failure: $2}
data: {train: $src/examples/arith/train.jsonl, eval: $tmp/eval.jsonl, chat_format: chatml, max_prompt_len: 32}
rollout: {n: 4, max_new_tokens: 4, temperature: 1.0}
train: {steps: 1, prompts_per_step: 4, micro_batch_tokens: 256, eval_every: 0, save_every: 0}
YAML
}

# Every reply is garbage and on_failure is zero: step 0 zeroes the 300 eval items (chunks of
# 256 and 44), step 1 its 16 rollouts and the 300 eval items again.
start_service not_msgpack
recipe "$tmp/zero" zero 2000 > "$tmp/zero.yaml"
"$troupe" run "$tmp/zero.yaml" 2> "$tmp/zero.err"
st=$?
check "a run whose service answers garbage, on_failure zero, exits 0" $st
[ $st = 0 ] || tail -n 20 "$tmp/zero.err"
python3 - "$tmp/zero/metrics.jsonl" <<'PY'
import json, sys
got = {r["step"]: r.get("reward/failures") for r in map(json.loads, open(sys.argv[1]))}
if got != {0: 300, 1: 316}:
    sys.exit(f"reward/failures per step: {got}, want {{0: 300, 1: 316}}")
PY
check "reward/failures sums the step's items: 300 at step 0, 16 + 300 at step 1" $?
stop_service

# The service answers the first chunk's 4 requests and dies: the step-0 evaluation fails on
# the second chunk, items 256..299 of the eval set.
start_service crash_after=4
recipe "$tmp/fail" fail 300 > "$tmp/fail.yaml"
"$troupe" run "$tmp/fail.yaml" 2> "$tmp/fail.err"
check "a run whose service dies in the step-0 evaluation exits 1" $([ $? = 1 ]; echo $?)
grep -q "evaluation at step 0 on $tmp/eval.jsonl" "$tmp/fail.err" && ! grep -q "step 1" "$tmp/fail.err"
check "the failure is the step-0 evaluation's, not step 1's" $?
grep -q "items 256\.\.299:" "$tmp/fail.err"
check "its item range counts over the eval set (256..299)" $?
echo "  $(tail -n 1 "$tmp/fail.err")"
stop_service
exit $fail
