#!/usr/bin/env bash
# `troupe generate` end to end. Greedy output on the chat fixture (ids, text and chatml
# prompts, tools/make_generate_fixtures.py) equals transformers' generate: output ids, finish
# reasons and text exactly, logprobs within 1e-5; so does a run with tiny passes, blocks and
# batches, and greedy runs on each family's model fixture (llama, qwen2, qwen3). Sampled runs: n lines per prompt in order, reproducible, unchanged by the batch
# layout, and their logprobs equal `troupe logprobs` on prompt + output. Bad input fails with
# exit 1 naming FILE:LINE; usage errors exit 2; a failed run leaves no output file.
set -u
troupe="$1"
src="${TROUPE_SOURCE_ROOT:-.}"
fx="$src/tests/fixtures/generate/chat_qwen2"
models="$src/tests/fixtures/models"
tmp=$(mktemp -d /tmp/troupe-generate-XXXXXX)
fail=0

check() {  # check DESCRIPTION STATUS: prints FAIL unless STATUS is 0
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; fi
}

# same_as_hf GOT: every line equals expected.jsonl (ids, finish, text exact; logprobs 1e-5).
same_as_hf() {
    python3 - "$1" "$fx/expected.jsonl" <<'EOF'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
bad = len(got) != len(want)
if bad: print(f"{len(got)} lines, want {len(want)}")
for g, w in zip(got, want):
    for k in ("index", "sample", "output_ids", "finish_reason", "text"):
        if g.get(k) != w[k]:
            print(f"line {w['index']}: {k} = {g.get(k)!r}, transformers {w[k]!r}"); bad = True
    d = max((abs(a - b) for a, b in zip(g["logprobs"], w["logprobs"])), default=0)
    if len(g["logprobs"]) != len(w["logprobs"]) or d > 1e-5:
        print(f"line {w['index']}: logprobs differ by {d}"); bad = True
sys.exit(1 if bad else 0)
EOF
}

"$troupe" generate --model "$fx" --prompts "$fx/prompts.jsonl" --temperature 0 \
    --max-new-tokens 12 --threads 2 >"$tmp/greedy.jsonl" 2>"$tmp/err"
st=$?; check "greedy: exit status ($(cat "$tmp/err"))" $st
same_as_hf "$tmp/greedy.jsonl"
check "greedy output equals transformers" $?
# Chunked prefill (3-token passes), 2-token blocks, one sequence at a time, --out.
"$troupe" generate --model "$fx" --prompts "$fx/prompts.jsonl" --temperature 0 \
    --max-new-tokens 12 --batch-tokens 3 --block-size 2 --max-seqs 1 --out "$tmp/small.jsonl" \
    2>"$tmp/err"
st=$?; check "greedy, small passes: exit status ($(cat "$tmp/err"))" $st
same_as_hf "$tmp/small.jsonl"
check "greedy with small passes and blocks equals transformers" $?

# Sampling: 3 samples a prompt, in order; the same again with another batch layout.
opts=(--model "$fx" --prompts "$fx/prompts.jsonl" --n 3 --temperature 0.9 --top-p 0.95
      --top-k 100 --seed 11 --max-new-tokens 10)
"$troupe" generate "${opts[@]}" >"$tmp/s1.jsonl" 2>"$tmp/err"
st=$?; check "sampling: exit status ($(cat "$tmp/err"))" $st
"$troupe" generate "${opts[@]}" --max-seqs 2 --block-size 3 --kv-tokens 60 --threads 1 \
    >"$tmp/s2.jsonl" 2>"$tmp/err"
st=$?; check "sampling, small pool: exit status ($(cat "$tmp/err"))" $st
# Tokens and logprobs are the same bits: the CPU product does not depend on the rows of a pass
# (on another backend, TROUPE_BACKEND, logprobs agree to fp32 rounding of reordered sums).
python3 - "$tmp/s1.jsonl" "$tmp/s2.jsonl" "${TROUPE_BACKEND:-cpu}" <<'EOF2'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
tol = 0 if sys.argv[3] == "cpu" else 1e-5
same = len(a) == len(b) > 0 and all(
    x["output_ids"] == y["output_ids"] and x["finish_reason"] == y["finish_reason"] and
    x["text"] == y["text"] and max(abs(p - q) for p, q in zip(x["logprobs"], y["logprobs"])) <= tol
    for x, y in zip(a, b))
