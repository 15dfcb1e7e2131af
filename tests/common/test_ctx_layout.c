/* tests/common/test_ctx_layout.c - the context layout table: KV and scratch sizes, refusals. */
#include <criterion/criterion.h>
#include <string.h>

#include "common.h"

static struct common_hparams moe_hp(void)
{
    return (struct common_hparams){.n_layer = 4,
                                   .n_embd = 256,
                                   .n_head = 8,
                                   .n_head_kv = 2,
                                   .head_dim_k = 32,
                                   .head_dim_v = 32,
                                   .n_ff_exp = 256,
                                   .n_expert = 8,
                                   .n_expert_used = 2,
                                   .n_rot = 32,
                                   .n_ctx_train = 256,
                                   .n_vocab = 1024};
}

Test(common_ctx_layout, f16_kv_counts_every_position_of_every_layer)
{
    struct common_hparams    hp = moe_hp();
    struct common_ctx_layout l;
    cr_assert_eq(common_ctx_layout_compute(
                     &hp, &(struct common_ctx_layout_opts){.n_ctx = 128, .n_threads = 2}, &l, NULL),
                 COMMON_OK);
    cr_assert_eq(l.n_ctx, 128);
    cr_assert_eq(l.n_batch, 128, "n_batch is capped at n_ctx");
    cr_assert_eq(l.kv_k_bytes, 4ull * 128 * 2 * 32 * 2);
    cr_assert_eq(l.kv_v_bytes, 4ull * 128 * 2 * 32 * 2);
    cr_assert_eq(l.kv_bytes, l.kv_k_bytes + l.kv_v_bytes);
    cr_assert_eq(l.buf[COMMON_CTX_X], 128ull * 256 * 4);
    cr_assert_eq(l.buf[COMMON_CTX_TH_SCORES], 2ull * 128 * 4, "per-thread scores");
    cr_assert_eq(l.buf[COMMON_CTX_MOE_OUT], 128ull * 2 * 256 * 4);
    cr_assert_eq(l.logits_bytes, 1024ull * 4);
}

/* -ngl: the last layers keep their KV on the device, so none of theirs is here; the scratch
 * buffers do not change. */
Test(common_ctx_layout, device_layers_have_no_kv_here)
{
    struct common_hparams         hp = moe_hp();
    struct common_ctx_layout      all, some, none;
    struct common_ctx_layout_opts o = {.n_ctx = 128, .n_threads = 2};
    cr_assert_eq(common_ctx_layout_compute(&hp, &o, &all, NULL), COMMON_OK);
    o.n_device_layers = 3;
    cr_assert_eq(common_ctx_layout_compute(&hp, &o, &some, NULL), COMMON_OK);
    o.n_device_layers = 999; /* llama.cpp's "all" */
    cr_assert_eq(common_ctx_layout_compute(&hp, &o, &none, NULL), COMMON_OK);
    cr_assert_eq(all.kv_layers, 4);
    cr_assert_eq(some.kv_layers, 1);
    cr_assert_eq(none.kv_layers, 0);
    cr_assert_eq(some.kv_k_bytes, all.kv_k_bytes / 4);
    cr_assert_eq(some.kv_bytes, all.kv_bytes / 4);
    cr_assert_eq(none.kv_bytes, 0);
    cr_assert_eq(none.scratch_bytes, all.scratch_bytes);
}

Test(common_ctx_layout, scratch_is_the_sum_of_the_aligned_buffers)
{
    struct common_hparams    hp = moe_hp();
    struct common_ctx_layout l;
    cr_assert_eq(common_ctx_layout_compute(&hp, NULL, &l, NULL), COMMON_OK);
    cr_assert_eq(l.n_ctx, 256, "defaults to the trained context below 4096");
    uint64_t sum = 0;
    for (int b = 0; b < COMMON_CTX_BUF_COUNT; b++) {
        uint64_t r = l.buf[b] ? (l.buf[b] + COMMON_CTX_ALIGN - 1) / COMMON_CTX_ALIGN : 1;
        sum += r * COMMON_CTX_ALIGN;
        cr_assert_neq(strcmp(common_ctx_buf_name((enum common_ctx_buf)b), "?"), 0);
    }
    cr_assert_eq(l.scratch_bytes, sum);
}

Test(common_ctx_layout, dense_model_has_no_moe_buffers)
{
    struct common_hparams hp = moe_hp();
    hp.n_expert = 0;
    hp.n_expert_used = 0;
    hp.n_ff = 512;
    struct common_ctx_layout l;
    cr_assert_eq(common_ctx_layout_compute(&hp, NULL, &l, NULL), COMMON_OK);
    cr_assert_eq(l.buf[COMMON_CTX_ROUTER], 0);
    cr_assert_eq(l.buf[COMMON_CTX_HINT_MARK], 0);
    cr_assert_eq(l.buf[COMMON_CTX_GATE], 256ull * 512 * 4);
}

Test(common_ctx_layout, q8_0_kv_uses_block_rows_and_needs_32_wide_heads)
{
    struct common_hparams    hp = moe_hp();
    struct common_ctx_layout l;
    cr_assert_eq(common_ctx_layout_compute(
                     &hp,
                     &(struct common_ctx_layout_opts){.n_ctx = 64, .cache_type = COMMON_CACHE_Q8_0},
                     &l, NULL),
                 COMMON_OK);
    cr_assert_eq(l.kv_k_head_bytes, 34, "one q8_0 block per 32 elements");
    cr_assert_eq(l.kv_k_bytes, 4ull * 64 * 2 * 34);
    hp.head_dim_k = 48;
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_ctx_layout_compute(
                     &hp,
                     &(struct common_ctx_layout_opts){.n_ctx = 64, .cache_type = COMMON_CACHE_Q8_0},
                     &l, &e),
                 COMMON_EINVAL);
    cr_assert(strstr(e.text, "multiples of 32"), "%s", e.text);
}

Test(common_ctx_layout, rejects_bad_context_sizes_and_leaves_out_unchanged)
{
    struct common_hparams    hp = moe_hp();
    struct common_ctx_layout l = {.n_ctx = 7};
    struct common_errmsg     e = {{0}};
    cr_assert_eq(
        common_ctx_layout_compute(&hp, &(struct common_ctx_layout_opts){.n_ctx = 1u << 25}, &l, &e),
        COMMON_EINVAL);
    cr_assert_eq(l.n_ctx, 7);
    hp.n_ctx_train = 0;
    cr_assert_eq(common_ctx_layout_compute(&hp, NULL, &l, &e), COMMON_EINVAL);
    hp = moe_hp();
    hp.n_head_kv = UINT32_MAX;
    hp.n_layer = UINT32_MAX;
    cr_assert_eq(
        common_ctx_layout_compute(
            &hp, &(struct common_ctx_layout_opts){.n_ctx = 1u << 24, .n_threads = 256}, &l, &e),
        COMMON_ERANGE, "%s", e.text);
}

Test(common_ctx_layout, cache_type_names_round_trip)
{
    enum common_cache_type t;
    cr_assert_eq(common_cache_type_parse("q8_0", &t), COMMON_OK);
    cr_assert_eq(t, COMMON_CACHE_Q8_0);
    cr_assert_str_eq(common_cache_type_name(t), "q8_0");
    cr_assert_eq(common_cache_type_parse("F16", &t), COMMON_OK);
    cr_assert_str_eq(common_cache_type_name(t), "f16");
    cr_assert_eq(common_cache_type_parse("q4_0", &t), COMMON_EINVAL);
}
