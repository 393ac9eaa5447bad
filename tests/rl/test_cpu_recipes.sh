#!/usr/bin/env bash
# The CPU recipes of configs/ (one per workflow) as shipped, 3 steps each: exit 0, metrics of
# steps 0..3 with eval at both ends, the final checkpoint, and a learning rate that ramps over
# the 3 updates (each warmup is longer). The committed pretraining dataset must be exactly
# what `troupe preprocess` makes of its JSONL.
set -u
troupe=$(realpath "$1")  # the tests run from the source root
src="${TROUPE_SOURCE_ROOT:-.}"
tmp=$(mktemp -d /tmp/troupe-cpu-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}

cd "$src" || exit 1  # recipes name their files relative to the source root

for spec in quickstart:grpo quickstart-ppo:ppo quickstart-sft:sft quickstart-pretrain:pretrain; do
    name=${spec%%:*}
    wf=${spec##*:}
    t0=$(date +%s.%N)
    # TROUPE_BACKEND=cuda runs the same recipes on a GPU (tools/gpu_suite.sh does).
    "$troupe" run "configs/$name.yaml" --set train.steps=3 --set run_dir="$tmp/$name" \
        --set backend="${TROUPE_BACKEND:-cpu}" --set precision="${TROUPE_PRECISION:-auto}" 2> "$tmp/$name.err"
    st=$?
    t1=$(date +%s.%N)
    check "configs/$name.yaml, 3 steps, exits 0 ($(python3 -c "print('%.1f' % ($t1 - $t0))") s)" $st
    [ $st = 0 ] || tail -n 20 "$tmp/$name.err"
    python3 tests/rl/check_run.py "$wf" "$tmp/$name" 3 0
    check "configs/$name.yaml: $wf metrics, eval at 0 and 3, final checkpoint" $?
done

# The quickstart's warmup of 5 cut to the 3 updates: 0, 1/3 and 2/3 of lr 6e-5.
python3 - "$tmp/quickstart/metrics.jsonl" <<'EOF'
import json, sys
lr = [json.loads(l).get("lr") for l in open(sys.argv[1])][1:]
want = [0.0, 2e-5, 4e-5]
ok = len(lr) == 3 and all(abs(a - b) < 1e-12 for a, b in zip(lr, want))
print("lr per step: %s, want %s" % (lr, want))
sys.exit(0 if ok else 1)
EOF
check "a warmup longer than the run ramps over the whole run" $?

"$troupe" preprocess --input examples/arith/pretrain.jsonl --tokenizer examples/arith/init/tokenizer.json \
    --output-prefix "$tmp/pretrain" --append-eod --quiet &&
    cmp "$tmp/pretrain.bin" examples/arith/pretrain.bin && cmp "$tmp/pretrain.idx" examples/arith/pretrain.idx
check "examples/arith/pretrain.{bin,idx} are troupe preprocess of examples/arith/pretrain.jsonl" $?

if [ $fail = 0 ]; then rm -rf "$tmp"; else echo "left $tmp for inspection"; fi
exit $fail
