#!/usr/bin/env bash
# deploy/run.sh - sets up, builds and generates text; makes a demo model when none is given.
# usage: deploy/run.sh [MODEL.gguf] ["prompt"] [extra sluice run options...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh >/dev/null

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! cmake --build build -j"$(nproc)" >build/build.log 2>&1; then
    tail -40 build/build.log
    echo "build failed (full log: build/build.log)"
    exit 1
fi

model="${1:-}"
prompt="${2:-Once upon a time}"
shift $(( $# > 2 ? 2 : $# ))
if [ -z "$model" ]; then
    model=build/demo.gguf
    if [ ! -f "$model" ]; then
        echo "run: no model given; writing a demo MoE model with random weights to $model"
        build/bin/sluice mkmodel --preset demo -o "$model"
    fi
    echo "run: the demo model has random weights, so its text is gibberish by design;"
    echo "     pass a real GGUF (e.g. from llama.cpp or Ollama) as the first argument."
fi
exec build/bin/sluice run -m "$model" -p "$prompt" -n 64 "$@"
