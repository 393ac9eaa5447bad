#!/usr/bin/env bash
# The commands as a careless or hostile user drives them: output into a FIFO, a directory, a
# missing directory, a full device or standard output by '-'; progress lines whose counts
# must equal the output's; and bad models, files and options, each an exit status (1
# failure, 2 usage) with a message naming the file, line or option, and no file left behind.
set -u
troupe="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"   # the tests cd
src="${TROUPE_SOURCE_ROOT:-.}"
models="$src/tests/fixtures/models"
gen="$src/tests/fixtures/generate/chat_qwen2"
tok="$src/tests/fixtures/tokenizer/qwen2.json"
tmp=$(mktemp -d /tmp/troupe-hostile-XXXXXX)
fail=0

check() {  # check DESCRIPTION STATUS: prints FAIL unless STATUS is 0
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; fi
}
# checkerr DESCRIPTION STATUS: as check, with the captured stderr shown on failure.
checkerr() {
    if [ "$2" != 0 ]; then echo "FAIL: $1, stderr:"; cat "$tmp/err"; fail=1; fi
}
# expect STATUS PATTERN CMD ARGS...: exit status and a stderr line matching PATTERN.
expect() {
    local want="$1" pat="$2"; shift 2
    timeout 60 "$troupe" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    local got=$?
    if [ "$got" != "$want" ] || ! grep -q -- "$pat" "$tmp/err"; then
        echo "FAIL: troupe $*: exit $got (want $want, /$pat/), stderr:"; cat "$tmp/err"; fail=1
    fi
}
lp_in="$models/qwen2/logprobs_input.jsonl"
"$troupe" logprobs --model "$models/qwen2" --data "$lp_in" >"$tmp/lp.ref" 2>"$tmp/err"
checkerr "logprobs reference run" $?
[ -s "$tmp/err" ] && { echo "FAIL: stderr not empty without --progress:"; cat "$tmp/err"; fail=1; }

# --out into a FIFO (what /dev/stdout is on a pipe) writes through it and leaves it a FIFO;
# renaming a temporary over it would replace the node itself.
mkfifo "$tmp/fifo"
timeout 60 cat "$tmp/fifo" >"$tmp/fifo.got" &
reader=$!
timeout 60 "$troupe" logprobs --model "$models/qwen2" --data "$lp_in" --out "$tmp/fifo" 2>"$tmp/err"
checkerr "logprobs --out FIFO" $?
wait "$reader"
[ -p "$tmp/fifo" ] && cmp -s "$tmp/fifo.got" "$tmp/lp.ref"
check "FIFO still a FIFO and it carried the output" $?
ls "$tmp" | grep -q '\.tmp\.' && { echo "FAIL: temporary left beside the FIFO"; fail=1; }

# '-' is standard output, not a file named '-'.
(cd "$tmp" && "$troupe" logprobs --model "$models/qwen2" --data "$lp_in" --out - >"$tmp/dash.out")
check "logprobs --out -" $?
cmp -s "$tmp/dash.out" "$tmp/lp.ref" && [ ! -e "$tmp/-" ]
check "--out - wrote standard output" $?
printf '{"input_ids": [5, 17, 42]}\n' >"$tmp/ids.jsonl"
(cd "$tmp" && "$troupe" generate --model "$gen" --prompts ids.jsonl --max-new-tokens 3 --out - \
    >"$tmp/gdash.out")
[ "$(wc -l <"$tmp/gdash.out")" = 1 ] && [ ! -e "$tmp/-" ]
check "generate --out - wrote standard output" $?

# A directory or a missing directory as --out fails, naming the path, and leaves nothing.
mkdir "$tmp/outdir"
expect 1 "outdir: is a directory" logprobs --model "$models/qwen2" --data "$lp_in" --out "$tmp/outdir"
expect 1 "outdir: is a directory" generate --model "$gen" --prompts "$tmp/ids.jsonl" --out "$tmp/outdir"
expect 1 "$tmp/missing/o.jsonl: cannot create" generate --model "$gen" --prompts "$tmp/ids.jsonl" \
    --out "$tmp/missing/o.jsonl"
[ -z "$(ls -A "$tmp/outdir")" ] && [ ! -e "$tmp/missing" ]
check "nothing left in or beside a refused --out" $?