sys.exit(0 if same else 1)
EOF2
check "samples do not depend on the batch layout or pool size" $?
"$troupe" generate "${opts[@]}" >"$tmp/s1b.jsonl" 2>/dev/null
cmp -s "$tmp/s1.jsonl" "$tmp/s1b.jsonl"
check "the same command gives the same bytes" $?
# --min-new-tokens 10: a stop id no longer ends a sample, which goes on drawing from the same
# stream: every sample is 10 tokens and begins with the same run's sample.
"$troupe" generate "${opts[@]}" --min-new-tokens 10 >"$tmp/s4.jsonl" 2>"$tmp/err" &&
    python3 - "$tmp/s1.jsonl" "$tmp/s4.jsonl" <<'EOF'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:])
ok = len(a) == len(b) and any(x["finish_reason"] == "stop" for x in a)
ok = ok and all(len(y["output_ids"]) == 10 and y["finish_reason"] == "length" and
                y["output_ids"][:len(x["output_ids"])] == x["output_ids"] for x, y in zip(a, b))
sys.exit(0 if ok else 1)
EOF
check "--min-new-tokens: stop ids do not end samples before it" $?
"$troupe" generate "${opts[@]}" --seed 12 >"$tmp/s3.jsonl" 2>/dev/null
! cmp -s "$tmp/s1.jsonl" "$tmp/s3.jsonl"
check "another seed, other samples" $?
python3 - "$tmp/s1.jsonl" "$fx/prompts.jsonl" "$tmp/lp_in.jsonl" "$tmp/lp_want.jsonl" <<'EOF'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
prompts = [json.loads(l) for l in open(sys.argv[2])]
n_p = len(prompts)
bad = [(g["index"], g["sample"]) for g in got] != [(i, j) for i in range(n_p) for j in range(3)]
distinct = any(len({tuple(g["output_ids"]) for g in got if g["index"] == i}) > 1
               for i in range(n_p))
for g in got:
    n = len(g["output_ids"])
    stops = {0, 2} if "messages" in prompts[g["index"]] else {0}   # <|endoftext|>, <|im_end|>
    stopped = g["output_ids"][-1] in stops
    bad |= not 1 <= n <= 10 or len(g["logprobs"]) != n
    bad |= g["finish_reason"] != ("stop" if stopped else "length") or (not stopped and n != 10)
    bad |= any(t in stops for t in g["output_ids"][:-1])
    bad |= not all(lp <= 0 for lp in g["logprobs"]) or not isinstance(g["text"], str)
# For id prompts: prompt + output as `troupe logprobs` input, generation's logprobs expected.
with open(sys.argv[3], "w") as fi, open(sys.argv[4], "w") as fo:
    for g in got:
        p = prompts[g["index"]]
        if "input_ids" in p:
            fi.write(json.dumps({"input_ids": p["input_ids"] + g["output_ids"]}) + "\n")
            fo.write(json.dumps(g["logprobs"]) + "\n")
sys.exit(1 if bad or not distinct else 0)
EOF
check "sampled lines: order, lengths, finish reasons, distinct samples" $?
"$troupe" logprobs --model "$fx" --data "$tmp/lp_in.jsonl" >"$tmp/lp_got.jsonl" 2>"$tmp/err"
st=$?; check "logprobs of the samples: exit status ($(cat "$tmp/err"))" $st
python3 - "$tmp/lp_got.jsonl" "$tmp/lp_want.jsonl" "${TROUPE_BACKEND:-cpu}" <<'EOF'
import json, sys
got = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
tol = 0 if sys.argv[3] == "cpu" else 1e-5
same = all(max([abs(a - b) for a, b in zip(g[-len(w):], w)] + [0]) <= tol for g, w in zip(got, want))
sys.exit(0 if len(got) == len(want) > 0 and same else 1)
EOF
check "generation logprobs equal troupe logprobs on prompt + output, bit for bit" $?
# The same in bf16 (the CPU's emulated mixed precision rounds as CUDA does, with the CPU's
# batch-invariant product): sampled logprobs are what `troupe logprobs` gives, bit for bit.
if [ "${TROUPE_BACKEND:-cpu}" = cpu ]; then
    "$troupe" generate "${opts[@]}" --precision bf16 >"$tmp/b1.jsonl" 2>"$tmp/err"
    st=$?; check "bf16 sampling: exit status ($(cat "$tmp/err"))" $st
    python3 - "$tmp/b1.jsonl" "$fx/prompts.jsonl" "$tmp/lpb_in.jsonl" "$tmp/lpb_want.jsonl" <<'EOF'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
