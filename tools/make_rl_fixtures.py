#!/usr/bin/env python3
"""RL algorithm fixtures for rl/advantage.c and engine/loss*.c: python3 tools/make_rl_fixtures.py OUTDIR

Writes OUTDIR/rl_reference.txt: random inputs (a batch of responses with padding, a fully
masked row, groups of different sizes) and, for many configurations, the advantages and the
losses computed in float64 with PyTorch from the published definitions, with the gradients
taken by autograd (dL/dlogp, dL/dentropy, dL/dvalue). The C test reads the same inputs and
compares its values and its hand-derived gradients against these.

Definitions (as docs/algorithms.md states them):
  GRPO    A = (r - mean_g) / (std_g + 1e-6), std unbiased (torch.std); Dr.GRPO: r - mean_g
  RLOO    A = r - mean of the other responses of the group
  REINFORCE++          returns G_t = r_t + gamma G_{t+1} over valid tokens, whitened over the batch
  REINFORCE++-baseline (r - mean_g) on every valid token, whitened over the batch
  GAE     delta_t = r_t + gamma V_{t+1} - V_t (V = 0 after the last valid token),
          A_t = delta_t + gamma lam A_{t+1}; returns = A + V; A whitened over the batch
  whitening (x - mean) / sqrt(var_unbiased + 1e-8) over valid tokens
  PPO     l = max(-A r, -A clip(r, 1-low, 1+high)); dual clip: min(l, -c A) where A < 0
  GSPO    r_b = exp(mean over valid tokens of (logp - old)) for every token of row b
  KL      logr = ref - logp: k1 = -logr, k2 = logr^2/2, k3 = exp(logr) - 1 - logr with logr
          clamped to [-20, 20] and k3 to [-10, 10]
  loss    agg(l) + kl_coef agg(kl) - entropy_coef agg(entropy)
  value   1/2 max((v - R)^2, (old + clamp(v - old, -c, c) - R)^2)
  agg     token-mean: sum/n_tokens; seq-mean-token-sum: sum_b(sum_t)/n_seqs;
          seq-mean-token-mean: sum_b(mean_t)/n_seqs; seq-mean-token-sum-norm:
          sum_b(sum_t / max_len)/n_seqs; n_seqs counts rows with a valid token.

Format: one record per line, whitespace separated:
  array NAME COUNT v1 v2 ...            inputs and expected outputs (float32 inputs are
                                        written with 9 significant digits: exact)
  policy AGG RATIO KL_EST KL_COEF ENT_COEF LOW HIGH DUAL MAX_LEN LOSS   then arrays
                                        grad_logp and grad_entropy follow
  value AGG CLIP LOSS                   then array grad_values follows
AGG, RATIO, KL_EST are the C enum indices (token-mean 0 ... ; token 0, sequence 1; k1 0 ...).
"""
import os
import sys

import numpy as np
import torch

torch.set_default_dtype(torch.float64)
B, T = 6, 7
LENS = [7, 3, 0, 5, 1, 6]       # row 2 is an empty response
GROUPS = [0, 0, 1, 1, 1, 2]     # group 2 has one response: kept out of the group estimators
AGGS = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def f32(x):
    return np.asarray(x, dtype=np.float32)


def masked_whiten(x, m):
    n = m.sum()
    mean = (x * m).sum() / n
    var = (((x - mean) * m) ** 2).sum() / (n - 1)
    return (x - mean) / torch.sqrt(var + 1e-8) * m


