#!/usr/bin/env bash
# deploy/fuzz.sh - builds the libFuzzer targets with clang and fuzzes the GGUF reader.
# usage: deploy/fuzz.sh [SECONDS]   (default 60; CI runs a short fixed time)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
build=build-fuzz
fixtures="${SLUICE_FIXTURES:-../shared/fixtures}"

CC=clang cmake -S . -B "$build" -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" --target fuzz_gguf sluice -j"$(nproc)" >/dev/null

# Seed corpus: the header of every fixture GGUF (first 64 KiB) and small complete models.
corpus="$build/corpus-gguf"
mkdir -p "$corpus"
if [ -d "$fixtures" ]; then
    for f in "$fixtures"/*/*.gguf; do
        head -c 65536 "$f" > "$corpus/$(basename "$f").head"
    done
else
    echo "fuzz: $fixtures absent, seeding from synthetic models only"
fi
"$build/bin/sluice" mkmodel -q -o "$corpus/dense.gguf" --n-embd 32 --n-head 2 --n-ff 32 --n-layer 1
"$build/bin/sluice" mkmodel -q -o "$corpus/moe.gguf" --n-embd 32 --n-head 2 --n-ff 32 --n-layer 1 \
    --n-expert 4 --type q8_0

log="$build/fuzz_gguf.log"
"$build/bin/fuzz_gguf" -max_total_time="$secs" -max_len=131072 -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 "$corpus" >"$log" 2>&1 || { tail -40 "$log"; exit 1; }
execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
echo "fuzz_gguf: ${execs:-?} executions in ${secs}s, no crash (corpus $corpus, log $log)"
