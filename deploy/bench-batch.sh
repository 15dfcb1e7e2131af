#!/usr/bin/env bash
# deploy/bench-batch.sh - continuous batching benchmark: the aggregate decode speed of 1, 4 and 16
# sequences decoded together (each fed fresh tokens, one batch per step), in RAM and at FRACTION%
# of the model as the RAM budget (cold, experts streamed from storage), side by side with
# llama.cpp's llama-batched-bench on the same file in the same run, with the bytes read per
# generated token and the limits measured in the same run: in RAM the prefill rate of a batch of
# the same size (the compute ceiling of a step), under the budget the storage limit.
#
# Needs root (drop_caches, memory cgroup). Not run by CI (deploy/test.sh runs the tests that cover
# what it uses). See docs/bench.md.
#
# Environment (all optional):
#   SLUICE    sluice binary                                   [build/bin/sluice]
#   MODEL     model path, made if missing    [/tmp/sluice-bench/moe-batch-balanced.gguf]
#             (a MoE of 32 experts top-4, Q4_0, balanced routing: every layer routes by the
#             current token, near uniform, as trained MoEs; natural routing would flatter reuse)
#   SIZE      size of the model to make                       [2G]
#   PEER      directory holding llama-batched-bench (and its libraries); empty = sluice only []
#   NPL       sequences of each run, comma-separated          [1,4,16]
#   N_GEN     tokens each sequence generates                  [32]
#   FRACTION  budget, % of the model                          [25]
#   REPS      repetitions of each sluice test                 [2]
#   THREADS   threads                                         [physical cores]
#   SLACK     cgroup cap above the budget (page tables, kernel memory)   [64M]
#   OUT       results directory                 [/tmp/sluice-bench/batch-<date>]
set -euo pipefail

SLUICE=${SLUICE:-build/bin/sluice}
MODEL=${MODEL:-/tmp/sluice-bench/moe-batch-balanced.gguf}
SIZE=${SIZE:-2G}
PEER=${PEER:-}
NPL=${NPL:-1,4,16}
N_GEN=${N_GEN:-32}
FRACTION=${FRACTION:-25}
REPS=${REPS:-2}
THREADS=${THREADS:-$(lscpu -p=CORE 2>/dev/null | grep -v '^#' | sort -u | wc -l)}
SLACK=${SLACK:-$((64 << 20))}
OUT=${OUT:-/tmp/sluice-bench/batch-$(date +%Y%m%d-%H%M%S)}

[ "$(id -u)" = 0 ] || { echo "bench-batch: needs root (drop_caches, memory cgroup)" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "bench-batch: no sluice binary at $SLUICE (set SLUICE)" >&2; exit 1; }
if [ -n "$PEER" ] && [ ! -x "$PEER/llama-batched-bench" ]; then
    echo "bench-batch: no llama-batched-bench in $PEER" >&2
    exit 1
fi
mkdir -p "$OUT" "$(dirname "$MODEL")"
if [ ! -f "$MODEL" ]; then
    echo "making $MODEL ($SIZE: 32 experts top-4, Q4_0, balanced routing)"
    "$SLUICE" mkmodel -o "$MODEL" --n-embd 1024 --n-head 16 --n-head-kv 4 --n-ff 768 \
        --n-expert 32 --n-expert-used 4 --n-vocab 32000 --type q4_0 --routing balanced \
        --size "$SIZE" -q
fi

# shellcheck source=deploy/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_setup_cgroup sluice-bench
trap bench_uncap EXIT

MODEL_BYTES=$(stat -c %s "$MODEL")
BUDGET=$((MODEL_BYTES * FRACTION / 100))
MAX_NP=$(echo "$NPL" | tr ',' '\n' | sort -n | tail -n 1)
PEER_CTX=$((MAX_NP * (N_GEN + 2)))
echo "model $MODEL ($MODEL_BYTES bytes), $THREADS threads, sequences $NPL, $N_GEN tokens each," \
    "budget $FRACTION% = $BUDGET bytes" | tee "$OUT/setup.txt"
echo "load: $(uptime)" | tee -a "$OUT/setup.txt"

