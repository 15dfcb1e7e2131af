#!/usr/bin/env bash
# deploy/bench-gpu.sh - the GPU benchmark of docs/bench.md: `sluice bench -ngl 999` beside
# llama.cpp's llama-bench (built with CUDA) on the same random-weight models, in the same run: a
# dense 8B-shaped llama in Q4_0 and in Q4_K, and a 30B-A3B-shaped MoE (qwen3moe, 128 experts,
# top-8, Q4_K); on request a model of gpt-oss-20b's size in MXFP4 (24 layers of 32 experts of
# 2880 x 2880, top-4, heads of 64, attention sinks, a sliding window on every other layer; mkmodel
# gives gpt-oss 2 x n_embd / n_head wide heads, so 90 query heads and 10 KV heads; about 11 GB).
# Prefill (ppP) and decode (tgN) tok/s of both, and decode as a fraction of the
# device's memory bandwidth measured in the same run (sluice bench's device-to-device copy probe:
# weights a token touches x tok/s / bandwidth). Needs a CUDA device; not run by CI.
#
# Environment (all optional):
#   SLUICE   sluice binary                                          [build/bin/sluice]
#   PEER     llama-bench binary (llama.cpp built with CUDA); empty = sluice alone []
#   MODELS   directory of the models, made there when missing       [/tmp/sluice-bench/gpu]
#   WHICH    models to run, of: dense-q4_0 dense-q4_k moe-q4_k gptoss-mxfp4 moe-q2_k (the MoE
#            in Q2_K, as the low-bit quants of DeepSeek-sized models are: about 2 minutes to
#            make on 16 cores, the quantizer's full search)
#                                                     [dense-q4_0 dense-q4_k moe-q4_k]
#   P, N     prompt tokens of the prefill test, tokens of the decode test   [512, 128]
#   REPS     repetitions of each test                               [3]
#   OUT      results directory                        [/tmp/sluice-bench/gpu-<date>]
#   ALSO     space-separated VAR=VALUE settings, each run as a further sluice line of every
#            model with that variable set (an A/B in the same run), e.g.
#            ALSO=SLUICE_NO_FUSION=1 or ALSO="SLUICE_NO_CUDA_GRAPHS=1 SLUICE_NO_FUSION=1"   []
set -euo pipefail

SLUICE=${SLUICE:-build/bin/sluice}
PEER=${PEER:-}
MODELS=${MODELS:-/tmp/sluice-bench/gpu}
WHICH=${WHICH:-dense-q4_0 dense-q4_k moe-q4_k}
P=${P:-512}
N=${N:-128}
REPS=${REPS:-3}
ALSO=${ALSO:-}
OUT=${OUT:-/tmp/sluice-bench/gpu-$(date +%Y%m%d-%H%M%S)}

[ -x "$SLUICE" ] || { echo "bench-gpu: no sluice binary at $SLUICE (set SLUICE)" >&2; exit 1; }
[ -z "$PEER" ] || [ -x "$PEER" ] || { echo "bench-gpu: PEER=$PEER is not executable" >&2; exit 1; }
mkdir -p "$MODELS" "$OUT"

# make_model NAME: the model's path, made first when missing. K-quants use mkmodel's
# --quick-quant (min/max scales: ten times faster to make, the same bytes per weight).
make_model() {
    local name=$1 path=$MODELS/$1.gguf
    local dense=(--arch llama --n-embd 4096 --n-layer 32 --n-head 32 --n-head-kv 8 --n-ff 14336
                 --n-vocab 128256)
    local moe=(--arch qwen3moe --n-embd 2048 --n-layer 48 --n-head 32 --n-head-kv 4 --n-ff 768
               --n-expert 128 --n-expert-used 8 --n-vocab 151936)
    local gptoss=(--arch gpt-oss --n-embd 2880 --n-layer 24 --n-head 90 --n-head-kv 10 --n-ff 2880
                  --n-expert 32 --n-expert-used 4 --n-vocab 201088)
    if [ ! -f "$path" ]; then
        local t0=$SECONDS
        case $name in
        dense-q4_0) "$SLUICE" mkmodel -o "$path.part" "${dense[@]}" --type q4_0 -q ;;
        dense-q4_k) "$SLUICE" mkmodel -o "$path.part" "${dense[@]}" --type q4_K --quick-quant -q ;;
        moe-q4_k) "$SLUICE" mkmodel -o "$path.part" "${moe[@]}" --type q4_K --quick-quant -q ;;
        gptoss-mxfp4) "$SLUICE" mkmodel -o "$path.part" "${gptoss[@]}" --type mxfp4 -q ;;
        moe-q2_k) "$SLUICE" mkmodel -o "$path.part" "${moe[@]}" --type q2_K -q ;;
        *) echo "bench-gpu: unknown model $name" >&2; return 1 ;;
        esac
        mv "$path.part" "$path"
        echo "made $path in $((SECONDS - t0)) s" >&2
    fi
    echo "$path"
}

