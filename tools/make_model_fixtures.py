#!/usr/bin/env python3
# Builds the tiny random-weight Hugging Face models the engine tests compare against, and
# what transformers computes on them (float32, CPU): logits, logprobs, loss gradients, AdamW
# steps, head outputs, greedy continuations.
# Usage: python3 tools/make_model_fixtures.py OUTDIR [NAME...]   (default: every fixture)
#
# OUTDIR/<name>/ is a save_pretrained directory (config.json, model.safetensors) plus
# expected.safetensors with these tensors (int tensors are I32):
#   input_ids [N]        the batch: sequences of seq_lens concatenated (each run unpadded,
#   seq_lens  [S]        as its own forward, so positions restart at 0 per sequence)
# LM models (llama3, qwen2, llama_bias: Llama with attention_bias, i.e. q/k/v/o_proj biases;
# qwen3: per-head q/k RMSNorm, no biases, head_dim 16 with hidden 32 and 4 heads):
#   logits [N, V]; logprobs [N]: ln p(ids[i+1] | ids[..i]) within the sequence, 0 at the
#   last token of each sequence; entropy [N] of the next-token distribution;
#   loss [1]: mean cross entropy over the N - S predicted tokens;
#   grad.<hf name>: d loss / d parameter, for every parameter (tied: the embedding only);
#   adamw [6]: lr, beta1, beta2, eps, weight_decay, max_grad_norm;
#   grad_norm [3]: pre-clip global gradient norm of each of the 3 steps;
#   step3.<hf name>: parameters after 3 steps of clip_grad_norm_ + torch.optim.AdamW, each
#   step on the same batch and the same loss;
#   gen.prompt.<i>, gen.output.<i>: generate(do_sample=False, max_new_tokens=16), the output
#   including the prompt;
#   and logprobs_input.jsonl / logprobs_expected.jsonl: the batch as `troupe logprobs` reads
#   it and the logprobs it must write.
# score model (Qwen2ForSequenceClassification, num_labels 1, pad_token_id set): scores [S]
#   at the last non-pad token (sequence 1 ends in pad tokens); coef [S]; loss = sum coef*score;
#   grad.<hf name>.
# value model (LlamaForTokenClassification, num_labels 1): values [N]; coef [N];
#   loss = sum coef*value; grad.<hf name>.
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file
from transformers import (LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification,
                          Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification,
                          Qwen3Config, Qwen3ForCausalLM)

VOCAB = 300
SEQ_LENS = [7, 12, 5]
PAD_ID = 0
# The AdamW steps are compared at 1e-5 abs, and eps decides whether that comparison means
# anything. AdamW's first update of an element is lr * g / (|g| + eps) (m and v hold only g),
# whose slope in g is lr * eps / (|g| + eps)^2, at most lr / eps where g = 0. fp32 leaves an
# absolute error in every gradient element (up to 1e-7 here after clipping, against float64),
# elements whose exact gradient is near zero included. With eps 1e-8 the slope there is
# 2e5, so that error can move such a parameter by anything up to 2 lr (a flipped sign):
# qwen3's lm_head.weight has an element whose gradient is 7.7e-9 before clipping and 9.1e-9
# in fp32, and transformers' own fp32 steps were 3.3e-5 from float64's (which elements land
# there is chance, not a property of a family). With eps 1e-3, a fifth of a typical element
# of the clipped gradient (global norm 1 over 3e4..4.4e4 parameters, rms 5e-3), the slope is
# at most 2: fp32 noise moves a parameter by at most 2e-7 a step, and transformers' fp32
# steps are within 3e-7 of float64's for every family (fp32's resolution of O(1) weights).
# eps and the gradient's size then reach the result too; with eps far below every |g| it
# depends only on the gradient's signs and its ratios between steps.
ADAMW = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-3, weight_decay=0.1)
MAX_GRAD_NORM = 1.0
PROMPTS = [[5, 17, 42], [100, 3, 250, 77, 9], [299]]


def common(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=PAD_ID)
    base.update(kw)
    return base


def llama3_config(**kw):
    # head_dim 16 with hidden 32 exercises an explicit head_dim. With theta 1e4 the rotary
    # wavelengths are 6.3, 19.9, 62.8, ...: original_max_position_embeddings 32 and
    # high_freq_factor 4 put them in all three llama3 bands (kept, smoothed, divided).
    return LlamaConfig(**common(head_dim=16, tie_word_embeddings=False, attention_bias=False,
                                rope_theta=10000.0,
                                rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                              "original_max_position_embeddings": 32}, **kw))


