#!/usr/bin/env bash
# Installs what gradsync needs to build and test on Debian 12, if missing.
# Idempotent: a machine that has everything is left as it is.
set -euo pipefail

packages=(
  gcc pkg-config meson ninja-build
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler
  libcmocka-dev
  libssl-dev
  g++ libgloo-dev
  clang libclang-rt-14-dev
  systemd groff-base python3 python3-venv
  gnuplot-nox
  iproute2  # ip netns, tc: scripts/netcluster.sh
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
