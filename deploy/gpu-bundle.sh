#!/usr/bin/env bash
# deploy/gpu-bundle.sh - runs sluice's device suites on a CUDA machine that has a driver but not
# the build's libraries (nng, criterion, liburing, ...) or no compiler: `pack` gathers a CUDA
# build's binaries, the shared libraries they load that are not the C library's, and the test
# fixtures into one archive; `check`, run on the CUDA machine from a copy of this repository,
# unpacks it and runs every device suite on the device (no host backend), then the device's share
# of the CLI and pipeline suites, and fails on a suite that fails or that skipped for want of a
# device.
#
# usage: deploy/gpu-bundle.sh pack [BUILD_DIR [OUT.tar.xz]]   (default build, gpu-bundle.tar.xz)
#        deploy/gpu-bundle.sh check BUNDLE.tar.xz [LOG_DIR]    (default /tmp/sluice-gpu-check)
# Environment of pack: SUITES, the test binaries to take [the device suites and cli_test_run;
# SUITES=all takes GPU_SUITES_ALL below, which adds the batch, archs, bench and pipeline tests
# that run -ngl, and the kill -9 tests of the daemons' device pool (pipeline_test_faults, only
# those: SUITE_FILTER below)];
# FIXTURES=0 leaves the fixtures out, F32=1 takes the 29 MiB moe-tiny F32 file too (left out by
# default: with it the archive passes the lent machines' 64 MiB; the tests that need what is left
# out skip, which check reports). Of check: SUITES, the test binaries to run (default: every one
# in the bundle), TIMEOUT, seconds per suite [600].
#
# The test binaries carry the absolute paths of the tree they were built in (the build directory,
# the sources, the fixtures); check makes those paths point into the bundle and this repository
# (it must be able to write there: run it as root on a machine of its own, as the lent ones are).
set -euo pipefail

# The device suites and the CLI's -ngl runs; then the other tests that run -ngl.
GPU_SUITES="executor_test_cuda_quant executor_test_cuda_ops executor_test_gpu common_test_devmem
cli_test_run"
GPU_SUITES_ALL="$GPU_SUITES executor_test_batch cli_test_archs cli_test_bench pipeline_test_sluicectl
pipeline_test_faults"
DAEMONS="sluice sluice-executor sluice-fetcher sluice-router"

# cache_value BUILD KEY: a value of the build's CMakeCache.txt.
cache_value() { sed -n "s/^$2:[A-Z]*=//p" "$1/CMakeCache.txt" | head -1; }

pack() {
    local build=${1:-build} out=${2:-gpu-bundle.tar.xz}
    [ -f "$build/CMakeCache.txt" ] || { echo "gpu-bundle: $build is no build directory" >&2; exit 2; }
    [ -f "$build/executor/libexecutor_cuda.a" ] ||
        { echo "gpu-bundle: $build was built without CUDA (configure with -DSLUICE_CUDA=ON)" >&2; exit 2; }
    local stage
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' RETURN
    mkdir -p "$stage/build/bin" "$stage/build/tests" "$stage/lib" "$stage/fixtures"
    local f files=()
    for f in $DAEMONS; do
        [ -x "$build/bin/$f" ] || { echo "gpu-bundle: $build/bin/$f missing (build it first)" >&2; exit 1; }
        cp "$build/bin/$f" "$stage/build/bin/"
        files+=("$build/bin/$f")
    done
    local suites=${SUITES:-$GPU_SUITES}
    [ "$suites" != all ] || suites=$GPU_SUITES_ALL
    for f in $suites; do
        if [ -x "$build/tests/$f" ]; then
            cp "$build/tests/$f" "$stage/build/tests/"
            files+=("$build/tests/$f")
        else
            echo "gpu-bundle: $build/tests/$f not built: left out" >&2
        fi
    done
    # The libraries they load, but the C library's own and the driver's (which the machine has).
    ldd "${files[@]}" 2>/dev/null | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux* | libcuda.so*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
    local fixtures
    fixtures=$(cache_value "$build" SLUICE_FIXTURES_DIR)
    if [ "${FIXTURES:-1}" != 0 ] && [ -d "$fixtures" ]; then
        cp -r "$fixtures/moe-tiny" "$fixtures/models" "$stage/fixtures/"
        [ "${F32:-0}" = 1 ] || rm -f "$stage/fixtures/moe-tiny/moe-tiny-f32.gguf"
    fi
    {
        echo "BINARY_DIR=$(cd "$build" && pwd)"
        echo "SOURCE_DIR=$(cache_value "$build" CMAKE_HOME_DIRECTORY)"
        echo "FIXTURES_DIR=$(cd "$fixtures" 2>/dev/null && pwd || echo "$fixtures")"
        echo "COMMIT=$(git -C "$(cache_value "$build" CMAKE_HOME_DIRECTORY)" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    } > "$stage/paths"
    # Every binary carries the same CUDA kernels (about 10 MB each): a dictionary larger than the
    # binaries lets xz store them once (60 MB with xz's default 8 MiB window, 31 MB with this).
    tar -C "$stage" -cf - . | xz -T1 --lzma2=preset=6,dict=192MiB > "$out"
    echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)): $(ls "$stage/build/tests" | wc -l) suites, $(ls "$stage/lib" | wc -l) libraries"
    [ "$(stat -c %s "$out")" -le $((52 << 20)) ] ||
        echo "gpu-bundle: over 52 MiB: with this repository it may not pass a lent machine's 64 MiB" >&2
}

