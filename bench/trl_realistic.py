"""TRL's side of the realistic-length GRPO table (bench/run_grpo_gpu.sh with LENGTHS=realistic).

Runs the peers' TRL anchor (trl_grpo_anchor.py, not part of this tree) unchanged through runpy, with two
patches that make its completions end by stop tokens instead of running to a fixed length:
  - the anchor passes min_new_tokens = --clen to HF generate (forced lengths); GRPOConfig is wrapped so that
    generation_kwargs carry --min-new-tokens instead, and --clen (given to the anchor) becomes only the
    longest completion (max_completion_length, HF's max_new_tokens);
  - the anchor saves its model with generation_config.eos_token_id = <|endoftext|> (151643); the save is
    wrapped so that the model declares the whole stop set: every id congruent to 151643 modulo
    --stop-every (for --stop-every 256: 594 ids of the 151,936, 151643 among them).
A random-weight model samples nearly uniformly over the vocabulary, so each new token past min_new_tokens
ends the completion with probability k / 151936 (k ids in the set): lengths are min_new_tokens plus a
geometric count, mean about --stop-every, capped at --clen. troupe's recipe lists the same ids
(rollout.stop_ids) with the same min_new_tokens and max_new_tokens.

How TRL (1.16) treats the stop set, and what it means for the lengths compared:
  - GRPOTrainer takes every eos id the model's generation_config declares, plus the tokenizer's EOS, as
    self.eos_token_ids, and passes that list to generate as eos_token_id: HF generate ends a sequence at
    the first of them it samples (none before min_new_tokens: HF's MinNewTokensLengthLogitsProcessor
    masks them there, where troupe lets such a token through as an ordinary one; either way no completion
    ends before min_new_tokens + 1 tokens) and pads it with the pad token (here also 151643) until the
    whole batch is done.
  - TRL then masks every completion after its first id from that list (torch.isin over eos_token_ids):
    the stop token itself counts and is trained on, the padding does not. So TRL's completion length
    (completions/mean_length, completion_mask summed) is the number of sampled tokens up to and including
    the stop token, as troupe's response_len/mean is. Because the tokenizer's EOS and the pad are in the
    set, nothing outside it ends or masks a completion, and the two sides' lengths follow one distribution.
  - HF generate still runs the whole batch until its longest completion is done (finished rows are
    padded, not removed), and TRL's training micro-batches are padded to their longest completion:
    that, against troupe's continuous batching and token-balanced micro-batches, is what the table shows.
  - The anchor's tokens_per_s figures assume every completion is --clen long; with stop tokens they are
    wrong and the table uses only the step times and the lengths logged here.

After the anchor's own output (its STEP, PROF, LOGS and SUMMARY lines) this prints one line
  LENGTHS {"mean": ..., "min": ..., "max": ..., "clipped_ratio": ..., "steps": [...]}
the mean completion length over the steps after the first (the anchor's warm-up), from TRL's logs.

Usage: python3 bench/trl_realistic.py [--min-new-tokens N] [--stop-every K] ANCHOR [ANCHOR_ARGS...]
  ANCHOR: the path of trl_grpo_anchor.py; ANCHOR_ARGS go to it as given (--clen is the longest completion,
  e.g. --steps 4 --shape qwen2.5-0.5b --clen 1024 --outdir DIR; --tiny for a CPU smoke test).
  --min-new-tokens N: stop tokens cannot end a completion before N + 1 tokens (default 16).
  --stop-every K: the stop set is every id congruent to 151643 modulo K (default 256).
"""
import argparse
import json
import runpy
import sys

EOS_ID = 151643  # the anchor's <|endoftext|>: its tokenizer's EOS and pad
VOCAB = 151936   # the anchor's vocabulary


def stop_set(every):
    """Every id congruent to EOS_ID modulo `every`, ascending."""
    return list(range(EOS_ID % every, VOCAB, every))


def main():
    ap = argparse.ArgumentParser(
        description="Run the TRL GRPO anchor with completions that end by a stop set (see the module docstring).",
        usage="trl_realistic.py [--min-new-tokens N] [--stop-every K] ANCHOR [ANCHOR_ARGS...]")
    ap.add_argument("--min-new-tokens", type=int, default=16,
                    help="stop tokens cannot end a completion before N + 1 tokens (default 16)")
    ap.add_argument("--stop-every", type=int, default=256,
                    help="the stop set: every id congruent to 151643 modulo K (default 256: 594 ids)")
    ap.add_argument("anchor", help="path of trl_grpo_anchor.py")
    ap.add_argument("anchor_args", nargs=argparse.REMAINDER, help="arguments for the anchor, as given")
    args = ap.parse_args()
    if args.stop_every < 1 or args.min_new_tokens < 0:
        ap.error("--stop-every must be >= 1 and --min-new-tokens >= 0")
    stops = stop_set(args.stop_every)

    import transformers
    import trl

    # HF generate's min_new_tokens: the anchor's forced length becomes the recipe's minimum.
    config_cls = trl.GRPOConfig

    def grpo_config(*a, **kw):
        kw["generation_kwargs"] = dict(kw.get("generation_kwargs") or {}, min_new_tokens=args.min_new_tokens)
        return config_cls(*a, **kw)

    trl.GRPOConfig = grpo_config  # the anchor's `from trl import GRPOConfig` finds this

    # The stop set as the model's eos ids: TRL reads them from the saved generation config both for
    # generate's eos_token_id and for its completion mask.
    save = transformers.Qwen2ForCausalLM.save_pretrained

    def save_with_stops(self, *a, **kw):
        self.generation_config.eos_token_id = stops
        return save(self, *a, **kw)

    transformers.Qwen2ForCausalLM.save_pretrained = save_with_stops

    print(f"trl_realistic: {len(stops)} stop ids (every {args.stop_every}th from {stops[0]}), "
          f"min_new_tokens {args.min_new_tokens}", flush=True)
    sys.argv = [args.anchor] + args.anchor_args
    g = runpy.run_path(args.anchor, run_name="__main__")

    logs = [l for l in g["timer"].logs if "completions/mean_length" in l]
    meas = [l for l in logs if l["step"] > 1] or logs
    if not meas:
        sys.exit("trl_realistic: TRL logged no completion lengths")
    n = len(meas)
    out = dict(mean=round(sum(l["completions/mean_length"] for l in meas) / n, 1),
               min=min(l["completions/min_length"] for l in meas),
               max=max(l["completions/max_length"] for l in meas),
               clipped_ratio=round(sum(l.get("completions/clipped_ratio", 0.0) for l in meas) / n, 4),
               steps=[l["step"] for l in meas], stop_ids=len(stops), min_new_tokens=args.min_new_tokens)
    print("LENGTHS", json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
