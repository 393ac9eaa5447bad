#!/usr/bin/env bash
# Runs the CPU benchmarks (kernels, training, decode, tokenizer vs HF tokenizers, training and
# decode vs PyTorch/transformers) from a build directory and prints them under a heading with
# the date, commit and machine, ready to be appended to bench/RESULTS.md. Timings depend on
# the machine being otherwise idle.
#
# usage: bench/run_cpu.sh BUILD_DIR [PYTHON]
# PYTHON with tokenizers adds the tokenizer comparison; with torch and transformers as well,
# bench_train and bench_generate run through run_cpu_peers.sh, which adds the PyTorch peer
# and the troupe-vs-PyTorch table.
set -euo pipefail
build="${1:?usage: run_cpu.sh BUILD_DIR [PYTHON]}"
py="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
echo "## CPU, $(date -u +%Y-%m-%d), commit $(git -C "$here" rev-parse --short HEAD)"
echo
echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'),"
echo "load average at start $(cut -d' ' -f1-3 /proc/loadavg)."
echo
echo '```'
echo "\$ bench_kernels"; "$build/bench/bench_kernels"
echo
if [ -n "$py" ] && "$py" -c 'import torch, transformers' 2>/dev/null; then
    "$here/run_cpu_peers.sh" "$build" "$py"
else
    echo "\$ bench_train"; "$build/bench/bench_train"
    echo; echo "\$ bench_generate"; "$build/bench/bench_generate"
fi
if [ -n "$py" ]; then
    echo; echo "\$ run_tokenize_bench.sh"; "$here/run_tokenize_bench.sh" "$build" "$py" 4
fi
echo '```'