# link_path PATH TARGET: makes PATH (absolute) name TARGET, unless it is TARGET already.
link_path() {
    local path=$1 target=$2
    [ "$(readlink -f "$path" 2>/dev/null)" = "$(readlink -f "$target")" ] && return 0
    if [ -e "$path" ] && [ ! -L "$path" ]; then
        echo "gpu-bundle: $path exists and is not the bundle's: refusing to replace it" >&2
        exit 1
    fi
    mkdir -p "$(dirname "$path")"
    ln -sfn "$target" "$path"
}

check() {
    local bundle=${1:?a bundle made by pack} logs=${2:-/tmp/sluice-gpu-check}
    local root src
    src=$(cd "$(dirname "$0")/.." && pwd)
    root=$(mktemp -d /tmp/sluice-gpu-bundle.XXXXXX)
    tar -C "$root" -xJf "$bundle"
    # shellcheck disable=SC1091
    . "$root/paths"
    link_path "$BINARY_DIR" "$root/build"
    [ "$SOURCE_DIR" = "$src" ] || link_path "$SOURCE_DIR" "$src"
    [ -z "$(ls -A "$root/fixtures")" ] || link_path "$FIXTURES_DIR" "$root/fixtures"
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export SLUICE_GPU_BACKEND=cuda # the device: not the host backend, nor common_devmem's host emulation
    mkdir -p "$logs"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
        sed 's/^/device: /' || echo "device: nvidia-smi failed"
    echo "bundle of $COMMIT"
    local suite fails=0 status line
    for suite in ${SUITES:-$(ls "$root/build/tests")}; do
        [ -x "$root/build/tests/$suite" ] || { echo "$suite: not in the bundle"; fails=$((fails + 1)); continue; }
        local t0=$SECONDS filter=()
        # the fault suite's kill -9 tests of the device pool (on the device under this check)
        [ "$suite" != pipeline_test_faults ] || filter=(--filter 'pipeline_faults/*device_pool*')
        status=0
        # The suites' own process per test; --jobs 1 as ctest runs them.
        (cd "$root/build/tests" && timeout "${TIMEOUT:-600}" "./$suite" --jobs 1 --verbose "${filter[@]}") \
            >"$logs/$suite.log" 2>&1 || status=$?
        line=$(grep -E '^\[====\] Synthesis' "$logs/$suite.log" | tail -1 | sed 's/^\[====\] Synthesis: //')
        local skipped
        skipped=$(grep -c -E '^\[SKIP\].*(no device|no CUDA|skipped)' "$logs/$suite.log" || true)
        echo "$suite: exit $status in $((SECONDS - t0)) s; ${line:-no summary}; $skipped skipped for want of a device or fixture"
        grep -E '^\[FAIL\]' "$logs/$suite.log" | head -10 | sed 's/^/    /' || true
        if [ "$status" -ne 0 ] || [ "$skipped" -ne 0 ]; then
            fails=$((fails + 1))
        fi
    done
    echo "gpu-bundle: $fails suite(s) failed or skipped; logs in $logs"
    [ "$fails" -eq 0 ]
}

case "${1:-}" in
pack) shift; pack "$@" ;;
check) shift; check "$@" ;;
-h | --help | "") sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ] ;;
*) echo "gpu-bundle: unknown verb '$1' (pack or check; --help)" >&2; exit 2 ;;
esac
