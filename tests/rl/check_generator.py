#!/usr/bin/env python3
"""Checks the runs of tests/rl/test_generator.sh, with only the standard library.

  check_generator.py same RUN_A RUN_B       the metrics both runs log agree exactly, step by
                                            step (timings and the generator's own sync/ and
                                            off_policy/ keys aside), on the same keys at least
  check_generator.py sync RUN STEPS [LIMIT] sync/seconds, sync/gb_per_s, sync/bytes on every
                                            step, staleness 0 (on-policy), logprob_diff/max at
                                            most LIMIT (default 0: sampling's bits are training's;
                                            another tensor-parallel layout samples equal to rounding)
  check_generator.py pipeline RUN STEPS LAG staleness 0 on step 1 and 1 after, the weights
                                            LAG optimizer steps old, finite tis/* every step
"""
import json
import math
import sys

# Not compared: timings, and the generation engines' statistics (gen/), which describe how the
# sampling was deployed: replicas split the samples, and each planned its own KV pool.
SKIP = ("time/", "throughput/", "utilization/", "memory/", "sync/", "off_policy/", "gen/")
MUST = ["reward/mean", "loss", "pg_loss", "grad_norm", "entropy", "logprob_diff/max", "response_len/mean",
        "approx_kl", "clip_frac", "lr"]


def metrics(run):
    with open(run + "/metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def finite(o, k):
    return isinstance(o.get(k), (int, float)) and math.isfinite(o[k])


def main():
    mode = sys.argv[1]
    bad = []
    if mode == "same":
        a, b = metrics(sys.argv[2]), metrics(sys.argv[3])
        if [o["step"] for o in a] != [o["step"] for o in b]:
            bad.append("steps differ")
        for x, y in zip(a, b):
            keys = [k for k in x if not k.startswith(SKIP)]
            if x["step"] > 0:
                bad += ["step %d: %s missing" % (x["step"], k) for k in MUST if k not in keys or k not in y]
            bad += ["step %d %s: %r vs %r" % (x["step"], k, x[k], y.get(k)) for k in keys if x[k] != y.get(k)]
    elif mode == "sync":
        ms = [o for o in metrics(sys.argv[2]) if o["step"] > 0]
        if len(ms) != int(sys.argv[3]):
            bad.append("%d steps logged" % len(ms))
        limit = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
        for o in ms:
            bad += ["step %d: %s = %r" % (o["step"], k, o.get(k))
                    for k in ("sync/seconds", "sync/gb_per_s", "sync/bytes", "time/sync", "logprob_diff/max")
                    if not finite(o, k)]
            if o.get("off_policy/staleness") != 0 or not o.get("logprob_diff/max", 1) <= limit:
                bad.append("step %d: staleness %r, logprob_diff/max %r (on-policy: 0, at most %g)"
                           % (o["step"], o.get("off_policy/staleness"), o.get("logprob_diff/max"), limit))
    else:
        ms = [o for o in metrics(sys.argv[2]) if o["step"] > 0]
        steps, lag = int(sys.argv[3]), int(sys.argv[4])
        if len(ms) != steps:
            bad.append("%d steps logged" % len(ms))
        for o in ms:
            off = o["step"] > 1
            want = (1 if off else 0, lag if off else 0)
            got = (o.get("off_policy/staleness"), o.get("off_policy/version_lag"))
            if got != want:
                bad.append("step %d: staleness, version_lag %r, want %r" % (o["step"], got, want))
            bad += ["step %d: %s = %r" % (o["step"], k, o.get(k))
                    for k in ("tis/weight_mean", "tis/clip_frac", "tis/ratio_max", "sync/gb_per_s", "loss")
                    if not finite(o, k)]
            if o["step"] < steps and not finite(o, "time/wait_generate"):
                bad.append("step %d: time/wait_generate = %r" % (o["step"], o.get("time/wait_generate")))
        # Sampled one update behind, the behaviour and training logprobs part after step 1.
        if not any(o.get("logprob_diff/max", 0) > 0 for o in ms if o["step"] > 1):
            bad.append("logprob_diff/max is 0 on every off-policy step")
    for b in bad[:10]:
        print("check_generator: " + b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
