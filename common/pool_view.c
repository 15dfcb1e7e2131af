/* common/pool_view.c - the expert pool segment's layout and its seqlock reader side. */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"

static uint64_t pool_align_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

int common_pool_layout(struct common_pool_hdr *h)
{
    uint64_t n_keys, table, index, data;
    if (!common_mul_u64((uint64_t)h->n_layer * h->n_expert, COMMON_POOL_BUNDLE + 1, &n_keys) ||
        !common_mul_u64(h->n_slots, h->slot_bytes, &data) ||
        !common_mul_u64(n_keys, sizeof(uint32_t), &index))
        return COMMON_EINVAL;
    h->table_off = pool_align_up(sizeof(struct common_pool_hdr), 64);
    table = (uint64_t)h->n_slots * sizeof(struct common_pool_slot);
    h->index_off = h->table_off + table;
    h->data_off = pool_align_up(h->index_off + index, COMMON_POOL_ALIGN);
    if (!common_add_u64(h->data_off, data, &h->segment_bytes))
        return COMMON_EINVAL;
    return COMMON_OK;
}

bool common_pool_key_ok(const struct common_pool_view *v, const struct common_pool_key *k)
{
    return k->layer < v->n_layer && k->expert < v->n_expert && k->part <= COMMON_POOL_BUNDLE;
}

uint64_t common_pool_key_index(const struct common_pool_view *v, const struct common_pool_key *k)
{
    return ((uint64_t)k->layer * v->n_expert + k->expert) * (COMMON_POOL_BUNDLE + 1) + k->part;
}

void common_pool_view_bind(struct common_pool_view *v, uint8_t *base, uint64_t map_bytes)
{
    v->base = base;
    v->map_bytes = map_bytes;
    v->map_owned = false;
    v->hdr = (struct common_pool_hdr *)(void *)base;
    v->slots = (struct common_pool_slot *)(void *)(base + v->hdr->table_off);
    v->index = (_Atomic uint32_t *)(void *)(base + v->hdr->index_off);
    v->data = base + v->hdr->data_off;
    v->n_slots = v->hdr->n_slots;
    v->n_layer = v->hdr->n_layer;
    v->n_expert = v->hdr->n_expert;
    v->slot_bytes = v->hdr->slot_bytes;
}

int common_pool_view_attach(int fd, struct common_pool_view *v, struct common_errmsg *e)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return common_errmsg_set(e, COMMON_EIO, "pool attach: fstat failed: %s", strerror(errno));
    if (st.st_size < 0 || (uint64_t)st.st_size < sizeof(struct common_pool_hdr))
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "pool attach: segment of %lld bytes is smaller than its header",
                                 (long long)st.st_size);
    struct common_pool_hdr h;
    if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
        return common_errmsg_set(e, COMMON_EIO, "pool attach: header read failed");
    if (h.magic != COMMON_POOL_MAGIC)
        return common_errmsg_set(e, COMMON_ECORRUPT, "pool attach: bad magic 0x%08x", h.magic);
    if (h.version != COMMON_POOL_VERSION)
        return common_errmsg_set(e, COMMON_ECORRUPT, "pool attach: version %u, expected %u",
                                 h.version, COMMON_POOL_VERSION);
    struct common_pool_hdr want = h;
    if (h.slot_bytes == 0 || h.slot_bytes % COMMON_POOL_ALIGN != 0 || h.n_slots == 0 ||
        h.n_slots >= COMMON_POOL_NO_SLOT - 1 || h.n_layer == 0 || h.n_expert == 0 ||
        common_pool_layout(&want) != COMMON_OK || want.table_off != h.table_off ||
        want.index_off != h.index_off || want.data_off != h.data_off ||
        want.segment_bytes != h.segment_bytes)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "pool attach: inconsistent layout (slot_bytes %llu, n_slots %u)",
                                 (unsigned long long)h.slot_bytes, h.n_slots);
    if (h.segment_bytes > (uint64_t)st.st_size || h.segment_bytes > (uint64_t)SIZE_MAX)
        return common_errmsg_set(e, COMMON_ECORRUPT,
                                 "pool attach: header says %llu bytes, segment has %lld",
                                 (unsigned long long)h.segment_bytes, (long long)st.st_size);
    void *base = mmap(NULL, (size_t)h.segment_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
        return common_errmsg_set(e, COMMON_EIO, "pool attach: mmap failed: %s", strerror(errno));
    /* Bind on the copy checked above, not on the mapped header another process may change. */
    struct common_pool_view nv = {
        .base = base,
        .map_bytes = h.segment_bytes,
        .map_owned = true,
        .hdr = base,
        .slots = (struct common_pool_slot *)(void *)((uint8_t *)base + h.table_off),
        .index = (_Atomic uint32_t *)(void *)((uint8_t *)base + h.index_off),
        .data = (uint8_t *)base + h.data_off,
        .n_slots = h.n_slots,
        .n_layer = h.n_layer,
        .n_expert = h.n_expert,
        .slot_bytes = h.slot_bytes,
    };
    *v = nv;
    return COMMON_OK;
}

