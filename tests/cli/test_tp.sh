#!/usr/bin/env bash
# `--tp N` of `troupe logprobs` and `troupe generate` (N local rank processes over the CPU's
# shared-memory communicator): logprobs at tp 2 and 4 (4 ranks hold the 2 key/value heads
# twice) match transformers within 1e-5 on the fixture models, as tp 1 does; generate at tp 2
# gives tp 1's greedy tokens and text, and sampled tokens drawn with the same seed (plain,
# top-k, top-p and both), whose logprobs are `troupe logprobs --tp 2`'s on prompt + output
# bit for bit; a tp that does not divide the query heads is an error naming them.
# --sequence-parallel holds to the same: its
# logprobs match transformers at tp 2 and 4, its generation draws tp 1's tokens, and its
# sampled logprobs are its own logprobs' bits; it needs --tp 2 or more.
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
    for tp in 2 4 "2 --sequence-parallel" "4 --sequence-parallel"; do
        "$troupe" logprobs --model "$fx/$m" --data "$fx/$m/logprobs_input.jsonl" --tp $tp \
            --threads 1 >"$tmp/$m.out" 2>"$tmp/err"
        st=$?; [ $st = 0 ] || cat "$tmp/err"
        check "$m: logprobs --tp $tp exits 0" $st
        close "$tmp/$m.out" "$fx/$m/logprobs_expected.jsonl"
        check "$m: logprobs --tp $tp within 1e-5 of transformers" $?
    done
done

# Generation: greedy and sampled, tp 1 against tp 2 (with and without sequence parallelism).
gen() {  # gen NAME TP ARGS...
    local name=$1 tp=$2
    shift 2
    "$troupe" generate --model "$gfx" --prompts "$gfx/prompts.jsonl" --max-new-tokens 12 \
        --threads 1 --tp $tp "$@" >"$tmp/$name.jsonl" 2>"$tmp/err"
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
# same_tokens NAME: tmp/NAME1 (tp 1) and tmp/NAME2 (tp 2) hold the same samples.
same_tokens() {
    fields "$tmp/${1}1.jsonl" >"$tmp/f1" && fields "$tmp/${1}2.jsonl" >"$tmp/f2" && cmp -s "$tmp/f1" "$tmp/f2"
}
# The sampled tokens' logprobs are the tp 2 training path's: logprobs --tp 2 ARGS on prompt +
# output, bit for bit.
same_logprobs() {  # same_logprobs SAMPLES.jsonl TP-ARGS...
    local samples=$1
    shift
    python3 - "$gfx/prompts.jsonl" "$samples" "$tmp/seqs.jsonl" "$tmp/want.jsonl" <<'PY' || return 1
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
    [ -s "$tmp/seqs.jsonl" ] || return 1
    "$troupe" logprobs --model "$gfx" --data "$tmp/seqs.jsonl" --threads 1 "$@" >"$tmp/lp2.jsonl" 2>"$tmp/err" ||
        { cat "$tmp/err"; return 1; }
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
}
gen greedy1 1 --temperature 0 && gen sample1 1 --n 3 --seed 5 &&
    gen cut1 1 --n 3 --seed 6 --temperature 0.8 --top-k 7 && gen nucleus1 1 --n 3 --seed 7 --top-p 0.8 &&
    gen both1 1 --n 3 --seed 8 --temperature 1.2 --top-k 30 --top-p 0.5
check "generate --tp 1 exits 0" $?
for sp in "" "--sequence-parallel"; do
    at="--tp 2${sp:+ $sp}"
    gen greedy2 "2 $sp" --temperature 0
    check "generate $at greedy exits 0" $?
    same_tokens greedy
    check "generate $at: greedy tokens, finish reasons and text are tp 1's" $?
    close "$tmp/greedy2.jsonl" "$tmp/greedy1.jsonl"
    check "generate $at: greedy logprobs within 1e-5 of tp 1's" $?
    gen sample2 "2 $sp" --n 3 --seed 5
    check "generate $at sampling exits 0" $?
    same_tokens sample
    check "generate $at: the same sampled tokens as tp 1 for the same seed" $?
    same_logprobs "$tmp/sample2.jsonl" --tp 2 $sp
    check "generate $at: sampled logprobs are logprobs $at's bits" $?
done
# Top-k, top-p and both: the ranks draw from their vocabulary columns, tp 1's tokens.
for cut in "cut --seed 6 --temperature 0.8 --top-k 7" "nucleus --seed 7 --top-p 0.8" \
    "both --seed 8 --temperature 1.2 --top-k 30 --top-p 0.5"; do
    set -- $cut
    name=$1
    shift
    gen ${name}2 2 --n 3 "$@" && same_tokens $name
    check "generate --tp 2 $*: tp 1's tokens" $?
done

# Errors: a tp that splits the 4 query heads unevenly; usage.
"$troupe" logprobs --model "$fx/llama3" --data "$fx/llama3/logprobs_input.jsonl" --tp 3 \
    >/dev/null 2>"$tmp/err"
st=$?
[ $st = 1 ] && grep -q "tp 3 does not divide the 4 query heads" "$tmp/err"
check "--tp 3 on 4 query heads: exit 1 naming them ($(cat "$tmp/err"))" $?
"$troupe" generate --model "$gfx" --prompts "$gfx/prompts.jsonl" --tp 0 >/dev/null 2>"$tmp/err"
[ $? = 2 ]
check "--tp 0 is a usage error" $?
"$troupe" generate --model "$gfx" --prompts "$gfx/prompts.jsonl" --sequence-parallel >/dev/null 2>"$tmp/err"
[ $? = 2 ] && grep -q "needs --tp 2 or more" "$tmp/err"
check "--sequence-parallel without --tp is a usage error" $?

rm -rf "$tmp"
exit $fail
