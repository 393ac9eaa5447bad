#!/usr/bin/env bash
# Checkpoints written by troupe load in transformers and compute exactly what the originals
# compute: each fixture checkpoint is loaded and saved by troupe (F32 single file, BF16
# shards, and a value head on the Llama trunk), then tools/check_hf_checkpoint.py compares
# them in transformers; the Llama fixture with attention_bias adds the o_proj bias, the Qwen3
# fixture the per-head q/k norms. Skipped
# (77) where Python has no torch/transformers.
set -u
resave="$1"
src="${TROUPE_SOURCE_ROOT:-.}"
py="${TROUPE_PYTHON:-/opt/refenv/bin/python}"
[ -x "$py" ] || py=python3
"$py" -c "import torch, transformers" 2>/dev/null || { echo "no torch/transformers: skipped"; exit 77; }
out=$(mktemp -d /tmp/troupe-hfrt-XXXXXX)
fail=0
check() {  # check SAVED REF [--bf16]
    "$py" "$src/tools/check_hf_checkpoint.py" "$@" >"$out/log" 2>&1 || { cat "$out/log"; fail=1; }
    grep -E "identical|DIFFERENT" "$out/log"
}
for m in tiny-llama tiny-qwen2-sharded tiny-mistral-rm; do
    ref="$src/tests/fixtures/io/$m"
    "$resave" "$ref" "$out/$m-f32" f32 0 || fail=1
    check "$out/$m-f32" "$ref"
    "$resave" "$ref" "$out/$m-bf16" bf16 3000 || fail=1
    ls "$out/$m-bf16"/model-00002-of-* >/dev/null 2>&1 || { echo "FAIL: $m bf16 not sharded"; fail=1; }
    check "$out/$m-bf16" "$ref" --bf16
done
"$resave" "$src/tests/fixtures/io/tiny-llama" "$out/value" f32 0 value || fail=1
check "$out/value" "$src/tests/fixtures/io/tiny-llama"
# Llama with attention_bias: the o_proj biases must be written (and kept by a value head).
bias="$src/tests/fixtures/models/llama_bias"
"$resave" "$bias" "$out/llama_bias-f32" f32 0 || fail=1
check "$out/llama_bias-f32" "$bias"
"$resave" "$bias" "$out/llama_bias-value" f32 0 value || fail=1
check "$out/llama_bias-value" "$bias"
# Qwen3: q_norm/k_norm written under their HF names, no biases, head_dim 16 (not hidden /
# heads) written back; F32, BF16 shards and a value head (Qwen3ForTokenClassification).
q3="$src/tests/fixtures/models/qwen3"
"$resave" "$q3" "$out/qwen3-f32" f32 0 || fail=1
check "$out/qwen3-f32" "$q3"
"$resave" "$q3" "$out/qwen3-bf16" bf16 20000 || fail=1
ls "$out/qwen3-bf16"/model-00002-of-* >/dev/null 2>&1 || { echo "FAIL: qwen3 bf16 not sharded"; fail=1; }
check "$out/qwen3-bf16" "$q3" --bf16
"$resave" "$q3" "$out/qwen3-value" f32 0 value || fail=1
check "$out/qwen3-value" "$q3"
[ $fail = 0 ] && rm -rf "$out"
exit $fail
