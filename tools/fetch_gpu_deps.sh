#!/usr/bin/env bash
# Runs on a Debian 12 (bookworm) amd64 machine with network, from anywhere in the repository:
# downloads into .debs/ (ignored) the Debian packages and Python wheels that tools/gpu_deps.sh
# unpacks on a GPU machine with no network and none of the upper layers' libraries, so that the
# full troupe binary builds there. Usage: tools/fetch_gpu_deps.sh; then carry .debs there.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.debs

# Headers, pkg-config files, the linker's .so link and the shared library itself for each
# dependency() of meson.build's upper layers. libpcre2-dev also links the 16/32-bit and POSIX
# PCRE2 libraries; troupe uses only libpcre2-8, so those stay out and their links dangle.
dev=(libzmq3-dev libzmq5 libmsgpack-dev libmsgpackc2 libyaml-dev libyaml-0-2
     libpcre2-dev libpcre2-8-0)
# What libzmq5 needs at run time beyond the image: gpu_deps.sh keeps each one only where the
# machine lacks its libraries. The -dev packages of these are left out on purpose: they only
# serve libzmq.pc's Requires.private (static linking), which gpu_deps.sh drops.
runtime=(libsodium23 libpgm-5.3-0 libnorm1 libbsd0 libmd0
         libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2 libkeyutils1)
# pkg-config itself, used there only if the image has none (meson finds every library above
# through it).
tools=(pkgconf pkgconf-bin libpkgconf3)
# Present on any Ubuntu 24.04 image that has python3 (libssl3 comes with python3's stdlib), and
# newer there than Debian 12's, so never shipped.
base=(libc6 libgcc-s1 libstdc++6 gcc-12-base zlib1g libssl3)

if ! apt-cache show libzmq5 >/dev/null 2>&1; then apt-get update -q; fi

# The closure check: every run-time dependency of a shipped library is shipped or in the base
# list, so a Debian update that adds one fails here rather than at link time there.
known=" ${dev[*]} ${runtime[*]} ${tools[*]} ${base[*]} "
missing=()
for p in "${dev[@]}" "${runtime[@]}" "${tools[@]}"; do
    case $p in *-dev) continue ;; esac   # their -dev dependencies are deliberately left out
    for d in $(apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks \
                   --no-replaces --no-enhances "$p" | awk '/^  (Pre)?Depends:/ {print $2}'); do
        case $known in *" $d "*) ;; *) missing+=("$p -> $d") ;; esac
    done
done
if [ ${#missing[@]} -ne 0 ]; then
    printf 'dependency not shipped and not in the base list: %s\n' "${missing[@]}" >&2
    exit 1
fi

# Fresh folders each time so that old versions do not pile up next to new ones.
rm -rf "${dest:?}/dev" "$dest/runtime" "$dest/tools" "$dest/wheels"
mkdir -p "$dest/dev" "$dest/runtime" "$dest/tools" "$dest/wheels"
download() {   # download DIR PKG...: retried once after refreshing stale package lists
    local dir=$1
    shift
    # APT::Sandbox::User=root: the _apt user may not write into a root-owned checkout.
    (cd "$dir" && apt-get -q -o APT::Sandbox::User=root download "$@") ||
        { apt-get update -q && (cd "$dir" && apt-get -q -o APT::Sandbox::User=root download "$@"); }
}
download "$dest/dev" "${dev[@]}"
download "$dest/runtime" "${runtime[@]}"
download "$dest/tools" "${tools[@]}"

# tests/roles runs examples/reward_service/reward_service.py under /usr/bin/python3 when that
# has pyzmq and msgpack (the e2e test is skipped otherwise); the GPU image's python3 is 3.12.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$dest/wheels" pyzmq msgpack

find "$dest" -type f \( -name '*.deb' -o -name '*.whl' \) -printf '%P\t%s\n' | sort
echo "total: $(find "$dest" -type f \( -name '*.deb' -o -name '*.whl' \) -printf '%s\n' |
    awk '{s += $1} END {printf "%.1f MiB", s / 1048576}') in $dest"
