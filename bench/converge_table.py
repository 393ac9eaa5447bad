#!/usr/bin/env python3
"""The verdict of the convergence check (bench/run_converge_gpu.sh): troupe's per-step losses
beside torch's from the same initialisation (seed 0) and from two other seeds.

    python3 bench/converge_table.py TROUPE.jsonl TORCH_SEED0.jsonl [TORCH_SEED1.jsonl ...] \
        [--window 10] [--steps 200] [--merged OUT.jsonl]

Per step: gap = |troupe - torch seed 0| and spread = max - min over the torch seeds. Both are
averaged over consecutive windows of --window steps (1-10, 11-20, ...; a shorter last window
counts too); troupe tracks torch in a window when its mean gap is at most its mean spread.
The verdict is "yes" when every window tracks and every run reached --steps.
"""
import argparse
import json
import math
import sys


def read_losses(path):
    """{step: loss} of one run's JSON lines (other lines and a torn last line are skipped)."""
    losses = {}
    try:
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if isinstance(r, dict) and "step" in r and "loss" in r:
                    losses[int(r["step"])] = float(r["loss"])
    except OSError as e:
        print(f"converge_table: {path}: {e.strerror}", file=sys.stderr)
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("troupe")
    p.add_argument("torch", nargs="+", help="torch runs, the one from troupe's init first")
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--steps", type=int, default=0, help="steps each run should have made")
    p.add_argument("--merged", help="write every step's losses here as JSON lines")
    a = p.parse_args()

    troupe = read_losses(a.troupe)
    torch = [read_losses(t) for t in a.torch]
    seeds_ok = [t for t in torch if t]
    # Steps every run has: troupe, seed 0 and at least two seeds for a spread.
    steps = sorted(s for s in troupe if s in torch[0])
    steps = [s for s in steps if sum(s in t for t in torch) >= 2]
    want = a.steps or max([len(t) for t in torch] + [len(troupe)])
    print(f"\nconvergence: troupe from torch seed 0's initialisation; {len(a.torch)} torch seeds; "
          f"gap = |troupe - torch seed 0|, spread = max - min over the torch seeds, both "
          f"averaged over windows of {a.window} steps")
    short = [f"troupe {len(troupe)}"] if len(troupe) < want else []
    short += [f"torch seed {i} {len(t)}" for i, t in enumerate(torch) if len(t) < want]
    if short:
        print(f"runs short of {want} steps: " + ", ".join(short))
    if not steps or not troupe or not torch[0] or len(seeds_ok) < 2:
        print("tracking: n/a (no steps with troupe, torch seed 0 and two torch seeds)")
        return 1

    rows = []
    for s in steps:
        seeds = [t[s] for t in torch if s in t]
        rows.append({"step": s, "troupe": troupe[s], "torch0": torch[0][s], "torch_min": min(seeds),
                     "torch_max": max(seeds), "torch_seeds": seeds,
                     "gap": abs(troupe[s] - torch[0][s]), "spread": max(seeds) - min(seeds)})
    if a.merged:
        with open(a.merged, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")

    print("\n| steps | troupe loss | torch seed 0 | torch min | torch max | gap | spread | tracks |")
    print("|---|---|---|---|---|---|---|---|")
    mean = lambda k, w: sum(r[k] for r in w) / len(w)
    held = windows = 0
    for i in range(0, len(rows), a.window):
        w = rows[i:i + a.window]
        gap, spread = mean("gap", w), mean("spread", w)
        ok = gap <= spread
        held += ok
        windows += 1
        print(f"| {w[0]['step']}-{w[-1]['step']} | {mean('troupe', w):.4f} | {mean('torch0', w):.4f} "
              f"| {mean('torch_min', w):.4f} | {mean('torch_max', w):.4f} | {gap:.3g} | {spread:.3g} "
              f"| {'yes' if ok else 'no'} |")
    last = rows[-1]
    print(f"\nlast step {last['step']}: troupe {last['troupe']:.4f}, torch seed 0 "
          f"{last['torch0']:.4f}, torch seeds " + ", ".join(f"{x:.4f}" for x in last["torch_seeds"]))
    finite = all(math.isfinite(r["troupe"]) for r in rows)
    yes = held == windows and not short and finite
    note = "" if finite else "; troupe's loss is not finite"
    print(f"tracking: {'yes' if yes else 'no'} (gap within spread at {held} of {windows} windows"
          f"{', some runs short' if short else ''}{note})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
