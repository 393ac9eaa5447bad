#!/usr/bin/env bash
# Runs on a GPU machine (CUDA toolkit with nvcc, cuBLAS, NCCL, OpenBLAS, meson, ninja, python3):
# builds the kernels and engine layers with the CUDA backend, then runs the CUDA op test, their
# unit tests and the CUDA benchmark; then builds the full troupe binary with CUDA, runs the
# unit and e2e suites, and runs the engine on the GPU: the model, training and generation
# tests and the logprobs/generate commands with TROUPE_BACKEND=cuda, two CUDA runs compared
# byte for byte, the CPU quickstart's GRPO run on the GPU beside the same run on the CPU, and
# device faults and shortages injected into a GRPO run on the GPU.
# Usage: tools/gpu_suite.sh [PART...]   parts: engine full cuda quickstart fault quickstart_gpu
# train_bench profile decode_stages rl_bench ppo_bench costs decode_bench decode_kernels ncu
# ncu_seqk train_kernels
# (default: the first five; train_bench, rl_bench and decode_bench need the peers' anchors carried in ./anchors,
# rl_bench TRL's wheels in ./.whl too; decode_bench needs no .debs)
#
# The full build needs the upper layers' libraries, which a bare GPU machine lacks: make .debs/
# on a networked Debian 12 machine with tools/fetch_gpu_deps.sh and carry .debs along (it is
# ignored by git); tools/gpu_deps.sh unpacks it there. Without .debs only the engine part runs.
# On the lent GPU machine: command `tools/gpu_suite.sh`, carry [".debs"], timeout 600 s; the
# whole script takes a few minutes on 16 cores. tools/gpu_prebuilt.sh runs the kernel tests and
# benchmarks from binaries built here instead, when a call's time is short.
#
# Output goes to $OUT when set, else ./gpu-results: summary.txt (each step's exit status and the
# test counts) and logs.tar.gz (one log per step plus meson's full test logs). The loose logs are
# removed after packing when $OUT is set, since only a few files come back from there.
set -u
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-gpu-results}"
logs="$out/logs"
mkdir -p "$logs"
summary="$out/summary.txt"
: >"$summary"
build="build-gpu"
build_all="build-gpu-all"
status=0

run() {   # run NAME CMD...: output to the terminal and to $logs/NAME.log; records failure
    local name=$1
    shift
    echo "== $name: $*"
    "$@" 2>&1 | tee "$logs/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    echo "$name: exit $rc" >>"$summary"
    if [ "$rc" -ne 0 ]; then status=1; fi
    return "$rc"
}

# shellcheck disable=SC2317  # called through run
configure() {   # configure DIR OPTION...: configure, or reconfigure a build folder left from before
    local dir=$1
    shift
    if [ -d "$dir" ]; then
        meson setup --reconfigure "$dir" "$@"
    else
        meson setup "$dir" "$@"
    fi
}

engine_part() {   # the kernels' tests: needs nothing beyond CUDA and OpenBLAS
    # With the libraries from .debs/ the full build serves; otherwise kernels + engine only.
    if [ "$build" = "$build_all" ]; then
        deps_and_build_all || return 1
    else
        run setup configure "$build" -Dcuda=enabled -Dlayers=engine || return 1
        run build ninja -C "$build" || return 1
    fi
    # The op test reports each op's error next to the CPU backend; 77 would mean no device seen.
    run test_cuda_ops env OPENBLAS_NUM_THREADS=1 "$build/tests/kernels/test_cuda_ops"
    # The CPU unit tests of the kernels and engine (the full part runs every layer's).
    if [ "$build" != "$build_all" ]; then
        run unit_kernels meson test -C "$build" --suite unit --print-errorlogs
        cp "$build/meson-logs/testlog.txt" "$logs/testlog_engine.txt" 2>/dev/null
    fi
    if [ "${BENCH_CUDA:-1}" != 0 ]; then run bench_cuda "$build/bench/bench_cuda"; fi
    # The row attention kernels (what the tensor-core ones replace at D 64 and 128) checked
    # too; the attention benchmark with torch's attention on the same shapes beside it.
    run test_cuda_ops_rows env TROUPE_CUDA_FLASH_ATTENTION=0 OPENBLAS_NUM_THREADS=1 \
        "$build/tests/kernels/test_cuda_ops" attention
    # ATTENTION_PEER_ONLY: shape names (comma-separated) for torch, when the others were
    # measured earlier on the machine; ATTENTION_PEER=0 skips torch.
    if [ "${ATTENTION_PEER:-1}" != 0 ]; then
        run attention_peer timeout 300 python3 bench/attention_peer.py \
            --troupe "$build/bench/bench_cuda" ${ATTENTION_PEER_ONLY:+--only "$ATTENTION_PEER_ONLY"}
    fi
}

