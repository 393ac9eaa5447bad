#!/usr/bin/env bash
# `--tp N` of `troupe logprobs` and `troupe generate` (N local rank processes over the CPU's
# shared-memory communicator): logprobs at tp 2 and 4 (4 ranks hold the 2 key/value heads
# twice) match transformers within 1e-5 on the fixture models, as tp 1 does; generate at tp 2
# gives tp 1's greedy tokens and text, and sampled tokens drawn with the same seed, whose
# logprobs are `troupe logprobs --tp 2`'s on prompt + output bit for bit; a tp that does not
# divide the query heads is an error naming them.
set -u
troupe="$1"
src="${TROUPE_SOURCE_ROOT:-.}"
fx="$src/tests/fixtures/models"
gfx="$src/tests/fixtures/generate/chat_qwen2"
tmp=$(mktemp -d /tmp/troupe-tp-XXXXXX)
fail=0

check() {  # check DESCRIPTION STATUS: prints FAIL unless STATUS is 0
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}

# close GOT WANT: the same lines and values (logprobs lists), every value within 1e-5.
close() {
    python3 - "$1" "$2" <<'PY'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
bad = len(got) != len(want)
for g, w in zip(got, want):
    a, b = g["logprobs"], w["logprobs"]
    if len(a) != len(b) or max((abs(x - y) for x, y in zip(a, b)), default=0) > 1e-5: bad = True
sys.exit(1 if bad else 0)
PY
}

for m in llama3 qwen2 llama_bias qwen3; do
    for tp in 2 4; do
        "$troupe" logprobs --model "$fx/$m" --data "$fx/$m/logprobs_input.jsonl" --tp $tp \
            --threads 1 >"$tmp/$m.$tp.out" 2>"$tmp/err"
        st=$?; [ $st = 0 ] || cat "$tmp/err"
        check "$m: logprobs --tp $tp exits 0" $st
        close "$tmp/$m.$tp.out" "$fx/$m/logprobs_expected.jsonl"
        check "$m: logprobs --tp $tp within 1e-5 of transformers" $?
    done
done

# Generation: greedy and sampled, tp 1 against tp 2.
gen() {  # gen NAME TP ARGS...
    local name=$1 tp=$2
    shift 2
    "$troupe" generate --model "$gfx" --prompts "$gfx/prompts.jsonl" --max-new-tokens 12 \
        --threads 1 --tp "$tp" "$@" >"$tmp/$name.jsonl" 2>"$tmp/err"
    local st=$?
    [ $st = 0 ] || cat "$tmp/err"
    return $st
}
fields() {  # the lines without logprobs
    python3 -c '
import json, sys
for l in open(sys.argv[1]):
    d = json.loads(l); d.pop("logprobs"); print(json.dumps(d, sort_keys=True))' "$1"
}
gen greedy1 1 --temperature 0 && gen greedy2 2 --temperature 0
check "generate --tp 2 greedy exits 0" $?
fields "$tmp/greedy1.jsonl" >"$tmp/g1" && fields "$tmp/greedy2.jsonl" >"$tmp/g2" && cmp -s "$tmp/g1" "$tmp/g2"
check "generate --tp 2: greedy tokens, finish reasons and text are tp 1's" $?
close "$tmp/greedy2.jsonl" "$tmp/greedy1.jsonl"
check "generate --tp 2: greedy logprobs within 1e-5 of tp 1's" $?
gen sample1 1 --n 3 --seed 5 && gen sample2 2 --n 3 --seed 5
check "generate --tp 2 sampling exits 0" $?
fields "$tmp/sample1.jsonl" >"$tmp/s1" && fields "$tmp/sample2.jsonl" >"$tmp/s2" && cmp -s "$tmp/s1" "$tmp/s2"
check "generate --tp 2: the same sampled tokens as tp 1 for the same seed" $?
# The sampled tokens' logprobs are the tp 2 training path's: logprobs --tp 2 on prompt + output.
python3 - "$gfx/prompts.jsonl" "$tmp/sample2.jsonl" "$tmp/seqs.jsonl" "$tmp/want.jsonl" <<'PY'
import json, sys
prompts = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[3], "w") as seqs, open(sys.argv[4], "w") as want:
    for l in open(sys.argv[2]):
        d = json.loads(l)
        p = prompts[d["index"]]
        if "input_ids" not in p: continue
        seqs.write(json.dumps({"input_ids": p["input_ids"] + d["output_ids"]}) + "\n")
        want.write(json.dumps({"n": len(p["input_ids"]), "logprobs": d["logprobs"]}) + "\n")
PY
check "sequences of the id prompts" $?
if [ -s "$tmp/seqs.jsonl" ]; then
    "$troupe" logprobs --model "$gfx" --data "$tmp/seqs.jsonl" --tp 2 --threads 1 >"$tmp/lp2.jsonl" 2>"$tmp/err"
    check "logprobs --tp 2 of the samples exits 0" $?
    python3 - "$tmp/lp2.jsonl" "$tmp/want.jsonl" <<'PY'
import json, struct, sys
f32 = lambda x: struct.pack("<f", x)
bad = 0
for a, b in zip(open(sys.argv[1]), open(sys.argv[2])):
    lp, w = json.loads(a)["logprobs"], json.loads(b)
    tail = lp[w["n"] - 1:]
    if [f32(x) for x in tail] != [f32(x) for x in w["logprobs"]]: bad = 1
sys.exit(bad)
PY
    check "sampled logprobs at tp 2 are logprobs --tp 2's bits" $?
fi

# Errors: a tp that splits the 4 query heads unevenly; usage.
"$troupe" logprobs --model "$fx/llama3" --data "$fx/llama3/logprobs_input.jsonl" --tp 3 \
    >/dev/null 2>"$tmp/err"
st=$?
[ $st = 1 ] && grep -q "tp 3 does not divide the 4 query heads" "$tmp/err"
check "--tp 3 on 4 query heads: exit 1 naming them ($(cat "$tmp/err"))" $?
"$troupe" generate --model "$gfx" --prompts "$gfx/prompts.jsonl" --tp 0 >/dev/null 2>"$tmp/err"
[ $? = 2 ]
check "--tp 0 is a usage error" $?

rm -rf "$tmp"
exit $fail