# Output that cannot be written (a full device) is a failure for every command, --help too.
if [ -c /dev/full ]; then
    for args in "--help" "--version" "info --help" "info --model $models/qwen2" \
                "logprobs --model $models/qwen2 --data $lp_in" \
                "generate --model $gen --prompts $tmp/ids.jsonl --max-new-tokens 2"; do
        # shellcheck disable=SC2086
        "$troupe" $args >/dev/full 2>"$tmp/err"
        st=$?
        [ "$st" = 1 ] && grep -q "writing standard output failed" "$tmp/err"
        checkerr "troupe $args >/dev/full: exit $st" $?
    done
    printf '{"text": "hi"}\n' | "$troupe" tokenize --tokenizer "$tok" >/dev/full 2>/dev/null
    check "tokenize >/dev/full fails" $(( $? != 1 ))
    [ -c /dev/full ]
    check "/dev/full is still a device" $?
fi

# --progress: the final line counts what was written. logprobs: 3 sequences of 7, 12 and 5
# tokens; generate: one line per sample, tokens = every output_ids entry.
"$troupe" logprobs --model "$models/qwen2" --data "$lp_in" --progress >/dev/null 2>"$tmp/err"
grep -q '^troupe logprobs: 3/3 sequences (100.0%), 24 tokens, .* in [0-9.]* s$' "$tmp/err"
checkerr "logprobs --progress final line" $?
"$troupe" logprobs --model "$models/qwen2" --data "$lp_in" --progress --quiet >/dev/null 2>"$tmp/err"
[ ! -s "$tmp/err" ]
check "--quiet wins over --progress" $?
"$troupe" generate --model "$gen" --prompts "$gen/prompts.jsonl" --n 3 --max-new-tokens 20 \
    --progress >"$tmp/gen.out" 2>"$tmp/err"
check "generate --progress" $?
samples=$(wc -l <"$tmp/gen.out")
tokens=$(grep -o '"output_ids": \[[^]]*\]' "$tmp/gen.out" | sed 's/.*\[//; s/\]//' |
         tr ',' '\n' | grep -c '[0-9]')
grep -q "^troupe generate: $samples/18 samples (100.0%), $tokens tokens, .* in [0-9.]* s\$" "$tmp/err"
checkerr "generate --progress final line ($samples samples, $tokens tokens)" $?

# The largest --batch-tokens on a small input needs no arena of that size: an arena of 2^24
# tokens (35 GB for this model) would not fit the 4 GB address space given here. Sanitizer
# builds reserve terabytes of shadow memory, so they skip this.
if ! ldd "$troupe" 2>/dev/null | grep -q libasan; then
    (ulimit -v 4000000
     "$troupe" logprobs --model "$models/qwen2" --data "$lp_in" --batch-tokens 16777216 --threads 2 \
         >"$tmp/big.out" 2>"$tmp/err" &&
     "$troupe" generate --model "$gen" --prompts "$tmp/ids.jsonl" --max-new-tokens 3 \
         --batch-tokens 16777216 --max-seqs 65536 --threads 2 >"$tmp/gbig.out" 2>>"$tmp/err")
    st=$?
    [ $st = 0 ] && cmp -s "$tmp/big.out" "$tmp/lp.ref" && cmp -s "$tmp/gbig.out" "$tmp/gdash.out"
    checkerr "huge --batch-tokens on a small input (exit $st)" $?
fi

# A run killed mid-way leaves no temporary behind and dies of the signal (143). The input is
# a FIFO held open and stalled after one line, so the kill lands while the output is open.
mkdir "$tmp/sig"
killed() {  # killed DESCRIPTION LINE CMD ARGS... (the input FIFO is $tmp/sig/in)
    local what="$1" line="$2"; shift 2
    rm -f "$tmp/sig/in"; mkfifo "$tmp/sig/in"
    "$troupe" "$@" 2>"$tmp/err" &
    local pid=$!
    exec 3>"$tmp/sig/in"
    printf '%s\n' "$line" >&3
    for _ in $(seq 100); do ls "$tmp/sig" | grep -q '\.tmp\.' && break; sleep 0.1; done
    ls "$tmp/sig" | grep -q '\.tmp\.'
    check "$what: temporary created" $?
    kill -TERM "$pid"
    wait "$pid"
    local st=$?
    exec 3>&-
    local left
    left=$(ls "$tmp/sig" | grep -v '^in$' | tr '\n' ' ')
    [ "$st" = 143 ] && [ -z "$left" ]
    checkerr "$what killed: exit $st, left '$left'" $?
}
killed preprocess '{"text": "a"}' preprocess --input "$tmp/sig/in" --tokenizer "$tok" \
    --output-prefix "$tmp/sig/pp" --quiet
killed generate '{"input_ids": [1]}' generate --model "$gen" --prompts "$tmp/sig/in" \
    --out "$tmp/sig/g.jsonl"