deps_and_build_all() {   # once per run: unpack .debs/ and build every layer with CUDA
    if [ -n "${built_all:-}" ]; then return "$built_all"; fi
    built_all=1
    run deps tools/gpu_deps.sh || return 1
    # shellcheck source=/dev/null
    . .deps-root/env.sh
    # werror=false: gcc 13 there may warn where Debian's gcc 12, which CI builds with, does not.
    run setup_all configure "$build_all" -Dcuda=enabled -Dwerror=false || return 1
    run build_all ninja -C "$build_all" || return 1
    built_all=0
}

full_part() {   # every layer and the troupe binary, with the libraries from .debs/
    deps_and_build_all || return 1
    run test_all meson test -C "$build_all" --suite unit --suite e2e --print-errorlogs
    cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_all.txt" 2>/dev/null
    # The model tests again by name, in a log of their own: forward against transformers,
    # gradients against finite differences, generation and the training step.
    run model_tests meson test -C "$build_all" --print-errorlogs \
        test_model_hf test_model_grad test_generate test_train
}

# The engine on the GPU: the same tests and commands as on the CPU, on device 0, in fp32
# (their references are fp32), then the bf16 tests.
cuda_part() {
    local t="$build_all/cli/troupe" fx=tests/fixtures
    run cuda_engine env TROUPE_BACKEND=cuda TROUPE_PRECISION=fp32 meson test -C "$build_all" --print-errorlogs \
        test_model_hf test_model_grad test_generate test_train test_arena test_kvcache \
        test_cuda_fault
    cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_cuda_engine.txt" 2>/dev/null
    # Mixed precision on the GPU: bf16 against transformers' autocast, frozen/trained layouts,
    # 200 SFT steps against fp32.
    run cuda_bf16 env TROUPE_BACKEND=cuda meson test -C "$build_all" --print-errorlogs \
        test_model_bf16
    cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_cuda_bf16.txt" 2>/dev/null
    run cuda_cli env TROUPE_BACKEND=cuda TROUPE_PRECISION=fp32 meson test -C "$build_all" --print-errorlogs \
        logprobs generate troupe_info
    cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_cuda_cli.txt" 2>/dev/null
    # The workflows' end-to-end tests (GRPO, SFT, PPO and pretraining runs, resumed runs equal
    # to uninterrupted ones) and every CPU recipe, with their workers on the GPU.
    # (CUDA_RUNS=0 leaves them out, for a short call.)
    if [ "${CUDA_RUNS:-1}" != 0 ]; then
        run cuda_runs env TROUPE_BACKEND=cuda TROUPE_PRECISION=fp32 meson test -C "$build_all" \
            --print-errorlogs run cpu_recipes
        cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_cuda_runs.txt" 2>/dev/null
        # The same runs in bf16, the GPU's default: a run killed and resumed equals the
        # uninterrupted one bit for bit there too (every kernel deterministic).
        run cuda_runs_bf16 env TROUPE_BACKEND=cuda meson test -C "$build_all" --print-errorlogs run
        cp "$build_all/meson-logs/testlog.txt" "$logs/testlog_cuda_runs_bf16.txt" 2>/dev/null
    fi
    # Two runs of the same command give the same bytes (every kernel is deterministic), and
    # the device's memory plan is what `info` prints.
    run cuda_twice bash -c "
        set -e
        for i in 1 2; do
            $t generate --backend cuda --model $fx/generate/chat_qwen2 \
                --prompts $fx/generate/chat_qwen2/prompts.jsonl --n 4 --temperature 0.9 \
                --top-p 0.95 --seed 3 --max-new-tokens 24 --quiet > $out/gen\$i.jsonl
            $t logprobs --backend cuda --model $fx/models/qwen2 \
                --data $fx/models/qwen2/logprobs_input.jsonl --quiet > $out/lp\$i.jsonl
        done
        cmp $out/gen1.jsonl $out/gen2.jsonl && cmp $out/lp1.jsonl $out/lp2.jsonl
        echo 'two CUDA runs: identical bytes'
        $t info --backend cuda --model examples/arith/model --tokens 4096
        rm -f $out/gen?.jsonl $out/lp?.jsonl"
    # The CPU backend's bits on this machine's processor (AVX-512 where it has it), brought
    # back to compare with another machine's (cpu_bits.jsonl: they must be the same bytes).
    run cpu_bits bash -c "
        $t logprobs --backend cpu --model $fx/models/qwen2 \
            --data $fx/models/qwen2/logprobs_input.jsonl --quiet > $out/cpu_bits.jsonl &&
        $t generate --backend cpu --model $fx/generate/chat_qwen2 \
            --prompts $fx/generate/chat_qwen2/prompts.jsonl --n 4 --temperature 0.9 \
            --top-p 0.95 --seed 3 --max-new-tokens 24 --quiet >> $out/cpu_bits.jsonl"
    if [ "${BENCH_CUDA:-1}" != 0 ]; then run bench_cuda "$build_all/bench/bench_cuda"; fi
}

