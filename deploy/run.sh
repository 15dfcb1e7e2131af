#!/usr/bin/env bash
# deploy/run.sh - sets up, builds, starts the daemons (fetcher, executor, router) through the
# supervisor and runs one generation through the client; without a model it uses the small trained
# model shipped in deploy/models/ (readable text).
# usage: deploy/run.sh [MODEL.gguf] ["prompt"] [extra `sluice generate` options...]
#        SLUICE_ONE_PROCESS=1 deploy/run.sh ...   the same generation with `sluice run` instead
# The daemons keep running afterwards (run dir: $SLUICE_RUN_DIR, default build/run);
# `deploy/sluicectl down --run-dir build/run` stops them.
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
prompt="${2:-}"
shift $(($# > 2 ? 2 : $#))
if [ -z "$model" ]; then
    model=deploy/models/moe-tiny-q4_0.gguf
    prompt="${prompt:-In the beginning}"
    echo "run: no model given; using $model, a 7.5M-parameter MoE trained on the World English"
    echo "     Bible (deploy/models/README.md). Pass any GGUF (llama.cpp, Ollama) as the first"
    echo "     argument for another model."
fi
prompt="${prompt:-Once upon a time}"
if [ -n "${SLUICE_ONE_PROCESS:-}" ]; then
    exec build/bin/sluice run -m "$model" -p "$prompt" -n 64 "$@"
fi

run_dir=$(realpath -m -- "${SLUICE_RUN_DIR:-build/run}")
model=$(realpath -- "$model")
# A previous run may serve another model: stop it, then start the daemons on this one.
if [ -f "$run_dir/sluicectl.pid" ]; then
    deploy/sluicectl down --run-dir "$run_dir" >/dev/null 2>&1 || true
fi
deploy/sluicectl up --model "$model" --run-dir "$run_dir" --bin build/bin
build/bin/sluice generate --run-dir "$run_dir" -p "$prompt" -n 64 "$@"
echo "run: the daemons keep running; more: build/bin/sluice generate --run-dir $run_dir -p TEXT"
echo "     stop them: deploy/sluicectl down --run-dir $run_dir"
