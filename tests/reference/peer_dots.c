/* tests/reference/peer_dots.c - which of the executor's dot kernels give llama.cpp's bits: every
 * weight type's dot (the active ISA) against the peer's ggml-cpu vec_dot on the same quantized
 * rows, on random data (the activations made by each side, compared byte for byte first). Built
 * against the peer and the project's static libraries, never by the project's build:
 *   P=/tmp/peer; B=build; gcc -O1 -Iexecutor -Icommon -Iproto -I$B/proto -I$P/ggml/include \
 *     tests/reference/peer_dots.c $B/executor/libexecutor_core.a $B/proto/libproto.a \
 *     $B/common/libcommon.a -L$P/build/bin -lggml-cpu -lggml-base -Wl,-rpath,$P/build/bin \
 *     -lpthread -lm -o /tmp/peer_dots && /tmp/peer_dots
 * Prints per type how many of 200 dots (rows of 256 to 5120 elements) differ. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/kernels.h"

int main(void)
{
    static const uint32_t types[] = {
        COMMON_GGML_TYPE_F16,   COMMON_GGML_TYPE_BF16,  COMMON_GGML_TYPE_Q8_0,
        COMMON_GGML_TYPE_Q4_0,  COMMON_GGML_TYPE_Q4_1,  COMMON_GGML_TYPE_Q5_0,
        COMMON_GGML_TYPE_Q5_1,  COMMON_GGML_TYPE_Q4_K,  COMMON_GGML_TYPE_Q5_K,
        COMMON_GGML_TYPE_Q6_K,  COMMON_GGML_TYPE_MXFP4, COMMON_GGML_TYPE_TQ1_0,
        COMMON_GGML_TYPE_TQ2_0,
    };
    executor_kernels_init();
    ggml_cpu_init();
    srand(1);
    int differ_all = 0;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu((enum ggml_type)types[ti]);
        const struct ggml_type_traits_cpu *ta = ggml_get_type_traits_cpu(tr->vec_dot_type);
        int                                differ = 0, act_differ = 0;
        for (int trial = 0; trial < 200; trial++) {
            const int64_t n = 256 * (1 + trial % 20);
            float        *w = malloc((size_t)n * 4), *x = malloc((size_t)n * 4);
            void         *qw = malloc((size_t)n * 4 + 64), *qa = malloc((size_t)n * 4 + 64);
            void         *qp = malloc((size_t)n * 4 + 64);
            for (int64_t i = 0; i < n; i++) {
                w[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
                x[i] = (float)(rand() % 2001 - 1000) / 333.0f;
            }
            executor_quantize_row_ref(types[ti], w, qw, n);
            executor_quantize_act(types[ti], x, qa, n);
            ta->from_float(x, qp, n);
            act_differ += memcmp(qa, qp, executor_act_row_size(types[ti], n)) != 0;
            float ours = executor_vec_dot(types[ti], n, qw, qa), peer = 0.0f;
            tr->vec_dot((int)n, &peer, 0, qw, 0, qp, 0, 1);
            differ += memcmp(&ours, &peer, sizeof(float)) != 0;
            free(w);
            free(x);
            free(qw);
            free(qa);
            free(qp);
        }
        printf("%-6s %3d of 200 dots differ (activation bytes differ in %d)\n",
               common_ggml_type_get(types[ti])->name, differ, act_differ);
        differ_all += differ;
    }
    return differ_all ? 1 : 0;
}
