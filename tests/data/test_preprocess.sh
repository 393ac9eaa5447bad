#!/usr/bin/env bash
# `troupe preprocess` end to end: the output holds HF tokenizers' ids (+ EOD) for every
# document (tools/preprocess_fixtures.py reference), 1 and 3 workers write identical files
# across several batches, and bad input fails with exit 1 naming file:line and leaves no
# output behind. Usage: test_preprocess.sh TROUPE CHECKER
set -u
troupe="$1"; check="$2"
src="${TROUPE_SOURCE_ROOT:-.}"
tok="$src/tests/fixtures/chat/qwen2_tokenizer.json"
tmp=$(mktemp -d /tmp/troupe-preprocess-XXXXXX)
fail=0
die() { echo "FAIL: $*"; fail=1; }

# 120 copies of the 50 documents: 6000+ lines, so more than one 4096-line batch.
for i in $(seq 120); do cat "$src/tests/fixtures/data/docs.jsonl"; done > "$tmp/in.jsonl"
for w in 1 3; do
    "$troupe" preprocess --input "$tmp/in.jsonl" --tokenizer "$tok" --output-prefix "$tmp/w$w" \
        --append-eod --workers $w 2> "$tmp/w$w.log" || { die "workers $w: exit $?"; cat "$tmp/w$w.log"; }
done
cmp -s "$tmp/w1.bin" "$tmp/w3.bin" || die ".bin differs between 1 and 3 workers"
cmp -s "$tmp/w1.idx" "$tmp/w3.idx" || die ".idx differs between 1 and 3 workers"
grep -q "6000 documents" "$tmp/w1.log" || { die "summary line"; cat "$tmp/w1.log"; }
# The fixture vocabulary is small: uint16 (code 8).
"$check" "$tmp/w3" tests/fixtures/data/docs.qwen2.ids.jsonl 120 8 || die "contents differ from HF"
ls "$tmp" | grep -q '\.tmp\.' && die "temporary files left behind"

# Bad input: exit 1, the message names file:line, no output files.
printf '{"text": "a"}\n\n{"text": "b",}\n' > "$tmp/bad.jsonl"
printf '{"text": "a"}\n{"body": "b"}\n' > "$tmp/nokey.jsonl"
printf '{"text": "a"}\n{"text": 5}\n' > "$tmp/type.jsonl"
expect_fail() {  # expect_fail STATUS PATTERN ARGS...
    local want="$1" pat="$2"; shift 2
    "$troupe" preprocess "$@" > "$tmp/out.log" 2>&1
    local got=$?
    [ "$got" = "$want" ] || { die "exit $got (wanted $want) for $*"; cat "$tmp/out.log"; }
    grep -qF -- "$pat" "$tmp/out.log" || { die "message lacks '$pat'"; cat "$tmp/out.log"; }
}
expect_fail 1 "bad.jsonl:3:" --input "$tmp/bad.jsonl" --tokenizer "$tok" --output-prefix "$tmp/bad" --workers 2
[ -e "$tmp/bad.bin" ] || [ -e "$tmp/bad.idx" ] && die "failed run left output files"
ls "$tmp" | grep -q 'bad\..*\.tmp\.' && die "failed run left temporary files"
expect_fail 1 "nokey.jsonl:2: missing field 'text'" --input "$tmp/nokey.jsonl" --tokenizer "$tok" --output-prefix "$tmp/x"
expect_fail 1 "type.jsonl:2: field 'text' must be a string, got number" --input "$tmp/type.jsonl" --tokenizer "$tok" --output-prefix "$tmp/x"
expect_fail 1 "body" --input "$tmp/nokey.jsonl" --json-key body --tokenizer "$tok" --output-prefix "$tmp/x"
expect_fail 1 "missing.jsonl: cannot open" --input "$tmp/missing.jsonl" --tokenizer "$tok" --output-prefix "$tmp/x"
expect_fail 1 "nope.json" --input "$tmp/bad.jsonl" --tokenizer "$tmp/nope.json" --output-prefix "$tmp/x"
expect_fail 2 "--workers" --input "$tmp/bad.jsonl" --tokenizer "$tok" --output-prefix "$tmp/x" --workers 0
expect_fail 2 "--eod-token" --input "$tmp/bad.jsonl" --tokenizer "$tok" --output-prefix "$tmp/x" --eod-token "<nope>"
expect_fail 2 "--output-prefix is required" --input "$tmp/bad.jsonl" --tokenizer "$tok"
# --json-key picks another field; --eod-token overrides the EOD.
printf '{"body": "hello"}\n' > "$tmp/body.jsonl"
"$troupe" preprocess --input "$tmp/body.jsonl" --json-key body --tokenizer "$tok" --output-prefix "$tmp/b" \
    --append-eod --eod-token "<|im_end|>" --quiet 2> "$tmp/b.log" || die "--json-key body"
[ -s "$tmp/b.log" ] && die "--quiet printed: $(cat "$tmp/b.log")"
# "hello" + <|im_end|> (id 2): the last uint16 of the .bin is 2.
last=$(od -An -tu2 -j $(( $(stat -c %s "$tmp/b.bin") - 2 )) "$tmp/b.bin" | tr -d ' ')
[ "$last" = "2" ] || die "--eod-token: last token $last"
[ $fail = 0 ] && rm -rf "$tmp"
exit $fail
