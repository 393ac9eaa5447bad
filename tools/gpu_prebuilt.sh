#!/usr/bin/env bash
# The kernel and engine tests and benchmarks on a GPU machine from binaries built elsewhere, so
# that a call spends its device time running them rather than compiling (a build there takes a
# minute or two of a call's limited time). nvcc compiles the CUDA backend on any machine; the
# binaries link cuBLAS and the CUDA runtime dynamically from /usr/local/cuda, which the GPU
# machine has too, and need nothing else there.
#
# Usage:
#   tools/gpu_prebuilt.sh pack [BUILD]   here: copies the binaries from BUILD (default
#                                        build-cuda, configured with -Dcuda=enabled) into
#                                        build-carry/ (ignored by git), to carry to the device,
#                                        each compressed by xz (a third of its size: a call's
#                                        tree is at most 64 MiB; run unpacks them); PACK_BINS
#                                        (paths under BUILD) carries fewer; CARRY
#                                        packs into another folder (build-base for trab)
#   tools/gpu_prebuilt.sh pack-variant NAME PATCH [BUILD]
#                                        here, after pack: a kernel variant beside them, PATCH
#                                        applied to the working tree, test_cuda_ops and
#                                        bench_cuda built into build-carry/variants/NAME/, then
#                                        the patch taken back out and the two rebuilt (about
#                                        6 MB a variant, compressed); VARIANT_ENVS, sets of
#                                        VAR=VALUE joined by commas and separated by spaces,
#                                        are the environments the variant is run in (default:
#                                        the call's own); VARIANT_SECTION, the bench_cuda and
#                                        test_cuda_ops section it is measured and tested with
#                                        (default attention; sample: the sampler's;
#                                        gemm_decode: the decode products';
#                                        attention_decode: bench_cuda attention decode), and
#                                        VARIANT_TEST_SECTION the test_cuda_ops one where
#                                        it differs (gemm_decode: matmul)
#   tools/gpu_prebuilt.sh run [PART...]  there: runs the parts with build-carry's binaries
# Parts (default: attn train):
#   attn   test_wgmma, test_cuda_ops attention (every bf16 pass on wgmma, the TMA forward and
#          dQ pass by default, against mma.sync; with TROUPE_CUDA_WGMMA=7, 15 and 63 too: wgmma
#          without TMA, the pipelined forward, and the pipelined TMA forward),
#          test_model_bf16, and bench_cuda attention on the default kernels, on mma.sync, on
#          wgmma without TMA, pipelined, and pipelined with TMA
#   ops    every test_cuda_ops section
#   kern   test_cuda_ops matmul, rmsnorm, rope, rope_kv_write, logsoftmax, buffers, sample,
#          sample_vocab and determinism (KERN_SECTIONS: others), and test_model_bf16
#   train  bench_train_gpu at the 0.5B and 1.5B shapes, 3 timed steps, dense and (0.5B) packed
#   decode bench_decode_gpu at the 0.5B and 1.5B shapes, batch 64 and 256, 256 + 256 tokens
#   split  decode attention's split walk (TROUPE_CUDA_DECODE_SPLIT): test_cuda_ops attention
#          (every decode kernel against the forward's rows, the split walk among them),
#          test_model_bf16 with it on wherever it fits, and bench_cuda attention decode (each
#          kernel, the split walk among them, then the rule)
#   pref   the prefetch op (TROUPE_CUDA_PREFETCH=1: a layer's weights brought into L2 ahead of
#          its products at generation; 2: lines marked evict-last): test_cuda_ops buffers,
#          test_model_bf16 with it on, and bench_decode_gpu with it off, 1 and 2, alternating,
#          at both shapes, batch 64 and 256, then at 0.5B batch 64 with the fused gate/up +
#          SwiGLU too
#   trab   bench_train_gpu at the 0.5B shape from BASE_CARRY (default build-base: binaries
#          of another commit, packed with CARRY=build-base PACK_BINS=bench/bench_train_gpu
#          and carried too) and from the tree's, alternating, TRAB_RUNS (2) times each
#   fglu   the decode step's gate/up product fused with SwiGLU (TROUPE_CUDA_FUSED_SWIGLU=1):
#          test_cuda_ops matmul (the fused op against the two ops, bitwise), test_model_bf16
#          with it on, and bench_decode_gpu with it off and on, alternating, at the 0.5B shape
#          (batch 64 and 256) and the 1.5B shape (batch 64)
#   peer   bench/run_gpu_train.sh beside torch (anchors/ carried too): the issue-13 table
#   conv   bench/run_converge_gpu.sh: 200 steps of the 0.5B shape beside three torch seeds
#          (the issue-13 convergence check; CONVERGE_BUDGET_S, default 540, bounds it)
#   apeer  bench/attention_peer.py: torch's best attention (SDPA, FlexAttention) beside
#          bench_cuda attention, the same shapes, with the ratios (APEER_ONLY: the shapes to run,
#          as attention_peer.py's --only takes them)
#   prof   TROUPE_CUDA_PROFILE's table of a training step at both shapes (device time per op)
#   ncu    Nsight Compute on one launch of the default (TMA) forward at D = 64 and 128 (dense
#          shapes): the details page and every SASS instruction's executions and stall
#          samples (csv)
#   gen    test_cuda_ops attention and buffers, and test_model_bf16 (generation on the default
#          kernels)
#   dprof  TROUPE_CUDA_PROFILE's table of decode steps (device time per op) at the 0.5B shape,
#          batch 64, and the 1.5B shape, batch 256
#   sncu   Nsight Compute on one draw of the sampler (sample_draw_kernel, bench_cuda sample's
#          first timed draw at temperature 1: 64 rows of 151,936 logits): the details page and
#          the SASS's executions and stall samples (csv)
#   gdec   bench_cuda gemm_decode: every candidate of a decode step's products at 64 and 256
#          rows (cuBLASLt's algorithms whole and split, and the sequential-k kernel's
#          configurations that keep the plan's bits) beside the batch-invariant plan, us each
#   wide   test_cuda_ops attention with the TMA forward's wide tiles at D = 64 and 128
#          (TROUPE_CUDA_WGMMA=247) against mma.sync, and bench_cuda attention
#          on narrow tiles (55) beside wide ones; WIDE_PICK=1 then runs the later parts with
#          wide tiles at each head dimension where they passed and were faster
#   smacc  test_cuda_ops attention with the wide forward's chunk accumulator in shared memory
#          (TROUPE_CUDA_WGMMA=503, the default; at D = 128 with two K/V stages) against
#          mma.sync, test_model_bf16 with it, and bench_cuda attention with it (503) beside the
#          accumulator in local memory (247)
#   variants  the tree's own bench_cuda attention in each environment of BASE_ENVS (as
#          VARIANT_ENVS; default: the call's own) when a variant is measured with it (that
#          bench takes minutes), then each variant's in each of its
#          environments, and its test_cuda_ops attention where it ran a dense forward faster
#          than the tree in the same environment (VARIANT_TESTS=all: everywhere), so that every
#          line compared comes from the same call; a variant packed with another
#          VARIANT_SECTION is measured with that bench_cuda section, beside the tree's in the
#          same environment, and always tested with that test_cuda_ops section
#   dec    test_cuda_ops attention (both decode kernels, and attention_decode_rope, against the
#          forward and the ops it joins), test_model_bf16, bench_cuda attention decode (each
#          decode kernel, then the rule), bench_decode_gpu with each decode kernel and with
#          RoPE in the decode attention's launch or not; DEC_NCU=1 adds Nsight Compute on the
#          shared-chunk decode kernel at batch 64, context 512 (0.5B's heads, then D = 128)
# Output: $OUT (else ./gpu-results): prebuilt.tar.gz (a log per step) and prebuilt_summary.txt
# (each step's exit status, its failed checks and the benchmark lines, also printed as each
# step ends, so that a run cut short still shows what it finished). PEER_TIMEOUT (seconds,
# default 400) bounds the peer part; PEER_SHAPES (default both) names the shapes it runs;
# PEER_COMPILE_ONLY=1 runs torch.compile without eager (bench/run_gpu_train.sh).
set -u
cd "$(dirname "$0")/.." || exit 1
carry="${CARRY:-build-carry}"
bins="tests/kernels/test_wgmma tests/kernels/test_cuda_ops tests/engine/test_model_bf16
      bench/bench_cuda bench/bench_train_gpu bench/bench_decode_gpu bench/converge_gpu"

