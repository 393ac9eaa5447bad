#!/usr/bin/env bash
# CLI contract: --help and --version succeed, unknown commands and options are usage errors
# (exit 2) with a message, every listed command answers --help with exit 0.
set -u
troupe="$1"
fail=0
expect() {  # expect STATUS DESCRIPTION CMD...
    local want="$1" what="$2"; shift 2
    "$@" >/tmp/troupe-cli-out.$$ 2>&1
    local got=$?
    if [ "$got" != "$want" ]; then
        echo "FAIL: $what: exit $got, wanted $want"; cat /tmp/troupe-cli-out.$$; fail=1
    fi
}
expect 0 "--help" "$troupe" --help
expect 0 "--version" "$troupe" --version
"$troupe" --version | grep -Eq '^troupe [0-9a-g.]+' || { echo "FAIL: version format"; fail=1; }
expect 2 "no command" "$troupe"
expect 2 "unknown command" "$troupe" frobnicate
"$troupe" frobnicate 2>&1 | grep -q "unknown command 'frobnicate'" || { echo "FAIL: message"; fail=1; }
expect 2 "unknown global flag" "$troupe" --frob
for cmd in $("$troupe" --help | awk '/^commands:/{on=1;next} on&&/^  [a-z]/{print $1}'); do
    expect 0 "$cmd --help" "$troupe" "$cmd" --help
    expect 2 "$cmd unknown flag" "$troupe" "$cmd" --no-such-flag-xyz
done
rm -f /tmp/troupe-cli-out.$$
exit $fail
