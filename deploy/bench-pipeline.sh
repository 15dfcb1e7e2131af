#!/usr/bin/env bash
# deploy/bench-pipeline.sh - decode speed of the daemons (sluicectl + sluice generate) against one
# process (sluice run) on the same model, prompt and seed, and the cost of the IPC per token.
# usage: deploy/bench-pipeline.sh [--model M.gguf] [-n N] [-r REPS] [-t THREADS] [--fetchers N]
#                                 [--bin DIR] [--out FILE.csv] [--executor-args "..."]
#                                 [--clients "1 4 16"] [--http]
# Without --model, a MoE with random weights is written to build/bench-pipeline.gguf
# (sluice mkmodel --preset demo --size 512M). Each repetition runs one process, then the daemons,
# after one warm-up generation of each (so both read the experts from the page cache or the pool,
# not from storage). Prints the decode tok/s of both, their ratio, and per generated token: the
# router<->executor round trip beyond the executor's own time, and the executor's wait for expert
# replies from the fetchers. --executor-args passes options to the executor daemon (for example
# "--direct-reads off" to pin every expert part through a request to the fetcher).
# --clients "1 4 16" then runs that many `sluice generate` clients at once (distinct short
# prompts, "No. I", so that decoding dominates; N tokens each, greedy) through the same daemons (started with --parallel of the largest count) and
# prints their aggregate tok/s (every client's tokens over the wall time from the first start to
# the last exit, prompts included; after one untimed run of as many clients, so that the experts
# they route to are in the pool), its ratio to one client, and the executor's sequences per batch
# over the run (continuous batching). --http adds the same through the router's OpenAI-compatible
# HTTP API: that many `curl` POSTs of /v1/completions at once (max_tokens N, temperature 0),
# tokens counted from each answer's usage.completion_tokens.
set -euo pipefail
cd "$(dirname "$0")/.."

model="" n=128 reps=3 threads="" fetchers=1 bin=build/bin out="" exec_args="" clients="" http=""
while [ $# -gt 0 ]; do
    case "$1" in
    --model | -m) model=$2 && shift ;;
    -n) n=$2 && shift ;;
    -r) reps=$2 && shift ;;
    -t) threads=$2 && shift ;;
    --fetchers) fetchers=$2 && shift ;;
    --bin) bin=$2 && shift ;;
    --out) out=$2 && shift ;;
    --executor-args) exec_args=$2 && shift ;;
    --clients) clients=$2 && shift ;;
    --http) http=1 ;;
    -h | --help) sed -n 2,23p "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
    *) echo "bench-pipeline: unknown option $1" >&2 && exit 2 ;;
    esac
    shift
done
for b in sluice sluice-fetcher sluice-executor sluice-router; do
    [ -x "$bin/$b" ] || { echo "bench-pipeline: $bin/$b is not built" >&2; exit 1; }
done
if [ -z "$model" ]; then
    model=build/bench-pipeline.gguf
    [ -f "$model" ] || "$bin/sluice" mkmodel --preset demo --size 512M -q -o "$model"
fi
model=$(realpath -- "$model")
run_dir=$(mktemp -d /tmp/sluice-bench-XXXXXX)
trap 'deploy/sluicectl down --run-dir "$run_dir" >/dev/null 2>&1 || true; rm -rf "$run_dir"' EXIT
prompt="The history of the kingdom begins"
targs=()
[ -z "$threads" ] || targs=(-t "$threads")