# The quickstart (GRPO, 800 steps) on the GPU (bf16, the CUDA default) and on the CPU (fp32)
# at once; their final greedy eval accuracies must be within 3 points.
quickstart_part() {
    local t="$build_all/cli/troupe" q="$PWD/qs-runs"
    rm -rf "$q" && mkdir -p "$q"
    # Bounded so that the suite still packs its logs when a run is slower than expected.
    (timeout 420 "$t" run configs/quickstart.yaml --set run_dir="$q/cpu" --set threads=8 \
        >"$logs/quickstart_cpu.log" 2>&1; echo "exit $?" >>"$logs/quickstart_cpu.log") &
    local cpu_pid=$!
    run quickstart_cuda timeout 420 "$t" run configs/quickstart.yaml --set run_dir="$q/cuda" \
        --set backend=cuda
    wait "$cpu_pid"
    run quickstart_compare python3 - "$q/cpu/metrics.jsonl" "$q/cuda/metrics.jsonl" <<'EOF'
import json, sys
def last(path, key):
    v = [json.loads(l) for l in open(path)]
    return [o[key] for o in v if key in o][-1], v
cpu, vc = last(sys.argv[1], "eval/accuracy")
gpu, vg = last(sys.argv[2], "eval/accuracy")
t = lambda v: sum(o.get("time/step", 0) for o in v)
print(f"final eval accuracy: cpu {cpu:.3f}, cuda {gpu:.3f} (diff {gpu - cpu:+.3f}); "
      f"step time sum: cpu {t(vc):.1f} s, cuda {t(vg):.1f} s")
sys.exit(0 if abs(gpu - cpu) <= 0.03 else 1)
EOF
}

