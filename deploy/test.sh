#!/usr/bin/env bash
# deploy/test.sh - sets up, builds and runs the whole test suite: release, ASan+UBSan, TSan, fuzz.
# usage: deploy/test.sh            (everything; what CI runs)
#        SLUICE_QUICK=1 deploy/test.sh   (release build and tests only)
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/setup.sh
echo "== setup done [${SECONDS}s]"

jobs=$(nproc)
fuzz_secs="${SLUICE_FUZZ_SECONDS:-60}"

# run_suite DIR SANITIZER CTEST_ARGS TARGETS CMAKE_ARGS...: configure, build (TARGETS, or
# everything when empty), run the tests with ctest. ctest gets twice the cores plus two in
# slots: a test that computes takes two (tests/CMakeLists.txt), the two fault suites, which
# mostly wait on daemons, one each.
run_suite() {
    local dir=$1 san=$2 ctest_args=$3 targets=$4
    shift 4
    echo "== $dir: configure and build ($*) [${SECONDS}s]"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DSLUICE_WERROR=ON "$@" >/dev/null
    # shellcheck disable=SC2086
    if ! cmake --build "$dir" -j"$jobs" ${targets:+--target $targets} >"$dir/build.log" 2>&1; then
        grep -E 'error|warning' "$dir/build.log" | head -40 || tail -40 "$dir/build.log"
        echo "build failed in $dir (full log: $dir/build.log)"
        exit 1
    fi
    echo "== $dir: tests [${SECONDS}s]"
    # shellcheck disable=SC2086
    (cd "$dir" && SLUICE_SANITIZER="$san" ctest --output-on-failure -j"$((2 * jobs + 2))" --timeout 1500 $ctest_args)
}

run_suite build "" "" ""
if [ -z "${SLUICE_QUICK:-}" ]; then
    # The sanitizer builds leave the CUDA kernels out (-DSLUICE_CUDA=OFF): without a device
    # their tests run on the host backend either way, and the release build above compiles and
    # links the kernels (two architectures each, the slowest files of the build).
    # The *_one_pass runs (label one_pass) are the release build's only: the same suites run
    # under ASan once, and executor_test_gpu's gpu_one_pass tests put layers on the CPU device.
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run_suite build-asan asan "-LE one_pass" "" -DSANITIZE=asan -DSLUICE_CUDA=OFF
    # Criterion's runner cannot start under ThreadSanitizer, so the TSan suite is the plain
    # programs of tests/tsan/ (label tsan), which drive every multi-threaded part; only they are
    # built.
    tsan_targets=$(cd tests/tsan && ls tsan_*.c | sed 's/\.c$//' | tr '\n' ' ')
    TSAN_OPTIONS=halt_on_error=1 run_suite build-tsan tsan "-L tsan" "$tsan_targets" \
        -DSANITIZE=tsan -DSLUICE_CUDA=OFF
    echo "== fuzz: ${fuzz_secs}s [${SECONDS}s]"
    bash deploy/fuzz.sh "$fuzz_secs"
fi
echo "== all suites passed [${SECONDS}s]"
