#!/usr/bin/env bash
# `troupe info` on the fixture checkpoints: the parameter count it prints must equal the sum
# of the tensor sizes that torch read from the same files (n_params in *.expected.json, made
# by tools/make_io_fixtures.py); bad directories fail with exit 1 naming the file, and a
# missing --model is a usage error (exit 2).
set -u
troupe="$1"
fix="$2"
fail=0
out=$(mktemp -d /tmp/troupe-info-XXXXXX)
for m in tiny-llama tiny-qwen2-sharded tiny-mistral-rm; do
    want=$(grep -o '"n_params": *[0-9]*' "$fix/$m.expected.json" | grep -o '[0-9]*$')
    if ! "$troupe" info --model "$fix/$m" --tokens 64 >"$out/$m.txt" 2>&1; then
        echo "FAIL: $m: exit $?"; cat "$out/$m.txt"; fail=1; continue
    fi
    got=$(awk '/^parameters / {print $2}' "$out/$m.txt")
    if [ -z "$want" ] || [ "$got" != "$want" ]; then
        echo "FAIL: $m: parameters '$got', torch counted '$want'"; fail=1
    fi
    arch=$(tr -d ' \n' <"$fix/$m/config.json" | grep -o '"architectures":\["[A-Za-z0-9]*"' | grep -o '"[A-Za-z0-9]*"$' | tr -d '"')
    grep -q "^architecture  $arch " "$out/$m.txt" || { echo "FAIL: $m: architecture $arch not shown"; fail=1; }
done
grep -q "^weights       sharded safetensors with index, checked" "$out/tiny-qwen2-sharded.txt" || { echo "FAIL: shards"; fail=1; }
grep -q "^tied embed    yes" "$out/tiny-qwen2-sharded.txt" || { echo "FAIL: tied"; fail=1; }

# Broken: a truncated weights file, a missing directory, no --model.
cp -r "$fix/tiny-llama" "$out/broken"
truncate -s 5000 "$out/broken/model.safetensors"
"$troupe" info --model "$out/broken" >"$out/broken.txt" 2>&1
rc=$?
[ $rc = 1 ] || { echo "FAIL: truncated weights: exit $rc"; fail=1; }
grep -q "broken/model.safetensors" "$out/broken.txt" || { echo "FAIL: file not named"; cat "$out/broken.txt"; fail=1; }
"$troupe" info --model "$out/nowhere" >"$out/nowhere.txt" 2>&1
rc=$?
[ $rc = 1 ] && grep -q "nowhere/config.json" "$out/nowhere.txt" || { echo "FAIL: missing dir: exit $rc"; fail=1; }
"$troupe" info >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: no --model: exit $rc"; fail=1; }
"$troupe" info --model "$fix/tiny-llama" --tokens 0 >/dev/null 2>&1
rc=$?
[ $rc = 2 ] || { echo "FAIL: --tokens 0: exit $rc"; fail=1; }
[ $fail = 0 ] && rm -rf "$out"
exit $fail