# Device failures injected into a GRPO run on the GPU (TROUPE_DEVICE_FAULT, kernels/fault.h):
# the unit test, then tests/rl/test_device_fault.sh with the CUDA backend: a real device fault
# in step 2's optimizer step, cudaMallocHost and cudaMalloc asked for more than the device
# holds. Each run's error must name role, rank and op, every worker must exit, and step 1's
# checkpoint must resume to the uninterrupted run's numbers. Its log also goes to $OUT loose.
fault_part() {
    run fault_unit env TROUPE_BACKEND=cuda "$build_all/tests/engine/test_device_fault"
    run fault env TROUPE_BACKEND=cuda TROUPE_SOURCE_ROOT="$PWD" OPENBLAS_NUM_THREADS=1 \
        tests/rl/test_device_fault.sh "$build_all/cli/troupe"
    cp "$logs/fault_unit.log" "$logs/fault.log" "$out/" 2>/dev/null
    echo "fault: $(grep -c '^ok:' "$logs/fault.log") ok, $(grep -c '^FAIL:' "$logs/fault.log") failed" >>"$summary"
}

# The GPU quickstart (tools/quickstart_gpu.sh): SFT from scratch of a 113M-parameter model,
# then GRPO with a verifier; its held-out accuracy must rise by 15 points or more.
quickstart_gpu_part() {
    rm -rf runs/quickstart-gpu-sft runs/quickstart-gpu
    run quickstart_gpu timeout "${QUICKSTART_GPU_LIMIT:-600}" tools/quickstart_gpu.sh "$build_all" || return 1
    run quickstart_gpu_gain python3 - runs/quickstart-gpu/metrics.jsonl <<'EOF'
import json, sys
ev = [o["eval/accuracy"] for o in map(json.loads, open(sys.argv[1])) if "eval/accuracy" in o]
sys.exit(0 if len(ev) >= 2 and ev[-1] - ev[0] >= 0.15 else 1)
EOF
}

# Training throughput at the Qwen2.5-0.5B and -1.5B shapes beside the PyTorch anchor (eager and
# torch.compile), when the peers' scripts were carried along in ./anchors (they are not part of
# this tree: copy ../shared/anchors into the carried folder).
train_bench_part() {
    if [ ! -f anchors/torch_anchor.py ]; then
        echo "train_bench: no anchors/torch_anchor.py, skipped" | tee -a "$summary"
        return 0
    fi
    # TRAIN_SHAPES narrows the shapes (default: both).
    # shellcheck disable=SC2086  # a list of shape names
    run train_bench bench/run_gpu_train.sh "$build_all" anchors ${TRAIN_SHAPES:-}
}

# Where a training step's device time goes (TROUPE_CUDA_PROFILE's table) at the 0.5B and 1.5B
# shapes, the LM head's chunk from the memory plan; with PROFILE_GEMM=1 every cuBLASLt
# candidate of the step's products timed, with PROFILE_LOGIT_ROWS=N the 0.5B step again at N
# rows a chunk.
profile_part() {
    local b="$build_all/bench/bench_train_gpu"
    if [ "${PROFILE_GEMM:-0}" = 1 ]; then run gemm_candidates "$build_all/bench/bench_cuda" gemm; fi
    run profile env TROUPE_CUDA_PROFILE=1 "$b" qwen2.5-0.5b 8 2048 3
    run profile_15b env TROUPE_CUDA_PROFILE=1 "$b" qwen2.5-1.5b 4 2048 3
    if [ -n "${PROFILE_LOGIT_ROWS:-}" ]; then
        run profile_rows env TROUPE_CUDA_PROFILE=1 "$b" qwen2.5-0.5b 8 2048 3 "$PROFILE_LOGIT_ROWS"
    fi
}

# One GRPO step against TRL's GRPOTrainer (bench/run_grpo_gpu.sh) at the shapes of GRPO_SHAPES
# (default: the 0.5B), when the anchors are carried in ./anchors and TRL's wheels in ./.whl.
rl_bench_part() {
    # shellcheck disable=SC2086  # a list of shape names
    run grpo_bench env WHEELS_DIR=.whl bench/run_grpo_gpu.sh "$build_all" anchors ${GRPO_SHAPES:-qwen2.5-0.5b}
}