def aggregate(l, m, mode, max_len):
    lens = m.sum(dim=1)
    nseq = (lens > 0).sum()
    if mode == "token-mean":
        return (l * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        return (l * m).sum(dim=1).sum() / nseq
    if mode == "seq-mean-token-mean":
        per = (l * m).sum(dim=1) / torch.clamp(lens, min=1)
        return per.sum() / nseq
    return ((l * m).sum(dim=1) / max_len).sum() / nseq


def kl_est(est, logp, ref):
    logr = ref - logp
    if est == 0:
        return -logr
    if est == 1:
        return 0.5 * logr * logr
    logr = torch.clamp(logr, -20, 20)
    return torch.clamp(torch.exp(logr) - 1 - logr, -10, 10)


def policy_loss(inp, agg, ratio, est, kl_coef, ent_coef, low, high, dual, max_len):
    m = inp["mask"]
    logp = inp["logp"].clone().requires_grad_(True)
    ent = inp["entropy"].clone().requires_grad_(True)
    lr = torch.clamp(logp - inp["old_logp"], -20, 20)
    if ratio == 0:
        r = torch.exp(lr)
    else:
        lens = m.sum(dim=1, keepdim=True)
        mean_lr = ((logp - inp["old_logp"]) * m).sum(dim=1, keepdim=True) / torch.clamp(lens, min=1)
        r = torch.exp(torch.clamp(mean_lr, -20, 20)).expand(B, T)
    a = inp["adv"]
    l = torch.maximum(-a * r, -a * torch.clamp(r, 1 - low, 1 + high))
    if dual > 0:
        l = torch.where(a < 0, torch.minimum(l, -a * dual), l)
    loss = aggregate(l, m, AGGS[agg], max_len)
    if kl_coef:
        loss = loss + kl_coef * aggregate(kl_est(est, logp, inp["ref_logp"]), m, AGGS[agg], max_len)
    if ent_coef:
        loss = loss - ent_coef * aggregate(ent, m, AGGS[agg], max_len)
    loss.backward()
    ge = ent.grad * m if ent.grad is not None else torch.zeros(B, T)
    return loss.item(), logp.grad * m, ge


def value_loss(inp, agg, clip):
    m = inp["mask"]
    v = inp["values"].clone().requires_grad_(True)
    old, ret = inp["old_values"], inp["returns"]
    l1 = (v - ret) ** 2
    if clip > 0:
        vc = old + torch.clamp(v - old, -clip, clip)
        l = 0.5 * torch.maximum(l1, (vc - ret) ** 2)
    else:
        l = 0.5 * l1
    loss = aggregate(l, m, AGGS[agg], 8.0)
    loss.backward()
    return loss.item(), v.grad * m


def group_adv(r, kind):
    out = torch.zeros(B)
    for g in set(GROUPS):
        idx = [i for i in range(B) if GROUPS[i] == g]
        if len(idx) < 2:
            continue
        x = r[idx]
        if kind == "grpo":
            out[idx] = (x - x.mean()) / (x.std() + 1e-6)
        elif kind == "drgrpo":
            out[idx] = x - x.mean()
        elif kind == "rloo":
            out[idx] = x - (x.sum() - x) / (len(idx) - 1)
        else:
            out[idx] = x - x.mean()
    return out


def main():
    outdir = sys.argv[1]
    os.makedirs(outdir, exist_ok=True)
    rng = np.random.default_rng(20240611)
    mask = np.array([[1 if t < LENS[b] else 0 for t in range(T)] for b in range(B)], dtype=np.float32)
    old = f32(rng.uniform(-3.0, -0.2, (B, T)))
    arrays = {
        "mask": mask,
        "old_logp": old,
        "logp": f32(old + rng.uniform(-0.45, 0.45, (B, T))),
        "ref_logp": f32(old + rng.uniform(-0.6, 0.6, (B, T))),
        "adv": f32(rng.uniform(-1.5, 1.5, (B, T))),
        "entropy": f32(rng.uniform(0.1, 2.5, (B, T))),
        "values": f32(rng.uniform(-1, 1, (B, T))),
        "old_values": f32(rng.uniform(-1, 1, (B, T))),
        "returns": f32(rng.uniform(-1.5, 1.5, (B, T))),
        "seq_rewards": f32(rng.choice([0.0, 1.0, 0.5], B)),
        "token_rewards": f32(rng.uniform(-0.05, 0.0, (B, T))),
    }
    inp = {k: torch.tensor(v.astype(np.float64)) for k, v in arrays.items()}
    m = inp["mask"]
    lines = ["# generated by tools/make_rl_fixtures.py; inputs then float64 PyTorch references"]

    def put(name, x):
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        lines.append("array %s %d %s" % (name, x.size, " ".join("%.17g" % v for v in x)))

    for k, v in arrays.items():
        lines.append("array %s %d %s" % (k, v.size, " ".join("%.9g" % x for x in v.reshape(-1))))
    put("group", GROUPS)

    # Advantages. Group scores add the row's per-token rewards to the outcome reward.
    score = inp["seq_rewards"] + (inp["token_rewards"] * m).sum(dim=1)
    for kind in ["grpo", "drgrpo", "rloo"]:
        put("adv_" + kind, group_adv(score, kind)[:, None] * m)
    put("adv_reinforce_pp_baseline", masked_whiten(group_adv(score, "center")[:, None] * m, m))
    tok = inp["token_rewards"] * m
    for b in range(B):
        if LENS[b]:
            tok[b, LENS[b] - 1] += inp["seq_rewards"][b]
    gamma, lam = 0.99, 0.95
    ret = torch.zeros(B, T)
    for b in range(B):
        g = 0.0
        for t in reversed(range(LENS[b])):
            g = tok[b, t] + gamma * g
            ret[b, t] = g
    put("adv_reinforce_pp", masked_whiten(ret, m))
    adv = torch.zeros(B, T)
    V = inp["values"]
    for b in range(B):
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(range(LENS[b])):
            delta = tok[b, t] + gamma * nxt_v - V[b, t]
            nxt_a = delta + gamma * lam * nxt_a
            adv[b, t] = nxt_a
            nxt_v = V[b, t]
    put("returns_gae", (adv + V) * m)
    put("adv_gae", masked_whiten(adv, m))

    for agg in range(4):
        for ratio in range(2):
            for est in range(3):
                for kl_coef, ent_coef, low, high, dual in [(0.0, 0.0, 0.2, 0.2, 0.0),
                                                           (0.1, 0.01, 0.2, 0.28, 3.0),
                                                           (0.05, 0.0, 0.1, 0.15, 1.1)]:
                    if kl_coef == 0.0 and est:
                        continue
                    loss, gl, ge = policy_loss(inp, agg, ratio, est, kl_coef, ent_coef, low, high, dual, 8.0)
                    lines.append("policy %d %d %d %r %r %r %r %r 8 %.17g" %
                                 (agg, ratio, est, kl_coef, ent_coef, low, high, dual, loss))
                    put("grad_logp", gl)
                    put("grad_entropy", ge)
    for agg in range(4):
        for clip in [0.0, 0.2]:
            loss, gv = value_loss(inp, agg, clip)
            lines.append("value %d %r %.17g" % (agg, clip, loss))
            put("grad_values", gv)
    with open(os.path.join(outdir, "rl_reference.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
