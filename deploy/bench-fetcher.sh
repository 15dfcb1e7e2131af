#!/usr/bin/env bash
# deploy/bench-fetcher.sh - expert streaming benchmark: fetcher (io_uring O_DIRECT) vs mmap under
# the same memory cap, cold, with the storage limit measured in the same run, and a budget sweep.
#
# Needs root (drop_caches, memory cgroup). Not run by CI (deploy/test.sh runs the tests that cover
# everything used here). See docs/bench.md for what each number means.
#
# Environment (all optional):
#   SLUICE     sluice binary                       [build/bin/sluice]
#   MODEL      model path, made if missing          [/tmp/sluice-bench/moe-large-balanced.gguf]
#              (made with the moe-large preset and --routing balanced: every layer routes by the
#              current token, near uniform, as trained MoEs; the natural routing of a random
#              network is skewed and flatters any cache)
#   SIZE       size of the model to make            [6G]
#   OUT        results directory                    [/tmp/sluice-bench/results-<date>]
#   FRACTION   budget of the main run, % of model   [25]
#   N_PROMPT   prefill tokens                       [64]
#   N_GEN      decode tokens                        [32]
#   THREADS    threads                              [physical cores]
#   REPS       cold runs of the main comparison     [3]
#   SWEEP      budget points, % of model; empty = no sweep  [100 75 50 35 25 15 10]
#   SWEEP_MMAP also sweep the mmap baseline (slow)  [0]
#   ADVISE     also run mmap with --mmap-advise in the main comparison (our routing's requests
#              given to the page cache as madvise(WILLNEED): a stronger baseline than llama.cpp) [1]
#   MMAP_RA_KB read-ahead (KiB) of the model's block device during the mmap runs, restored after;
#              each mmap page fault reads about this much. Empty = leave it as it is  []
#   MMAP_RA_ALSO one more mmap run per repetition at this read-ahead (KiB; the kernel's usual
#              default is 128), when it differs from the one above; empty = none  [128]
#   EXTRA      extra sluice bench flags for the fetcher runs (e.g. "--prefetch none")
#   QSF        also run the fetcher on the model converted to QSF (sluice convert, made beside
#              the model if missing): one read per expert instead of three, checksums checked [0]
#   PEER       directory holding llama.cpp's llama-batched-bench (and its libraries): its decode
#              of the same file under the same cap, at the device's read-ahead and at
#              MMAP_RA_ALSO (one sequence, -nr: no repacked copy); empty = none  []
#   SLACK      cgroup cap above the budget, same for both modes: page tables and kernel memory
#              that VmHWM does not count (a cap of exactly the budget OOM-kills a 100% run) [64M]
set -euo pipefail

SLUICE=${SLUICE:-build/bin/sluice}
MODEL=${MODEL:-/tmp/sluice-bench/moe-large-balanced.gguf}
SIZE=${SIZE:-6G}
OUT=${OUT:-/tmp/sluice-bench/results-$(date +%Y%m%d-%H%M%S)}
FRACTION=${FRACTION:-25}
N_PROMPT=${N_PROMPT:-64}
N_GEN=${N_GEN:-32}
THREADS=${THREADS:-}
REPS=${REPS:-3}
SWEEP=${SWEEP-"100 75 50 35 25 15 10"}
SWEEP_MMAP=${SWEEP_MMAP:-0}
EXTRA=${EXTRA:-}
SLACK=${SLACK:-$((64 << 20))}
ADVISE=${ADVISE:-1}
MMAP_RA_KB=${MMAP_RA_KB:-}
MMAP_RA_ALSO=${MMAP_RA_ALSO-128}
QSF=${QSF:-0}
PEER=${PEER:-}

[ "$(id -u)" = 0 ] || { echo "bench-fetcher: needs root (drop_caches, memory cgroup)" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "bench-fetcher: no sluice binary at $SLUICE (set SLUICE)" >&2; exit 1; }
mkdir -p "$OUT" "$(dirname "$MODEL")"

if [ ! -f "$MODEL" ]; then
    echo "making $MODEL ($SIZE, moe-large preset, balanced routing)"
    "$SLUICE" mkmodel -o "$MODEL" --preset moe-large --routing balanced --size "$SIZE" -q
