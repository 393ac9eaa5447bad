#!/usr/bin/env bash
# Builds the data-layer fuzz targets with libFuzzer (clang -fsanitize=fuzzer plus ASan and
# UBSan): tools/build_fuzzers.sh BUILD_DIR OUT_DIR. BUILD_DIR is a configured meson build
# (for tr_build_config.h). Run e.g. OUT_DIR/fuzz_idx -max_total_time=60 tests/fixtures/indexed
set -euo pipefail
build="$1"; out="$2"
root="$(cd "$(dirname "$0")/.." && pwd)"
command -v clang >/dev/null || { echo "clang not found: no libFuzzer build" >&2; exit 77; }
mkdir -p "$out"
flags=(-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -I"$root" -I"$build")
clang "${flags[@]}" "$root/tests/data/fuzz_jsonl.c" "$root/data/jsonl.c" "$root/engine/err.c" \
    "$root/engine/json.c" -o "$out/fuzz_jsonl"
clang "${flags[@]}" "$root/tests/data/fuzz_idx.c" "$root/data/indexed.c" "$root/engine/err.c" \
    "$root/engine/file.c" -o "$out/fuzz_idx"
echo "built $out/fuzz_jsonl $out/fuzz_idx"
