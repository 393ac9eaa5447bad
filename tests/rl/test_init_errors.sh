#!/usr/bin/env bash
# What a user sees when a worker's init fails: `troupe run` names each context once, outermost
# first (starting the workers, the worker, the op, then the cause), and so does the worker's
# own log. Each case used to read "... critic/0: init: init: ...".
set -u
troupe=$(realpath "$1")  # the tests run from the source root
src="${TROUPE_SOURCE_ROOT:-.}"
tmp=$(mktemp -d /tmp/troupe-initerr-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS; returns STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
    return "$2"
}

cd "$src" || exit 1

# expect NAME WORKER CAUSE [--set K=V]...: the run fails with exactly
# "troupe run: error: starting the workers: WORKER: init: CAUSE", and WORKER's log has one
# failure line, ending "[WORKER] failed: init: CAUSE".
expect() {
    local name="$1" worker="$2" cause="$3"
    shift 3
    "$troupe" run configs/quickstart.yaml --set run_dir="$tmp/$name" --set train.steps=1 "$@" 2> "$tmp/$name.err"
    local st=$?
    local want="troupe run: error: starting the workers: $worker: init: $cause"
    local got
    got=$(tail -n 1 "$tmp/$name.err")
    [ $st = 1 ] && [ "$got" = "$want" ]
    check "$name: exit 1 with '$want'" $? || echo "  got $st: $got"
    python3 - "$tmp/$name/logs/${worker/\//-}.log" "[$worker] failed: init: $cause" <<'EOF'
import sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if "failed" in l]
ok = len(lines) == 1 and lines[0].endswith(sys.argv[2])
parts = lines[0].split(": ") if lines else []
ok = ok and all(a != b for a, b in zip(parts, parts[1:]))
print("log: %s" % lines)
sys.exit(0 if ok else 1)
EOF
    check "$name: the worker's log says '[$worker] failed: init: ...' once" $?
}

# A critic given an LM checkpoint (from: policy would add the value head).
expect critic_lm critic/0 \
    "examples/arith/model is a causal LM (LlamaForCausalLM); the critic role needs a value (token classification) model" \
    --set workflow=ppo --set models.critic.path=examples/arith/model
# A policy directory with a config but no weights: the engine's own message under the op.
expect no_weights policy/0 "examples/arith/init: no model.safetensors or model.safetensors.index.json" \
    --set models.policy.path=examples/arith/init

# A memory budget too small for the weights and one micro-batch: the worker refuses at init
# with the memory plan's numbers instead of failing later.
"$troupe" run configs/quickstart.yaml --set run_dir="$tmp/small_budget" --set train.steps=1 \
    --set memory_gb=0.001 2>"$tmp/small_budget.err"
st=$?
got=$(tail -n 1 "$tmp/small_budget.err")
[ $st = 1 ] && printf '%s' "$got" | grep -q "policy/0: init: memory plan: weights 3.4 MiB .* more than the 1.0 MiB the budget has"
check "a memory budget smaller than the plan: exit 1 naming the plan's parts" $? || echo "  got $st: $got"

if [ $fail = 0 ]; then rm -rf "$tmp"; else echo "left $tmp for inspection"; fi
exit $fail
