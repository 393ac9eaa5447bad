#!/usr/bin/env bash
# One GRPO optimizer step, end to end, on the GPU beside the peer, in one invocation: troupe
# (`troupe run`, policy and reference colocated on one GPU) and TRL's GRPOTrainer (the anchor
# trl_grpo_anchor.py) at the same shape and settings: random weights of the Qwen2.5-0.5B or
# -1.5B shape, 64 prompts x 8 samples, prompts of 256 tokens, exactly 256 new tokens per
# completion (no stop token: the model config names no EOS and the prompts take no chat
# format), KL to a reference with coefficient (TRL: beta) 0.04, one AdamW step per GRPO step.
# LENGTHS=realistic (environment) makes the lengths realistic instead: completions end by a stop
# token, spread from 16 to 1,024 new tokens. A random-weight model samples nearly uniformly over
# the 151,936-id vocabulary, so a stop set of 594 ids (one in 256: every id congruent to 151643,
# TRL's EOS, modulo 256) ends a completion after each token with probability 1/256: with
# min_new_tokens 16 and max_new_tokens 1024 the lengths are 16 plus a geometric count, mean
# about 267, about 2% cut at 1,024. troupe lists the set as rollout.stop_ids; TRL runs through
# bench/trl_realistic.py, which gives the anchor's model the set as its eos ids and
# min_new_tokens 16 (see there for how TRL masks after a stop). There continuous batching
# (troupe) against padded batches that run to the longest completion (HF generate), and
# token-balanced micro-batches against padded ones, show.
# 4 steps each, the first a warm-up; the table gives the mean of the other 3: s/step, with
# generation, reference logprobs and training (troupe: the forward/backward passes, the
# optimizer step and the old-logprob check: the ratio's old logprobs are generation's, as TRL's
# single-iteration GRPO takes the policy's own, and 8 sequences are recomputed to measure the
# difference, printed as logprob_diff/max; OLD_LOGPROBS=recompute in the environment makes it a
# pass over the whole batch instead; TRL: everything after the rollout) and the
# rest (rewards, troupe's weight sync, bookkeeping), the ratio TRL / troupe (above 1:
# troupe is faster) and each side's mean completion length over the measured steps, stop token
# included (troupe's response_len/mean, TRL's completions/mean_length), which must agree.
#
# usage: bench/run_grpo_gpu.sh [--tiny | --check] BUILD_DIR ANCHOR_DIR [SHAPE...]
#   SHAPE: qwen2.5-0.5b, qwen2.5-1.5b (default: both).
#   ANCHOR_DIR holds trl_grpo_anchor.py (the peers' scripts; they are not part of this tree).
#   WHEELS_DIR (environment): a folder of the wheels the anchor needs and the GPU image lacks
#     (trl 1.16.0, datasets 5.0.1, dill 0.4.1, multiprocess 0.70.19); they are installed into
#     the temporary folder with pip --no-index --no-deps and put on PYTHONPATH.
#   WORKFLOW=ppo (environment): PPO with a critic instead (the policy's body under a value
#     head, colocated with policy and reference; GAE, one epoch, one mini-batch); TRL has no
#     such anchor here, so troupe runs alone and its critic phase is printed too.
#   LENGTHS=realistic (environment): completions end by stop tokens (above): rollout.stop_ids,
#     min_new_tokens 16, max_new_tokens 1024; with --tiny 19 stop ids of the 300 (one in 16),
#     min_new_tokens 4, max_new_tokens 64 (TRL's tiny model keeps the full vocabulary: one id in
#     16 of it).
#   TRL_MB (environment): completions per TRL micro-batch (default 32 as the anchor's; 16 with
#     LENGTHS=realistic, whose micro-batches pad to nearly 1,280 tokens a row; 8 with --tiny).
#   KEEP=1 (environment): leave the temporary folder (model config, tokenizer, prompts,
#     recipes, runs) in place; by default only the checkpoints the runs end with are removed.
#   --tiny: a CPU smoke test of the whole path (width 64, 2 layers, a 300-id vocabulary,
#     8 prompts x 4 samples, 16 + 16 tokens, backend cpu); the anchor runs with --tiny when
#     TRL imports, and is skipped with a note otherwise.
#   --check: the real shapes' files and recipe, run on the CPU with the batch and lengths cut
#     down by --set (1 prompt x 2 samples, 4 new tokens, 1 step, with LENGTHS=realistic
#     min_new_tokens 2; qwen2.5-0.5b unless shapes are named): proves the GPU recipe loads and
#     its files work, without a GPU (0.5B: about 13 GB of memory and a few minutes on 2 cores).
#
# On the GPU machine, from the repository root with .debs/ (tools/fetch_gpu_deps.sh: the upper
# layers' libraries), the anchors in shared/anchors and the wheels in .whl carried:
#   { [ -x build-cuda/cli/troupe ] || tools/gpu_deps.sh; } && . .deps-root/env.sh &&
#   { [ -d build-cuda ] || meson setup build-cuda -Dcuda=enabled -Dwerror=false; } &&
#   ninja -C build-cuda cli/troupe &&
#   WHEELS_DIR=.whl bench/run_grpo_gpu.sh build-cuda shared/anchors qwen2.5-0.5b qwen2.5-1.5b
# and the realistic table the same with LENGTHS=realistic in front of the last line (/tmp holds
# each run's final checkpoint until its shape is done: about 15 GiB at 1.5B; one shape per
# command if both do not fit in the time limit).
set -u
usage="usage: run_grpo_gpu.sh [--tiny | --check] BUILD_DIR ANCHOR_DIR [SHAPE...]"
mode=gpu
case "${1:-}" in
--tiny) mode=tiny; shift ;;
--check) mode=check; shift ;;
esac
lengths=${LENGTHS:-full}
case "$lengths" in
full | realistic) ;;
*) echo "run_grpo_gpu.sh: LENGTHS is full or realistic, not '$lengths'" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?$usage}
anchors=${2:?$usage}
shift 2
shapes=("$@")
[ ${#shapes[@]} -gt 0 ] || shapes=(qwen2.5-0.5b qwen2.5-1.5b)
[ "$mode" = gpu ] || [ $# -gt 0 ] || shapes=(qwen2.5-0.5b)
[ "$mode" != tiny ] || shapes=(tiny)
troupe=$build/cli/troupe
[ -x "$troupe" ] || { echo "run_grpo_gpu.sh: no troupe binary at $troupe (build first)" >&2; exit 1; }
[ -f "$anchors/trl_grpo_anchor.py" ] || echo "run_grpo_gpu.sh: note: no $anchors/trl_grpo_anchor.py; TRL is skipped"
for s in "${shapes[@]}"; do
    case "$s" in
    qwen2.5-0.5b | qwen2.5-1.5b | tiny) ;;
    *) echo "run_grpo_gpu.sh: unknown shape '$s' (qwen2.5-0.5b, qwen2.5-1.5b)" >&2; exit 2 ;;
    esac
done
tmp=$(mktemp -d /tmp/troupe-grpo-bench-XXXXXX) || { echo "run_grpo_gpu.sh: mktemp failed" >&2; exit 1; }
echo "run_grpo_gpu.sh: working in $tmp"
cleanup() { [ "${KEEP:-0}" = 1 ] || rm -rf "$tmp"; }
trap cleanup EXIT

# The peer's Python packages, when given as wheels.
pypath=${PYTHONPATH:-}
if [ -n "${WHEELS_DIR:-}" ]; then
    echo "== installing the anchor's wheels from $WHEELS_DIR"
    if ! python3 -m pip install --quiet --no-index --no-deps --target "$tmp/pylib" "$WHEELS_DIR"/*.whl; then
        echo "run_grpo_gpu.sh: installing the wheels of $WHEELS_DIR failed" >&2
        exit 1
    fi
    pypath=$tmp/pylib${pypath:+:$pypath}
fi
have_trl=0
if [ -f "$anchors/trl_grpo_anchor.py" ] &&
    PYTHONPATH=$pypath python3 -c 'import torch, transformers, accelerate, trl, datasets' 2>"$tmp/trl_import.err"; then
    have_trl=1
else
    echo "run_grpo_gpu.sh: note: TRL anchor skipped (not importable: $(tail -n 1 "$tmp/trl_import.err" 2>/dev/null))"
fi

# Lengths of the completions: CLEN new tokens each (full), or ended by the stop set (every id
# congruent to 151643 modulo STOP_EVERY) after at least MIN_NEW and at most CLEN (realistic).
if [ "$lengths" = realistic ]; then
    if [ "$mode" = tiny ]; then clen=64 min_new=4 stop_every=16; else clen=1024 min_new=16 stop_every=256; fi
else
    if [ "$mode" = tiny ]; then clen=16; else clen=256; fi
    min_new=0 stop_every=0
fi
# TRL's micro-batch (completions, padded to the longest): 32 as the anchor's at full length, 16
# with realistic lengths, whose micro-batches pad to nearly 1,024 new tokens (16 x 1,280 tokens,
# about troupe's 16,384-token micro-batches), 8 with --tiny.
if [ "$mode" = tiny ]; then trl_mb=8; elif [ "$lengths" = realistic ]; then trl_mb=16; else trl_mb=32; fi
trl_mb=${TRL_MB:-$trl_mb}

# write_inputs SHAPE DIR BACKEND STEPS CLEN MIN_NEW STOP_EVERY: writes SHAPE's config.json,
# tokenizer.json, prompts and recipe into DIR.
#   config.json: Qwen2 at the shape, eos_token_id null (no stop token), random init by troupe.
#   tokenizer.json: BPE over whole words with ignore_merges: id 0..10 are "t" and the digits,
#     id 11 + i is the word "t<i>", so every id of the vocabulary decodes, and a prompt of
#     words "t<i>" separated by spaces is exactly one token per word (as the anchor's).
#   prompts.jsonl: enough prompts of exactly PLEN tokens for every step.
#   recipe.yaml: grpo with the anchor's settings (realistic: and the stop set as rollout.stop_ids).
write_inputs() {
    python3 - "$@" <<'PY'
import json, os, random, sys
shape, d, backend, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
clen, min_new, stop_every = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
old_lp = os.environ.get("OLD_LOGPROBS", "rollout")
ppo = os.environ.get("WORKFLOW", "grpo") == "ppo"
dims = {  # hidden, intermediate, layers, heads, kv heads, vocab
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, 151936),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, 151936),
    "tiny": (64, 128, 2, 4, 2, 300),
}[shape]
hidden, inter, layers, heads, kv, vocab = dims
tiny = shape == "tiny"
# mb (--tiny): sequences of 16 + 16 tokens per micro-batch. The real shapes leave the micro-batch
# to the policy's memory plan (16,384 tokens on an H200 at both shapes: 32 full-length
# sequences), which packs realistic rows of up to 1,280 tokens by tokens.
prompts, n, plen, mb = (8, 4, 16, 8) if tiny else (64, 8, 256, 32)
# The stop set: ids congruent to TRL's EOS (151643) modulo stop_every, so that on the full
# vocabulary the two sides stop on the same ids (trl_realistic.py's rule).
stops = list(range(151643 % stop_every, vocab, stop_every)) if stop_every else []
stop_line = f"  stop_ids: [{', '.join(map(str, stops))}]\n" if stops else ""
os.makedirs(os.path.join(d, "model"), exist_ok=True)
cfg = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab,
    "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
    "num_attention_heads": heads, "num_key_value_heads": kv, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": True, "initializer_range": 0.02, "attention_dropout": 0.0,
    "use_sliding_window": False, "sliding_window": None,
    "bos_token_id": None, "eos_token_id": None, "pad_token_id": None, "torch_dtype": "bfloat16",
}
with open(os.path.join(d, "model", "config.json"), "w") as f:
    json.dump(cfg, f, indent=1)
words = vocab - 11
tv = {"t": 0}
tv.update({str(k): 1 + k for k in range(10)})
tv.update({f"t{i}": 11 + i for i in range(words)})
tok = {
    "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
    "post_processor": None,
    "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
              "ignore_merges": True, "vocab": tv, "merges": []},
}
with open(os.path.join(d, "model", "tokenizer.json"), "w") as f:
    json.dump(tok, f)
rng = random.Random(1)
with open(os.path.join(d, "prompts.jsonl"), "w") as f:
    for _ in range(prompts * steps):
        f.write(json.dumps({"prompt": " ".join(f"t{rng.randrange(words)}" for _ in range(plen))}) + "\n")
# The reward: 1 when the response's text ends in 0-4 (about half of them), so every group
# has a spread of rewards and every completion trains, as with the anchor's length reward.
critic = """  critic:
    from: policy
    optim: {lr: 1.0e-5, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1.0e-8, grad_clip: 1.0}
""" if ppo else ""
recipe = f"""# {"PPO" if ppo else "GRPO"} at the TRL anchor's settings ({shape}); written by bench/run_grpo_gpu.sh
workflow: {"ppo" if ppo else "grpo"}
seed: 1
run_dir: {d}/run
backend: {backend}
threads: 0
models:
  policy:
    init: {{config: {d}/model/config.json, seed: 1}}
    optim: {{lr: 1.0e-6, weight_decay: 0.0, betas: [0.9, 0.999], eps: 1.0e-8, grad_clip: 1.0}}
  reference:
    from: policy
{critic}  reward:
    kind: rule
    function: regex
    pattern: "[0-4]$"
data:
  train: {d}/prompts.jsonl
  chat_format: none
  max_prompt_len: {plen}
rollout:
  n: {n}
  max_new_tokens: {clen}
  min_new_tokens: {min_new}
{stop_line}  temperature: 1.0
  top_p: 1.0
algorithm:
  advantage: {"gae" if ppo else "grpo"}
  norm_by_std: true
  clip: {{low: 0.2, high: 0.2}}
  kl: {{coef: 0.04, estimator: k3, placement: loss}}
  loss_agg: token-mean
  ppo_epochs: 1
  mini_batches: 1
  old_logprobs: {old_lp}
train:
  steps: {steps}
  prompts_per_step: {prompts}
  micro_batch_tokens: {mb * (plen + 16) if tiny else 0}
  save_dtype: bf16
placement:
  colocate: [[policy, reference{", critic" if ppo else ""}]]
log:
  tensorboard: false
  progress: true
"""
with open(os.path.join(d, "recipe.yaml"), "w") as f:
    f.write(recipe)
PY
}

# Means over the steps after the first of metrics.jsonl's time/* keys, response length and clip
# ratio: "step gen ref train steps length diff sequences critic clip".
troupe_times() {
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("step", 0) >= 1 and r.get("time/step")]
meas = rows[1:] or rows
if not meas:
    sys.exit("no step with time/step in " + sys.argv[1])
mean = lambda k: sum(r.get(k) or 0.0 for r in meas) / len(meas)
diff = max(r.get("logprob_diff/max") or 0.0 for r in rows)
seqs = min(r.get("logprob_diff/sequences") or 0 for r in rows)
print(f"{mean('time/step'):.3f} {mean('time/generate'):.3f} {mean('time/reference'):.3f} "
      f"{mean('time/train'):.3f} {len(meas)} {mean('response_len/mean'):.1f} {diff:.3g} {seqs} "
      f"{mean('time/critic'):.3f} {mean('response_len/clip_ratio'):.4f}")
PY
}

steps=4
[ "$mode" != check ] || steps=1
backend=cuda
[ "$mode" = gpu ] || backend=cpu
for s in "${shapes[@]}"; do
    d=$tmp/$s
    mkdir -p "$d" || { echo "run_grpo_gpu.sh: $s: cannot make $d" >&2; exit 1; }
    if ! write_inputs "$s" "$d" "$backend" "$steps" "$clen" "$min_new" "$stop_every"; then
        echo "run_grpo_gpu.sh: $s: writing the model config, tokenizer, prompts and recipe failed" >&2
        exit 1
    fi
    sets=()
    if [ "$mode" = check ]; then
        sets=(--set train.prompts_per_step=1 --set rollout.n=2 --set rollout.max_new_tokens=4
              --set train.micro_batch_tokens=520)
        [ "$lengths" != realistic ] || sets+=(--set rollout.min_new_tokens=2)
    fi
    echo "== troupe $s ($backend)"
    if ! "$troupe" run "$d/recipe.yaml" "${sets[@]}"; then
        echo "run_grpo_gpu.sh: $s: troupe run failed (recipe $d/recipe.yaml, logs in $d/run/logs)" >&2
        KEEP=1
        exit 1
    fi
    if ! troupe_times "$d/run/metrics.jsonl" >"$d/troupe.txt"; then
        echo "run_grpo_gpu.sh: $s: reading troupe's metrics failed ($d/run/metrics.jsonl)" >&2
        KEEP=1
        exit 1
    fi
    read -r t_step t_gen t_ref t_train t_n t_len t_diff t_seqs t_critic t_clip <"$d/troupe.txt"
    echo "troupe ${WORKFLOW:-grpo} $s: $t_step s/step (generate $t_gen, reference $t_ref, train $t_train, critic $t_critic; mean of $t_n steps, mean response length $t_len, cut at max_new_tokens $t_clip; logprob_diff/max $t_diff over $t_seqs sequences a step)"
    rm -rf "$d/run/checkpoints"
    [ "$mode" != check ] || continue
    [ "$have_trl" = 1 ] && [ "${WORKFLOW:-grpo}" = grpo ] || continue
    echo "== TRL $s"
    targs=(--steps "$steps" --outdir "$d/trl" --clen "$clen" --mb "$trl_mb")
    if [ "$mode" = tiny ]; then
        targs+=(--tiny --prompts 8 --gens 4 --plen 16)
    else
        targs+=(--shape "$s")
    fi
    tcmd=(python3 "$anchors/trl_grpo_anchor.py")
    if [ "$lengths" = realistic ]; then
        tcmd=(python3 "$here/trl_realistic.py" --min-new-tokens "$min_new" --stop-every "$stop_every"
              "$anchors/trl_grpo_anchor.py")
    fi
    if ! PYTHONPATH=$pypath "${tcmd[@]}" "${targs[@]}" >"$d/trl.out" 2>"$d/trl.err"; then
        echo "run_grpo_gpu.sh: $s: the TRL anchor failed; the end of $d/trl.err:" >&2
        tail -n 20 "$d/trl.err" >&2
        KEEP=1
        continue
    fi
    grep '^SUMMARY ' "$d/trl.out" | tail -n 1 | cut -d' ' -f2- >"$d/trl.json"
    grep '^LOGS ' "$d/trl.out" | tail -n 1 | cut -d' ' -f2- >"$d/trl_logs.json"
    grep '^LENGTHS ' "$d/trl.out" || true
done

# The table: one row per shape, TRL n/a where it did not run.
[ "$mode" != check ] || { echo "run_grpo_gpu.sh: check passed for ${shapes[*]}"; exit 0; }
python3 - "$tmp" "$lengths" "${shapes[@]}" <<'PY'
import json, os, sys
tmp, lengths, shapes = sys.argv[1], sys.argv[2], sys.argv[3:]

def split(step, gen, ref, train):
    return f"{step:.2f} ({gen:.2f}, {ref:.2f}, {train:.2f}, {step - gen - ref - train:.2f})"


# TRL's mean completion length over the steps after the first, from its logged metrics.
def trl_length(path):
    if not os.path.exists(path) or not os.path.getsize(path):
        return None
    logs = [l for l in json.load(open(path)) if "completions/mean_length" in l]
    meas = [l for l in logs if l["step"] > 1] or logs
    return sum(l["completions/mean_length"] for l in meas) / len(meas) if meas else None


print(f"\nGRPO step, {lengths} lengths")
print("\n| shape | troupe s/step (gen, ref, train, other) | TRL s/step (gen, ref, train, other) | TRL / troupe "
      "| mean completion tokens troupe / TRL |")
print("|---|---|---|---|---|")
for s in shapes:
    f = open(os.path.join(tmp, s, "troupe.txt")).read().split()
    step, gen, ref, train = map(float, f[:4])
    t = split(step, gen, ref, train)
    p, ratio, tl = "n/a (not run)", "n/a", "n/a"
    path = os.path.join(tmp, s, "trl.json")
    if os.path.exists(path) and os.path.getsize(path):
        r = json.load(open(path))
        p = split(r["mean_step_s"], r["mean_generate_s"], r["mean_ref_logprobs_s"], r["mean_train_s"])
        ratio = f"{r['mean_step_s'] / step:.2f}x"
        n = trl_length(os.path.join(tmp, s, "trl_logs.json"))
        tl = f"{n:.1f}" if n is not None else "n/a"
    print(f"| {s} | {t} | {p} | {ratio} | {float(f[5]):.1f} / {tl} |")
PY
