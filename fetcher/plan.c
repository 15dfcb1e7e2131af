/* fetcher/plan.c - memory budget plan: resident weights, KV, overhead, and the pool that fits. */
#include "fetcher.h"

#include <stdio.h>

/* Per-slot table bytes (struct pool_slot, rounded) and per-bundle bookkeeping (key index,
 * trace counters and histogram, front layout), kept generous rather than exact. */
#define PLAN_SLOT_TABLE_BYTES 256u
#define PLAN_BUNDLE_BYTES     512u
#define PLAN_TRACE_LOG_BYTES  (UINT64_C(4) << 20)
#define PLAN_SQE_BYTES        256u
#define PLAN_DEFAULT_BASE     (UINT64_C(16) << 20)

static uint64_t plan_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

uint64_t fetcher_plan_slot_bytes(const struct common_model *m)
{
    uint64_t best = 0;
    if (!common_model_is_moe(m))
        return 0;
    if (common_gguf_is_qsf(m->gguf) && !m->ffn_streamed)
        return common_gguf_bundle_buf_max(m->gguf); /* one read, decoded in place */
    for (uint32_t l = 0; l < m->hp.n_layer; l++) {
        for (uint32_t x = 0; x < m->hp.n_expert && common_model_layer_is_moe(m, l); x++) {
            uint64_t sum = 0;
            for (int p = 0; p < COMMON_EXPERT_PART_COUNT; p++) {
                struct common_span s;
                if (common_model_expert_span(m, l, x, (enum common_expert_part)p, &s) != 0)
                    return 0;
                uint64_t start = s.offset / FETCHER_ALIGN * FETCHER_ALIGN;
                sum += plan_align_up(s.offset + s.size, FETCHER_ALIGN) - start;
            }
            if (sum > best)
                best = sum;
        }
    }
    return best;
}

/* Activations and scratch when the caller gives none: what one context of the default shape
 * allocates (common/ctx_layout.c, the table executor_ctx_create() allocates from) plus its
 * logits row. 0 when the hyper-parameters admit no context (the KV of the caller fails then). */
static uint64_t plan_act_default(const struct common_hparams *hp)
{
    struct common_ctx_layout lay;
    if (common_ctx_layout_compute(hp, NULL, &lay, NULL) != COMMON_OK)
        return 0;
    return lay.scratch_bytes + lay.logits_bytes;
}

int fetcher_plan_compute(const struct common_model *m, const struct fetcher_plan_opts *o,
                         struct fetcher_plan *plan, struct common_errmsg *e)
{
    if (!common_model_is_moe(m))
        return common_errmsg_set(e, COMMON_EINVAL, "plan: model has no routed experts");
    if (!o || o->ram_budget == 0)
        return common_errmsg_set(e, COMMON_EINVAL, "plan: ram budget is zero");
    struct fetcher_plan p = {
        .ram_budget = o->ram_budget,
        .resident_bytes = m->bytes_resident,
        .kv_bytes = o->kv_bytes,
        .act_bytes = o->act_bytes ? o->act_bytes : plan_act_default(&m->hp),
        .base_bytes = o->base_bytes ? o->base_bytes : PLAN_DEFAULT_BASE,
        .staging_bytes = o->staging_bytes,
        .slot_bytes = fetcher_plan_slot_bytes(m),
        .n_bundles = m->hp.n_layer * m->hp.n_expert,
    };
    uint32_t qd = o->queue_depth ? o->queue_depth : 32;
    p.io_bytes = (uint64_t)qd * PLAN_SQE_BYTES + (uint64_t)p.n_bundles * PLAN_BUNDLE_BYTES +
                 PLAN_TRACE_LOG_BYTES;
    p.min_slots = o->min_slots ? o->min_slots : 2 * m->hp.n_expert_used;
    if (p.min_slots > p.n_bundles)
        p.min_slots = p.n_bundles;
    if (p.min_slots == 0)
        p.min_slots = 1;

