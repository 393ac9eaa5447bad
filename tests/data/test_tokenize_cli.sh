#!/usr/bin/env bash
# End to end: `troupe tokenize` on the fixture texts must print exactly the ids HF tokenizers
# wrote, `--decode` on those ids exactly HF's decoded texts; malformed input fails with exit 1
# and a message naming the line, a missing --tokenizer is a usage error (exit 2).
set -u
troupe="$1"
fx="${TROUPE_SOURCE_ROOT:-.}/tests/fixtures/tokenizer"
tmp="$(mktemp -d /tmp/troupe-tokcli-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
fail=0
die() { echo "FAIL: $*"; fail=1; }

for name in qwen2 llama3 gpt2 split_removed; do
    tj="$fx/$name.json"
    "$troupe" tokenize --tokenizer "$tj" < "$fx/texts.jsonl" > "$tmp/ids" 2> "$tmp/err" ||
        die "$name: encode exit $?: $(cat "$tmp/err")"
    if ! cmp -s "$tmp/ids" "$fx/$name.ids.jsonl"; then
        die "$name: ids differ from HF"
        diff "$tmp/ids" "$fx/$name.ids.jsonl" | head -5
    fi
    # HF's decode of each line's ids: the text itself unless $name.decode.jsonl says otherwise.
    sed -n 's/^{"line":\([0-9]*\),"text":\(.*\)}$/\1\t{"text":\2}/p' "$fx/$name.decode.jsonl" > "$tmp/over"
    awk -F'\t' 'FILENAME == ARGV[1] { over[$1 + 1] = $2; next } { print ((FNR in over) ? over[FNR] : $0) }' \
        "$tmp/over" "$fx/texts.jsonl" > "$tmp/want"
    "$troupe" tokenize --tokenizer "$tj" --decode < "$fx/$name.ids.jsonl" > "$tmp/text" 2> "$tmp/err" ||
        die "$name: decode exit $?: $(cat "$tmp/err")"
    if ! cmp -s "$tmp/text" "$tmp/want"; then
        die "$name: decoded text differs from HF"
        diff "$tmp/text" "$tmp/want" | head -5
    fi
done

q="$fx/qwen2.json"
expect_fail() {  # expect_fail STATUS WHAT PATTERN INPUT ARGS...
    local want="$1" what="$2" pat="$3" input="$4"; shift 4
    printf '%b' "$input" | "$troupe" tokenize "$@" > "$tmp/out" 2> "$tmp/err"
    local got=$?
    [ "$got" = "$want" ] || die "$what: exit $got, wanted $want"
    grep -q -- "$pat" "$tmp/err" || die "$what: stderr lacks '$pat': $(cat "$tmp/err")"
}
expect_fail 1 "bad JSON on line 2" "<stdin>:2" '{"text":"a"}\n{"text":\n' --tokenizer "$q"
expect_fail 1 "text not a string" "<stdin>:1: field 'text'" '{"text":5}\n' --tokenizer "$q"
expect_fail 1 "no text field" "<stdin>:3" '{"text":"a"}\n\n{"txt":"b"}\n' --tokenizer "$q"
expect_fail 1 "invalid UTF-8" "<stdin>:1" '{"text":"\\udc80"}\n' --tokenizer "$q"
expect_fail 1 "unknown id" "<stdin>:2: id 999999" '{"ids":[1]}\n{"ids":[999999]}\n' --tokenizer "$q" --decode
expect_fail 1 "ids not integers" "ids\[1\]" '{"ids":[1,"x"]}\n' --tokenizer "$q" --decode
expect_fail 1 "missing tokenizer file" "/no/such/tokenizer.json" '' --tokenizer /no/such/tokenizer.json
expect_fail 2 "no --tokenizer" "--tokenizer" ''
# Output lines stop at the bad line: the good first line is still written.
printf '{"text":"hello"}\nbad\n' | "$troupe" tokenize --tokenizer "$q" > "$tmp/out" 2>/dev/null
[ "$(wc -l < "$tmp/out")" = 1 ] || die "lines before the bad one were not written"
# Empty input: no output, success.
"$troupe" tokenize --tokenizer "$q" < /dev/null > "$tmp/out" || die "empty input failed"
[ ! -s "$tmp/out" ] || die "empty input gave output"
exit $fail
