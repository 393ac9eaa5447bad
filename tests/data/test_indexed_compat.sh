#!/usr/bin/env bash
# Megatron compatibility, the other direction: files our builder writes are read by
# tools/indexed_fixtures.py (Megatron-Core's IndexedDataset when megatron.core imports, else a
# numpy reader of the documented layout) and hold the listed documents.
# Usage: test_indexed_compat.sh TEST_INDEXED. Skips (77) without a Python that has numpy.
set -u
src="${TROUPE_SOURCE_ROOT:-.}"
py=""
for c in "${TROUPE_PYTHON:-}" /opt/refenv/bin/python python3; do
    [ -n "$c" ] && "$c" -c 'import numpy' 2>/dev/null && { py="$c"; break; }
done
[ -n "$py" ] || { echo "no Python with numpy: skipped"; exit 77; }
tmp=$(mktemp -d /tmp/troupe-compat-XXXXXX)
TROUPE_INDEXED_OUT="$tmp" "$1" > "$tmp/log" 2>&1 || { cat "$tmp/log"; exit 1; }
fail=0
for n in megatron_u16 megatron_i32; do
    "$py" "$src/tools/indexed_fixtures.py" check "$tmp/$n" "$src/tests/fixtures/indexed/contents.json" \
        "$n" > "$tmp/$n.log" 2>&1 || fail=1
    grep -E "match|mismatch|not usable" "$tmp/$n.log"
done
[ $fail = 0 ] && rm -rf "$tmp"
exit $fail
