#!/usr/bin/env bash
# deploy/bench-vram.sh - the VRAM expert tier's benchmark (docs/bench.md, "GPU: the expert
# pool"): a balanced-routing MoE several times larger than the device budget, every layer on the
# device (-ngl 999), its routed experts in a pool of --vram-budget fed from a RAM pool of
# --ram-budget (fed from storage), for each --expert-miss mode; beside llama.cpp's llama-bench
# with -ngl 999 --n-cpu-moe N (the experts of as many layers on the device as fit the same
# budget, the others on its CPU), under the same memory cap when run as root. Then a squeeze
# sweep over device budgets, as CSV and PNG.
#
# Per run: prefill and decode tok/s; the device pool's share of picks found, copied in and
# computed on the CPU; bytes copied per decode token against the pool's copy probe (the limit of
# its copies, measured in the same run); the share of copy time hidden behind the kernels; bytes
# read from storage per token against the storage limit (sluice bench --io-probe: the replay of
# the run's own reads through the fetcher's engine, cold, in the same run). Needs a CUDA device for its figures; SLUICE_GPU_BACKEND=host runs
# the same steps on the CPU's host backend (a check of this script, not a measurement). Not run
# by CI.
#
# Environment (all optional):
#   SLUICE   sluice binary                                              [build/bin/sluice]
#   MODEL    model, made when missing (mkmodel --preset moe-large --routing balanced)
#                                                          [/tmp/sluice-bench/vram-moe.gguf]
#   SIZE     size of the model to make                                  [40G]
#   VRAM     --vram-budget of the main runs, % of the routed experts    [25]
#   RAM      --ram-budget of the main runs, % of the model              [50]
#   MODES    --expert-miss modes of the main runs                       [copy auto cpu]
#   P, N     prefill and decode tokens                                  [64, 32]
#   THREADS  CPU threads (-t)                                           [physical cores]
#   SWEEP    device budgets of the sweep, % of the routed experts; empty = none
#                                                                       [5 10 25 50 75]
#   DAEMONS  1: also through the daemons (sluicectl up, the fetchers' device pool), --expert-miss
#            copy; 0: not                                               [1]
#   FILLS    --vram-fill modes of runs of their own, in one process and through the daemons
#            (where the pool's misses come from: the RAM pool, or storage through the fetcher's
#            pinned staging; the main runs take auto)                  [ram storage]
#   PEER     llama-bench built with CUDA; empty = sluice alone          []
#   SLACK    cgroup cap above the RAM budget (as root)                  [256M]
#   OUT      results directory                          [/tmp/sluice-bench/vram-<date>]
set -euo pipefail

SLUICE=${SLUICE:-build/bin/sluice}
MODEL=${MODEL:-/tmp/sluice-bench/vram-moe.gguf}
SIZE=${SIZE:-40G}
VRAM=${VRAM:-25}
RAM=${RAM:-50}
MODES=${MODES:-copy auto cpu}
P=${P:-64}
N=${N:-32}
THREADS=${THREADS:-}
SWEEP=${SWEEP-"5 10 25 50 75"}
PEER=${PEER:-}
DAEMONS=${DAEMONS:-1}
FILLS=${FILLS:-ram storage}
SLACK=${SLACK:-$((256 << 20))}
OUT=${OUT:-/tmp/sluice-bench/vram-$(date +%Y%m%d-%H%M%S)}

[ -x "$SLUICE" ] || { echo "bench-vram: no sluice binary at $SLUICE (set SLUICE)" >&2; exit 1; }
[ -z "$PEER" ] || [ -x "$PEER" ] || { echo "bench-vram: PEER=$PEER is not executable" >&2; exit 1; }
mkdir -p "$OUT" "$(dirname "$MODEL")"

if [ ! -f "$MODEL" ]; then
    echo "== making $MODEL ($SIZE, balanced routing)"
    "$SLUICE" mkmodel --preset moe-large --routing balanced --size "$SIZE" -o "$MODEL"
