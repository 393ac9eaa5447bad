#!/usr/bin/env bash
# Runs on a GPU machine: variants of the CUDA kernels measured side by side in one call. The
# tree itself is the base; each patch in .ab/ (made where the branches are, for example
# `git diff main BRANCH > .ab/NAME.patch`; the folder is ignored by git and carried) is applied
# to a copy of the tree. Each variant is built with the CUDA backend (kernels + engine, no
# .debs needed), then runs the op tests of the decode step's kernels, test_model_bf16
# (generation's logprobs against the training forward), bench_cuda sample and attention, and
# the generator at batch 64 and 256 of the 0.5B shape, batch-invariant.
# Usage: tools/gpu_ab.sh [NAME...]   (default: base and every patch in .ab/)
#   AB_OPS (environment): test_cuda_ops sections (default: attention sample logsoftmax rmsnorm
#   rope_kv_write matmul).
# Output: $OUT/ab (else ./ab-results): NAME.*.log, and summary.txt with each variant's
# test exits and benchmark lines.
set -u
cd "$(dirname "$0")/.." || exit 1
root=$PWD
out="${OUT:-ab-results}/ab"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
names="$*"
if [ -z "$names" ]; then
    names="base"
    for p in .ab/*.patch; do [ -f "$p" ] && names="$names $(basename "$p" .patch)"; done
fi

note() { echo "$*" | tee -a "$summary"; }

for v in $names; do
    dir="/tmp/ab-$v"
    rm -rf "$dir"
    mkdir -p "$dir"
    # the working tree without build folders or carried payloads
    tar -c --exclude='./build*' --exclude=./.git --exclude=./.ab --exclude=./.debs \
        --exclude=./.deps-root --exclude=./anchors --exclude=./.whl --exclude=./ab-results . |
        tar -x -C "$dir"
    if [ "$v" != base ]; then
        if ! (cd "$dir" && patch -p1 <"$root/.ab/$v.patch") >"$out/$v.patch.log" 2>&1; then
            note "$v: the patch does not apply"
            continue
        fi
    fi
    if ! (cd "$dir" && meson setup build -Dcuda=enabled -Dlayers=engine &&
        ninja -C build) >"$out/$v.build.log" 2>&1; then
        note "$v: build failed"
        continue
    fi
    b="$dir/build"
    for s in ${AB_OPS:-attention sample logsoftmax rmsnorm rope_kv_write matmul}; do
        OPENBLAS_NUM_THREADS=1 "$b/tests/kernels/test_cuda_ops" "$s" >"$out/$v.ops_$s.log" 2>&1
        note "$v: test_cuda_ops $s: exit $? ($(grep -E 'checks' "$out/$v.ops_$s.log" | tail -1))"
    done
    (cd "$dir" && TROUPE_BACKEND=cuda meson test -C build --print-errorlogs test_model_bf16) \
        >"$out/$v.model_bf16.log" 2>&1
    note "$v: test_model_bf16: exit $?"
    "$b/bench/bench_cuda" sample >"$out/$v.sample.log" 2>&1
    grep -E "sample B=|logsoftmax" "$out/$v.sample.log" | sed "s/^/$v: /" >>"$summary"
    "$b/bench/bench_cuda" attention >"$out/$v.attention.log" 2>&1
    grep -E "attn_decode" "$out/$v.attention.log" | sed "s/^/$v: /" >>"$summary"
    for bt in 64 256; do
        timeout 120 "$b/bench/bench_decode_gpu" qwen2.5-0.5b "$bt" 1 256 256 \
            >"$out/$v.decode_$bt.log" 2>&1
        grep "troupe decode" "$out/$v.decode_$bt.log" | sed "s/^/$v: /" >>"$summary"
    done
done
cat "$summary"
