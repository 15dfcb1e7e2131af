#!/usr/bin/env bash
# deploy/fuzz.sh - builds the libFuzzer targets with clang and fuzzes the GGUF reader.
# usage: deploy/fuzz.sh [SECONDS]   (default 60, split 3:1:1:1:2:1:1:1:1 between the GGUF reader,
#        the executor's model loading, the QSF reader, the HTTP API's request parser, the
#        control-message decoder, config files with the option parser, KL-divergence base files,
#        the fetcher's device pool records, and the tokenizers; CI runs a short fixed time)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
build=build-fuzz
fixtures="${SLUICE_FIXTURES:-../shared/fixtures}"

CC=clang CXX=clang++ cmake -S . -B "$build" -DSLUICE_FUZZ=ON -DSLUICE_TESTS=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! cmake --build "$build" --target fuzz_gguf fuzz_model fuzz_qsf fuzz_openai fuzz_proto fuzz_config fuzz_tokenize fuzz_kld fuzz_devpool -j"$(nproc)" >"$build/build.log" 2>&1; then
    grep -E 'error' "$build/build.log" | head -20
    echo "fuzz build failed (log: $build/build.log)"
    exit 1
fi

# Seed models are written by the regular (gcc, release) build's sluice.
if [ ! -x build/bin/sluice ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build --target sluice -j"$(nproc)" >/dev/null
fi

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
build/bin/sluice mkmodel -q -o "$corpus/dense.gguf" --n-embd 32 --n-head 2 --n-ff 32 --n-layer 1
build/bin/sluice mkmodel -q -o "$corpus/moe.gguf" --n-embd 32 --n-head 2 --n-ff 32 --n-layer 1 \
    --n-expert 4 --type q8_0
for arch in qwen2moe olmoe deepseek2; do
    build/bin/sluice mkmodel -q -o "$corpus/$arch.gguf" --arch $arch --n-embd 64 --n-head 2 \
        --n-head-kv 2 --n-ff 32 --n-layer 2 --n-vocab 259 --type q8_0
done
# bitnet with per-tensor scales and sub-norms; I2_S in its three layouts (told apart by size).
build/bin/sluice mkmodel -q -o "$corpus/bitnet.gguf" --arch bitnet --n-embd 256 --n-head 2 \
    --n-ff 256 --n-layer 1 --n-vocab 259 --type tq2_0
for layout in qk256 bitnet32 split32; do
    build/bin/sluice mkmodel -q -o "$corpus/i2s-$layout.gguf" --arch bitnet-b1.58 --n-embd 128 \
        --n-head 2 --n-ff 128 --n-layer 1 --n-vocab 259 --type i2_s --i2s-layout $layout
done

# fuzz TARGET CORPUS SECONDS: runs one target, prints its execution count.
fuzz() {
    local target=$1 dir=$2 t=$3 log="$build/$1.log"
    [ "$t" -ge 1 ] || t=1 # libFuzzer reads -max_total_time=0 as no limit
    mkdir -p "$dir"
    # Crash, timeout and slow-unit inputs go beside the log, not into the working tree.
    "$build/bin/$target" -max_total_time="$t" -max_len=131072 -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$build/$1-" -print_final_stats=1 "$dir" >"$log" 2>&1 ||
        { tail -40 "$log"; exit 1; }
    local execs
    execs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    echo "$target: ${execs:-?} executions in ${t}s, no crash (corpus $dir, log $log)"
}
# Tokenizer seeds: the fixture test strings; the first byte picks vocabulary and options.
tcorpus="$build/corpus-tokenize"
mkdir -p "$tcorpus"
if [ -d "$fixtures/tokenizer" ]; then
    i=0
    for f in "$fixtures"/tokenizer/*.inp; do
        { printf "\\$(printf '%03o' $(( i % 16 )))"; cat "$f"; } > "$tcorpus/seed-$i"
        i=$(( i + 1 ))
    done
fi
# Config seeds: the sample config, for each section.
ccorpus="$build/corpus-config"
mkdir -p "$ccorpus"
for i in 0 1 2 3; do
    { printf "\\$(printf '%03o' "$i")"; cat deploy/sluice.conf.example; } > "$ccorpus/seed-$i"
done
# KL-divergence seed: a small base file saved by `sluice perplexity` on the dense seed model.
kcorpus="$build/corpus-kld"
mkdir -p "$kcorpus"
build/bin/sluice perplexity -m "$corpus/dense.gguf" -f deploy/sluice.conf.example -c 16 \
    --chunks 2 --kl-divergence-base "$kcorpus/seed.kld" >/dev/null 2>&1 ||
    echo "fuzz: no KL-divergence seed (sluice perplexity failed)"
t_gguf=$(( secs / 4 ))
t_qsf=$(( secs / 12 ))
t_model=$(( secs / 12 ))
t_openai=$(( secs / 12 ))
t_proto=$(( secs / 6 ))
t_config=$(( secs / 12 ))
t_kld=$(( secs / 12 ))
t_devpool=$(( secs / 12 ))
fuzz fuzz_gguf "$corpus" "$t_gguf"
mcorpus="$build/corpus-model"
mkdir -p "$mcorpus"
cp "$corpus"/*.gguf "$mcorpus"/
fuzz fuzz_model "$mcorpus" "$t_model"
# QSF seeds: the small MoE seed models converted (sluice convert).
qcorpus="$build/corpus-qsf"
mkdir -p "$qcorpus"
for m in moe qwen2moe deepseek2; do
    build/bin/sluice convert "$corpus/$m.gguf" "$qcorpus/$m.qsf" >/dev/null
done
fuzz fuzz_qsf "$qcorpus" "$t_qsf"
# HTTP API seeds: a chat and a completion body (the first byte picks the endpoint).
ocorpus="$build/corpus-openai"
mkdir -p "$ocorpus"
printf '\001{"model":"model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"stream":true,"max_tokens":5,"stop":["a","b"],"temperature":0.5,"top_p":0.9}' \
    >"$ocorpus/chat"
printf '\000{"prompt":"hello","max_tokens":3,"top_k":2,"min_p":0.1,"seed":4,"presence_penalty":0.5,"frequency_penalty":0.2,"repeat_penalty":1.1,"stop":"x"}' \
    >"$ocorpus/completion"
fuzz fuzz_openai "$ocorpus" "$t_openai"
fuzz fuzz_proto "$build/corpus-proto" "$t_proto"
fuzz fuzz_config "$ccorpus" "$t_config"
fuzz fuzz_kld "$kcorpus" "$t_kld"
# Device pool seeds (48-byte records: op, tag, layer, expert, part, prio, loan, bytes as u32,
# src, dst as u64; the target maps op to COPY, MARK, WAIT, READ): a copy of 4 KiB, and a read
# of the gate of expert 2 of layer 1 (36864 bytes in moe-tiny's q4_0).
dcorpus="$build/corpus-devpool"
mkdir -p "$dcorpus"
z4='\000\000\000\000'
printf "${z4}${z4}${z4}${z4}${z4}${z4}${z4}\\000\\020\\000\\000\\100\\000\\000\\000${z4}${z4}${z4}" >"$dcorpus/copy"
printf "\\003\\000\\000\\000${z4}\\001\\000\\000\\000\\002\\000\\000\\000${z4}${z4}${z4}\\000\\220\\000\\000${z4}${z4}${z4}${z4}" \
    >"$dcorpus/read"
fuzz fuzz_devpool "$dcorpus" "$t_devpool"
fuzz fuzz_tokenize "$tcorpus" $(( secs - t_gguf - t_model - t_qsf - t_openai - t_proto - t_config - t_kld - t_devpool ))