# PPO with a critic (bench/run_grpo_gpu.sh with WORKFLOW=ppo: policy, reference and critic
# colocated on the GPU; troupe alone, TRL has no PPO anchor here) at the shapes of GRPO_SHAPES.
ppo_bench_part() {
    # shellcheck disable=SC2086  # a list of shape names
    run ppo_bench env WORKFLOW=ppo bench/run_grpo_gpu.sh "$build_all" /nonexistent ${GRPO_SHAPES:-qwen2.5-0.5b}
}

# What the zero-mismatch mode and activation recompute cost at the 0.5B shape: one GRPO step's
# generation (bench_decode_gpu) and a training step at the GRPO bench's micro-batch (32 rows of
# 512) with batch-invariant products on (the default) and off, and training with recompute;
# and what recorded decode steps gain (the same generation with TROUPE_CUDA_GRAPHS=0).
costs_part() {
    local d="$build_all/bench/bench_decode_gpu" tb="$build_all/bench/bench_train_gpu"
    run cost_decode_invariant env TROUPE_CUDA_BATCH_INVARIANT=1 timeout 180 "$d" qwen2.5-0.5b
    run cost_decode_no_graphs env TROUPE_CUDA_GRAPHS=0 timeout 180 "$d" qwen2.5-0.5b
    run cost_decode_fastest env TROUPE_CUDA_BATCH_INVARIANT=0 timeout 180 "$d" qwen2.5-0.5b
    run cost_train_invariant env TROUPE_CUDA_BATCH_INVARIANT=1 timeout 180 "$tb" qwen2.5-0.5b 32 512 3
    run cost_train_fastest env TROUPE_CUDA_BATCH_INVARIANT=0 timeout 180 "$tb" qwen2.5-0.5b 32 512 3
    run cost_train_recompute env TROUPE_RECOMPUTE=on timeout 180 "$tb" qwen2.5-0.5b 32 512 3
}

# Decode throughput beside HF generate with a static KV cache + torch.compile
# (bench/run_decode_gpu.sh: tokens/s, the ratio, troupe's fraction of the roofline) at the shapes
# of DECODE_SHAPES (default both) and batch 64 and 256 (BATCHES), when the anchors are carried in
# ./anchors (without them troupe runs alone). Needs only the engine layer; each run's output is
# kept in $logs/decode_bench, packed with the logs.
decode_bench_part() {
    if [ "$build" = "$build_all" ]; then
        deps_and_build_all || return 1
    else
        run setup_decode configure "$build" -Dcuda=enabled -Dlayers=engine || return 1
    fi
    run build_decode ninja -C "$build" bench/bench_decode_gpu || return 1
    # shellcheck disable=SC2086  # a list of shape names
    run decode_bench env OUT="$logs" bench/run_decode_gpu.sh "$build" anchors ${DECODE_SHAPES:-}
}