fi
MODEL_BYTES=$(stat -c %s "$MODEL")
QSF_MODEL="${MODEL%.gguf}.qsf"
if [ "$QSF" = 1 ] && [ ! -f "$QSF_MODEL" ]; then
    echo "converting $MODEL to $QSF_MODEL"
    "$SLUICE" convert "$MODEL" "$QSF_MODEL"
fi
THR=()
[ -n "$THREADS" ] && THR=(-t "$THREADS")

# shellcheck source=deploy/bench-lib.sh
. "$(dirname "$0")/bench-lib.sh"
bench_setup_cgroup sluice-bench

# run_capped BYTES LOGFILE ARGS...: runs sluice bench cold inside the cgroup capped at BYTES + SLACK.
run_capped() {
    local limit=$1 log=$2
    shift 2
    bench_run_capped $((limit + SLACK)) "$log" "$SLUICE" bench "$@"
}

# run_capped_cmd BYTES LOGFILE CMD...: any command cold inside the cgroup capped at BYTES + SLACK.
run_capped_cmd() {
    local limit=$1 log=$2
    shift 2
    bench_run_capped $((limit + SLACK)) "$log" "$@"
}
# peer_tg LOGFILE: llama-batched-bench's S_TG t/s (one sequence).
peer_tg() { awk -F'|' '$4+0 == 1 && $2+0 > 0 { gsub(/ /, "", $9); print $9 }' "$1" | head -n 1; }

# The read-ahead setting of the block device that holds the model (a partition's parent), if any.
RA_FILE=""
dev=$(basename "$(df --output=source "$MODEL" | tail -n 1)")
[ -e "/sys/class/block/$dev/partition" ] && dev=$(basename "$(readlink -f "/sys/class/block/$dev/..")")
[ -w "/sys/block/$dev/queue/read_ahead_kb" ] && RA_FILE=/sys/block/$dev/queue/read_ahead_kb
RA_KB=$([ -n "$RA_FILE" ] && cat "$RA_FILE" || echo unknown)
if [ -n "$MMAP_RA_KB" ] && [ -z "$RA_FILE" ]; then
    echo "bench-fetcher: MMAP_RA_KB set but no read-ahead setting found for $MODEL" >&2
    exit 1
fi
restore_ra() { [ -n "$RA_FILE" ] && echo "$RA_KB" > "$RA_FILE"; true; }
trap restore_ra EXIT

# run_mmap BYTES LOGFILE ARGS...: run_capped with the mmap read-ahead (MMAP_RA_KB) in force.
run_mmap() {
    local rc=0
    [ -n "$MMAP_RA_KB" ] && echo "$MMAP_RA_KB" > "$RA_FILE"
    run_capped "$@" || rc=$?
    restore_ra
    return $rc
}

# The second mmap read-ahead, unless it is the one the mmap runs use already.
[ -n "$MMAP_RA_ALSO" ] && [ -z "$RA_FILE" ] && MMAP_RA_ALSO=""
[ -n "$MMAP_RA_ALSO" ] && [ "$MMAP_RA_ALSO" = "${MMAP_RA_KB:-$RA_KB}" ] && MMAP_RA_ALSO=""

# field LOGFILE KEY: value of KEY in the 'result:' line.
field() { grep '^result:' "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"; }
rss_kb() { sed -n 's/^peak rss: \([0-9]*\) kB.*/\1/p' "$1"; }

BUDGET=$((MODEL_BYTES * FRACTION / 100))
COMMON=(-m "$MODEL" -p "$N_PROMPT" -n "$N_GEN" -r 1 "${THR[@]}" --report-rss)
echo "model $MODEL ($MODEL_BYTES bytes), budget $FRACTION% = $BUDGET bytes, cgroup $CG"
echo "read-ahead of ${RA_FILE:-the model device}: $RA_KB KiB${MMAP_RA_KB:+ ($MMAP_RA_KB KiB during the mmap runs)}" | tee "$OUT/readahead.txt"
echo "load: $(uptime)" | tee "$OUT/load.txt"

summary=$OUT/summary.csv
echo "run,mode,pp_tok_s,tg_tok_s,tg_bytes_per_tok,tg_hit_rate,peak_rss_kb,probe_bw,probe_bw_qd1,replay_bw" \
    > "$summary"