if [ "${1:-}" = pack-variant ]; then
    name=${2:?pack-variant NAME PATCH [BUILD]} patch=${3:?pack-variant NAME PATCH [BUILD]}
    build=${4:-build-cuda}
    vbins="tests/kernels/test_cuda_ops bench/bench_cuda"
    git apply --check "$patch" || exit 1
    git apply "$patch" || exit 1
    # shellcheck disable=SC2086
    ninja -C "$build" $vbins >/dev/null
    rc=$?
    if [ $rc = 0 ]; then
        for b in $vbins; do
            mkdir -p "$carry/variants/$name/$(dirname "$b")"
            cp "$build/$b" "$carry/variants/$name/$b" && xz -f -T0 -3 "$carry/variants/$name/$b" ||
                rc=1
        done
        echo "${VARIANT_ENVS:-}" >"$carry/variants/$name/envs"
        echo "${VARIANT_SECTION:-attention}" >"$carry/variants/$name/section"
        echo "${VARIANT_TEST_SECTION:-${VARIANT_SECTION:-attention}}" \
            >"$carry/variants/$name/test_section"
    fi
    git apply -R "$patch" || { echo "gpu_prebuilt: could not take $patch back out" >&2; exit 1; }
    # shellcheck disable=SC2086
    ninja -C "$build" $vbins >/dev/null || exit 1
    [ $rc = 0 ] && du -sh "$carry/variants/$name"
    exit $rc
