#!/usr/bin/env bash
# Tokenizer encode throughput, troupe vs Hugging Face tokenizers, one thread each, on the
# same generated corpus; prints both lines and the ratio per fixture tokenizer.
#
# usage: bench/run_tokenize_bench.sh BUILD_DIR [PYTHON] [MB]
set -euo pipefail
build="${1:?usage: run_tokenize_bench.sh BUILD_DIR [PYTHON] [MB]}"
py="${2:-python3}"
mb="${3:-4}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
corpus="$(mktemp /tmp/troupe-tokbench-XXXXXX.jsonl)"
trap 'rm -f "$corpus"' EXIT
"$py" "$here/bench_tokenize_hf.py" --write-corpus "$corpus" "$mb"
for name in qwen2 llama3; do
    tj="$root/tests/fixtures/tokenizer/$name.json"
    ours="$("$build/bench/bench_tokenize" "$tj" "$corpus")"
    theirs="$("$py" "$here/bench_tokenize_hf.py" "$tj" "$corpus")"
    echo "[$name] $ours"
    echo "[$name] $theirs"
    t1="$(echo "$ours" | sed -E 's/.* ([0-9]+) tokens.*/\1/')"
    t2="$(echo "$theirs" | sed -E 's/.* ([0-9]+) tokens.*/\1/')"
    [ "$t1" = "$t2" ] || echo "[$name] WARNING: token counts differ ($t1 vs $t2)"
    r1="$(echo "$ours" | sed -E 's/.* ([0-9.]+) MB\/s/\1/')"
    r2="$(echo "$theirs" | sed -E 's/.* ([0-9.]+) MB\/s/\1/')"
    awk -v a="$r1" -v b="$r2" -v n="$name" 'BEGIN { printf "[%s] troupe / hf = %.2fx\n", n, a / b }'
done
