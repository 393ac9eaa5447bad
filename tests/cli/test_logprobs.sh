#!/usr/bin/env bash
# `troupe logprobs` end to end: on the transformers fixtures its output matches the logprobs
# transformers computed (1e-5 abs, line for line, in input order: fp32 sums in another order
# differ by a few ulp per layer), and is the same bytes for every --batch-tokens, whether
# sequences share a forward or not; text input equals its token ids; bad input fails with exit 1 and a message
# naming FILE:LINE; usage errors exit 2.
set -u
troupe="$1"
src="${TROUPE_SOURCE_ROOT:-.}"
fx="$src/tests/fixtures/models"
tmp=$(mktemp -d /tmp/troupe-logprobs-XXXXXX)
fail=0

# compare GOT WANT: same number of lines and values, every value within 1e-5.
compare() {
    awk -v tol=1e-5 '
        function parse(line, arr,   s, n) {
            s = line; sub(/^[^[]*\[/, "", s); sub(/\].*$/, "", s)
            if (s ~ /^ *$/) return 0
            return split(s, arr, /, */)
        }
        NR == FNR { want[FNR] = $0; nw = FNR; next }
        {
            ng++
            n1 = parse($0, g); n2 = parse(want[FNR], w)
            if (n1 != n2) { printf "line %d: %d values, want %d\n", FNR, n1, n2; bad = 1; next }
            for (i = 1; i <= n1; i++) {
                d = g[i] - w[i]; if (d < 0) d = -d
                if (d > tol || g[i] == "") { printf "line %d value %d: %s vs %s\n", FNR, i, g[i], w[i]; bad = 1 }
            }
        }
        END { if (ng != nw) { printf "%d lines, want %d\n", ng, nw; bad = 1 } exit bad }
    ' "$2" "$1"
}

check() {  # check DESCRIPTION STATUS: prints FAIL unless STATUS is 0
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; fi
}

for m in llama3 qwen2 llama_bias qwen3; do
    "$troupe" logprobs --model "$fx/$m" --data "$fx/$m/logprobs_input.jsonl" --threads 2 \
        >"$tmp/$m.out" 2>"$tmp/err"
    st=$?; check "$m: exit status $st ($(cat "$tmp/err"))" $st
    compare "$tmp/$m.out" "$fx/$m/logprobs_expected.jsonl"
    check "$m: stdout matches transformers" $?
    # One sequence per forward (batch of 1 token forces it) and --out.
    "$troupe" logprobs --model "$fx/$m" --data "$fx/$m/logprobs_input.jsonl" --batch-tokens 1 \
        --out "$tmp/$m.file.jsonl" 2>"$tmp/err"
    st=$?; check "$m --out: exit status ($(cat "$tmp/err"))" $st
    compare "$tmp/$m.file.jsonl" "$fx/$m/logprobs_expected.jsonl"
    check "$m: --out file matches transformers" $?
    # Batch invariance is the CPU backend's promise (TROUPE_BACKEND picks another backend).
    [ "${TROUPE_BACKEND:-cpu}" = cpu ] || continue
    cmp -s "$tmp/$m.out" "$tmp/$m.file.jsonl"
    check "$m: one sequence per forward gives the bytes of a shared forward" $?
    for bt in 7 33 100; do
        "$troupe" logprobs --model "$fx/$m" --data "$fx/$m/logprobs_input.jsonl" \
            --batch-tokens $bt --threads 1 >"$tmp/$m.bt.out" 2>"$tmp/err"
        cmp -s "$tmp/$m.out" "$tmp/$m.bt.out"
        check "$m: --batch-tokens $bt --threads 1 gives the same bytes" $?
    done
done

# "text" lines are encoded with the model's tokenizer.json: the same output as the ids that
# `troupe tokenize` (checked against HF tokenizers) gives for the text.
tokfx="$src/tests/fixtures/generate/chat_qwen2"
printf '{"text": "Hello world, this is a test of generation."}\n{"text": "fox \\u00e9t\\u00e9"}\n' \
    >"$tmp/text_in.jsonl"
"$troupe" tokenize --tokenizer "$tokfx/tokenizer.json" <"$tmp/text_in.jsonl" |
    sed 's/"ids"/"input_ids"/' >"$tmp/text_ids.jsonl"
check "tokenize" $?
"$troupe" logprobs --model "$tokfx" --data "$tmp/text_in.jsonl" >"$tmp/text.out" 2>"$tmp/err"
st=$?; check "text input ($(cat "$tmp/err"))" $st
"$troupe" logprobs --model "$tokfx" --data "$tmp/text_ids.jsonl" >"$tmp/text_ids.out" 2>&1
check "ids of the text" $?
[ -s "$tmp/text.out" ] && cmp -s "$tmp/text.out" "$tmp/text_ids.out"
check "text and its ids give the same logprobs" $?

# A one-token sequence gives an empty list; blank lines are skipped.
printf '{"input_ids": [5]}\n\n{"input_ids": [5, 6]}\n' >"$tmp/short.jsonl"
"$troupe" logprobs --model "$fx/llama3" --data "$tmp/short.jsonl" >"$tmp/short.out" 2>&1
check "short sequences" $?
head -1 "$tmp/short.out" | grep -qx '{"logprobs": \[\]}'
check "one token -> []" $?
[ "$(wc -l <"$tmp/short.out")" = 2 ]
check "two output lines" $?

# expect_error STATUS PATTERN ARGS...: exit status and a message matching PATTERN.
expect_error() {
    local want="$1" pat="$2"; shift 2
    "$troupe" logprobs "$@" >"$tmp/out" 2>"$tmp/err"
    local got=$?
    if [ "$got" != "$want" ] || ! grep -q -- "$pat" "$tmp/err"; then
        echo "FAIL: logprobs $*: exit $got (want $want), stderr:"; cat "$tmp/err"; fail=1
    fi
}
printf '{"input_ids": [1, 2]}\n{"input_ids": [1, 300]}\n' >"$tmp/range.jsonl"
expect_error 1 'range.jsonl:2: input_ids\[1\] = 300 is outside' \
    --model "$fx/llama3" --data "$tmp/range.jsonl"
printf '{"input_ids": [1, 2]}\n\n{"input_ids": [1, 2,]}\n' >"$tmp/malformed.jsonl"
expect_error 1 'malformed.jsonl:3:' --model "$fx/llama3" --data "$tmp/malformed.jsonl"
printf '{"input_ids": [1, "x"]}\n' >"$tmp/type.jsonl"
expect_error 1 'type.jsonl:1: input_ids\[1\] must be an integer' \
    --model "$fx/llama3" --data "$tmp/type.jsonl"
printf '{"text": "hello"}\n' >"$tmp/text.jsonl"
expect_error 1 "text.jsonl:1: 'text' needs the model's tokenizer.json" \
    --model "$fx/llama3" --data "$tmp/text.jsonl"
printf '{"text": "hello", "input_ids": [1, 2]}\n' >"$tmp/both.jsonl"
expect_error 1 'both.jsonl:1: give one of' --model "$fx/llama3" --data "$tmp/both.jsonl"
expect_error 1 'causal LM' --model "$fx/score_qwen2" --data "$tmp/short.jsonl"
expect_error 1 'config.json' --model "$tmp/no-such-model" --data "$tmp/short.jsonl"
expect_error 1 'no-such.jsonl' --model "$fx/llama3" --data "$tmp/no-such.jsonl"
expect_error 2 'required' --data "$tmp/short.jsonl"
expect_error 2 'threads' --model "$fx/llama3" --data "$tmp/short.jsonl" --threads -1
# A failed run leaves no output file behind.
"$troupe" logprobs --model "$fx/llama3" --data "$tmp/range.jsonl" --out "$tmp/partial.jsonl" \
    2>/dev/null
[ ! -e "$tmp/partial.jsonl" ] && [ -z "$(ls "$tmp" | grep 'partial.jsonl.tmp')" ]
check "no partial output file" $?

rm -rf "$tmp"
exit $fail
