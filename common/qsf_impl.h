/* common/qsf_impl.h - private to common/: QSF's on-disk layout, shared by the reader (qsf.c) and
 * the writer (qsf_write.c). docs/qsf.md describes the same bytes for readers of the format. */
#ifndef COMMON_QSF_IMPL_H
#define COMMON_QSF_IMPL_H

#include <stdint.h>

#include "common.h"

/* The header: QSF_HEADER_BYTES at offset 0, alone in the first 4 KiB page; every field
 * little-endian; header_hash (at 120) is the XXH3-64 of bytes [0, 120). */
#define QSF_HEADER_BYTES  128u
#define QSF_HEADER_HASHED 120u
#define QSF_HASH_XXH3     2u /* XXH3_64bits, seed 0 (libxxhash, dispatched to AVX2/AVX-512) */

struct qsf_header {
    uint32_t magic;       /*   0: COMMON_QSF_MAGIC */
    uint32_t version;     /*   4: COMMON_QSF_VERSION */
    uint32_t hash_kind;   /*   8: QSF_HASH_XXH3 */
    uint32_t flags;       /*  12: 0 */
    uint64_t meta_off;    /*  16: the embedded GGUF image (metadata and tensor infos) */
    uint64_t meta_len;    /*  24: its bytes, padded so its data section starts at meta_len */
    uint64_t meta_virt;   /*  32: bytes the image's tensor infos lay out after it */
    uint64_t index_off;   /*  40 */
    uint64_t index_len;   /*  48 */
    uint64_t data_off;    /*  56: resident tensors, at their image offsets */
    uint64_t data_len;    /*  64 */
    uint64_t bundles_off; /* 72 */
    uint64_t bundles_len; /* 80 */
    uint32_t n_layer;     /*  88: bundle rows */
    uint32_t n_expert;    /*  92: bundles per row */
    uint64_t meta_hash;   /*  96: XXH3-64 of the image */
    uint64_t index_hash;  /* 104: XXH3-64 of the index */
    /* 112: 8 reserved zero bytes */
    uint64_t header_hash; /* 120 */
};

/* Bundle files (`sluice convert --shards N`): the metadata key QSF_KEY_FILES lists their paths
 * (relative ones to the main file's directory); file k (1..N) starts with a header of
 * QSF_HEADER_BYTES in its first 4 KiB page: magic QSF_BFILE_MAGIC (u32 at 0), version (4), k
 * (8), N (12), the main file's index checksum (u64 at 16, binding the two), its size (24), and
 * at 120 the XXH3-64 of bytes [0, 120). Its bundles follow from offset 4096. */
#define QSF_KEY_FILES   "qsf.bundle_files"
#define QSF_BFILE_MAGIC 0x42465351u /* "QSFB" */
#define QSF_MAX_FILES   64u

/* The index: n_tensors (u64), n_bundles (u64), then a tensor record per image tensor, then
 * n_layer * n_expert bundle records, layer-major. */
#define QSF_INDEX_HEAD 16u
#define QSF_TREC_BYTES 24u /* kind u32, layer u32, part u32, 0 u32, hash u64 */
#define QSF_BREC_BYTES 40u /* offset u64, stored u64, raw u64, hash u64, codec u32, file u32 */

enum qsf_tensor_kind {
    QSF_TENSOR_RESIDENT = 0, /* in the data region; hash = XXH3-64 of its bytes */
    QSF_TENSOR_BUNDLED = 1,  /* expert part `part` of layer `layer`, in the bundles */
};

struct qsf_trec {
    uint32_t kind, layer, part;
    uint64_t hash;
};

/* A checksum computed over pieces (XXH3-64, the same value as common_qsf_hash of the whole). */
struct qsf_hasher;
struct qsf_hasher *qsf_hash_begin(void); /* NULL when out of memory */
void               qsf_hash_update(struct qsf_hasher *h, const void *p, size_t n);
uint64_t           qsf_hash_end(struct qsf_hasher *h); /* frees h */

/* Decodes and checks (magic, version, checksum) the header bytes at p. */
int      qsf_header_decode(const uint8_t *p, struct qsf_header *h, struct common_errmsg *e);
uint64_t qsf_align_up(uint64_t v, uint64_t a);
/* Parts' offsets in a decoded bundle from their sizes (each part 64-byte aligned), and the
 * bundle's raw bytes (up to the end of the last part). */
void qsf_part_layout(const uint64_t size[COMMON_EXPERT_PART_COUNT],
                     uint64_t off[COMMON_EXPERT_PART_COUNT], uint64_t *raw);
/* Fills b->read_off and b->buf_bytes from b->codec, b->raw and b->stored. */
void qsf_bundle_layout(struct common_qsf_bundle *b);

#endif /* COMMON_QSF_IMPL_H */