# Bad models: each message names the file that is wrong.
mkdir -p "$tmp/noweights" "$tmp/trunc" "$tmp/cfgdir/config.json" "$tmp/emptycfg"
cp "$models/qwen2/config.json" "$tmp/noweights/"
cp "$models/qwen2/config.json" "$tmp/trunc/"
head -c 100000 "$models/qwen2/model.safetensors" >"$tmp/trunc/model.safetensors"
: >"$tmp/emptycfg/config.json"
expect 1 "noweights: no model.safetensors" logprobs --model "$tmp/noweights" --data "$lp_in"
expect 1 "trunc/model.safetensors: .*truncated" generate --model "$tmp/trunc" --prompts "$tmp/ids.jsonl"
expect 1 "trunc/model.safetensors: .*truncated" info --model "$tmp/trunc"
expect 1 "cfgdir/config.json: not a regular file" info --model "$tmp/cfgdir"
expect 1 "emptycfg/config.json:1:1:" logprobs --model "$tmp/emptycfg" --data "$lp_in"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' >"$tmp/wrong.json"
expect 1 "wrong.json: model.type: unsupported model type 'WordPiece'" tokenize \
    --tokenizer "$tmp/wrong.json"

# A weight that is NaN: printf's "nan" would be invalid JSON, so it is an error naming the
# line (logprobs) or the sample (generate), and no output file is left.
nan_model() {  # nan_model SRC DST: a copy whose first down_proj weight of layer 1 is NaN
    cp -r "$1" "$2" && python3 - "$2/model.safetensors" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))["model.layers.1.mlp.down_proj.weight"]
    assert t["dtype"] == "F32"
    f.seek(8 + n + t["data_offsets"][0])
    f.write(struct.pack("<I", 0x7FC00000))
EOF
}
nan_model "$models/qwen2" "$tmp/nan" && nan_model "$gen" "$tmp/gnan"
check "NaN models made" $?
expect 1 "logprobs_input.jsonl:1: logprob 0 is nan: the model computes non-finite" logprobs \
    --model "$tmp/nan" --data "$lp_in" --out "$tmp/nan.out"
expect 1 "index 0 sample 0: the logprob of output token 0 is nan" generate --model "$tmp/gnan" \
    --prompts "$tmp/ids.jsonl" --out "$tmp/nan.out"
[ ! -e "$tmp/nan.out" ]
check "no output from a NaN model" $?

# Bad data files and lines.
printf '[1, 2]\n' >"$tmp/array.jsonl"
expect 1 "array.jsonl:1: .*object" logprobs --model "$models/qwen2" --data "$tmp/array.jsonl"
expect 1 "array.jsonl:1: .*object" generate --model "$gen" --prompts "$tmp/array.jsonl"
expect 1 "array.jsonl:1: .*object" preprocess --input "$tmp/array.jsonl" --tokenizer "$tok" \
    --output-prefix "$tmp/pp" --quiet
expect 1 "$tmp: read failed: Is a directory" logprobs --model "$models/qwen2" --data "$tmp"
"$troupe" logprobs --model "$models/qwen2" --data - <&- >/dev/null 2>"$tmp/err"
[ $? = 1 ] && grep -q -- "-: read failed: Bad file descriptor" "$tmp/err"
checkerr "closed standard input" $?
ls "$tmp" | grep -q '^pp\.' && { echo "FAIL: preprocess left files behind"; fail=1; }

# Bad options: usage errors naming the option.
for o in "--n -1" "--n 99999999999999999999" "--max-new-tokens -5" "--threads -1" \
         "--temperature -1" "--temperature nan" "--temperature inf" "--top-p 0" "--top-p 1.5" \
         "--top-p nan" "--top-k -1" "--seed -1" "--block-size 0" "--max-seqs -1"; do
    # shellcheck disable=SC2086
    expect 2 "${o%% *}" generate --model "$gen" --prompts "$tmp/ids.jsonl" $o
done
expect 2 "\-\-model needs a non-empty value" info --model ""
expect 2 "\-\-out needs a non-empty value" logprobs --model "$models/qwen2" --data "$lp_in" --out=
expect 2 "threads" logprobs --model "$models/qwen2" --data "$lp_in" --threads 100000
expect 2 "tokens" info --model "$models/qwen2" --tokens -1
expect 2 "output-prefix must end in a file name" preprocess --input "$lp_in" --tokenizer "$tok" \
    --output-prefix "$tmp/outdir/"
[ -z "$(ls -A "$tmp/outdir")" ]
check "preprocess wrote nothing for a directory prefix" $?

rm -rf "$tmp"
exit $fail