fi

# json_num KEY: the first number of "KEY": in the model's inspect --json.
"$SLUICE" inspect --json "$MODEL" > "$OUT/inspect.json"
json_num() { grep -o "\"$1\": *[0-9]*" "$OUT/inspect.json" | head -1 | grep -o '[0-9]*$'; }
MODEL_BYTES=$(json_num tensor_bytes)
EXPERT_BYTES=$(json_num expert_bytes)
N_LAYER=$(json_num n_layer)
if [ -z "$EXPERT_BYTES" ] || [ "$EXPERT_BYTES" -eq 0 ]; then
    echo "bench-vram: $MODEL has no routed experts" >&2
    exit 1
fi
RAM_BYTES=$((MODEL_BYTES * RAM / 100))
T=${THREADS:+-t $THREADS}

# As root the runs are capped (RAM budget + SLACK, page cache included) and start cold.
CAPPED=0
if [ "$(id -u)" = 0 ]; then
    # shellcheck source=deploy/bench-lib.sh
    . "$(dirname "$0")/bench-lib.sh"
    bench_setup_cgroup sluice-bench-vram
    CAPPED=1
    trap bench_uncap EXIT
else
    echo "bench-vram: not root: runs are neither capped nor cold (the fetcher's O_DIRECT reads" \
        "skip the page cache either way)" >&2
fi
run() { # run LOG CMD...
    local log=$1
    shift
    if [ "$CAPPED" = 1 ]; then
        bench_run_capped $((RAM_BYTES + SLACK)) "$log" "$@"
    else
        "$@" > "$log" 2>&1 || { echo "run failed ($1), see $log" >&2; tail -5 "$log" >&2; return 1; }
    fi
}

# field LOG LINE KEY: KEY=value of the first line of LOG starting with LINE.
field() { grep -m1 "^$2" "$1" | grep -o "$3=[^ ]*" | head -1 | cut -d= -f2; }

# sluice_run MODE VRAM_BYTES LOG [FILL]: one bench run (--vram-fill FILL, default auto);
# appends its CSV row.
sluice_run() {
    local mode=$1 vb=$2 log=$3 fill=${4:-auto}
    # shellcheck disable=SC2086
    run "$log" "$SLUICE" bench -m "$MODEL" -p "$P" -n "$N" -r 1 $T -ngl 999 \
        --vram-budget "$vb" --ram-budget "$RAM_BYTES" --expert-miss "$mode" --vram-fill "$fill" \
        --io-probe || return 0
    [ "$fill" = auto ] || mode="$mode fill-$fill"
    local tg pp rv sb pbw sr
    pp=$(field "$log" "result:" pp_tok_s)
    tg=$(field "$log" "result:" tg_tok_s)
    # storage: bytes read per decode token, the limit (--io-probe: the replay of the run's own
    # reads, else random expert parts), their ratio
    sb=$(field "$log" "result:" tg_bytes_per_tok)
    pbw=$(field "$log" "result:" replay_bw)
    [ -n "$pbw" ] && [ "$pbw" != 0 ] || pbw=$(field "$log" "result:" probe_bw)
    sr=$(awk -v b="$sb" -v t="$tg" -v l="$pbw" 'BEGIN { if (l > 0) printf "%.4f", b * t / l }')
    rv="result_vram: test=tg$N"
    echo "sluice,$mode,$vb,$RAM_BYTES,$pp,$tg,$(field "$log" "$rv" hits),$(field "$log" "$rv" copied),$(field "$log" "$rv" cpu),$(field "$log" "$rv" copied_bytes_per_tok),$(field "$log" "$rv" copy_bw),$(field "$log" "$rv" copy_ratio),$sb,$pbw,$sr" >> "$OUT/summary.csv"
}