def llama_bias_config(**kw):
    # attention_bias puts a bias on all four attention projections in LlamaAttention (Qwen2
    # stops at v_proj): the o_proj bias is what this model adds over the others. Classic RoPE
    # and head_dim from hidden / heads, so the llama3 path is not needed to reach it.
    return LlamaConfig(**common(tie_word_embeddings=False, attention_bias=True,
                                rope_theta=10000.0, **kw))


def qwen2_config(**kw):
    return Qwen2Config(**common(tie_word_embeddings=True, rope_theta=10000.0, **kw))


def qwen3_config(**kw):
    # q/k per-head norms (q_norm, k_norm of head_dim) before RoPE; head_dim 16 while
    # hidden / heads is 8, so the query width (64) differs from hidden (32) as in Qwen3-0.6B
    # (1024 hidden, 16 heads of 128). Untied, unlike qwen2's fixture.
    return Qwen3Config(**common(head_dim=16, tie_word_embeddings=False, attention_bias=False,
                                rope_theta=10000.0, **kw))


LM_CLASSES = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM}


def redraw(model, gen):
    # Default init (std 0.02) makes every logit nearly equal, which hides wrong math; these
    # spreads keep activations O(1) through both layers.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.2 * torch.randn(p.shape, generator=gen))
            elif "embed_tokens" in name:
                # Tied models reuse this as the LM head: 0.4 keeps logits within a few units
                # (a realistic, not saturated, softmax).
                p.copy_(0.4 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[1]
                p.copy_(torch.randn(p.shape, generator=gen) * (1.5 / math.sqrt(fan_in)))


def batch(gen, pad_tail=None):
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen) for n in SEQ_LENS]
    for s in seqs:  # keep pad ids out of the body so only the padded tail is pad
        s[s == PAD_ID] = 7
    if pad_tail is not None:
        seqs[pad_tail][-3:] = PAD_ID
    return seqs


def ids_tensor(seqs):
    return (torch.cat(seqs).to(torch.int32).contiguous(),
            torch.tensor([len(s) for s in seqs], dtype=torch.int32))


def param_names(model):
    # named_parameters() lists a tied lm_head once, as the embedding.
    return [n for n, _ in model.named_parameters()]


def lm_loss(model, seqs):
    total, count = 0.0, 0
    for s in seqs:
        logits = model(s[None]).logits[0]
        lp = torch.log_softmax(logits[:-1], dim=-1)
        total = total - lp.gather(1, s[1:, None]).sum()
        count += len(s) - 1
    return total / count


def lm_fixture(model, gen):
    model.eval()
    seqs = batch(gen)
    out = {}
    out["input_ids"], out["seq_lens"] = ids_tensor(seqs)
    with torch.no_grad():
        logits, lps, ents = [], [], []
        for s in seqs:
            lg = model(s[None]).logits[0]
            ls = torch.log_softmax(lg, dim=-1)
            lp = torch.zeros(len(s))
            lp[:-1] = ls[:-1].gather(1, s[1:, None])[:, 0]
            logits.append(lg)
            lps.append(lp)
            ents.append(-(ls.exp() * ls).sum(-1))
        out["logits"] = torch.cat(logits)
        out["logprobs"] = torch.cat(lps)
        out["entropy"] = torch.cat(ents)

    model.zero_grad()
    loss = lm_loss(model, seqs)
    loss.backward()
    out["loss"] = loss.detach().reshape(1)
    params = dict(model.named_parameters())
    for n in param_names(model):
        out["grad." + n] = params[n].grad.detach().clone()

    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    norms = []
    for _ in range(3):
        opt.zero_grad()
        lm_loss(model, seqs).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
        opt.step()
    out["grad_norm"] = torch.tensor(norms)
    out["adamw"] = torch.tensor([ADAMW["lr"], ADAMW["betas"][0], ADAMW["betas"][1],
                                 ADAMW["eps"], ADAMW["weight_decay"], MAX_GRAD_NORM])
    params = dict(model.named_parameters())
    for n in param_names(model):
        out["step3." + n] = params[n].detach().clone()
    return out