    uint64_t fixed = 0, per_slot = p.slot_bytes + PLAN_SLOT_TABLE_BYTES, min_pool = 0;
    if (!common_add_u64(p.resident_bytes, p.kv_bytes, &fixed) ||
        !common_add_u64(fixed, p.act_bytes, &fixed) || !common_add_u64(fixed, p.io_bytes, &fixed) ||
        !common_add_u64(fixed, p.base_bytes, &fixed) ||
        !common_add_u64(fixed, p.staging_bytes, &fixed) ||
        !common_mul_u64(per_slot, p.min_slots, &min_pool) ||
        !common_add_u64(fixed, min_pool, &p.min_budget))
        return common_errmsg_set(e, COMMON_ERANGE, "plan: sizes overflow");
    uint64_t n = o->ram_budget > fixed ? (o->ram_budget - fixed) / per_slot : 0;
    p.n_slots = n > p.n_bundles ? p.n_bundles : (uint32_t)n;
    p.pool_bytes = (uint64_t)p.n_slots * p.slot_bytes;
    *plan = p;
    if (p.n_slots < p.min_slots) {
        char b[7][32], staging[80] = "";
        if (p.staging_bytes)
            snprintf(staging, sizeof(staging), " + device staging %s (--vram-fill)",
                     common_format_size(p.staging_bytes, b[6], 32));
        return common_errmsg_set(
            e, COMMON_ERANGE,
            "ram budget %s is too small: the minimum is %s (%llu bytes) = resident %s + KV %s + "
            "activations/io/base %s%s + %u expert slots of %s",
            common_format_size(o->ram_budget, b[0], sizeof(b[0])),
            common_format_size(p.min_budget, b[1], sizeof(b[1])), (unsigned long long)p.min_budget,
            common_format_size(p.resident_bytes, b[2], 32),
            common_format_size(p.kv_bytes, b[3], 32),
            common_format_size(p.act_bytes + p.io_bytes + p.base_bytes, b[4], 32), staging,
            p.min_slots, common_format_size(p.slot_bytes, b[5], 32));
    }
    return COMMON_OK;
}

int fetcher_plan_format(const struct fetcher_plan *p, char *buf, size_t len)
{
    char     b[11][32], staging[96] = "";
    uint64_t used = p->resident_bytes + p->kv_bytes + p->act_bytes + p->io_bytes + p->base_bytes +
                    p->staging_bytes + p->pool_bytes + (uint64_t)p->n_slots * PLAN_SLOT_TABLE_BYTES;
    double share = p->n_bundles ? 100.0 * (double)p->n_slots / (double)p->n_bundles : 0.0;
    if (p->staging_bytes)
        snprintf(staging, sizeof(staging), "  device staging    %s (storage to the device pool)\n",
                 common_format_size(p->staging_bytes, b[10], 32));
    return snprintf(
        buf, len,
        "memory plan: ram budget %s\n"
        "  resident weights  %s (attention, norms, embeddings, router)\n"
        "  kv cache          %s\n"
        "  activations       %s\n"
        "  i/o and tables    %s\n"
        "  base overhead     %s\n"
        "%s"
        "  expert pool       %s = %u slots x %s (%u of %u bundles, %.1f%%)%s\n"
        "  unused            %s\n"
        "  minimum budget    %s (%u slots)\n",
        common_format_size(p->ram_budget, b[0], 32),
        common_format_size(p->resident_bytes, b[1], 32), common_format_size(p->kv_bytes, b[2], 32),
        common_format_size(p->act_bytes, b[3], 32), common_format_size(p->io_bytes, b[4], 32),
        common_format_size(p->base_bytes, b[5], 32), staging,
        common_format_size(p->pool_bytes, b[6], 32), p->n_slots,
        common_format_size(p->slot_bytes, b[7], 32), p->n_slots, p->n_bundles, share,
        p->n_slots == p->n_bundles ? ": every expert fits" : "",
        common_format_size(p->ram_budget > used ? p->ram_budget - used : 0, b[8], 32),
        common_format_size(p->min_budget, b[9], 32), p->min_slots);
}
