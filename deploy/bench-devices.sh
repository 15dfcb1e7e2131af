#!/usr/bin/env bash
# deploy/bench-devices.sh - a model spread over two storage devices, one fetcher daemon each,
# against the same model on one device: decode tok/s, bytes read per token, and the read rate
# as a fraction of the devices' limit measured in the same run.
#
# Two SSDs are emulated by two loop devices (direct I/O on their backing files, so nothing is
# cached under them), each with an ext4 file system and its own read limit (the blkio cgroup's
# throttle, BPS bytes/s per device, kept well under the host disk's rate so that the two do not
# share a bottleneck). Each repetition runs three setups cold, alternating:
#   one      the QSF file on device A, one fetcher
#   one2     its bundles in two files, both on device A, two fetchers (more fetchers, one device)
#   two      its bundles in two files, one on A and one on B, two fetchers (--shard-by file)
# Every run samples up to N_GEN tokens at temperature 1 (the same prompt and, per repetition, seed)
# through the daemons (sluicectl up, sluice generate) under --ram-budget of FRACTION% of the model.
# The limit of each setup is a direct read of its bundle files, all at once, in the same cgroup.
# Printed per setup: decode tok/s; the bytes read per token of the steady decode (the fetchers'
# trace: loads per token after the warm-up, times a bundle's bytes); the request's read rate (all
# bytes the fetchers read over the prefill and decode time) as a fraction of that limit.
#
# Needs root (loop devices, mount, blkio cgroup, drop_caches). Not run by CI.
#
# Environment (all optional):
#   BIN        directory of sluice and its daemons     [build/bin]
#   MODEL      GGUF model, made if missing              [/tmp/sluice-bench/devices-balanced.gguf]
#              (mkmodel --preset moe-large --routing balanced --size SIZE)
#   SIZE       size of the model to make                [2G]
#   WORK       where the backing files and mounts go    [/tmp/sluice-bench/devices]
#   OUT        results directory                        [/tmp/sluice-bench/devices-<date>]
#   BPS        read limit of each device, bytes/s       [300000000]
#   FRACTION   --ram-budget, % of the model             [25]
#   N_GEN      tokens generated per run                 [32]
#   REPS       repetitions of the three setups          [3]
#   THREADS    executor threads                         [the machine's cores]
#   SETUPS     which setups, in order                   [one one2 two]
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-build/bin}
MODEL=${MODEL:-/tmp/sluice-bench/devices-balanced.gguf}
SIZE=${SIZE:-2G}
WORK=${WORK:-/tmp/sluice-bench/devices}
OUT=${OUT:-/tmp/sluice-bench/devices-$(date +%Y%m%d-%H%M%S)}
BPS=${BPS:-300000000}
FRACTION=${FRACTION:-25}
N_GEN=${N_GEN:-32}
REPS=${REPS:-3}
THREADS=${THREADS:-$(nproc)}
SETUPS=${SETUPS:-one one2 two}
SLUICE=$BIN/sluice
SLUICECTL=deploy/sluicectl
BLKIO=/sys/fs/cgroup/blkio

case "${1:-}" in
-h | --help) sed -n 2,34p "$0" | sed 's/^# \{0,1\}//' && exit 0 ;;
"") ;;
*) echo "bench-devices: no arguments (see --help)" >&2 && exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "bench-devices: needs root (loop devices, mount, cgroups)" >&2; exit 1; }
[ -x "$SLUICE" ] || { echo "bench-devices: no sluice binary in $BIN (set BIN)" >&2; exit 1; }
[ -d "$BLKIO" ] || { echo "bench-devices: no blkio cgroup at $BLKIO (cgroup v1)" >&2; exit 1; }
for t in losetup mkfs.ext4 mount umount dd; do
    command -v "$t" > /dev/null || { echo "bench-devices: $t not found" >&2; exit 1; }
done
mkdir -p "$OUT" "$WORK" "$(dirname "$MODEL")"
if [ ! -f "$MODEL" ]; then
    echo "== making $MODEL ($SIZE, balanced routing)"
    "$SLUICE" mkmodel --preset moe-large --routing balanced --size "$SIZE" -q -o "$MODEL"
fi
MODEL_BYTES=$(stat -c %s "$MODEL")
BUDGET=$((MODEL_BYTES * FRACTION / 100))

