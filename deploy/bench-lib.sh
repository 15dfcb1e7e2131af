# deploy/bench-lib.sh - sourced by the benchmark scripts: a memory cgroup whose limit counts the
# page cache, cold caches, and running a command inside the cgroup. Needs root.
#
# bench_setup_cgroup NAME       sets CG (the cgroup) and CG_LIMIT (its limit file): the v1 memory
#                               controller, else v2 memory.max
# bench_drop_caches             writes back and drops the page cache
# bench_run_capped BYTES LOG CMD...   runs CMD cold inside the cgroup capped at BYTES; its output
#                               to LOG; on failure says so with the log's tail and returns 1
# bench_uncap                   lifts the cap

bench_setup_cgroup() {
    if [ -d /sys/fs/cgroup/memory ]; then
        CG=/sys/fs/cgroup/memory/$1
        CG_LIMIT=$CG/memory.limit_in_bytes
    elif [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        CG=/sys/fs/cgroup/$1
        CG_LIMIT=$CG/memory.max
    else
        echo "$1: no memory cgroup found" >&2
        exit 1
    fi
    mkdir -p "$CG"
}

bench_drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }

bench_run_capped() {
    local limit=$1 log=$2
    shift 2
    echo "$limit" > "$CG_LIMIT"
    bench_drop_caches
    ( echo $BASHPID > "$CG/cgroup.procs"; exec "$@" ) > "$log" 2>&1 || {
        echo "run failed ($1), see $log" >&2
        tail -5 "$log" >&2
        return 1
    }
}

bench_uncap() { echo max > "$CG_LIMIT" 2>/dev/null || echo -1 > "$CG_LIMIT" 2>/dev/null || true; }