fi
if [ "${1:-}" = pack ]; then
    build=${2:-build-cuda}
    rm -rf "$carry" && mkdir -p "$carry" || exit 1
    for b in ${PACK_BINS:-$bins}; do
        mkdir -p "$carry/$(dirname "$b")"
        cp "$build/$b" "$carry/$b" && xz -f -T0 -3 "$carry/$b" || exit 1
    done
    du -sh "$carry"
    exit 0
fi
[ "${1:-}" = run ] || { sed -n "2,/^set -u/p" "$0" | sed "\$d"; exit 2; }
shift
parts="${*:-attn train}"
out="${OUT:-gpu-results}"
logs="$out/prebuilt"
mkdir -p "$logs"
summary="$out/prebuilt_summary.txt"
: >"$summary"
export TROUPE_SOURCE_ROOT=$PWD OPENBLAS_NUM_THREADS=1
# the binaries come compressed (pack)
find "$carry" -name '*.xz' -exec xz -d -f -T0 {} + || { echo "gpu_prebuilt: unpacking failed" >&2; exit 1; }

step() {   # step NAME CMD...: output to $logs/NAME.log, exit status to the summary
    local name=$1
    shift
    "$@" >"$logs/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc" | tee -a "$summary"
    grep -hE "CHECK failed" "$logs/$name.log" | head -3 | tee -a "$summary"
}
has() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
# attn_bench NAME TAG BENCH [VAR=VALUE...]: step NAME, bench_cuda attention (the binary BENCH) in
# that environment, its lines into the summary as "TAG attn shape=..."
attn_bench() {
    local name=$1 tag=$2 bin=$3
    shift 3
    step "$name" env "$@" "$bin" attention
    grep "^attn shape" "$logs/$name.log" | sed "s/^/$tag /" | tee -a "$summary"
}
# fwd_ms TAG SHAPE: the forward's milliseconds at SHAPE on TAG's summary line
fwd_ms() {
    awk -v p="$1 attn shape=$2 " 'index($0, p) == 1 && match($0, /fwd_ms=[0-9.]+/) {
        print substr($0, RSTART + 7, RLENGTH - 7); exit }' "$summary"
}
# fwd_faster TAG BASE SHAPE: whether TAG ran the forward at SHAPE faster than BASE did
fwd_faster() {
    awk -v a="$(fwd_ms "$2" "$3")" -v b="$(fwd_ms "$1" "$3")" 'BEGIN { exit !(b > 0 && b < a) }'
}
# ncu_profile NAME KERNEL SKIP TAG [VAR=VALUE...] -- CMD...: step NAME, Nsight Compute on the
# launch of the kernel matching the regex KERNEL after SKIP of them in CMD (run in that
# environment); the details page and the SASS's executions and stall samples (csv) beside the
# logs, the headline metrics into the summary as "TAG ..."
ncu_profile() {
    local name=$1 kernel=$2 skip=$3 tag=$4 r="$logs/$1" ncu envs=()
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    shift 4
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    step "$name" timeout 150 env "${envs[@]}" "$ncu" --clock-control none --set full \
        --kernel-name-base mangled --kernel-name "regex:$kernel" --launch-skip "$skip" \
        --launch-count 1 -o "$r" "$@"
    "$ncu" -i "$r.ncu-rep" --page details >"$r.details.txt" 2>&1
    "$ncu" -i "$r.ncu-rep" --page source --print-source sass --csv >"$r.sass.csv" 2>&1
    rm -f "$r.ncu-rep"
    grep -E "Duration|Executed Ipc A|Issue Slots Busy|Registers Per|Achieved Occ|DRAM Throughput" \
        "$r.details.txt" | sed "s/^/$tag /" | tee -a "$summary"
}

