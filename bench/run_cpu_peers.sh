#!/usr/bin/env bash
# troupe beside PyTorch on the CPU: runs bench_train and bench_generate (their usual tables)
# and bench/cpu_peer.py (the same model, batch and definitions in transformers: training
# eager and under torch.compile, HF generate decode), one after the other on this machine,
# then prints one table of tok/s per thread count with the ratios troupe/peer.
# Each program runs alone, so none of them competes with another for cores; the machine
# should otherwise be idle. On a 2-core machine the whole run takes several minutes, most
# of it torch.compile compiling the training step once per thread count.
#
# usage: bench/run_cpu_peers.sh BUILD_DIR [PYTHON_WITH_TORCH_AND_TRANSFORMERS]
set -euo pipefail
build="${1:?usage: run_cpu_peers.sh BUILD_DIR [PYTHON]}"
py="${2:-python3}"
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d /tmp/troupe-cpupeers-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS

# The C benchmarks print their table and then, with --machine, key=value lines; the table
# is shown as run_cpu.sh always showed it and the lines are kept for the comparison.
troupe() {
    local name="$1"
    echo "\$ $name"
    "$build/bench/$name" --machine >"$tmp/$name.out"
    # (less the blank line --machine puts before its lines)
    grep -v '^troupe ' "$tmp/$name.out" | sed '$ { /^$/ d }'
    grep '^troupe ' "$tmp/$name.out" >>"$tmp/troupe.txt"
}
troupe bench_train
echo
troupe bench_generate
echo
echo "\$ cpu_peer.py"
# torch and inductor write warnings on stderr; they are kept out of the results but shown
# if the peer fails.
if ! "$py" "$here/cpu_peer.py" >"$tmp/peer.txt" 2>"$tmp/peer.err"; then
    cat "$tmp/peer.txt" "$tmp/peer.err" >&2
    exit 1
fi
cat "$tmp/peer.txt"
echo
echo "\$ troupe vs PyTorch"
"$py" "$here/cpu_peer.py" --table "$tmp/troupe.txt" "$tmp/peer.txt"
echo "(troupe and peer runs took $((SECONDS - start)) s in all)"