# The two devices. A holds the whole file and the two layouts' files on it, B one shard.
LOOPS=()
MOUNTS=()
CG=$BLKIO/sluice-bench-devices
cleanup() {
    deploy/sluicectl down --run-dir "$WORK/run" > /dev/null 2>&1 || true
    for m in "${MOUNTS[@]}"; do umount "$m" 2> /dev/null || true; done
    for l in "${LOOPS[@]}"; do losetup -d "$l" 2> /dev/null || true; done
    rmdir "$CG" 2> /dev/null || true
}
trap cleanup EXIT
make_device() { # make_device NAME BYTES: a loop device with ext4 mounted at WORK/NAME, both
    # recorded (LOOPS, MOUNTS) for the cleanup as soon as they exist
    local img=$WORK/$1.img dir=$WORK/$1 dev
    rm -f "$img"
    truncate -s $(($2 / 4096 * 4096)) "$img"
    dev=$(losetup --direct-io=on -f --show "$img")
    LOOPS+=("$dev")
    MOUNTS+=("$dir")
    mkfs.ext4 -q -F "$dev"
    mkdir -p "$dir"
    mount "$dev" "$dir"
}
make_device a $((MODEL_BYTES * 5 / 2 + (512 << 20)))
make_device b $((MODEL_BYTES / 2 + (512 << 20)))
DEV_A=${LOOPS[0]}
DEV_B=${LOOPS[1]}
echo "== devices: $DEV_A ($WORK/a) and $DEV_B ($WORK/b), each read at most $BPS bytes/s"

echo "== converting (sluice convert)"
mkdir -p "$WORK/a/one" "$WORK/a/one2" "$WORK/a/one2-s1" "$WORK/a/two" "$WORK/b/two-s1"
"$SLUICE" convert "$MODEL" "$WORK/a/one/m.qsf" > "$OUT/convert-one.log" 2>&1
"$SLUICE" convert --shards 2 --shard-dir "$WORK/a/one2" --shard-dir "$WORK/a/one2-s1" \
    "$MODEL" "$WORK/a/one2/m.qsf" > "$OUT/convert-one2.log" 2>&1
"$SLUICE" convert --shards 2 --shard-dir "$WORK/a/two" --shard-dir "$WORK/b/two-s1" \
    "$MODEL" "$WORK/a/two/m.qsf" > "$OUT/convert-two.log" 2>&1
sync

# Every run and probe goes in one blkio cgroup that throttles each device.
mkdir -p "$CG"
for d in "$DEV_A" "$DEV_B"; do
    echo "$((16#$(stat -L -c %t "$d"))):$((16#$(stat -L -c %T "$d"))) $BPS" > "$CG/blkio.throttle.read_bps_device"
done
in_cg() { ( echo $BASHPID > "$CG/cgroup.procs"; exec "$@" ); }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

# files SETUP: the bundle files a setup reads; fetchers SETUP, shard_by SETUP.
files() {
    case $1 in
    one) echo "$WORK/a/one/m.qsf" ;;
    *) find "$WORK/a/$1" "$WORK/b/$1-s1" "$WORK/a/$1-s1" -maxdepth 1 -type f 2> /dev/null | sort ;;
    esac
}
fetchers() { [ "$1" = one ] && echo 1 || echo 2; }
shard_by() { [ "$1" = one ] && echo expert || echo file; }

# probe SETUP: bytes/s of reading every bundle file of the setup at once (direct, 4 MiB reads,
# up to 1 GiB each), as the fetchers would.
probe() {
    local f sz t0 t1 total=0 pids=()
    drop_caches
    t0=$(date +%s.%N)
    for f in $(files "$1"); do
        in_cg dd if="$f" of=/dev/null bs=4M count=256 iflag=direct status=none &
        pids+=($!)
        sz=$(stat -c %s "$f")
        total=$((total + (sz < (1 << 30) ? sz : (1 << 30))))
    done
    wait "${pids[@]}"
    t1=$(date +%s.%N)
    awk -v b="$total" -v a="$t0" -v z="$t1" 'BEGIN { printf "%.0f", b / (z - a) }'
}

prompt="The history of the kingdom begins with"
echo "setup,rep,decode_tok_s,bytes_read,steady_bytes_per_token,read_bytes_per_s,limit_bytes_per_s,hit_rate" \
    > "$OUT/summary.csv"