# The decode step's kernels: the op tests of its products, attention and sampler (bits against
# cuBLASLt, the forward and the CPU), their benchmarks, the generator at batch 64 and 256
# (profiled at 64), generation's logprobs against the training forward, and a training step
# (what the forward's softmax chunks cost it).
decode_kernels_part() {
    local t="$build_all/tests/kernels/test_cuda_ops" bc="$build_all/bench/bench_cuda"
    local d="$build_all/bench/bench_decode_gpu"
    echo "profilers: $(command -v nsys ncu || echo none)" | tee "$logs/profilers.log"
    for s in attention sample logsoftmax rope kv_write rope_kv_write matmul; do
        run "ops_$s" env OPENBLAS_NUM_THREADS=1 "$t" "$s"
    done
    # generation on the GPU: fp32 against the CPU's tokens, bf16 against its own forward
    run generate_f32 env TROUPE_BACKEND=cuda TROUPE_PRECISION=fp32 meson test -C "$build_all" \
        --print-errorlogs test_generate
    run generate_bf16 env TROUPE_BACKEND=cuda meson test -C "$build_all" --print-errorlogs \
        test_generate
    run bench_sample "$bc" sample
    run bench_gemm_decode "$bc" gemm_decode
    run bench_attention "$bc" attention
    # both modes: batch-invariant (the default) and fastest (split reductions at decode sizes)
    for inv in 1 0; do
        for b in 64 256; do
            run "decode_${b}_inv$inv" env TROUPE_CUDA_BATCH_INVARIANT=$inv timeout 120 \
                "$d" qwen2.5-0.5b "$b" 1 256 256
        done
    done
    run decode_grpo timeout 120 "$d" qwen2.5-0.5b
    run decode_profile_64 env TROUPE_CUDA_PROFILE=1 timeout 120 "$d" qwen2.5-0.5b 64 1 256 256
    run model_bf16 env TROUPE_BACKEND=cuda meson test -C "$build_all" --print-errorlogs test_model_bf16
    run train_05b timeout 120 "$build_all/bench/bench_train_gpu" qwen2.5-0.5b 8 2048 3
    # What the knobs of newer kernels change: decode products without the backend's own
    # GEMM (TROUPE_CUDA_SEQK=0), decode attention's copies through the slot-offset table
    # (TROUPE_CUDA_DECODE_LEAN=0)
    for knob in TROUPE_CUDA_SEQK=0 TROUPE_CUDA_DECODE_LEAN=0; do
        for b in 64 256; do
            local tag=${knob#TROUPE_CUDA_}
            run "decode_${b}_${tag%=0}_off" env "$knob" timeout 120 "$d" qwen2.5-0.5b "$b" 1 256 256
        done
    done
    run bench_attention_lean_off env TROUPE_CUDA_DECODE_LEAN=0 "$bc" attention
    # ... and what the early starts of a decode step's small kernels add (TROUPE_CUDA_PDL=1),
    # with generation's bf16 equalities checked under them
    run generate_bf16_pdl env TROUPE_BACKEND=cuda TROUPE_CUDA_PDL=1 meson test -C "$build_all" \
        --print-errorlogs test_generate
    for b in 64 256; do
        run "decode_${b}_pdl_on" env TROUPE_CUDA_PDL=1 timeout 120 "$d" qwen2.5-0.5b "$b" 1 256 256
    done
    # DECODE_CHUNKS="128 ...": the softmax chunk's trade (decode attention against the training
    # forward's folds) at other lengths, every part of it that the chunk touches
    for c in ${DECODE_CHUNKS:-}; do
        run "ops_attention_chunk$c" env TROUPE_CUDA_SOFTMAX_CHUNK="$c" OPENBLAS_NUM_THREADS=1 "$t" attention
        run "bench_attention_chunk$c" env TROUPE_CUDA_SOFTMAX_CHUNK="$c" "$bc" attention
        for b in 64 256; do
            run "decode_${b}_chunk$c" env TROUPE_CUDA_SOFTMAX_CHUNK="$c" timeout 120 \
                "$d" qwen2.5-0.5b "$b" 1 256 256
        done
        run "train_05b_chunk$c" env TROUPE_CUDA_SOFTMAX_CHUNK="$c" timeout 120 \
            "$build_all/bench/bench_train_gpu" qwen2.5-0.5b 8 2048 3
    done
    # DECODE_15B=1: the 1.5B shape at batch 64 and 256 too
    if [ "${DECODE_15B:-0}" = 1 ]; then
        for b in 64 256; do run "decode_15b_$b" timeout 120 "$d" qwen2.5-1.5b "$b" 1 256 256; done
    fi
}

# Kernel counters of a decode step (Nsight Compute, where the image has it). First every kernel
# of one steady decode step of the 0.5B shape at 64 rows (a replayed graph's nodes, well past the
# warm-up's first steps) with its duration and DRAM bytes, summed by kernel name in
# ncu_step_summary.txt: the step's true device time, which the event profile inflates. Then for
# each kernel family in NCU_KERNELS (environment; name patterns) a few instances' speed of light,
# occupancy, warp stall reasons and launch shape, one log each: what bounds a latency-bound
# kernel (too few warps, a dependent load, a barrier) shows there, where a timing alone does not.
ncu_part() {
    local ncu d="$build_all/bench/bench_decode_gpu" k
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    if [ ! -x "$ncu" ]; then
        echo "ncu: not on this machine" | tee -a "$summary"
        return 0
    fi
    run ncu_step timeout "${NCU_STEP_TIMEOUT:-200}" "$ncu" --csv --page raw --clock-control none \
        --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes.sum --launch-skip "${NCU_SKIP:-4000}" \
        --launch-count "${NCU_COUNT:-300}" --log-file "$logs/ncu_step.csv" \
        "$d" qwen2.5-0.5b 64 1 256 64
    run ncu_step_summary python3 tools/ncu_summary.py "$logs/ncu_step.csv"
    for k in ${NCU_KERNELS:-fa_decode rmsnorm sample_draw swiglu}; do
        [ "$k" = - ] && continue   # NCU_KERNELS=-: the step's sums alone
        run "ncu_$k" timeout 90 "$ncu" --kernel-name "regex:$k" --launch-skip 200 \
            --launch-count 2 --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --section LaunchStats --section MemoryWorkloadAnalysis \
            "$d" qwen2.5-0.5b 64 1 256 32
    done
}

# The sequential-k GEMM (kernels/cuda/gemm_seqk.cu) under Nsight Compute: `bench_cuda
# gemm_decode` runs its ten configurations seven times each (a check, then six timed runs) for
# the 0.5B model's qkv, o, gate/up and down at 64 rows, in that order; SEQK_SKIP picks one
# launch (default: the down projection's tile 16x32, a timed run), profiled in full.
ncu_seqk_part() {
    local ncu
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    [ -x "$ncu" ] || { echo "ncu: not on this machine" | tee -a "$summary"; return 0; }
    run ncu_seqk timeout 120 "$ncu" --kernel-name sq_kernel --launch-skip "${SEQK_SKIP:-260}" \
        --launch-count 1 --set full "$build_all/bench/bench_cuda" gemm_decode
}

# The training step's own kernels: the warpgroup-MMA tile products (test_wgmma), the op tests
# of attention (forward, backward and decode against the CPU, run to run; every pass on
# wgmma against mma.sync, the pipelined wgmma forward too) and RMSNorm (rows alone against the batch's too), generation's bf16
# logprobs against the training forward's (test_model_bf16), the attention section of
# bench_cuda on wgmma, on mma.sync and with the pipelined forward (with ATTN_PEER=1 torch's
# attention beside it), the device
# time of each of the backward's passes at the 0.5B shape (TROUPE_CUDA_PROFILE's table), the
# 0.5B training step dense and packed (BENCH_PACKED=1), and with ATTN_NCU=1 a full Nsight
# Compute report of one launch of each kernel at that shape (ncu_attn_*.log: occupancy, stall
# reasons, pipe use; ATTN_NCU_KERNELS narrows the kernels).
train_kernels_part() {
    local t="$build_all/tests/kernels/test_cuda_ops" bc="$build_all/bench/bench_cuda" k ncu
    run test_wgmma "$build_all/tests/kernels/test_wgmma"
    run attn_ops env OPENBLAS_NUM_THREADS=1 "$t" attention
    run attn_ops_mma env TROUPE_CUDA_WGMMA=0 OPENBLAS_NUM_THREADS=1 "$t" attention
    run attn_ops_wg env TROUPE_CUDA_WGMMA=7 OPENBLAS_NUM_THREADS=1 "$t" attention
    run attn_ops_pipe env TROUPE_CUDA_WGMMA=15 OPENBLAS_NUM_THREADS=1 "$t" attention
    run rmsnorm_ops env OPENBLAS_NUM_THREADS=1 "$t" rmsnorm
    run model_bf16 env TROUPE_BACKEND=cuda meson test -C "$build_all" --print-errorlogs \
        test_model_bf16
    run attn_bench "$bc" attention
    run attn_bench_mma env TROUPE_CUDA_WGMMA=0 "$bc" attention
    run attn_bench_wg env TROUPE_CUDA_WGMMA=7 "$bc" attention
    run attn_bench_pipe env TROUPE_CUDA_WGMMA=15 "$bc" attention
    if [ "${ATTN_PEER:-0}" = 1 ]; then
        run attention_peer timeout 300 python3 bench/attention_peer.py --troupe "$bc"
    fi
    run attn_profile env TROUPE_CUDA_PROFILE=1 "$bc" attention qwen05b_dense
    run attn_train_05b timeout 120 "$build_all/bench/bench_train_gpu" qwen2.5-0.5b 8 2048 3
    # the same tokens packed as rollouts come (documents of 256 to 2,048): issue 13 asks for
    # packed MFU within 10% of dense, attention counted per document
    run train_05b_packed env BENCH_PACKED=1 timeout 120 "$build_all/bench/bench_train_gpu" \
        qwen2.5-0.5b 8 2048 3
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    if [ "${ATTN_NCU:-0}" = 1 ] && [ -x "$ncu" ]; then
        for k in ${ATTN_NCU_KERNELS:-fa_forward fa_dkv fa_dq fa_rows}; do
            run "ncu_attn_$k" timeout 120 "$ncu" --kernel-name "regex:$k" --launch-skip 3 \
                --launch-count 1 --set full "$bc" attention qwen05b_dense
        done
    fi
}

# Decode attention at each cp.async stage count the launch can pick, for the rule that picks it.
decode_stages_part() {
    local b="$build_all/bench/bench_cuda"
    for n in 1 2 4; do
        run "decode_stages_$n" bash -c "TROUPE_CUDA_DECODE_STAGES=$n $b attention | grep -E 'attn_decode|attn_copy'"
    done
}

parts="${*:-engine full cuda quickstart fault}"
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
run nvidia-smi nvidia-smi || true
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
echo "commit: $commit" | tee -a "$summary"
if [ -d .debs/dev ]; then build=$build_all; fi
if has engine; then engine_part; fi
if has decode_bench; then decode_bench_part; fi
if [ -d .debs/dev ]; then
    if has full; then full_part; fi
    if has cuda || has quickstart || has fault || has quickstart_gpu || has train_bench || has profile ||
        has rl_bench || has decode_stages || has ppo_bench || has costs || has decode_kernels ||
        has ncu || has ncu_seqk || has train_kernels; then
        deps_and_build_all
    fi
    if has cuda; then cuda_part; fi
    if has quickstart; then quickstart_part; fi
    if has fault; then fault_part; fi
    if has quickstart_gpu; then quickstart_gpu_part; fi
    if has train_bench; then train_bench_part; fi
    if has profile; then profile_part; fi
    if has decode_stages; then decode_stages_part; fi
    if has train_kernels; then train_kernels_part; fi
    if has decode_kernels; then decode_kernels_part; fi
    if has ncu; then ncu_part; fi
    if has ncu_seqk; then ncu_seqk_part; fi
    if has rl_bench; then rl_bench_part; fi
    if has ppo_bench; then ppo_bench_part; fi
    if has costs; then costs_part; fi
else
    echo "no .debs/: the full binary is not built (make it with tools/fetch_gpu_deps.sh and carry it)" |
        tee -a "$summary"
fi

# Test counts of each meson test run, for a glance without unpacking the logs.
for f in "$logs"/unit_kernels.log "$logs"/test_all.log "$logs"/model_tests.log; do
    [ -f "$f" ] || continue
    echo "$(basename "$f" .log): $(grep -E '^(Ok|Fail|Skipped|Timeout):' "$f" | tr -s ' ' | tr '\n' ' ')" >>"$summary"
done
echo "overall status: $status" >>"$summary"
tar -czf "$out/logs.tar.gz" -C "$out" logs && if [ -n "${OUT:-}" ]; then rm -rf "$logs"; fi
cat "$summary"
echo "logs in $out; overall status $status"
exit "$status"
