#!/usr/bin/env bash
# rollout.stop_ids end to end: every id of the quickstart policy's 274-id vocabulary listed as a
# stop id (more than any fixed stop table held) with rollout.min_new_tokens 3 makes every
# response, trained on and evaluated, exactly 4 tokens; an id past the vocabulary stops the run
# before its first step with a message naming the key.
set -u
troupe=$(realpath "$1")  # the tests run from the source root
src="${TROUPE_SOURCE_ROOT:-.}"
tmp=$(mktemp -d /tmp/troupe-stopids-XXXXXX)
fail=0
check() {  # check DESCRIPTION STATUS
    if [ "$2" != 0 ]; then echo "FAIL: $1"; fail=1; else echo "ok: $1"; fi
}
cd "$src" || exit 1

all=$(python3 -c "print('[' + ', '.join(str(i) for i in range(273, -1, -1)) + ']')")
"$troupe" run configs/quickstart.yaml --set run_dir="$tmp/all" --set train.steps=1 \
    --set rollout.min_new_tokens=3 --set "rollout.stop_ids=$all" >"$tmp/all.out" 2>&1
st=$?
check "a run with 274 stop ids exits 0" $st || tail -n 5 "$tmp/all.out"
python3 - "$tmp/all/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
lens = [(r["step"], k, r[k]) for r in rows for k in ("response_len/mean", "eval/response_len") if k in r]
print("response lengths:", lens)
sys.exit(0 if any(k == "response_len/mean" for _, k, _ in lens) and all(v == 4 for _, _, v in lens) else 1)
PY
check "every response ends at its 4th token (3 kept by min_new_tokens, then a stop id)" $?
grep -q "stop_ids: \[273, 272, " "$tmp/all/resolved.yaml"
check "resolved.yaml lists the stop ids in the recipe's order" $?

"$troupe" run configs/quickstart.yaml --set run_dir="$tmp/past" --set train.steps=1 \
    --set 'rollout.stop_ids=[5, 274]' 2>"$tmp/past.err"
st=$?
got=$(tail -n 1 "$tmp/past.err")
want="troupe run: error: rollout.stop_ids[1]: 274 is outside the policy's vocabulary [0, 274)"
[ $st = 1 ] && [ "$got" = "$want" ]
check "a stop id past the vocabulary: exit 1 with '$want'" $? || echo "  got $st: $got"

if [ $fail = 0 ]; then rm -rf "$tmp"; else echo "left $tmp for inspection"; fi
exit $fail
