#!/usr/bin/env bash
# tests/reference/make-arch-refs.sh - makes tests/reference/archs.txt, the llama.cpp greedy ids the
# architecture tests compare with, and prints the KL-divergence figures of every file.
# usage: tests/reference/make-arch-refs.sh PEER_DIR [OUT]
#   PEER_DIR: a llama.cpp built by ../shared/tools/build-peer-llama.sh (its include/ and
#   build/bin/); OUT defaults to tests/reference/archs.txt. Needs build/bin/sluice. PEER_COMMIT
#   (e.g. "unslothai/llama.cpp d32676d7 2026-08-18") is recorded in the file's header.
# For each architecture and weight type: `sluice mkmodel` writes a tiny random model (the args are
# stored in the file, the tests write the same model again), peer_greedy.c (built here against the
# peer's libllama) prints 32 greedy ids after a fixed prompt, and llama-perplexity saves a
# KL-divergence base on a text that `sluice perplexity --kl-divergence` then compares with.
set -euo pipefail
cd "$(dirname "$0")/../.."
peer=${1:?usage: make-arch-refs.sh PEER_DIR [OUT]}
out=${2:-tests/reference/archs.txt}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
gcc -O2 -I"$peer/include" -I"$peer/ggml/include" tests/reference/peer_greedy.c \
    -L"$peer/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$peer/build/bin" -o "$tmp/peer_greedy"
text=${SLUICE_REF_TEXT:-../shared/fixtures/moe-tiny/eval.txt}
prompt=1,300,301,302,303,310,320,330,340,350,360,370,380,390,400,410
{
    echo "# llama.cpp greedy ids on random-weight models written by sluice mkmodel (32 steps,"
    echo "# prompt $prompt), made by tests/reference/make-arch-refs.sh with the peer at"
    echo "# ${PEER_COMMIT:-an unnamed llama.cpp} (PEER_COMMIT names the source the peer was built from)."
    echo "# arch type | mkmodel args | ids | each step's gap between the two best logits"
} > "$out"
for arch in llama qwen2 qwen3 qwen2moe qwen3moe olmoe; do
    kv=4
    [ "$arch" = olmoe ] && kv=8
    for type in f32 q8_0; do
        args="--arch $arch --preset tiny --n-vocab 512 --n-ff 256 --n-head-kv $kv --type $type --seed 11"
        m="$tmp/$arch-$type.gguf"
        build/bin/sluice mkmodel -q $args -o "$m"
        res=$("$tmp/peer_greedy" "$m" 32 "$prompt")
        ids=$(echo "$res" | head -1)
        margin=$(echo "$res" | sed -n 2p)
        echo "$arch $type | $args | $ids | $margin" >> "$out"
        "$peer/build/bin/llama-perplexity" -m "$m" -f "$text" -c 128 -t 2 --no-repack \
            --kl-divergence-base "$tmp/base.kld" >"$tmp/ppl.log" 2>&1
        peer_ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' "$tmp/ppl.log")
        build/bin/sluice perplexity -m "$m" --kl-divergence-base "$tmp/base.kld" --kl-divergence \
            -t 2 >"$tmp/kld.log" 2>&1
        ours=$(build/bin/sluice perplexity -m "$m" -f "$text" -c 128 -t 2 2>/dev/null |
            sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
        printf '%-9s %-5s ppl llama.cpp %s sluice %s | %s | %s | %s\n' "$arch" "$type" "$peer_ppl" \
            "$ours" "$(grep 'Mean    KLD' "$tmp/kld.log")" "$(grep 'Maximum KLD' "$tmp/kld.log")" \
            "$(grep '^Same top p' "$tmp/kld.log")"
    done
done
echo "wrote $out"