# llama.cpp with one KV cache for all the sequences, as large as the run needs (as sluice's
# contexts are), not resized to fill memory (-fit off), and batches as large as a step.
UB=$((MAX_NP > 32 ? MAX_NP : 32))
PEER_CMD=(env LD_LIBRARY_PATH="$PEER" "$PEER/llama-batched-bench" -m "$MODEL" -c "$PEER_CTX"
    -fit off -kvu -b "$UB" -ub "$UB" -npp 1 -ntg "$N_GEN" -npl "$NPL" -t "$THREADS")

echo "== in RAM"
bench_drop_caches
"$SLUICE" bench -m "$MODEL" -p "$MAX_NP" -n "$N_GEN" -npl "$NPL" -r "$REPS" -t "$THREADS" \
    > "$OUT/sluice-ram.txt" 2>&1
if [ -n "$PEER" ]; then
    bench_drop_caches
    "${PEER_CMD[@]}" > "$OUT/peer-ram.txt" 2>&1
fi
echo "== at $FRACTION% of the model"
bench_run_capped $((BUDGET + SLACK)) "$OUT/sluice-budget.txt" "$SLUICE" bench -m "$MODEL" \
    --ram-budget "$BUDGET" -p 0 -n "$N_GEN" -npl "$NPL" -r "$REPS" -t "$THREADS" --io-probe
if [ -n "$PEER" ]; then
    # -nr: llama.cpp's repacked copy of Q4_0 weights is anonymous memory, the size of the
    # model: under the cap it must read the mapped file like the page cache it streams through.
    bench_run_capped $((BUDGET + SLACK)) "$OUT/peer-budget.txt" "${PEER_CMD[@]}" -nr || true
fi
bench_uncap

# sluice_val LOG NP KEY: KEY of the result_parallel line of NP sequences.
sluice_val() { grep "^result_parallel: .* n_parallel=$2 " "$1" | tr ' ' '\n' | sed -n "s/^$3=//p"; }
# peer_ts LOG NP: llama-batched-bench's S_TG t/s of the row with B = NP.
peer_ts() { [ -f "$1" ] && awk -F'|' -v b="$2" '$4+0 == b && $2+0 > 0 { gsub(/ /, "", $9); print $9 }' "$1" | head -n 1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2fx", a / b; else print "-" }'; }

s1=$(sluice_val "$OUT/sluice-ram.txt" 1 tok_s)
b1=$(sluice_val "$OUT/sluice-budget.txt" 1 tok_s)
p1=$(peer_ts "$OUT/peer-ram.txt" 1)
q1=$(peer_ts "$OUT/peer-budget.txt" 1)
{
    echo "| seqs | sluice RAM t/s | vs 1 | llama.cpp RAM t/s | vs 1 | sluice $FRACTION% t/s | vs 1 | read/token | llama.cpp $FRACTION% t/s | vs 1 |"
    echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    for np in $(echo "$NPL" | tr ',' ' '); do
        s=$(sluice_val "$OUT/sluice-ram.txt" "$np" tok_s)
        b=$(sluice_val "$OUT/sluice-budget.txt" "$np" tok_s)
        rb=$(sluice_val "$OUT/sluice-budget.txt" "$np" bytes_per_tok)
        p=$(peer_ts "$OUT/peer-ram.txt" "$np")
        q=$(peer_ts "$OUT/peer-budget.txt" "$np")
        printf '| %s | %.2f | %s | %s | %s | %.2f | %s | %.1f MiB | %s | %s |\n' "$np" "$s" \
            "$(ratio "$s" "$s1")" "${p:--}" "$(ratio "$p" "$p1")" "$b" "$(ratio "$b" "$b1")" \
            "$(awk -v v="$rb" 'BEGIN { print v / 1048576 }')" "${q:--}" "$(ratio "$q" "$q1")"
    done
    echo
    grep "| pp$MAX_NP " "$OUT/sluice-ram.txt" | awk -F'|' -v n="$MAX_NP" \
        '{ gsub(/ /, "", $7); print "compute ceiling in RAM: sluice prefill of " n " tokens, " $7 " t/s" }'
    grep "^storage limit" "$OUT/sluice-budget.txt" || true
} | tee "$OUT/summary.md"
echo "results in $OUT"