prompts = [json.loads(l) for l in open(sys.argv[2])]
with open(sys.argv[3], "w") as fi, open(sys.argv[4], "w") as fo:
    for g in got:
        p = prompts[g["index"]]
        if "input_ids" in p:
            fi.write(json.dumps({"input_ids": p["input_ids"] + g["output_ids"]}) + "\n")
            fo.write(json.dumps(g["logprobs"]) + "\n")
EOF
    "$troupe" logprobs --precision bf16 --model "$fx" --data "$tmp/lpb_in.jsonl" \
        >"$tmp/lpb_got.jsonl" 2>"$tmp/err"
    st=$?; check "bf16 logprobs of the samples: exit status ($(cat "$tmp/err"))" $st
    python3 - "$tmp/lpb_got.jsonl" "$tmp/lpb_want.jsonl" "$tmp/s1.jsonl" "$tmp/b1.jsonl" <<'EOF'
import json, sys
got = [json.loads(l)["logprobs"] for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
same = all(g[-len(w):] == w for g, w in zip(got, want))
# And bf16 really ran: its logprobs are not fp32's.
f32 = [json.loads(l)["logprobs"] for l in open(sys.argv[3])]
b16 = [json.loads(l)["logprobs"] for l in open(sys.argv[4])]
sys.exit(0 if len(got) == len(want) > 0 and same and f32 != b16 else 1)
EOF
    check "bf16 generation logprobs equal bf16 troupe logprobs, bit for bit" $?
fi

# Greedy on the model fixtures of every family against transformers' generate (the prompts
# and outputs of expected.safetensors; the header is read by hand, the data is I32).
for m in llama3 qwen2 llama_bias qwen3; do
    python3 - "$models/$m/expected.safetensors" "$tmp/$m.prompts.jsonl" "$tmp/$m.want.jsonl" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
def ints(key):
    a, b = head[key]["data_offsets"]
    assert head[key]["dtype"] == "I32"
    return list(struct.unpack(f"<{(b - a) // 4}i", raw[8 + n + a:8 + n + b]))
with open(sys.argv[2], "w") as fp, open(sys.argv[3], "w") as fw:
    i = 0
    while f"gen.prompt.{i}" in head:
        p = ints(f"gen.prompt.{i}")
        fp.write(json.dumps({"input_ids": p}) + "\n")
        fw.write(json.dumps(ints(f"gen.output.{i}")[len(p):]) + "\n")
        i += 1
EOF
    "$troupe" generate --model "$models/$m" --prompts "$tmp/$m.prompts.jsonl" --temperature 0 \
        --max-new-tokens 16 >"$tmp/$m.greedy.jsonl" 2>"$tmp/err"
    st=$?; check "$m greedy: exit status ($(cat "$tmp/err"))" $st
    python3 - "$tmp/$m.greedy.jsonl" "$tmp/$m.want.jsonl" <<'EOF'
import json, sys
got = [json.loads(l)["output_ids"] for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
sys.exit(0 if len(got) == len(want) >= 3 and got == want else 1)
EOF
    check "$m: greedy tokens equal transformers' generate" $?
done

# A model without tokenizer.json: ids work (no "text"), text prompts are an error.
printf '{"input_ids": [5, 17, 42]}\n' >"$tmp/ids.jsonl"
"$troupe" generate --model "$models/llama3" --prompts "$tmp/ids.jsonl" --n 2 \
    --max-new-tokens 4 >"$tmp/ids.out" 2>"$tmp/err"
st=$?; check "ids without a tokenizer ($(cat "$tmp/err"))" $st
[ "$(wc -l <"$tmp/ids.out")" = 2 ] && ! grep -q '"text"' "$tmp/ids.out"
check "two lines without text" $?

# expect_error STATUS PATTERN ARGS...: exit status and a message matching PATTERN.
expect_error() {
    local want="$1" pat="$2"; shift 2
    "$troupe" generate "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" != "$want" ] || ! grep -q -- "$pat" "$tmp/err"; then
        echo "FAIL: generate $*: exit $got (want $want), stderr:"; cat "$tmp/err"; fail=1
    fi
}
printf '{"input_ids": [1]}\n\n{"prompt": "hi"}\n' >"$tmp/text.jsonl"
expect_error 1 'text.jsonl:3:.*tokenizer.json' --model "$models/llama3" --prompts "$tmp/text.jsonl"
printf '{"input_ids": [1, 2]}\n{"input_ids": [1, 3000]}\n' >"$tmp/range.jsonl"
expect_error 1 'range.jsonl:2: input_ids\[1\] = 3000 is outside' --model "$fx" \
    --prompts "$tmp/range.jsonl"
printf '{"input_ids": [1, 2]}\n{"input_ids": [1, 2],}\n' >"$tmp/malformed.jsonl"
expect_error 1 'malformed.jsonl:2:' --model "$fx" --prompts "$tmp/malformed.jsonl"
printf '{"prompt": "a", "input_ids": [1]}\n' >"$tmp/both.jsonl"
expect_error 1 'both.jsonl:1: give only one' --model "$fx" --prompts "$tmp/both.jsonl"
printf '{"messages": [{"role": "robot", "content": "x"}]}\n' >"$tmp/role.jsonl"
expect_error 1 'role.jsonl:1: messages\[0\].role' --model "$fx" --prompts "$tmp/role.jsonl"
printf '{"text": "x"}\n' >"$tmp/none.jsonl"
expect_error 1 "none.jsonl:1: a line needs" --model "$fx" --prompts "$tmp/none.jsonl"
expect_error 1 'kv-tokens 8 is too small: the longest request needs' --model "$fx" --prompts "$fx/prompts.jsonl" --kv-tokens 8
expect_error 1 'causal LM' --model "$models/score_qwen2" --prompts "$tmp/ids.jsonl"
expect_error 1 'no-such.jsonl' --model "$fx" --prompts "$tmp/no-such.jsonl"
expect_error 2 'required' --model "$fx"
expect_error 2 '\-\-n must' --model "$fx" --prompts "$tmp/ids.jsonl" --n 0
expect_error 2 'min-new-tokens must' --model "$fx" --prompts "$tmp/ids.jsonl" --max-new-tokens 4 --min-new-tokens 5
expect_error 2 'top-p' --model "$fx" --prompts "$tmp/ids.jsonl" --top-p 1.5
expect_error 2 'chat-format' --model "$fx" --prompts "$tmp/ids.jsonl" --chat-format vicuna
# qwen3 is a known format, but this Qwen2-style tokenizer has no think tokens for it.
expect_error 1 "no '<think>' token" --model "$fx" --prompts "$fx/prompts.jsonl" --chat-format qwen3
expect_error 2 'no-thinking applies to --chat-format qwen3' --model "$fx" --prompts "$tmp/ids.jsonl" \
    --no-thinking
expect_error 2 'temperature' --model "$fx" --prompts "$tmp/ids.jsonl" --temperature -1
# A failed run leaves no output file behind.
"$troupe" generate --model "$fx" --prompts "$tmp/range.jsonl" --out "$tmp/partial.jsonl" \
    2>/dev/null
[ ! -e "$tmp/partial.jsonl" ] && [ -z "$(ls "$tmp" | grep 'partial.jsonl.tmp')" ]
check "no partial output file" $?

rm -rf "$tmp"
exit $fail
