#!/usr/bin/env bash
# The GPU quickstart in one command, from a bare GPU machine (CUDA toolkit, OpenBLAS, meson,
# ninja, python3): unpacks the libraries carried in .debs/ when the system lacks them
# (tools/gpu_deps.sh; make .debs/ on a networked Debian 12 machine with
# tools/fetch_gpu_deps.sh), builds troupe with CUDA, makes the arithmetic data, fine-tunes a
# 113M-parameter model from scratch (configs/quickstart-gpu-sft.yaml), runs GRPO on it
# (configs/quickstart-gpu.yaml) and prints the held-out accuracy before and after.
# Usage: tools/quickstart_gpu.sh [BUILD_DIR]   (default build-gpu-all)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu-all}"
if ! pkg-config --exists libzmq msgpack yaml-0.1 libpcre2-8 2>/dev/null; then
    tools/gpu_deps.sh
    # shellcheck source=/dev/null
    . .deps-root/env.sh
fi
[ -d "$build" ] || meson setup "$build" -Dcuda=enabled -Dbuildtype=release
ninja -C "$build"
python3 examples/arith/make_data.py examples/arith/gpu --max-operand 99 --careless 0.9 --no-tokenizer
for r in runs/quickstart-gpu-sft runs/quickstart-gpu; do
    if [ -e "$r" ]; then echo "$r exists: remove it to run the quickstart again" >&2; exit 1; fi
done
start=$(date +%s)
"$build/cli/troupe" run configs/quickstart-gpu-sft.yaml
"$build/cli/troupe" run configs/quickstart-gpu.yaml
python3 - runs/quickstart-gpu/metrics.jsonl "$(($(date +%s) - start))" <<'PY'
import json, sys
ev = [(o["step"], o["eval/accuracy"]) for o in map(json.loads, open(sys.argv[1])) if "eval/accuracy" in o]
print("held-out accuracy: %s" % " ".join("step %d %.3f" % e for e in ev))
print("GRPO gain %+.1f points; SFT and GRPO took %s s" % (100 * (ev[-1][1] - ev[0][1]), sys.argv[2]))
PY