# calc EXPR: arithmetic on decimals.
calc() { awk "BEGIN { printf \"%.6f\", $1 }"; }
# decode_rate: reads "... decode X tok/s ..." from stdin.
decode_rate() { sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p' | tail -n 1; }
# stat NAME DAEMON: one value of `sluice ctl stats`.
stat() {
    "$bin/sluice" ctl --run-dir "$run_dir" --daemon "$2" stats |
        awk -v k="$1" '$1 == k { print $2 }'
}

one_process() {
    "$bin/sluice" run -m "$model" -p "$prompt" -n "$n" --temp 0 ${targs[@]+"${targs[@]}"} \
        2>&1 >/dev/null | decode_rate
}
daemons() {
    "$bin/sluice" generate --run-dir "$run_dir" -p "$prompt" -n "$n" --temp 0 2>&1 >/dev/null |
        decode_rate
}

echo "== model $model, $n tokens, $reps reps, $fetchers fetcher(s)"
max_clients=1
for c in $clients; do [ "$c" -gt "$max_clients" ] && max_clients=$c; done
[ -z "$http" ] || command -v curl >/dev/null || { echo "bench-pipeline: --http needs curl" >&2; exit 1; }
upargs=()
[ -z "$http" ] || upargs=(--http 127.0.0.1:0)
deploy/sluicectl up --model "$model" --run-dir "$run_dir" --fetchers "$fetchers" --bin "$bin" \
    --parallel "$((max_clients > 4 ? max_clients : 4))" ${upargs[@]+"${upargs[@]}"} \
    --executor-args "$exec_args" ${targs[@]+"${targs[@]}"} >/dev/null
one_process >/dev/null
daemons >/dev/null
results=()
for ((r = 1; r <= reps; r++)); do
    a=$(one_process)
    s0=$(stat steps router) w0=$(stat steps.wall_ms router) e0=$(stat steps.exec_ms router)
    q0=0
    for ((i = 0; i < fetchers; i++)); do
        q0=$(calc "$q0 + $(stat fetcher.$i.wait_ms executor)")
    done
    b=$(daemons)
    s1=$(stat steps router) w1=$(stat steps.wall_ms router) e1=$(stat steps.exec_ms router)
    q1=0
    for ((i = 0; i < fetchers; i++)); do
        q1=$(calc "$q1 + $(stat fetcher.$i.wait_ms executor)")
    done
    steps=$(calc "$s1 - $s0")
    rt_us=$(calc "($w1 - $w0 - ($e1 - $e0)) * 1000 / $steps")
    fw_us=$(calc "($q1 - $q0) * 1000 / $steps")
    ratio=$(calc "$b / $a")
    printf 'rep %d: one process %8.2f tok/s   daemons %8.2f tok/s   ratio %.3f   ' "$r" "$a" "$b" "$ratio"
    printf 'step round trip beyond the executor %.1f us/token   expert wait %.1f us/token\n' \
        "$rt_us" "$fw_us"
    results+=("$r,$a,$b,$ratio,$rt_us,$fw_us")
done
# Summary: means and medians over the reps (one process alone varies by several percent between
# reps on a small VM, so the median of the per-rep ratios is the steadier figure).
printf '%s\n' "${results[@]}" | awk -F, '
    function median(a, n,    i, j, t) {
        for (i = 2; i <= n; i++)
            for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { n++; oa[n] = $2; ob[n] = $3; or[n] = $4; ort[n] = $5; sa += $2; sb += $3; if ($4 >= 0.97) k++ }
    END {
        if (!n) exit
        printf "== one process: mean %.2f median %.2f tok/s; daemons: mean %.2f median %.2f tok/s\n",
            sa / n, median(oa, n), sb / n, median(ob, n)
        printf "== ratio: of the means %.3f, median of the reps %.3f (%d of %d reps >= 0.97); ",
            sb / sa, median(or, n), k, n
        printf "step round trip median %.1f us/token\n", median(ort, n)
    }'
# clients C: C greedy generations at once; prints the aggregate tok/s.
# (tokens counted from each client's "generated N tokens": one may stop early at an EOS).
clients_rate() {
    local c=$1 pids=() t0 t1 tokens=0
    t0=$(date +%s.%N)
    for ((i = 1; i <= c; i++)); do
        "$bin/sluice" generate --run-dir "$run_dir" -p "No. $i" -n "$n" --temp 0 \
            >/dev/null 2>"$run_dir/client-$i.err" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "bench-pipeline: a client failed" >&2; exit 1; }; done
    t1=$(date +%s.%N)
    for ((i = 1; i <= c; i++)); do
        tokens=$((tokens + $(sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p' "$run_dir/client-$i.err")))
    done
    calc "$tokens / ($t1 - $t0)"
}
# clients_http C: the same through HTTP, C completions POSTed at once; prints the aggregate tok/s.
clients_http() {
    local c=$1 pids=() t0 t1 tokens=0 url got
    url=$(cat "$run_dir/router.http")
    t0=$(date +%s.%N)
    for ((i = 1; i <= c; i++)); do
        curl -s -f -m 3600 "$url/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"prompt\":\"No. $i\",\"max_tokens\":$n,\"temperature\":0}" \
            >"$run_dir/http-$i.json" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || { echo "bench-pipeline: an HTTP client failed" >&2; exit 1; }; done
    t1=$(date +%s.%N)
    for ((i = 1; i <= c; i++)); do
        got=$(sed -n 's/.*"completion_tokens": *\([0-9]*\).*/\1/p' "$run_dir/http-$i.json")
        [ -n "$got" ] || { echo "bench-pipeline: no usage in answer $i: $(head -c 300 "$run_dir/http-$i.json")" >&2; exit 1; }
        tokens=$((tokens + got))
    done
    calc "$tokens / ($t1 - $t0)"
}
base=""
declare -A grate=()
for c in $clients; do
    clients_rate "$c" >/dev/null # warm-up: the experts this many sequences route to are loaded
    b0=$(stat batches executor) q0=$(calc "$(stat batch_seqs_mean executor) * $b0")
    rate=$(clients_rate "$c")
    b1=$(stat batches executor) q1=$(calc "$(stat batch_seqs_mean executor) * $b1")
    [ -n "$base" ] || base=$rate
    grate[$c]=$rate
    printf '== %2d clients at once: %8.2f tok/s together (%.2fx one client), %.2f sequences per executor batch\n' \
        "$c" "$rate" "$(calc "$rate / $base")" "$(calc "($q1 - $q0) / ($b1 - $b0)")"
done
hbase=""
for c in ${http:+$clients}; do
    clients_http "$c" >/dev/null # warm-up, as above
    b0=$(stat batches executor) q0=$(calc "$(stat batch_seqs_mean executor) * $b0")
    rate=$(clients_http "$c")
    b1=$(stat batches executor) q1=$(calc "$(stat batch_seqs_mean executor) * $b1")
    [ -n "$hbase" ] || hbase=$rate
    printf '== %2d HTTP clients at once: %8.2f tok/s together (%.2fx one client; %.2fx as many sluice generate clients), %.2f sequences per executor batch\n' \
        "$c" "$rate" "$(calc "$rate / $hbase")" "$(calc "$rate / ${grate[$c]}")" "$(calc "($q1 - $q0) / ($b1 - $b0)")"
done
if [ -n "$out" ]; then
    echo "rep,one_process_tok_s,daemons_tok_s,ratio,step_rt_us,expert_wait_us" >"$out"
    printf '%s\n' "${results[@]}" >>"$out"
    echo "== wrote $out"
fi
