#!/usr/bin/env python3
# Checks a run directory written by `troupe run` (used by test_run.sh and test_quickstart.sh):
#   check_run.py grpo|ppo|sft|pretrain RUN_DIR STEPS EVAL_EVERY [EXTRA_EVAL_STEPS]
#                                                                   metrics, schedule, checkpoints
#   check_run.py same RUN_A RUN_B                                   equal metrics step by step
#   check_run.py checkpoints RUN_DIR LAST                           the complete checkpoints
#                                                                   end at step LAST, each whole,
#                                                                   no temporary left (a failed
#                                                                   save removes its own)
#   check_run.py learns RUN_DIR KEY MIN_GAIN                         last eval - first eval >= gain
#   check_run.py rises RUN_DIR KEY                                   mean of KEY over the last
#                                                                   quarter of steps > first quarter
# Prints what is wrong and exits 1.
import json
import math
import os
import sys

errors = []


def err(msg):
    errors.append(msg)
    if len(errors) <= 20:
        print("check_run: " + msg, file=sys.stderr)


def metrics(run):
    out = []
    path = os.path.join(run, "metrics.jsonl")
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.endswith("\n"):
                err("%s:%d: line without newline" % (path, n))
            o = json.loads(line)
            if not line.startswith('{"step": '):
                err("%s:%d: 'step' is not the first key" % (path, n))
            out.append(o)
    return out


RL_KEYS = ["reward/mean", "reward/std", "kl", "entropy", "clip_frac", "grad_norm", "lr",
           "response_len/mean", "logprob_diff/max", "throughput/tokens_per_s", "time/generate",
           "time/reward", "time/train", "time/sync", "throughput/generate_tokens_per_s",
           "throughput/train_tokens_per_s", "throughput/train_tflops", "throughput/decode_gbps",
           "memory/policy/weights", "memory/policy/grads", "memory/policy/optimizer",
           "memory/policy/activations"]
SFT_KEYS = ["loss", "grad_norm", "lr", "throughput/tokens_per_s", "time/train", "memory/policy/weights"]
CKPT_FILES = ["config.json", "model.safetensors", "trainer_state.json",
              "optim_exp_avg.safetensors", "optim_exp_avg_sq.safetensors"]


def finite(o, k):
    v = o.get(k)
    return isinstance(v, (int, float)) and math.isfinite(v)


def check_steps(ms, steps, every, eval_key, extra):
    got = [o["step"] for o in ms]
    if got != list(range(steps + 1)):
        err("steps %s, want 0..%d once each" % (got, steps))
    want_eval = {0, steps} | ({s for s in range(0, steps + 1, every)} if every else set()) | extra
    have_eval = {o["step"] for o in ms if eval_key in o}
    if have_eval != want_eval:
        err("%s at steps %s, want %s" % (eval_key, sorted(have_eval), sorted(want_eval)))
    for o in ms:
        if eval_key in o and not finite(o, eval_key):
            err("step %d: %s = %r" % (o["step"], eval_key, o[eval_key]))


# Present on every step, but null when the run has nothing to measure it against.
NULLABLE = {"kl"}


def check_keys(ms, keys):
    for o in ms:
        if o["step"] == 0:
            continue
        for k in keys:
            if k in NULLABLE and k in o and o[k] is None:
                continue
            if not finite(o, k):
                err("step %d: %s missing or not finite (%r)" % (o["step"], k, o.get(k)))