void common_pool_view_detach(struct common_pool_view *v)
{
    if (v->map_owned && v->base)
        munmap(v->base, (size_t)v->map_bytes);
    memset(v, 0, sizeof(*v));
}

uint32_t common_pool_n_slots(const struct common_pool_view *v)
{
    return v->n_slots;
}

uint64_t common_pool_slot_bytes(const struct common_pool_view *v)
{
    return v->slot_bytes;
}

uint8_t *common_pool_slot_data(const struct common_pool_view *v, uint32_t slot)
{
    return v->data + (uint64_t)slot * v->slot_bytes;
}

int common_pool_read_begin(const struct common_pool_view *v, const struct common_pool_key *key,
                           uint32_t part, struct common_pool_loan *out)
{
    if (!common_pool_key_ok(v, key) || part > COMMON_POOL_WHOLE)
        return COMMON_EINVAL;
    /* Acquire: pairs with the writer's release store of the index at a claim or an unindex. */
    uint32_t s_plus_1 =
        atomic_load_explicit(&v->index[common_pool_key_index(v, key)], memory_order_acquire);
    if (s_plus_1 == 0 || s_plus_1 > v->n_slots)
        return COMMON_ENOENT;
    const struct common_pool_slot *s = &v->slots[s_plus_1 - 1];
    /* Acquire: pairs with the writer's release increments of gen. */
    uint32_t gen = atomic_load_explicit(&s->gen, memory_order_acquire);
    /* Acquire: pairs with the writer's release store of READY when a load completes. */
    if (atomic_load_explicit(&s->state, memory_order_acquire) != COMMON_POOL_SLOT_READY ||
        s->layer != key->layer || s->expert != key->expert || s->part != key->part)
        return COMMON_ENOENT;
    uint64_t off = 0, size = v->slot_bytes;
    if (part < COMMON_EXPERT_PART_COUNT) {
        off = s->part_off[part];
        size = s->part_size[part];
        if (off > v->slot_bytes || size > v->slot_bytes - off)
            return COMMON_ENOENT; /* torn read of a slot being reused */
    }
    out->slot = s_plus_1 - 1;
    out->gen = gen;
    out->data = common_pool_slot_data(v, s_plus_1 - 1) + off;
    out->size = size;
    return COMMON_OK;
}

bool common_pool_loan_is_valid(const struct common_pool_view *v, const struct common_pool_loan *l)
{
    if (l->slot >= v->n_slots)
        return false;
    /* Acquire: pairs with the writer's release increments of gen (claim, free). */
    return atomic_load_explicit(&v->slots[l->slot].gen, memory_order_acquire) == l->gen;
}

bool common_pool_read_valid(const struct common_pool_view *v, const struct common_pool_loan *l)
{
    /* Acquire fence: the reader's loads of slot bytes happen before the generation re-check
     * (the seqlock read side); pairs with the writer's release fence after it moves gen. */
    atomic_thread_fence(memory_order_acquire);
    return common_pool_loan_is_valid(v, l);
}

uint64_t common_pool_evictions(const struct common_pool_view *v)
{
    /* Acquire: pairs with the writer's release increment when it evicts a READY slot. */
    return atomic_load_explicit(&v->hdr->evictions, memory_order_acquire);
}