echo "runner,mode,vram_budget,ram_budget,pp_tok_s,tg_tok_s,tg_found,tg_copied,tg_cpu,copied_bytes_per_tok,copy_bw,copy_ratio,storage_bytes_per_tok,storage_bw,storage_ratio" > "$OUT/summary.csv"
VB=$((EXPERT_BYTES * VRAM / 100))
echo "== model $MODEL: $MODEL_BYTES bytes, routed experts $EXPERT_BYTES; --vram-budget $VB ($VRAM%), --ram-budget $RAM_BYTES ($RAM%)"
for mode in $MODES; do
    echo "== sluice, --expert-miss $mode"
    sluice_run "$mode" "$VB" "$OUT/sluice-$mode.log"
done
for fill in $FILLS; do # in one process, the misses through the RAM pool or staging
    echo "== sluice, --expert-miss copy --vram-fill $fill"
    sluice_run copy "$VB" "$OUT/sluice-copy-$fill.log" "$fill"
done

if [ "$DAEMONS" = 1 ]; then
    # The same budgets through the daemons: the device pool is the fetcher's memory, filled by
    # the fetcher from its RAM pool or from storage (--vram-fill; docs/gpu.md). A prompt of about
    # P words, then N tokens sampled at temperature 1; the executor's and the fetcher's counters
    # after.
    SLUICECTL=$(dirname "$0")/sluicectl
    BIN=$(dirname "$SLUICE")
    prompt=$(for ((i = 0; i < P; i++)); do printf 'word%d ' $((i % 17)); done)
    stat_of() { awk -v k="$1" '$1 == k {print $2}' "$2"; }
    for fill in $FILLS; do
        echo "== sluice through the daemons (the fetcher's device pool), --expert-miss copy, --vram-fill $fill"
        RD=$OUT/run-daemons-$fill
        D=$OUT/daemons-$fill
        # shellcheck disable=SC2086
        run "$D-up.log" "$SLUICECTL" up --bin "$BIN" -m "$MODEL" --run-dir "$RD" \
            -ngl 999 --vram-budget "$VB" --ram-budget "$RAM_BYTES" --vram-fill "$fill" $T || continue
        "$SLUICE" generate --run-dir "$RD" -p "$prompt" -n "$N" --temp 1 --seed 1 \
            > "$D-gen.log" 2>&1 || echo "bench-vram: generate failed" >&2
        "$SLUICE" ctl --run-dir "$RD" --daemon executor stats > "$D-executor.txt" || true
        "$SLUICE" ctl --run-dir "$RD" --daemon fetcher-0 stats > "$D-fetcher.txt" || true
        "$SLUICECTL" down --run-dir "$RD" > /dev/null 2>&1 || true
        gen=$(grep -m1 '^generate:' "$D-gen.log" || true)
        ptok=$(echo "$gen" | sed -n 's/.*prompt \([0-9]*\) tokens in \([0-9.]*\) ms.*/\1 \2/p')
        dpp=$(echo "$ptok" | awk '$2 > 0 {printf "%.2f", $1 * 1000 / $2}')
        dtg=$(echo "$gen" | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
        ex=$D-executor.txt
        hits=$(stat_of gpu_pool.hits "$ex")
        copied=$(stat_of gpu_pool.copied "$ex")
        cbytes=$(stat_of gpu_pool.copied_bytes "$ex")
        busy=$(stat_of gpu_pool.copy_busy_ms "$ex")
        stall=$(stat_of gpu_pool.copy_stall_ms "$ex")
        hidden=$(awk -v b="$busy" -v s="$stall" 'BEGIN { if (b > 0) { h = 1 - s / b; if (h < 0) h = 0; printf "%.2f", h } }')
        # (found and copied count the prompt's picks too; the per-token columns are left empty)
        echo "sluice-daemons,copy fill-$fill,$VB,$RAM_BYTES,$dpp,$dtg,$hits,$copied,0,,,,,," >> "$OUT/summary.csv"
        fe=$D-fetcher.txt
        echo "   --vram-fill $fill: the pool in the fetcher's memory: $(stat_of gpu_pool.in_fetcher "$ex");" \
            "over the run $cbytes bytes copied in ($(stat_of gpu_pool.staged "$ex") parts from" \
            "storage through staging), the fetcher copying $(stat_of gpu_pool.fetcher_copy_ms "$ex")" \
            "ms, the kernels waiting $stall ms: ${hidden:-0} of the copy time hidden; per tier:" \
            "device pool $hits found of $((hits + copied)) picks, fetcher-0's RAM pool hit rate" \
            "$(stat_of trace.hit_rate "$fe") ($(stat_of trace.accesses "$fe") accesses)," \
            "$(stat_of trace.bytes_read "$fe") bytes read from storage" \
            | tee "$D-summary.txt"
    done
fi

if [ -n "$PEER" ]; then
    # The experts of as many layers as fit the same device budget stay on the device.
    per_layer=$((EXPERT_BYTES / N_LAYER))
    on_dev=$((VB / per_layer))
    ncm=$((N_LAYER - on_dev))
    [ "$ncm" -ge 0 ] || ncm=0
    echo "== llama.cpp, -ngl 999 --n-cpu-moe $ncm ($on_dev of $N_LAYER layers' experts on the device)"
    # shellcheck disable=SC2086
    run "$OUT/peer.log" "$PEER" -m "$MODEL" -p "$P" -n "$N" -r 1 ${THREADS:+-t $THREADS} \
        -ngl 999 --n-cpu-moe "$ncm" -o csv || true
    ptg=$(grep -E ",$N,|,\"$N\"," "$OUT/peer.log" | tail -1 | awk -F, '{print $(NF-1)}' | tr -d '"')
    ppp=$(grep -E ",$P,0,|,\"$P\",\"0\"," "$OUT/peer.log" | tail -1 | awk -F, '{print $(NF-1)}' | tr -d '"')
    echo "llama.cpp,n-cpu-moe $ncm,$VB,$RAM_BYTES,$ppp,$ptg,,,,,,,,," >> "$OUT/summary.csv"
fi

if [ -n "$SWEEP" ]; then
    echo "vram_pct,vram_budget,tg_tok_s,found,copied,cpu,copy_ratio" > "$OUT/sweep.csv"
    for pct in $SWEEP; do
        vb=$((EXPERT_BYTES * pct / 100))
        echo "== sweep: --vram-budget $vb ($pct% of the experts), --expert-miss copy"
        log=$OUT/sweep-$pct.log
        sluice_run copy "$vb" "$log"
        rv="result_vram: test=tg$N"
        echo "$pct,$vb,$(field "$log" "result:" tg_tok_s),$(field "$log" "$rv" hits),$(field "$log" "$rv" copied),$(field "$log" "$rv" cpu),$(field "$log" "$rv" copy_ratio)" >> "$OUT/sweep.csv"
    done
    if command -v gnuplot > /dev/null; then
        gnuplot <<EOF || echo "bench-vram: gnuplot failed: no sweep.png" >&2
set terminal png size 800,500
set output "$OUT/sweep.png"
set datafile separator ","
set key top left
set xlabel "--vram-budget, % of the routed experts"
set ylabel "decode tok/s"
set y2label "share of picks found in the device pool"
set y2range [0:1]
set ytics nomirror
set y2tics
set title "sluice decode with the experts in a device pool ($(basename "$MODEL"))"
plot "$OUT/sweep.csv" skip 1 using 1:3 with linespoints title "tg$N tok/s", \
     "" skip 1 using 1:(\$4 / (\$4 + \$5 + \$6)) axes x1y2 with linespoints title "found"
EOF
    fi
fi

echo "== results in $OUT"
column -s, -t < "$OUT/summary.csv"
[ -z "$SWEEP" ] || column -s, -t < "$OUT/sweep.csv"
