#!/usr/bin/env bash
# Device failures in the middle of a run, injected with TROUPE_DEVICE_FAULT (kernels/fault.h)
# into the quickstart's GRPO run cut to 2 steps with a checkpoint after each: a device error
# in step 2's optimizer step, a shortage of memory while step 2's checkpoint is written, one
# while the policy worker starts, and a malformed value. Each run exits 1 with one line naming
# the role, rank and op and the failure (with the memory figures for a shortage), the worker's
# log says the same, the worker exits on the controller's shutdown and none outlives the run;
# step 1's checkpoint is whole and a run resumed from it completes as an uninterrupted one.
# On the backend TROUPE_BACKEND names (tools/gpu_suite.sh's fault part runs it with cuda, where
# the error is a real device fault).
set -u
troupe=$(realpath "$1")  # the runs start from the source root
src="${TROUPE_SOURCE_ROOT:-.}"
backend="${TROUPE_BACKEND:-cpu}"
tmp=$(mktemp -d /tmp/troupe-fault-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS; returns STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
    return "$2"
}

cd "$src" || exit 1
check_py=tests/rl/check_run.py
head -n 16 examples/arith/eval.jsonl > "$tmp/eval.jsonl"

# run NAME RUN FAULT [OPTION...]: configs/quickstart.yaml in $tmp/RUN for 2 small steps (4
# prompts x 4 samples), saving each, with TROUPE_DEVICE_FAULT=FAULT (empty: none); stderr to
# $tmp/NAME.err.
run() {
    local name=$1 dir=$2 fault=$3
    shift 3
    TROUPE_DEVICE_FAULT="$fault" "$troupe" run configs/quickstart.yaml --set run_dir="$tmp/$dir" \
        --set backend="$backend" --set precision="${TROUPE_PRECISION:-auto}" --set threads=1 \
        --set train.steps=2 --set train.prompts_per_step=4 --set rollout.n=4 \
        --set train.save_every=1 --set train.eval_every=0 --set data.eval="$tmp/eval.jsonl" \
        "$@" 2> "$tmp/$name.err"
}

# expect_failure NAME RUN STATUS PATTERN: exit 1; the last line of stderr, the run's error,
# matches PATTERN (grep -E); policy/0's log has the same failure once and the worker left on
# the controller's shutdown; no process of the run is left.
expect_failure() {
    local name=$1 dir=$2 st=$3 pattern=$4 got log="$tmp/$2/logs/policy-0.log"
    got=$(tail -n 1 "$tmp/$name.err")
    echo "  $got"
    [ "$st" = 1 ] && printf '%s\n' "$got" | grep -qE -- "$pattern"
    check "$name: exit 1 with an error naming the role, rank, op and failure (got $st)" $?
    local cause="${got#*policy/0: }"
    [ "$(grep -cF -- "[policy/0] failed: $cause" "$log")" = 1 ]
    check "$name: policy/0's log has the failure once" $?
    grep -qF "[policy/0] exiting: shutdown requested" "$log"
    check "$name: the worker exited on the controller's shutdown" $? || tail -n 3 "$log"
    ! pgrep -f -- "$tmp/$dir/" > /dev/null
    check "$name: no worker outlives the run" $?
}

run clean clean ""
check "an uninterrupted 2-step run exits 0" $? || tail -n 5 "$tmp/clean.err"

# A device error in step 2's optimizer step (its one sync point; step 1's was the first).
run error error "error:optimizer step:2"
st=$?
expect_failure error error $st "^troupe run: error: step 2: policy/0: train: .*failure before the sync point 'optimizer step': .*injected by TROUPE_DEVICE_FAULT=error:optimizer step:2"
if [ "$backend" = cuda ]; then
    why="an illegal memory access was encountered"
else
    why="simulated device failure"
fi
grep -qF "$why" "$tmp/error.err"
check "error: the failure is the backend's own ('$why')" $?
python3 "$check_py" checkpoints "$tmp/error" 1
check "error: step 1's checkpoint is whole and nothing later was saved" $?
run error_resume error "" --resume
check "error: the run resumes from step 1 and completes" $? || tail -n 5 "$tmp/error_resume.err"
python3 "$check_py" grpo "$tmp/error" 2 0 && python3 "$check_py" same "$tmp/error" "$tmp/clean"
check "error: the resumed run equals the uninterrupted one" $?

# No memory for the staging of step 2's Adam moments (each save stages both moments, so the
# third such allocation): the save fails half written, step 1's checkpoint stays.
run oom_save oom_save "oom:training state staging:3"
st=$?
expect_failure oom_save oom_save $st "^troupe run: error: checkpoint of step 2, policy: policy/0: save: .*training state staging: cannot allocate [0-9.]+ MiB of pinned host memory \($backend backend: [0-9.]+ of [0-9.]+ MiB free; injected by TROUPE_DEVICE_FAULT=oom:training state staging:3\)$"
python3 "$check_py" checkpoints "$tmp/oom_save" 1
check "oom_save: step 1's checkpoint is whole, and step 2's half-written one was removed" $?
run oom_save_resume oom_save "" --resume
check "oom_save: the run resumes from step 1 and completes" $? ||
    tail -n 5 "$tmp/oom_save_resume.err"
python3 "$check_py" grpo "$tmp/oom_save" 2 0 && python3 "$check_py" same "$tmp/oom_save" "$tmp/clean"
check "oom_save: the resumed run equals the uninterrupted one" $?

# No device memory for the policy's Adam moments when its worker starts.
run oom_init oom_init "oom:Adam first moments"
st=$?
expect_failure oom_init oom_init $st "^troupe run: error: starting the workers: policy/0: init: Adam first moments: cannot allocate [0-9.]+ MiB of device memory \($backend backend: [0-9.]+ of [0-9.]+ MiB free; injected by TROUPE_DEVICE_FAULT=oom:Adam first moments\)$"

# A value that injects nothing is refused rather than letting a test pass untested.
run malformed malformed "error:optimizer step:0"
st=$?
got=$(tail -n 1 "$tmp/malformed.err")
[ $st = 1 ] && printf '%s\n' "$got" | grep -qF "policy/0: init: TROUPE_DEVICE_FAULT='error:optimizer step:0': want KIND:WHERE[:N]"
check "a malformed TROUPE_DEVICE_FAULT stops the run naming it (got $st: $got)" $?

if [ $fail = 0 ]; then rm -rf "$tmp"; else echo "left $tmp for inspection"; fi
exit $fail
