#!/usr/bin/env bash
# Runs on a GPU machine (CUDA toolkit with nvcc, cuBLAS, OpenBLAS, meson, ninja): builds the
# kernels and engine layers with the CUDA backend, then runs the CUDA op test and the CUDA
# benchmark. Logs go to $OUT when set, else ./gpu-results. Usage: tools/gpu_suite.sh
set -u
cd "$(dirname "$0")/.."
out="${OUT:-gpu-results}"
mkdir -p "$out"
build=build-gpu
status=0

run() {   # run NAME CMD...: output to the terminal and to $out/NAME.log; records failure
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    if [ "$rc" -ne 0 ]; then status=1; fi
    return "$rc"
}

run nvidia-smi nvidia-smi || true
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true
if [ -d "$build" ]; then
    run setup meson setup --reconfigure "$build" -Dcuda=enabled -Dlayers=engine || exit 1
else
    run setup meson setup "$build" -Dcuda=enabled -Dlayers=engine || exit 1
fi
run build ninja -C "$build" || exit 1
# The op test reports each op's error next to the CPU backend; 77 would mean no device seen.
run test_cuda_ops env OPENBLAS_NUM_THREADS=1 "$build/tests/kernels/test_cuda_ops"
run unit_kernels meson test -C "$build" --suite unit --print-errorlogs
run bench_cuda "$build/bench/bench_cuda"
echo "logs in $out; overall status $status"
exit "$status"
