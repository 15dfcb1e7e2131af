#!/usr/bin/env bash
# deploy/setup.sh - installs every Debian package sluice needs; idempotent, safe to run twice.
set -euo pipefail

pkgs=(
    build-essential cmake pkg-config git
    clang libclang-rt-14-dev
    libnng-dev liburing-dev libcriterion-dev libjansson-dev liblz4-dev libxxhash-dev
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
else
    echo "setup: installing ${missing[*]}"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        SUDO="sudo"
    fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The `openai` client from the npm registry, for the HTTP API's test (tests/router/test_http.c
# skips that test, saying so, without it): into build-npm/ beside the build trees, not the system.
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v npm >/dev/null 2>&1; then
    echo "setup: installing nodejs npm (optional)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    { $SUDO apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
            nodejs npm; } >/dev/null 2>&1 || echo "setup: nodejs/npm not installed (optional)"
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "setup: no npm: the OpenAI client test will be skipped"
elif [ -d "$root/build-npm/node_modules/openai" ]; then
    echo "setup: npm package openai present"
elif npm install --prefix "$root/build-npm" --no-audit --no-fund --silent openai@4 >/dev/null 2>&1; then
    echo "setup: npm package openai installed in build-npm/"
else
    echo "setup: npm install openai failed: the OpenAI client test will be skipped"
fi
echo "setup: done"
