#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, with .debs/ carried there (made by
# tools/fetch_gpu_deps.sh): unpacks the upper layers' libraries into a private prefix, never
# into /, and writes PREFIX/env.sh, the environment that builds and runs the full binary.
# Usage: tools/gpu_deps.sh [PREFIX]   (default ./.deps-root); then: . PREFIX/env.sh
# TROUPE_DEPS_ALL=1 takes libzmq's dependencies from the prefix even where the machine has them.
set -euo pipefail
cd "$(dirname "$0")/.."
debs=$PWD/.debs
root=${1:-$PWD/.deps-root}
case $root in /*) ;; *) root=$PWD/$root ;; esac
root=${root%/}
case $root in "" | /usr | /usr/local | /opt) echo "refusing prefix '$root/'" >&2; exit 2 ;; esac
if [ ! -d "$debs/dev" ]; then
    echo "no $debs/dev: run tools/fetch_gpu_deps.sh where there is network, then carry .debs" >&2
    exit 1
fi
multiarch=x86_64-linux-gnu

unpack() {   # unpack DEB DIR
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$1" "$2"
    else   # a .deb is an ar archive around data.tar.*; GNU tar reads its compression itself
        local member tmp
        member=$(ar t "$1" | grep '^data\.tar')
        tmp=$(mktemp)
        ar p "$1" "$member" >"$tmp"
        tar -xf "$tmp" -C "$2"
        rm -f "$tmp"
    fi
}

system_has() {   # system_has SONAME: the machine's own loader already finds this library
    if ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {f = 1} END {exit !f}'; then return 0; fi
    local d
    for d in /lib/$multiarch /usr/lib/$multiarch /lib64 /usr/lib64; do
        [ -s "$d/$1" ] && return 0
    done
    return 1
}

# Only a folder this script made before (it holds env.sh) is wiped and made anew.
if [ -d "$root" ] && [ -n "$(ls -A "$root")" ] && [ ! -f "$root/env.sh" ]; then
    echo "$root is not empty and was not made by tools/gpu_deps.sh; not touching it" >&2
    exit 2
fi
rm -rf "$root"
mkdir -p "$root"
# The libraries troupe links against, always from the prefix: their headers and .so links
# must match the very library that is loaded.
for f in "$debs"/dev/*.deb; do unpack "$f" "$root"; done
# libzmq's own dependencies fill gaps only: a library the image already has stays the image's,
# so that LD_LIBRARY_PATH does not put Debian's copy in front of it for every other program.
stage=$root/.stage
for f in "$debs"/runtime/*.deb; do
    rm -rf "$stage"
    mkdir -p "$stage"
    unpack "$f" "$stage"
    need=0
    while IFS= read -r so; do
        if [ -n "${TROUPE_DEPS_ALL:-}" ] || ! system_has "$(basename "$so")"; then need=1; fi
    done < <(find "$stage" -name 'lib*.so.[0-9]*' ! -name '*.so.*.*')
    if [ "$need" = 1 ]; then
        cp -a "$stage/." "$root/"
        echo "gpu_deps: from the prefix: $(basename "$f")"
    else
        echo "gpu_deps: the machine has it: $(basename "$f")"
    fi
done
rm -rf "$stage"

# Debian's .pc files name prefix=/usr; here the prefix is $root/usr. msgpack.pc says
# libdir=${exec_prefix}/lib where Debian installs into lib/<multiarch>. libzmq.pc's
# Requires.private names the -dev packages of krb5, libsodium, OpenPGM, NORM and libbsd, which
# only static linking needs: without them pkg-config would refuse libzmq altogether.
for pc in "$root/usr/lib/$multiarch/pkgconfig"/*.pc "$root/usr/share/pkgconfig"/*.pc; do
    [ -f "$pc" ] || continue
    sed -i -e "s|^prefix=/usr\$|prefix=$root/usr|" \
           -e "s|^libdir=\${exec_prefix}/lib\$|libdir=\${exec_prefix}/lib/$multiarch|" \
           -e "s|^libdir=\${prefix}/lib\$|libdir=\${prefix}/lib/$multiarch|" "$pc"
done
sed -i -e '/^Requires\.private:/d' "$root/usr/lib/$multiarch/pkgconfig/libzmq.pc"
if grep -l '=/usr\b' "$root"/usr/lib/$multiarch/pkgconfig/*.pc; then
    echo "a .pc file above still points into /usr" >&2
    exit 1
fi

libs=$root/usr/lib/$multiarch:$root/lib/$multiarch
env_file=$root/env.sh
{
    echo "# Written by tools/gpu_deps.sh: the upper layers' libraries in a private prefix."
    echo "export TROUPE_DEPS_ROOT='$root'"
    echo "export PKG_CONFIG_PATH='$root/usr/lib/$multiarch/pkgconfig:$root/usr/share/pkgconfig'\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
    # For running, and for the linker, which looks there for libzmq's own dependencies. No
    # LIBRARY_PATH or C_INCLUDE_PATH: pkg-config would take those for system folders and drop
    # the prefix's -L and -I from its answers.
    echo "export LD_LIBRARY_PATH='$libs'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
} >"$env_file"

# meson finds every library through pkg-config; bring it when the image has none. Its built-in
# search path is Debian's, which is Ubuntu's too, so the image's openblas.pc is still found.
if ! command -v pkg-config >/dev/null && ! command -v pkgconf >/dev/null; then
    for f in "$debs"/tools/*.deb; do unpack "$f" "$root"; done
    echo "export PATH='$root/usr/bin':\$PATH" >>"$env_file"
    echo "export PKG_CONFIG='$root/usr/bin/pkgconf'" >>"$env_file"
    echo "gpu_deps: pkg-config from the prefix"
fi

# pyzmq and msgpack for the Python reward service test, installed for whichever python3 runs it.
if compgen -G "$debs/wheels/*.whl" >/dev/null; then
    mkdir -p "$root/python"
    if ! python3 -m pip install -q --no-index --no-deps --no-compile --target "$root/python" \
            "$debs"/wheels/*.whl 2>/dev/null; then
        # no pip: a wheel is a zip of the installed files
        for w in "$debs"/wheels/*.whl; do python3 -m zipfile -e "$w" "$root/python"; done
    fi
    echo "export PYTHONPATH='$root/python'\${PYTHONPATH:+:\$PYTHONPATH}" >>"$env_file"
fi

# Check: each library meson.build asks for resolves into the prefix.
(
    # shellcheck source=/dev/null
    . "$env_file"
    pc=${PKG_CONFIG:-$(command -v pkg-config || command -v pkgconf)}
    for m in libzmq msgpack yaml-0.1 libpcre2-8; do
        version=$("$pc" --modversion "$m")
        libs=$("$pc" --libs "$m")
        case $libs in *"-L$root/"*) ;; *) echo "$m does not resolve into $root" >&2; exit 1 ;; esac
        printf 'gpu_deps: %-12s %-8s %s\n' "$m" "$version" "$libs"
    done
)
echo "gpu_deps: wrote $env_file; use it with: . $env_file"