def generations(model, out):
    # From the initial weights: callers save the model before the AdamW steps run.
    model.eval()
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ids = torch.tensor([p])
            g = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=16, pad_token_id=PAD_ID)
            out[f"gen.prompt.{i}"] = torch.tensor(p, dtype=torch.int32)
            out[f"gen.output.{i}"] = g[0].to(torch.int32)


def save(model, outdir, name, expected):
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(d, "expected.safetensors"))
    print(name, sum(v.numel() for v in expected.values()), "values in expected")


def make_lm(outdir, name, cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = LM_CLASSES[cfg.model_type](cfg).float()
    redraw(model, gen)
    d = os.path.join(outdir, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)  # initial weights, before any step
    expected = {}
    generations(model, expected)
    expected.update(lm_fixture(model, gen))
    save_file({k: v.contiguous() for k, v in expected.items()},
              os.path.join(d, "expected.safetensors"))
    write_logprobs_jsonl(d, expected)
    print(name, sum(v.numel() for v in expected.values()), "values in expected")


def write_logprobs_jsonl(d, expected):
    # The same batch as `troupe logprobs` input and expected output (len - 1 values a line).
    ids, lens = expected["input_ids"].tolist(), expected["seq_lens"].tolist()
    lp = expected["logprobs"].tolist()
    with open(os.path.join(d, "logprobs_input.jsonl"), "w") as fi, \
            open(os.path.join(d, "logprobs_expected.jsonl"), "w") as fo:
        o = 0
        for n in lens:
            fi.write(json.dumps({"input_ids": ids[o:o + n]}) + "\n")
            fo.write(json.dumps({"logprobs": [float(x) for x in lp[o:o + n - 1]]}) + "\n")
            o += n


def make_score(outdir, seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = qwen2_config(num_labels=1)
    model = Qwen2ForSequenceClassification(cfg).float()
    redraw(model, gen)
    model.eval()
    seqs = batch(gen, pad_tail=1)
    out = {}
    out["input_ids"], out["seq_lens"] = ids_tensor(seqs)
    coef = torch.randn(len(seqs), generator=gen)
    model.zero_grad()
    scores = torch.cat([model(s[None]).logits for s in seqs])  # [S, 1]
    loss = (coef * scores[:, 0]).sum()
    loss.backward()
    out["scores"] = scores.detach()[:, 0].contiguous()
    out["coef"] = coef
    out["loss"] = loss.detach().reshape(1)
    params = dict(model.named_parameters())
    for n in param_names(model):
        out["grad." + n] = params[n].grad.detach().clone()
    save(model, outdir, "score_qwen2", out)


def make_value(outdir, seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = llama3_config(num_labels=1)
    model = LlamaForTokenClassification(cfg).float()
    redraw(model, gen)
    model.eval()  # no dropout before the value projection
    seqs = batch(gen)
    out = {}
    out["input_ids"], out["seq_lens"] = ids_tensor(seqs)
    n = sum(len(s) for s in seqs)
    coef = torch.randn(n, generator=gen)
    model.zero_grad()
    values = torch.cat([model(s[None]).logits[0, :, 0] for s in seqs])
    loss = (coef * values).sum()
    loss.backward()
    out["values"] = values.detach()
    out["coef"] = coef
    out["loss"] = loss.detach().reshape(1)
    params = dict(model.named_parameters())
    for n in param_names(model):
        out["grad." + n] = params[n].grad.detach().clone()
    save(model, outdir, "value_llama3", out)


FIXTURES = {
    "llama3": lambda d: make_lm(d, "llama3", llama3_config(), 1),
    "qwen2": lambda d: make_lm(d, "qwen2", qwen2_config(), 2),
    "score_qwen2": lambda d: make_score(d, 3),
    "value_llama3": lambda d: make_value(d, 4),
    "llama_bias": lambda d: make_lm(d, "llama_bias", llama_bias_config(), 5),
    "qwen3": lambda d: make_lm(d, "qwen3", qwen3_config(), 6),
}


def main():
    if len(sys.argv) < 2 or any(n not in FIXTURES for n in sys.argv[2:]):
        print("usage: make_model_fixtures.py OUTDIR [%s ...]" % "|".join(FIXTURES),
              file=sys.stderr)
        sys.exit(2)
    outdir = sys.argv[1]
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name in sys.argv[2:] or FIXTURES:
        FIXTURES[name](outdir)


if __name__ == "__main__":
    main()
