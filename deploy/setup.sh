#!/usr/bin/env bash
# deploy/setup.sh - installs every Debian package sluice needs; idempotent, safe to run twice.
set -euo pipefail

pkgs=(
    build-essential cmake pkg-config git
    clang libclang-rt-14-dev
    libnng-dev liburing-dev libcriterion-dev libjansson-dev
    flatbuffers-compiler libflatbuffers-dev
    gnuplot-nox
    curl
)

missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done

if [ "${#missing[@]}" -eq 0 ]; then
    echo "setup: all ${#pkgs[@]} packages present"
    exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