for rep in $(seq 1 "$REPS"); do
    f=$OUT/fetcher-$rep.txt
    m=$OUT/mmap-$rep.txt
    # shellcheck disable=SC2086
    run_capped "$BUDGET" "$f" "${COMMON[@]}" --ram-budget "$BUDGET" --io uring --io-probe $EXTRA
    run_mmap "$BUDGET" "$m" "${COMMON[@]}" --ram-budget "$BUDGET" --io mmap
    runs=("fetcher $f" "mmap $m")
    if [ "$QSF" = 1 ]; then
        qf=$OUT/qsf-$rep.txt
        # shellcheck disable=SC2086
        run_capped "$BUDGET" "$qf" "${COMMON[@]/#$MODEL/$QSF_MODEL}" --ram-budget "$BUDGET" \
            --io uring --io-probe $EXTRA
        runs+=("qsf $qf")
    fi
    if [ -n "$MMAP_RA_ALSO" ]; then
        r=$OUT/mmap-ra$MMAP_RA_ALSO-$rep.txt
        echo "$MMAP_RA_ALSO" > "$RA_FILE"
        run_capped "$BUDGET" "$r" "${COMMON[@]}" --ram-budget "$BUDGET" --io mmap || { restore_ra; exit 1; }
        restore_ra
        runs+=("mmap-ra$MMAP_RA_ALSO $r")
    fi
    if [ -n "$PEER" ]; then
        # llama.cpp: one sequence, a prompt of one token, N_GEN decoded (S_TG of its table).
        pcmd=(env LD_LIBRARY_PATH="$PEER" "$PEER/llama-batched-bench" -m "$MODEL" -c $((N_GEN + 8))
            -fit off -kvu -b 32 -ub 32 -npp 1 -ntg "$N_GEN" -npl 1 -nr "${THR[@]}")
        pl=$OUT/peer-$rep.txt
        run_capped_cmd "$BUDGET" "$pl" "${pcmd[@]}" || true
        runs+=("peer $pl")
        if [ -n "$MMAP_RA_ALSO" ]; then
            pr=$OUT/peer-ra$MMAP_RA_ALSO-$rep.txt
            echo "$MMAP_RA_ALSO" > "$RA_FILE"
            run_capped_cmd "$BUDGET" "$pr" "${pcmd[@]}" || true
            restore_ra
            runs+=("peer-ra$MMAP_RA_ALSO $pr")
        fi
    fi
    if [ "$ADVISE" = 1 ]; then
        a=$OUT/mmap-advise-$rep.txt
        run_mmap "$BUDGET" "$a" "${COMMON[@]}" --ram-budget "$BUDGET" --io mmap --mmap-advise
        runs+=("mmap-advise $a")
    fi
    for x in "${runs[@]}"; do
        # shellcheck disable=SC2086
        set -- $x
        if [ "${1#peer}" != "$1" ]; then
            echo "$rep,$1,,$(peer_tg "$2"),,,,,," >> "$summary"
            continue
        fi
        echo "$rep,$1,$(field "$2" pp_tok_s),$(field "$2" tg_tok_s),$(field "$2" tg_bytes_per_tok),$(field "$2" tg_hit_rate),$(rss_kb "$2"),$(field "$2" probe_bw),$(field "$2" probe_bw_qd1),$(field "$2" replay_bw)" >> "$summary"
    done
    grep -E '^\| [a-z]|^storage|^decode vs' "$f" | sed "s/^/fetcher[$rep] /"
    grep -E '^\| [a-z]' "$m" | sed "s/^/mmap[$rep]    /"
    [ "$QSF" = 1 ] && grep -E '^\| [a-z]|^storage|^decode vs' "$qf" | sed "s/^/qsf[$rep] /"
    [ "$ADVISE" = 1 ] && grep -E '^\| [a-z]' "$a" | sed "s/^/mmap-advise[$rep] /"
    if [ -n "$MMAP_RA_ALSO" ]; then
        grep -E '^\| [a-z]' "$r" | sed "s/^/mmap-ra${MMAP_RA_ALSO}[$rep] /"
    fi
done

