#!/usr/bin/env bash
# The quickstart learns: configs/quickstart.yaml, shortened to STEPS steps (default 200;
# the learning-rate schedule shrinks with it), must raise the held-out eval accuracy (greedy
# answers scored by the rule reward) by at least MIN_GAIN (default 0.08; the full run gains
# about 0.18) from the first eval to the last, and the training reward of the last quarter
# of the steps must beat the first quarter's; every step's record and the final checkpoint
# are checked as in test_run.sh. The CPU backend computes the same bits on any machine, so
# the outcome does not depend on the host.
#   test_quickstart.sh TROUPE [STEPS] [MIN_GAIN]
set -u
troupe="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # absolute: the run cds below
steps="${2:-200}"
gain="${3:-0.08}"
src="${TROUPE_SOURCE_ROOT:-.}"
tmp=$(mktemp -d /tmp/troupe-quickstart-XXXXXX)
cd "$src" || exit 1
"$troupe" run configs/quickstart.yaml --set run_dir="$tmp/run" --set train.steps="$steps" \
    --set train.eval_every=40 --set train.save_every=0 2> "$tmp/err"
st=$?
if [ $st != 0 ]; then
    echo "FAIL: troupe run exited $st"
    tail -n 20 "$tmp/err"
    exit 1
fi
fail=0
python3 tests/rl/check_run.py grpo "$tmp/run" "$steps" 40 || fail=1
python3 tests/rl/check_run.py learns "$tmp/run" eval/accuracy "$gain" || fail=1
python3 tests/rl/check_run.py rises "$tmp/run" reward/mean || fail=1
if [ $fail = 0 ]; then rm -rf "$tmp"; else echo "left $tmp for inspection"; fi
exit $fail
