#!/usr/bin/env python3
# Encode throughput of Hugging Face tokenizers on one thread, over the same JSONL corpus as
# bench/bench_tokenize.c; with --write-corpus it writes that corpus (generated mixed text:
# prose in several scripts, code, numbers, emoji) instead.
#
# usage: bench_tokenize_hf.py TOKENIZER_JSON CORPUS_JSONL [PASSES]
#        bench_tokenize_hf.py --write-corpus CORPUS_JSONL [MB]
import json
import os
import random
import sys
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))


def write_corpus(path, mb):
    from make_tokenizer_fixtures import gen_corpus
    rng = random.Random(7)
    with open(path, "w", encoding="utf-8") as f:
        total = 0
        while total < mb * 1e6:
            doc = "".join(gen_corpus(rng, rng.randint(5, 40)))
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
            total += len(doc.encode("utf-8"))


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "--write-corpus":
        write_corpus(sys.argv[2], float(sys.argv[3]) if len(sys.argv) > 3 else 4.0)
        return
    if len(sys.argv) < 3:
        print("usage: bench_tokenize_hf.py TOKENIZER_JSON CORPUS_JSONL [PASSES]", file=sys.stderr)
        sys.exit(2)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(sys.argv[1])
    passes = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    with open(sys.argv[2], encoding="utf-8") as f:
        docs = [json.loads(line)["text"] for line in f]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    best, tokens = 1e30, 0
    for _ in range(passes):
        tokens = 0
        t0 = time.perf_counter()
        for d in docs:
            tokens += len(tok.encode(d, add_special_tokens=False).ids)
        best = min(best, time.perf_counter() - t0)
    print("hf: %d docs, %.2f MB, %d tokens, %.3f s, %.2f MB/s"
          % (len(docs), nbytes / 1e6, tokens, best, nbytes / 1e6 / best))


if __name__ == "__main__":
    main()