# The compute limit: the same decode with every weight in RAM (no cap, page cache warm, no
# streaming), for the overlap figure below.
c=$OUT/compute.txt
cat "$MODEL" > /dev/null # the page cache warm: the runs above dropped it
"$SLUICE" bench -m "$MODEL" -p 0 -n "$N_GEN" -r 1 "${THR[@]}" > "$c" 2>&1 || {
    echo "bench-fetcher: all-resident run failed, see $c" >&2
    exit 1
}
CTOK=$(field "$c" tg_tok_s)
echo "compute limit (all weights in RAM): $CTOK tok/s"

# Ratios over the repetitions: fetcher decode vs its storage limit, vs the mmap baseline, and how
# much of the I/O time the decode hides behind compute: per token, decode time t, compute-only
# time tc (all resident), I/O-only time tio (bytes per token / replay bandwidth); hidden =
# (tc + tio - t) / min(tc, tio): 1 = the shorter of the two is fully overlapped, 0 = none.
awk -F, -v budget="$BUDGET" -v ctok="$CTOK" 'NR > 1 {
        if ($2 == "fetcher") { n++; tg[n] = $4; bpt[n] = $5; bw[n] = $10 > 0 ? $10 : $8; rss[n] = $7; pp[n] = $3 }
        else if ($2 == "mmap") { k++; mtg[k] = $4; mpp[k] = $3; mrss[k] = $7; mbpt[k] = $5 }
        else if ($2 == "peer") { u++; ptg[u] = $4; psp[u] = $4 > 0 ? tg[u] / $4 : 0; pzsp[u] = $4 > 0 && ztg[u] > 0 ? ztg[u] / $4 : 0 }
        else if ($2 ~ /^peer-ra/) { v++; vtg[v] = $4; vname = $2; vsp[v] = $4 > 0 ? tg[v] / $4 : 0; vzsp[v] = $4 > 0 && ztg[v] > 0 ? ztg[v] / $4 : 0 }
        else if ($2 == "qsf") { z++; ztg[z] = $4; zbpt[z] = $5; zbw[z] = $10 > 0 ? $10 : $8; zlim[z] = $4 * $5 / zbw[z]; zsp[z] = $4 / tg[z] }
        else if ($2 ~ /^mmap-ra/) { q++; qtg[q] = $4; qname = $2; qsp[q] = tg[q] / $4 }
        else { j++; atg[j] = $4; app[j] = $3; abpt[j] = $5; asp[j] = tg[j] / $4 } }
    function stats(a, c,   i, s, lo, hi) { s = 0; lo = 1e30; hi = -1e30
        for (i = 1; i <= c; i++) { s += a[i]; if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
        return sprintf("%.3f (min %.3f, max %.3f, n %d)", s / c, lo, hi, c) }
    END {
        for (i = 1; i <= n; i++) {
            lim[i] = tg[i] * bpt[i] / bw[i]; sp[i] = tg[i] / mtg[i]
            t[i] = 1000 / tg[i]; tio[i] = 1000 * bpt[i] / bw[i]; tc[i] = ctok > 0 ? 1000 / ctok : 0
            m = tc[i] < tio[i] ? tc[i] : tio[i]
            hid[i] = m > 0 ? (tc[i] + tio[i] - t[i]) / m : 0
        }
        print "fetcher decode tok/s:          " stats(tg, n)
        print "fetcher prefill tok/s:         " stats(pp, n)
        print "fetcher decode bytes/token:    " stats(bpt, n)
        print "mmap decode tok/s:             " stats(mtg, k)
        print "mmap prefill tok/s:            " stats(mpp, k)
        print "mmap decode bytes/token:       " stats(mbpt, k)
        if (j > 0) {
            print "mmap-advise decode tok/s:      " stats(atg, j)
            print "mmap-advise prefill tok/s:     " stats(app, j)
            print "mmap-advise decode bytes/token:" stats(abpt, j)
        }
        print "fetcher decode / storage limit " stats(lim, n) "   target >= 0.9 (limit: the replay of the decode loads)"
        print "fetcher / mmap decode speedup  " stats(sp, n) "   target >= 10 at the device read-ahead, 5 at 128 KiB"
        if (j > 0)
            print "fetcher / mmap-advise speedup  " stats(asp, j)
        if (q > 0) {
            print qname " decode tok/s:     " stats(qtg, q)
            print "fetcher / " qname " speedup " stats(qsp, q) "   target >= 5"
        }
        if (z > 0) {
            print "qsf decode tok/s:              " stats(ztg, z)
            print "qsf decode bytes/token:        " stats(zbpt, z)
            print "qsf decode / storage limit     " stats(zlim, z)
            print "qsf / gguf fetcher decode      " stats(zsp, z)
        }
        if (u > 0) {
            print "llama.cpp decode tok/s:        " stats(ptg, u)
            print "fetcher / llama.cpp decode     " stats(psp, u) "   target >= 10 at the device read-ahead"
            if (z > 0) print "qsf / llama.cpp decode         " stats(pzsp, u)
        }
        if (v > 0) {
            print "llama.cpp " vname " tok/s:   " stats(vtg, v)
            print "fetcher / llama.cpp " vname "  " stats(vsp, v) "   target >= 5"
            if (z > 0) print "qsf / llama.cpp " vname "      " stats(vzsp, v)
        }
        print "fetcher peak rss kB:           " stats(rss, n) "   budget " int(budget / 1024)
        print "mmap peak rss kB:              " stats(mrss, k)
        print "decode ms/token:               " stats(t, n)
        print "  compute only (all resident): " stats(tc, n)
        print "  I/O only (replay):           " stats(tio, n)
        print "  share of the shorter hidden: " stats(hid, n)
    }' "$summary" | tee "$OUT/ratios.txt"

# Squeeze sweep: budget from 100% down, tok/s and hit rate per point.
sweep=$OUT/sweep.csv
echo "percent,budget_bytes,mode,tg_tok_s,tg_hit_rate,tg_bytes_per_tok,pp_tok_s,peak_rss_kb" > "$sweep"
for pct in $SWEEP; do
    b=$((MODEL_BYTES * pct / 100))
    log=$OUT/sweep-fetcher-$pct.txt
    # shellcheck disable=SC2086
    if run_capped "$b" "$log" "${COMMON[@]}" --ram-budget "$b" --io uring $EXTRA; then
        echo "$pct,$b,fetcher,$(field "$log" tg_tok_s),$(field "$log" tg_hit_rate),$(field "$log" tg_bytes_per_tok),$(field "$log" pp_tok_s),$(rss_kb "$log")" >> "$sweep"
    fi
    if [ "$SWEEP_MMAP" = 1 ]; then
        log=$OUT/sweep-mmap-$pct.txt
        if run_mmap "$b" "$log" "${COMMON[@]}" --ram-budget "$b" --io mmap; then
            echo "$pct,$b,mmap,$(field "$log" tg_tok_s),$(field "$log" tg_hit_rate),$(field "$log" tg_bytes_per_tok),$(field "$log" pp_tok_s),$(rss_kb "$log")" >> "$sweep"
        fi
    fi
    tail -n 1 "$sweep"
done
bench_uncap

if [ -z "$SWEEP" ]; then
    :
elif command -v gnuplot > /dev/null; then
    grep -E ',fetcher,' "$sweep" > "$OUT/sweep-fetcher.dat" || true
    grep -E ',mmap,' "$sweep" > "$OUT/sweep-mmap.dat" || true
    plots="'$OUT/sweep-fetcher.dat' using 1:4 with linespoints title 'fetcher decode tok/s' axes x1y1, '$OUT/sweep-fetcher.dat' using 1:(\$5*100) with linespoints dashtype 2 title 'fetcher hit rate %' axes x1y2"
    [ -s "$OUT/sweep-mmap.dat" ] && plots="$plots, '$OUT/sweep-mmap.dat' using 1:4 with linespoints title 'mmap decode tok/s' axes x1y1"
    gnuplot <<GP
set terminal png size 900,560
set output '$OUT/sweep.png'
set datafile separator ','
set title 'sluice squeeze sweep: $(basename "$MODEL"), cold, $N_GEN decode tokens'
set xlabel 'ram budget (% of model)'
set ylabel 'decode tok/s'
set y2label 'expert hit rate (%)'
set y2range [0:100]
set ytics nomirror
set y2tics
set xrange [*:*] reverse
set key top right
plot $plots
GP
    echo "plot: $OUT/sweep.png"
else
    echo "gnuplot not found (deploy/setup.sh installs gnuplot-nox): no PNG" >&2
fi
echo "results in $OUT"