def check_safetensors(path):
    # Whole: the header parses and the last tensor ends where the file does.
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
        try:
            header = json.loads(f.read(n)) if 0 < n <= size - 8 else None
        except ValueError:
            header = None
    if not isinstance(header, dict):
        err("%s: no readable header" % path)
        return
    end = max([v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"] + [0])
    if 8 + n + end != size:
        err("%s: %d bytes, its header describes %d" % (path, size, 8 + n + end))


def check_checkpoints(run, steps, roles, tokenizer=True):
    root = os.path.join(run, "checkpoints")
    names = sorted(os.listdir(root)) if os.path.isdir(root) else []
    if "step_%d" % steps not in names:
        err("no checkpoint of the last step %d (have %s)" % (steps, names))
    for n in names:
        if not n.startswith("step_") or not n[5:].isdigit():
            err("unexpected entry checkpoints/%s (a temporary left behind?)" % n)
            continue
        if int(n[5:]) > steps:
            err("checkpoints/%s is later than step %d" % (n, steps))
        d = os.path.join(root, n)
        st = json.load(open(os.path.join(d, "run_state.json")))
        if st.get("step") != int(n[5:]):
            err("%s/run_state.json says step %r" % (d, st.get("step")))
        for role in roles:
            for f in CKPT_FILES + (["tokenizer.json"] if tokenizer and role == "policy" else []):
                if not os.path.isfile(os.path.join(d, role, f)):
                    err("%s/%s/%s missing" % (d, role, f))
            if not os.path.isdir(os.path.join(d, role)):
                continue
            for f in sorted(os.listdir(os.path.join(d, role))):
                if f.endswith(".safetensors"):
                    check_safetensors(os.path.join(d, role, f))
            ts = json.load(open(os.path.join(d, role, "trainer_state.json")))
            if not isinstance(ts.get("step"), int) or ts["step"] < int(n[5:]):
                err("%s/%s/trainer_state.json: optimizer step %r for run step %s"
                    % (d, role, ts.get("step"), n[5:]))
    if not os.path.isfile(os.path.join(run, "resolved.yaml")):
        err("resolved.yaml missing")


def main():
    mode = sys.argv[1]
    if mode == "same":
        a = {o["step"]: o for o in metrics(sys.argv[2])}
        b = {o["step"]: o for o in metrics(sys.argv[3])}
        if sorted(a) != sorted(b):
            err("steps differ: %s vs %s" % (sorted(a), sorted(b)))
        for s in sorted(set(a) & set(b)):
            for k in sorted(set(a[s]) | set(b[s])):
                if k.split("/")[0] in ("time", "throughput", "utilization", "memory", "plan"):
                    continue
                # The end of an earlier, shorter run evaluated where the longer one did not.
                if k.startswith("eval/") and (k not in a[s] or k not in b[s]):
                    continue
                if a[s].get(k) != b[s].get(k):
                    err("step %d %s: %r vs %r" % (s, k, a[s].get(k), b[s].get(k)))
    elif mode == "checkpoints":
        check_checkpoints(sys.argv[2], int(sys.argv[3]), ["policy"])
    elif mode == "learns":
        ms = metrics(sys.argv[2])
        key, gain = sys.argv[3], float(sys.argv[4])
        ev = [(o["step"], o[key]) for o in ms if key in o]
        print("%s: %s" % (key, " ".join("%d:%.3f" % e for e in ev)))
        if len(ev) < 2 or ev[-1][1] - ev[0][1] < gain:
            err("%s rose by %.3f from the first to the last eval, want >= %.3f"
                % (key, ev[-1][1] - ev[0][1] if len(ev) >= 2 else float("nan"), gain))
    elif mode == "rises":
        key = sys.argv[3]
        v = [o[key] for o in metrics(sys.argv[2]) if o["step"] > 0 and finite(o, key)]
        q = max(1, len(v) // 4)
        first, last = sum(v[:q]) / q, sum(v[-q:]) / q
        print("%s: first quarter %.4f, last quarter %.4f" % (key, first, last))
        if not last > first:
            err("%s did not rise: %.4f -> %.4f" % (key, first, last))
    else:
        run, steps, every = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        extra = {int(x) for x in sys.argv[5].split(",")} if len(sys.argv) > 5 else set()
        ms = metrics(run)
        resolved = open(os.path.join(run, "resolved.yaml")).read()
        lp_tol = 1e-4 if "\nbackend: cuda" in "\n" + resolved else 0
        if mode in ("grpo", "ppo"):
            check_steps(ms, steps, every, "eval/accuracy", extra)
            keys = RL_KEYS + (["critic/value_loss", "critic/grad_norm", "time/critic"]
                              if mode == "ppo" else [])
            check_keys(ms, keys)
            for o in ms[1:]:
                # The CPU backend's forward is batch-invariant: generation's logprobs are
                # the training path's bits, so the largest difference is exactly 0. CUDA's is
                # not yet: fp32 sums in other orders, a few ulp per layer.
                if o.get("logprob_diff/max", 1) > lp_tol:
                    err("step %d: logprob_diff/max %r: generation and training disagree"
                        % (o["step"], o.get("logprob_diff/max")))
                if not 0 <= o.get("eval/accuracy", 0) <= 1:
                    err("step %d: eval/accuracy out of [0, 1]" % o["step"])
            check_checkpoints(run, steps, ["policy", "critic"] if mode == "ppo" else ["policy"])
        else:
            check_steps(ms, steps, every, "eval/loss", extra)
            check_keys(ms, SFT_KEYS)
            train = [o["loss"] for o in ms if "loss" in o]
            ev = [o["eval/loss"] for o in ms if "eval/loss" in o]
            if mode == "sft" and not (train[-1] < train[0] and ev[-1] < ev[0]):
                err("sft did not learn: loss %s, eval/loss %s" % (train, ev))
            check_checkpoints(run, steps, ["policy"], tokenizer=True)
    if len(errors) > 20:
        print("check_run: ... %d problems in all" % len(errors), file=sys.stderr)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