t="$carry/tests/kernels/test_cuda_ops" bc="$carry/bench/bench_cuda" bt="$carry/bench/bench_train_gpu"
if has attn; then
    step test_wgmma "$carry/tests/kernels/test_wgmma"
    step attn_ops "$t" attention
    step attn_ops_wg env TROUPE_CUDA_WGMMA=7 "$t" attention
    step attn_ops_pipe env TROUPE_CUDA_WGMMA=15 "$t" attention
    step attn_ops_tpipe env TROUPE_CUDA_WGMMA=63 "$t" attention
    step model_bf16 env TROUPE_BACKEND=cuda timeout 120 "$carry/tests/engine/test_model_bf16"
    for v in "default:" "mma:TROUPE_CUDA_WGMMA=0" "wg:TROUPE_CUDA_WGMMA=7" \
        "pipe:TROUPE_CUDA_WGMMA=15" "tpipe:TROUPE_CUDA_WGMMA=63"; do
        attn_bench "attn_bench_${v%%:*}" "${v%%:*}" "$bc" ${v#*:}
    done
fi
if has ops; then step ops_all "$t"; fi
if has kern; then
    for sec in ${KERN_SECTIONS:-matmul rmsnorm rope rope_kv_write logsoftmax buffers sample \
        sample_vocab determinism}; do
        step "${sec}_ops" "$t" "$sec"
    done
    has attn || step model_bf16 env TROUPE_BACKEND=cuda timeout 120 "$carry/tests/engine/test_model_bf16"
fi
if has train; then
    step train_05b timeout 100 "$bt" qwen2.5-0.5b 8 2048 3
    step train_05b_packed env BENCH_PACKED=1 timeout 100 "$bt" qwen2.5-0.5b 8 2048 3
    step train_15b timeout 100 "$bt" qwen2.5-1.5b 4 2048 3
    grep -h "troupe train" "$logs"/train_*.log | tee -a "$summary"
fi
if has split; then
    step split_ops "$t" attention
    step split_model_bf16 env TROUPE_BACKEND=cuda TROUPE_CUDA_DECODE_SPLIT=1 timeout 120 \
        "$carry/tests/engine/test_model_bf16"
    step split_bench "$bc" attention decode
    grep "^attn_" "$logs/split_bench.log" | tee -a "$summary"
fi
if has pref; then
    step pref_ops "$t" buffers
    step pref_model_bf16 env TROUPE_BACKEND=cuda TROUPE_CUDA_PREFETCH=1 timeout 120 \
        "$carry/tests/engine/test_model_bf16"
    i=0
    for v in "qwen2.5-0.5b 64" "qwen2.5-0.5b 256" "qwen2.5-1.5b 64" "qwen2.5-1.5b 256" \
        "qwen2.5-0.5b 64"; do
        set -- $v
        i=$((i + 1))
        for p in 0 1 2; do
            n="pref_${1}_b$2_p${p}_$i"
            step "$n" env TROUPE_CUDA_PREFETCH=$p timeout 60 "$carry/bench/bench_decode_gpu" \
                "$1" "$2" 1 256 256
            grep -h "^troupe decode" "$logs/$n.log" | sed "s/^/prefetch=$p /" | tee -a "$summary"
        done
    done
    # with the weights in L2 the fused gate/up + SwiGLU (the sequential-k kernel) may win
    for p in 1 2; do
        n="pref_fglu_p$p"
        step "$n" env TROUPE_CUDA_PREFETCH=$p TROUPE_CUDA_FUSED_SWIGLU=1 timeout 60 \
            "$carry/bench/bench_decode_gpu" qwen2.5-0.5b 64 1 256 256
        grep -h "^troupe decode" "$logs/$n.log" | sed "s/^/prefetch=$p fused_swiglu=1 /" |
            tee -a "$summary"
    done
fi
if has trab; then
    # the 0.5B training step of the pack in BASE_CARRY (CARRY=build-base pack, of the commit
    # before) and of the tree's, alternating, TRAB_RUNS times each: a change's gain measured
    # on one machine in one call
    base=${BASE_CARRY:-build-base}
    find "$base" -name '*.xz' -exec xz -d -f -T0 {} +
    for i in $(seq "${TRAB_RUNS:-2}"); do
        for w in base tree; do
            bin="$carry/bench/bench_train_gpu"
            [ $w = base ] && bin="$base/bench/bench_train_gpu"
            step "trab_${w}_$i" timeout 100 "$bin" qwen2.5-0.5b 8 2048 3
            grep -h "troupe train" "$logs/trab_${w}_$i.log" | sed "s/^/$w /" | tee -a "$summary"
        done
    done
fi
if has decode; then
    for sh in qwen2.5-0.5b qwen2.5-1.5b; do
        for b in 64 256; do
            step "decode_${sh}_$b" timeout 120 "$carry/bench/bench_decode_gpu" "$sh" "$b" 1 256 256
            grep -h "^troupe decode" "$logs/decode_${sh}_$b.log" | tee -a "$summary"
        done
    done
fi
if has apeer; then
    step attn_peer timeout 300 python3 bench/attention_peer.py --troupe "$bc" \
        ${APEER_ONLY:+--only "$APEER_ONLY"}
    grep -E "^\||ratio|x$" "$logs/attn_peer.log" | head -20 | tee -a "$summary"
fi
if has prof; then
    step prof_05b env TROUPE_CUDA_PROFILE=1 timeout 100 "$bt" qwen2.5-0.5b 8 2048 3
    step prof_15b env TROUPE_CUDA_PROFILE=1 timeout 100 "$bt" qwen2.5-1.5b 4 2048 3
    for p in prof_05b prof_15b; do
        sed -n '/^cuda profile/,+24p' "$logs/$p.log" | sed "s/^/$p /" | tee -a "$summary"
    done
fi
if has ncu; then
    for k in "64:qwen05b_dense" "128:qwen15b_dense"; do
        ncu_profile "ncu_fwd${k%%:*}" "fa_forward_tma_kernelILi${k%%:*}E" 2 "fwd${k%%:*}" -- \
            "$bc" attention "${k#*:}"
    done
fi
if has gen; then
    step gen_ops "$t" attention
    step gen_buffers "$t" buffers
    step gen_model_bf16 env TROUPE_BACKEND=cuda timeout 120 "$carry/tests/engine/test_model_bf16"
fi
if has sncu; then
    # bench_cuda sample draws greedily first (REPS + 1 = 4 launches), then at temperature 1:
    # its warm-up launch skipped, the first timed one profiled
    ncu_profile ncu_sample sample_draw_kernel 5 sample -- "$bc" sample
fi
if has dprof; then
    for v in "qwen2.5-0.5b 64" "qwen2.5-1.5b 256"; do
        set -- $v
        n="dprof_${1}_b$2"
        step "$n" env TROUPE_CUDA_PROFILE=1 timeout 120 "$carry/bench/bench_decode_gpu" "$1" "$2" 1 256 256
        sed -n '/^cuda profile/,+30p' "$logs/$n.log" | sed "s/^/$n /" | tee -a "$summary"
    done
fi
if has gdec; then
    step gemm_decode timeout 200 "$bc" gemm_decode
    grep -E "rows:|plan|seqk" "$logs/gemm_decode.log" | head -120 | tee -a "$summary"
fi
if has wide; then
    step wide_ops env TROUPE_CUDA_WGMMA=247 "$t" attention
    attn_bench wide_bench_narrow narrow "$bc" TROUPE_CUDA_WGMMA=55
    attn_bench wide_bench_wide wide "$bc" TROUPE_CUDA_WGMMA=247
    # the mask the measurements favour: wide tiles at a head dimension where they passed the
    # tests and ran the dense forward faster (WIDE_PICK=1 exports it to the parts after)
    pick=55
    if grep -q "^wide_ops: exit 0" "$summary"; then
        fwd_faster wide narrow qwen05b_dense && pick=$((pick | 128))
        fwd_faster wide narrow qwen15b_dense && pick=$((pick | 64))
    fi
    echo "wide pick: TROUPE_CUDA_WGMMA=$pick" | tee -a "$summary"
    [ "${WIDE_PICK:-0}" = 1 ] && export TROUPE_CUDA_WGMMA=$pick
fi
if has smacc; then
    step smacc_ops env TROUPE_CUDA_WGMMA=503 "$t" attention
    step smacc_model_bf16 env TROUPE_BACKEND=cuda TROUPE_CUDA_WGMMA=503 timeout 120 \
        "$carry/tests/engine/test_model_bf16"
    attn_bench smacc_bench_local local "$bc" TROUPE_CUDA_WGMMA=247
    attn_bench smacc_bench_smacc smacc "$bc" TROUPE_CUDA_WGMMA=503
fi
if has variants; then
    # vbench NAME BIN_ROOT ENV [SECTION]: bench_cuda attention (or SECTION) from BIN_ROOT in
    # ENV (VAR=VALUE joined by commas; "-": the call's own), tagged "NAME[ENV]"
    vbench() {
        local e=$3 tag=$1 sec=${4:-attention}
        [ "$e" = - ] && e="" || tag="$1[$e]"
        if [ "$sec" = attention ]; then
            attn_bench "variant_${1}_bench_${e//[=,]/_}" "$tag" "$2/bench/bench_cuda" ${e//,/ }
            return
        fi
        local name="variant_${1}_bench_${sec}_${e//[=,]/_}" args=$sec
        # attention_decode: bench_cuda attention decode, the decode kernels' shapes
        [ "$sec" = attention_decode ] && args="attention decode"
        # shellcheck disable=SC2086
        step "$name" env ${e//,/ } "$2/bench/bench_cuda" $args
        # the section's result lines (gemm_decode's name each product and candidate)
        local pat="^ +$sec "
        [ "$sec" = gemm_decode ] && pat="plan|seqk"
        [ "$sec" = attention_decode ] && pat="^attn_"
        grep -E "$pat" "$logs/$name.log" | sed "s/^ */$tag /" | tee -a "$summary"
    }
    # whether TAG ran a dense forward faster than TREE (or TREE has no such line)
    faster_than() {
        local s a b
        for s in qwen05b_dense qwen15b_dense; do
            [ -z "$(fwd_ms "$2" $s)" ] && return 0
            fwd_faster "$1" "$2" $s && return 0
        done
        return 1
    }
    # the tree's bench_cuda attention (minutes) only where a variant is measured with it
    if cat "$carry"/variants/*/section 2>/dev/null | grep -qx attention; then
        for e in ${BASE_ENVS:-"-"}; do vbench tree "$carry" "$e"; done
    fi
    for v in "$carry"/variants/*/; do
        [ -d "$v" ] || continue
        n=$(basename "$v") sets=$(cat "$v/envs" 2>/dev/null)
        sec=$(cat "$v/section" 2>/dev/null || echo attention)
        tsec=$(cat "$v/test_section" 2>/dev/null || echo "$sec")
        for e in ${sets:-"-"}; do
            # another section's variant: the tree's own bench beside it, in this environment
            [ "$sec" != attention ] && vbench tree "$carry" "$e" "$sec"
            vbench "$n" "$v" "$e" "$sec"
            tag="[$e]"
            [ "$e" = - ] && tag="" e=""
            # the tests where the variant is a candidate (VARIANT_TESTS=all: everywhere)
            if [ "$sec" != attention ] || [ "${VARIANT_TESTS:-}" = all ] ||
                faster_than "$n$tag" "tree$tag"; then
                step "variant_${n}_ops_${e//[=,]/_}" env ${e//,/ } "$v/tests/kernels/test_cuda_ops" "$tsec"
            fi
        done
    done
fi
if has dec; then
    step dec_ops "$t" attention
    step dec_model_bf16 env TROUPE_BACKEND=cuda timeout 120 "$carry/tests/engine/test_model_bf16"
    step dec_bench "$bc" attention decode
    grep "^attn_" "$logs/dec_bench.log" | tee -a "$summary"
    # decode steps with each decode attention kernel (COOP) and RoPE and the cache write in
    # the attention's launch or not (ROPE)
    for v in "qwen2.5-0.5b 64 0 0" "qwen2.5-0.5b 64 1 0" "qwen2.5-0.5b 64 0 1" \
        "qwen2.5-0.5b 64 1 1" "qwen2.5-0.5b 256 auto 0" "qwen2.5-0.5b 256 auto 1" \
        "qwen2.5-1.5b 64 0 0" "qwen2.5-1.5b 64 1 1"; do
        set -- $v
        n="dec_${1}_b$2_coop$3_rope$4"
        step "$n" env TROUPE_CUDA_DECODE_COOP=$3 TROUPE_CUDA_DECODE_ROPE=$4 timeout 120 \
            "$carry/bench/bench_decode_gpu" "$1" "$2" 1 256 256
        grep -h "^troupe decode" "$logs/$n.log" | sed "s/^/coop=$3 rope=$4 /" | tee -a "$summary"
    done
    if [ "${DEC_NCU:-0}" = 1 ]; then
        for k in "512:64 512 14 2 64" "d128:64 512 12 2 128"; do
            ncu_profile "ncu_dec${k%%:*}" fa_decode_coop 2 "dec${k%%:*}" \
                TROUPE_CUDA_DECODE_COOP=1 -- "$bc" attention decode ${k#*:}
        done
    fi
fi
if has conv; then
    step converge env CONVERGE_OUT="$out/converge" bench/run_converge_gpu.sh "$carry"
    sed -n '/^convergence:/,$p' "$logs/converge.log" | tee -a "$summary"
fi
if has fglu; then
    step fglu_ops "$t" matmul
    grep "matmul_swiglu" "$logs/fglu_ops.log" | tee -a "$summary"
    step fglu_model_bf16 env TROUPE_BACKEND=cuda TROUPE_CUDA_FUSED_SWIGLU=1 timeout 120 \
        "$carry/tests/engine/test_model_bf16"
    for v in "qwen2.5-0.5b 64" "qwen2.5-0.5b 256" "qwen2.5-1.5b 64"; do
        set -- $v
        for r in 1 2; do
            for f in 0 1; do
                n="fglu_${1}_b$2_f${f}_$r"
                step "$n" env TROUPE_CUDA_FUSED_SWIGLU=$f timeout 120 \
                    "$carry/bench/bench_decode_gpu" "$1" "$2" 1 256 256
                grep -h "^troupe decode" "$logs/$n.log" | sed "s/^/fused=$f /" | tee -a "$summary"
            done
        done
    done
fi
if has peer; then
    step peer_train timeout "${PEER_TIMEOUT:-400}" bench/run_gpu_train.sh "$carry" anchors ${PEER_SHAPES:-}
    grep -E "^\|" "$logs/peer_train.log" | tee -a "$summary"
fi
tar czf "$out/prebuilt.tar.gz" -C "$out" prebuilt && rm -rf "$logs"