# run_setup SETUP REP
run_setup() {
    local s=$1 rep=$2 model n sb lim log=$OUT/$1-$2 gen tok pms ngen slot bytes=0 hits=0 acc=0 i b
    n=$(fetchers "$s")
    sb=$(shard_by "$s")
    model=$WORK/a/$s/m.qsf
    lim=$(probe "$s")
    rm -rf "$WORK/run"
    drop_caches
    in_cg "$SLUICECTL" up --bin "$BIN" -m "$model" --run-dir "$WORK/run" --fetchers "$n" \
        --shard-by "$sb" --ram-budget "$BUDGET" -t "$THREADS" -c 512 > "$log-up.log" 2>&1 ||
        { echo "bench-devices: $s: sluicectl up failed, see $log-up.log" >&2; tail -3 "$log-up.log" >&2; return 1; }
    "$SLUICE" generate --run-dir "$WORK/run" -p "$prompt" -n "$N_GEN" --temp 1 --seed "$rep" \
        > "$log-gen.log" 2>&1 || echo "bench-devices: $s: generate failed, see $log-gen.log" >&2
    for ((i = 0; i < n; i++)); do
        "$SLUICE" ctl --run-dir "$WORK/run" --daemon "fetcher-$i" stats > "$log-fetcher-$i.txt" || true
        b=$(awk '$1 == "trace.bytes_read" {printf "%.0f", $2}' "$log-fetcher-$i.txt")
        bytes=$((bytes + ${b:-0}))
        hits=$((hits + $(awk '$1 == "trace.hits" {printf "%.0f", $2}' "$log-fetcher-$i.txt")))
        acc=$((acc + $(awk '$1 == "trace.accesses" {printf "%.0f", $2}' "$log-fetcher-$i.txt")))
    done
    "$SLUICECTL" down --run-dir "$WORK/run" > /dev/null 2>&1 || true
    # The steady decode's loads per token (the fetchers' trace, written to their logs at stop)
    # times a bundle's bytes; the read rate is over the whole request (prefill and decode).
    for ((i = 0; i < n; i++)); do
        awk '/faults\/token/ { for (j = 1; j < NF; j++) if ($j == "steady") print $(j + 1) }' \
            "$WORK/run/logs/fetcher-$i.log" | tail -n 1
    done > "$log-steady.txt"
    slot=$(awk '$1 == "pool.slot_bytes" {printf "%.0f", $2}' "$log-fetcher-0.txt")
    gen=$(grep -m1 'decode .* tok/s' "$log-gen.log" || true)
    tok=$(echo "$gen" | sed -n 's/.*decode \([0-9.]*\) tok\/s.*/\1/p')
    pms=$(echo "$gen" | sed -n 's/.*prompt [0-9]* tokens in \([0-9.]*\) ms.*/\1/p')
    ngen=$(echo "$gen" | sed -n 's/.*generated \([0-9]*\) tokens.*/\1/p')
    awk -v s="$s" -v r="$rep" -v t="${tok:-0}" -v b="$bytes" -v n="${ngen:-0}" -v l="$lim" \
        -v h="$hits" -v a="$acc" -v pms="${pms:-0}" -v slot="${slot:-0}" \
        -v steady="$(paste -sd+ "$log-steady.txt")" 'BEGIN {
            split(steady, f, "+"); loads = 0; for (j in f) loads += f[j]
            secs = pms / 1000 + (t > 0 ? n / t : 0)
            printf "%s,%d,%.2f,%.0f,%.0f,%.0f,%.0f,%.3f\n", s, r, t, b, loads * slot,
                (secs > 0 ? b / secs : 0), l, (a ? h / a : 0) }' >> "$OUT/summary.csv"
    tail -n 1 "$OUT/summary.csv"
}

echo "== model $MODEL ($MODEL_BYTES bytes), --ram-budget $BUDGET ($FRACTION%), $N_GEN tokens, $REPS reps"
for ((rep = 1; rep <= REPS; rep++)); do
    for s in $SETUPS; do run_setup "$s" "$rep" || true; done
done

echo
echo "setup  decode tok/s (mean, min-max)  MB read/token (steady)  request read rate / limit  limit MB/s"
awk -F, 'NR > 1 && $3 > 0 {
        n[$1]++; t[$1] += $3; if (!($1 in lo) || $3 < lo[$1]) lo[$1] = $3; if ($3 > hi[$1]) hi[$1] = $3
        bpt[$1] += $5; r[$1] += $6 / $7; l[$1] += $7
        if (!($1 in order)) { order[$1] = ++k; name[k] = $1 }
    }
    END {
        for (i = 1; i <= k; i++) { s = name[i]
            printf "%-6s %6.2f (%.2f-%.2f)            %7.1f                %5.2f                    %6.0f\n", s, t[s] / n[s],
                lo[s], hi[s], bpt[s] / n[s] / 1e6, r[s] / n[s], l[s] / n[s] / 1e6 }
        if (("one" in n) && ("two" in n))
            printf "two devices / one: %.2fx decode\n", (t["two"] / n["two"]) / (t["one"] / n["one"])
    }' "$OUT/summary.csv" | tee "$OUT/summary.txt"
echo "results in $OUT"
