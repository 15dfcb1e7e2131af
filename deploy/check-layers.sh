#!/usr/bin/env bash
# deploy/check-layers.sh - fails when a folder includes or links what the layering forbids.
#
# usage: deploy/check-layers.sh [SOURCE_DIR]      check the tree (default: this repository)
#        deploy/check-layers.sh --self-test       check that planted violations are caught
#
# The layering (DESIGN.md section 1): cli -> {router, executor, fetcher} -> proto -> common.
# The three daemon folders are peers: none includes another's headers or links its library.
# - Includes: a quoted #include in folder F must name a file of F (relative to the including
#   file) or the face header of a folder F may use (common.h, proto.h, executor.h, fetcher.h,
#   router.h, and the router's client library header sluice_client.h).
# - Links: every project library a target of F links (target_link_libraries in F/CMakeLists.txt)
#   must belong to F or to a folder F may use.
# Prints one line per violation and exits 1 when there is any, 0 otherwise.
set -euo pipefail

# allowed FOLDER: the folders FOLDER may use besides itself.
allowed() {
    case "$1" in
    common) echo "" ;;
    proto) echo "common" ;;
    executor | fetcher | router) echo "proto common" ;;
    cli) echo "router executor fetcher proto common" ;;
    *) echo "" ;;
    esac
}

# face_owner HEADER: the folder whose face HEADER is, or nothing.
face_owner() {
    case "$1" in
    common.h) echo common ;;
    proto.h) echo proto ;;
    executor.h) echo executor ;;
    fetcher.h) echo fetcher ;;
    router.h | sluice_client.h) echo router ;;
    *) echo "" ;;
    esac
}

# target_owner TARGET: the folder a CMake target of the project belongs to, or nothing.
target_owner() {
    case "$1" in
    common | common_devmem) echo common ;;
    proto) echo proto ;;
    executor_core | executor_cuda | sluice-executor) echo executor ;;
    fetcher_core | sluice-fetcher) echo fetcher ;;
    router_core | sluice_client | sluice-router) echo router ;;
    sluice) echo cli ;;
    *) echo "" ;;
    esac
}

FOLDERS="common proto executor fetcher router cli"

# check_tree DIR: prints violations of the tree at DIR; returns 1 when there is any.
check_tree() {
    local root=$1 bad=0 folder file inc dir target owner lib ok a
    for folder in $FOLDERS; do
        [ -d "$root/$folder" ] || continue
        local ok_folders
        ok_folders="$folder $(allowed "$folder")"
        while IFS= read -r file; do
            dir=$(dirname "$file")
            while IFS= read -r inc; do
                [ -n "$inc" ] || continue
                if [ -e "$dir/$inc" ]; then
                    # A file next to the includer: it must stay inside the folder.
                    local real
                    real=$(cd "$(dirname "$dir/$inc")" && pwd -P)/$(basename "$inc")
                    case "$real" in
                    "$(cd "$root/$folder" && pwd -P)"/*) continue ;;
                    esac
                    echo "${file#"$root"/}: includes \"$inc\" from outside $folder/"
                    bad=1
                    continue
                fi
                owner=$(face_owner "$inc")
                if [ "$folder" = proto ] && [ "$inc" = sluice_generated.h ]; then
                    continue # flatc's output for proto/sluice.fbs, in the build tree
                fi
                ok=0
                for a in $ok_folders; do
                    [ "$owner" = "$a" ] && ok=1
                done
                if [ "$ok" = 0 ]; then
                    if [ -n "$owner" ]; then
                        echo "${file#"$root"/}: includes \"$inc\", the face of $owner/, which $folder/ may not use"
                    else
                        echo "${file#"$root"/}: includes \"$inc\", not a file of $folder/ nor a face header"
                    fi
                    bad=1
                fi
            done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$file")
        done < <(find "$root/$folder" -type f \( -name '*.c' -o -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) | sort)

        # Links: target_link_libraries(TARGET [PUBLIC|PRIVATE|INTERFACE] LIB ...), possibly over
        # several lines, in the folder's CMakeLists.txt.
        local cm="$root/$folder/CMakeLists.txt"
        [ -f "$cm" ] || continue
        while IFS= read -r line; do
            set -- $line
            target=$1
            shift
            for lib in "$@"; do
                owner=$(target_owner "$lib")
                [ -n "$owner" ] || continue
                ok=0
                for a in $ok_folders; do
                    [ "$owner" = "$a" ] && ok=1
                done
                if [ "$ok" = 0 ]; then
                    echo "$folder/CMakeLists.txt: $target links $lib of $owner/, which $folder/ may not use"
                    bad=1
                fi
            done
        done < <(tr '\n' ' ' <"$cm" | grep -o 'target_link_libraries([^)]*)' |
            sed -e 's/target_link_libraries(//' -e 's/)$//' -e 's/\<\(PUBLIC\|PRIVATE\|INTERFACE\)\>//g')
    done
    return $bad
}

# self_test: plants one violation of each kind in a copy of the tree; each must be caught, and
# the untouched copy must pass.
self_test() {
    local src tmp fails=0
    src=$(cd "$(dirname "$0")/.." && pwd -P)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' RETURN
    for f in $FOLDERS; do
        cp -r "$src/$f" "$tmp/$f"
    done
    if ! check_tree "$tmp" >/dev/null; then
        echo "self-test: the clean copy fails"
        fails=1
    fi
    # plant CASE FILE TEXT: appends TEXT to FILE of a fresh copy and expects a violation.
    plant() {
        local name=$1 file=$2 text=$3 saved
        saved=$(mktemp)
        cp "$tmp/$file" "$saved"
        printf '%s\n' "$text" >>"$tmp/$file"
        if check_tree "$tmp" >/dev/null; then
            echo "self-test: not caught: $name"
            fails=1
        fi
        cp "$saved" "$tmp/$file"
        rm -f "$saved"
    }
    plant "executor includes the fetcher's face" executor/forward.c '#include "fetcher.h"'
    plant "router includes the executor's face" router/sampler.c '#include "executor.h"'
    plant "proto includes a daemon's face" proto/wire.c '#include "router.h"'
    plant "executor reaches into fetcher/ by path" executor/remote.c '#include "../fetcher/pool.h"'
    plant "a private header of another folder" fetcher/fetcher.c '#include "kv.h"'
    plant "fetcher links the executor" fetcher/CMakeLists.txt 'target_link_libraries(fetcher_core PRIVATE executor_core)'
    plant "router links the fetcher" router/CMakeLists.txt 'target_link_libraries(sluice-router PRIVATE fetcher_core)'
    plant "common links proto" common/CMakeLists.txt 'target_link_libraries(common PUBLIC proto)'
    if [ "$fails" = 0 ]; then
        echo "check-layers self-test: every planted violation caught"
    fi
    return $fails
}

if [ "${1:-}" = "--self-test" ]; then
    self_test
    exit $?
fi
root=$(cd "${1:-$(dirname "$0")/..}" && pwd -P)
if check_tree "$root"; then
    echo "check-layers: cli -> {router, executor, fetcher} -> proto -> common holds"
else
    echo "check-layers: the layering is broken (see the lines above)"
    exit 1
fi