# csv_field FILE ROW COLUMN: the field of data row ROW (1 = the first after the header) under the
# header COLUMN, quotes removed.
csv_field() {
    awk -F, -v row="$2" -v col="$3" '
        NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); if ($i == col) c = i } next }
        NR == row + 1 { v = $c; gsub(/"/, "", v); print v; exit }' "$1"
}

# peer_ts FILE N_PROMPT N_GEN: llama-bench's avg_ts of that test.
peer_ts() {
    awk -F, -v p="$2" -v g="$3" '
        NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); h[$i] = i } next }
        { np = $h["n_prompt"]; ng = $h["n_gen"]; gsub(/"/, "", np); gsub(/"/, "", ng)
          if (np == p && ng == g) { v = $h["avg_ts"]; gsub(/"/, "", v); print v; exit } }' "$1"
}

table=$OUT/table.md
{
    echo "| model | size | test | sluice t/s | llama.cpp t/s | sluice / llama.cpp | sluice bw ratio | llama.cpp bw ratio |"
    echo "|---|---:|---|---:|---:|---:|---:|---:|"
} >"$table"
# sluice_rows NAME MODEL LABEL [VAR=VALUE]: sluice bench of MODEL (with VAR=VALUE in its
# environment), its lines of the table (model NAME, LABEL added), beside the peer's csv.
sluice_rows() {
    local name=$1 model=$2 label=$3 set=${4:-}
    local tag=${set:+.${set//[^A-Za-z0-9_]/_}}
    local f=$OUT/$1.sluice$tag.csv log=$OUT/$1.sluice$tag.log
    env ${set:+"$set"} "$SLUICE" bench -m "$model" -ngl 999 -p "$P" -n "$N" -r "$REPS" -o csv \
        >"$f" 2>"$log" ||
        { echo "bench-gpu: sluice bench failed on $name $set:" >&2; tail -5 "$log" >&2; exit 1; }
    size=$(awk -v b="$(csv_field "$f" 1 model_size)" 'BEGIN { printf "%.2f GiB", b / 1073741824 }')
    active=$(csv_field "$f" 2 model_active_bytes)
    membw=$(csv_field "$f" 2 membw_bytes_per_s)
    for row in 1 2; do
        np=$(csv_field "$f" "$row" n_prompt)
        ng=$(csv_field "$f" "$row" n_gen)
        ts=$(csv_field "$f" "$row" avg_ts)
        test=$([ "$np" != 0 ] && echo "pp$np" || echo "tg$ng")
        peer=""
        [ -n "$PEER" ] && [ -s "$OUT/$name.peer.csv" ] && peer=$(peer_ts "$OUT/$name.peer.csv" "$np" "$ng")
        awk -v name="$name$label" -v size="$size" -v test="$test" -v ts="$ts" -v peer="$peer" \
            -v active="$active" -v bw="$membw" -v dec="$([ "$ng" != 0 ] && echo 1 || echo 0)" 'BEGIN {
            ratio = peer != "" ? sprintf("%.2fx", ts / peer) : "-"
            sb = dec && bw > 0 ? sprintf("%.3f", ts * active / bw) : "-"
            pb = dec && bw > 0 && peer != "" ? sprintf("%.3f", peer * active / bw) : "-"
            printf "| %s | %s | %s | %.2f | %s | %s | %s | %s |\n", name, size, test, ts,
                   peer != "" ? sprintf("%.2f", peer) : "-", ratio, sb, pb }' >>"$table"
    done
}

for name in $WHICH; do
    model=$(make_model "$name")
    if [ -n "$PEER" ]; then
        "$PEER" -m "$model" -ngl 99 -p "$P" -n "$N" -r "$REPS" -o csv \
            >"$OUT/$name.peer.csv" 2>"$OUT/$name.peer.log" ||
            { echo "bench-gpu: llama-bench failed on $name:" >&2; tail -5 "$OUT/$name.peer.log" >&2; }
    fi
    sluice_rows "$name" "$model" ""
    grep -m1 '^gpu:' "$OUT/$name.sluice.log" >&2 || true
    for v in $ALSO; do
        sluice_rows "$name" "$model" " ($v)" "$v"
    done
done
echo
echo "device bandwidth (sluice bench's copy probe, bytes read + written): $(awk -v b="$membw" 'BEGIN { printf "%.0f GB/s", b / 1e9 }')"
echo "weights touched per decoded token: see model_active_bytes in $OUT/*.sluice.csv"
cat "$table"
