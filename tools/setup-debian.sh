#!/usr/bin/env bash
# Installs what troupe needs to build and test on Debian 12 (run as root or with sudo).
# The CUDA toolkit is not installed here: with nvcc under /usr/local/cuda the CUDA backend
# builds too, without it meson's `cuda` option (auto) leaves it out.
set -euo pipefail
pkgs=(build-essential pkg-config meson ninja-build git python3
      libzmq3-dev libmsgpack-dev libyaml-dev libpcre2-dev
      libopenblas-dev python3-zmq python3-msgpack)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
