/* tests/common/test_qsf.c - QSF: conversion keeps every byte, LZ4 bundles decode to their
 * source, and flipped bytes in the header, the metadata, the index, a tensor or a bundle are
 * caught. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fixture.h"

struct qsf_pair {
    char                   *dir, *gguf_path, *qsf_path;
    struct common_gguf     *gguf, *qsf;
    struct common_model     m;  /* of gguf */
    struct common_model     mq; /* of qsf */
    struct common_qsf_stats st;
};

/* Converts `gguf_path` into DIR/model.qsf and opens both. */
static void pair_open(struct qsf_pair *p, char *gguf_path, enum common_qsf_lz4 lz4)
{
    struct common_errmsg e = {{0}};
    p->gguf_path = gguf_path;
    if (!p->dir)
        p->dir = fixture_tmpdir();
    p->qsf_path = malloc(strlen(p->dir) + 16);
    sprintf(p->qsf_path, "%s/model.qsf", p->dir);
    cr_assert_eq(common_gguf_open(gguf_path, NULL, &p->gguf, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_model_init(&p->m, p->gguf, &e), COMMON_OK, "%s", e.text);
    struct common_qsf_convert_opts o = {.lz4 = lz4};
    cr_assert_eq(common_qsf_convert(p->gguf, &p->m, p->qsf_path, &o, &p->st, &e), COMMON_OK, "%s",
                 e.text);
    cr_assert_eq(common_gguf_open(p->qsf_path, NULL, &p->qsf, &e), COMMON_OK, "%s", e.text);
    cr_assert(common_gguf_is_qsf(p->qsf));
    cr_assert(!common_gguf_is_qsf(p->gguf));
    cr_assert_eq(common_model_init(&p->mq, p->qsf, &e), COMMON_OK, "%s", e.text);
}

static void pair_close(struct qsf_pair *p)
{
    common_model_fini(&p->m);
    common_model_fini(&p->mq);
    common_gguf_close(p->gguf);
    common_gguf_close(p->qsf);
    fixture_rmtree(p->dir);
    free(p->dir);
    free(p->gguf_path);
    free(p->qsf_path);
}

static uint8_t *read_span(const struct common_gguf *g, const struct common_span *s)
{
    uint8_t *b = malloc(s->size ? s->size : 1);
    cr_assert_not_null(b);
    cr_assert_eq(common_gguf_read_span(g, s, b, NULL), COMMON_OK);
    return b;
}

/* The decoded bundle (layer, expert) of the QSF file, read and checked as the fetcher does. */
static uint8_t *read_bundle(const struct common_gguf *g, uint32_t l, uint32_t x,
                            struct common_qsf_bundle *b)
{
    cr_assert_eq(common_gguf_bundle(g, l, x, b), COMMON_OK);
    uint8_t *buf = aligned_alloc(COMMON_QSF_ALIGN, b->buf_bytes);
    cr_assert_not_null(buf);
    struct common_span s = {.split = b->file, .offset = b->offset, .size = b->stored};
    cr_assert_eq(common_gguf_read_span(g, &s, buf + b->read_off, NULL), COMMON_OK);
    struct common_errmsg e = {{0}};
    cr_assert_eq(common_qsf_bundle_finish(b, buf, &e), COMMON_OK, "layer %u expert %u: %s", l, x,
                 e.text);
    return buf;
}

/* Every kv, every resident tensor and every expert part of the QSF file equals the GGUF's. */
static void assert_same_model(struct qsf_pair *p)
{
    const struct common_gguf *g = p->gguf, *q = p->qsf;
    /* The same keys, and qsf.bundle_files where bundle files exist. */
    cr_assert_eq(common_gguf_n_kv(q), common_gguf_n_kv(g) + (common_gguf_n_splits(q) > 1));
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++) {
        const struct common_gguf_kv *a = common_gguf_kv_at(g, i);
        const struct common_gguf_kv *b = common_gguf_find(q, a->key);
        cr_assert_not_null(b, "kv %s missing", a->key);
        cr_assert_eq(a->value.type, b->value.type, "kv %s", a->key);
    }
    cr_assert_eq(common_gguf_n_tensors(q), common_gguf_n_tensors(g));
    uint64_t n_bundled = 0;
    for (uint64_t i = 0; i < common_gguf_n_tensors(q); i++) {
        const struct common_gguf_tensor *tq = common_gguf_tensor_at(q, i);
        const struct common_gguf_tensor *tg = common_gguf_tensor_find(g, tq->name);
        cr_assert_not_null(tg, "%s", tq->name);
        cr_assert_eq(tq->type, tg->type);
        cr_assert_eq(tq->size, tg->size);
        cr_assert_eq(memcmp(tq->ne, tg->ne, sizeof(tq->ne)), 0);
        if (common_gguf_tensor_bundled(q, i)) {
            n_bundled++;
            continue;
        }
        struct common_span sg = {.split = tg->split, .offset = tg->offset, .size = tg->size};
        struct common_span sq = {.split = tq->split, .offset = tq->offset, .size = tq->size};
        uint8_t           *a = read_span(g, &sg), *b = read_span(q, &sq);
        cr_assert_eq(memcmp(a, b, tg->size), 0, "tensor %s differs", tq->name);
        cr_assert_eq(common_gguf_check_tensor(q, i, b, NULL), COMMON_OK);
        free(a);
        free(b);
    }
    cr_assert_eq(n_bundled, 3u * p->m.hp.n_layer, "every layer's gate, up and down bundled");
    for (uint32_t l = 0; l < p->m.hp.n_layer; l++)
        for (uint32_t x = 0; x < p->m.hp.n_expert; x++) {
            struct common_qsf_bundle b;
            uint8_t                 *raw = read_bundle(q, l, x, &b);
            for (int part = 0; part < COMMON_EXPERT_PART_COUNT; part++) {
                struct common_span s;
                cr_assert_eq(common_model_expert_span(&p->m, l, x, part, &s), COMMON_OK);
                cr_assert_eq(b.part_size[part], s.size);
                uint8_t *want = read_span(g, &s);
                cr_assert_eq(memcmp(raw + b.part_off[part], want, s.size), 0,
                             "layer %u expert %u part %d differs", l, x, part);
                free(want);
                struct common_span sq;
                cr_assert_eq(common_model_expert_span(&p->mq, l, x, part, &sq), COMMON_OK);
                cr_assert_eq(sq.size, s.size);
                cr_assert_eq(sq.offset,
                             b.codec == COMMON_QSF_RAW ? b.offset + b.part_off[part] : UINT64_MAX);
            }
            cr_assert_eq(b.offset % COMMON_QSF_ALIGN, 0);
            free(raw);
        }
}

Test(qsf, conversion_keeps_every_byte, .timeout = 60)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_k_m.gguf");
    struct qsf_pair p = {0};
    pair_open(&p, path, COMMON_QSF_LZ4_AUTO);
    assert_same_model(&p);
    cr_assert_eq(p.st.n_bundles, 32);
    cr_assert_eq(p.st.n_lz4, 0, "quantized random-looking bytes do not compress by 10%%");
    cr_assert_eq(p.st.stored_bytes, p.st.raw_bytes);
    struct common_qsf_stats vs;
    struct common_errmsg    e = {{0}};
    cr_assert_eq(common_qsf_verify(p.qsf, NULL, NULL, &vs, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(vs.n_bundles, 32);
    cr_assert_eq(vs.n_bad, 0);
    cr_assert_eq(vs.n_tensors, p.st.n_tensors);
    cr_assert_eq(vs.resident_bytes, p.st.resident_bytes);
    struct stat sb;
    cr_assert_eq(stat(p.qsf_path, &sb), 0);
    cr_assert_eq((uint64_t)sb.st_size, p.st.file_bytes);
    /* No temporary file is left behind. */
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", p.qsf_path);
    cr_assert_neq(access(tmp, F_OK), 0);
    /* A QSF file is not converted again, and a GGUF one is not verified. */
    cr_assert_eq(common_qsf_convert(p.qsf, &p.mq, tmp, NULL, &vs, NULL), COMMON_EINVAL);
    cr_assert_eq(common_qsf_verify(p.gguf, NULL, NULL, &vs, NULL), COMMON_EINVAL);
    pair_close(&p);
}

Test(qsf, lz4_bundles_decode_to_their_source, .timeout = 120)
{
    FIXTURE_OR_SKIP(src, "moe-tiny/moe-tiny-f32.gguf");
    struct qsf_pair p = {.dir = fixture_tmpdir()};
    char           *coarse = malloc(strlen(p.dir) + 16);
    sprintf(coarse, "%s/coarse.gguf", p.dir);
    cr_assert_eq(fixture_write_coarse_experts(src, coarse), 0);
    free(src);
    pair_open(&p, coarse, COMMON_QSF_LZ4_AUTO);
    cr_assert_eq(p.st.n_lz4, p.st.n_bundles, "every coarse bundle compresses by 10%%");
    cr_assert_lt(p.st.stored_bytes * 10, p.st.raw_bytes * 9);
    assert_same_model(&p);
    struct common_qsf_stats vs;
    struct common_errmsg    e = {{0}};
    cr_assert_eq(common_qsf_verify(p.qsf, NULL, NULL, &vs, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(vs.n_lz4, p.st.n_bundles);
    /* --lz4 never stores them raw. */
    struct common_qsf_stats st;
    char                    raw_path[4096];
    snprintf(raw_path, sizeof(raw_path), "%s/raw.qsf", p.dir);
    struct common_qsf_convert_opts o = {.lz4 = COMMON_QSF_LZ4_NEVER};
    cr_assert_eq(common_qsf_convert(p.gguf, &p.m, raw_path, &o, &st, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(st.n_lz4, 0);
    cr_assert_eq(st.stored_bytes, st.raw_bytes);
    cr_assert_gt(st.file_bytes, p.st.file_bytes);
    pair_close(&p);
}

/* Bundle files in two directories: experts [0, 4) in the first, [4, 8) in the second (the
 * shards of two fetcher daemons), every byte as in the GGUF; a missing or foreign bundle file
 * is refused at open. */
Test(qsf, bundle_files_in_two_directories, .timeout = 60)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    struct qsf_pair      p = {.dir = fixture_tmpdir()};
    struct common_errmsg e = {{0}};
    char                 d1[2048], d2[2048], f2[4096], other[4096];
    snprintf(d1, sizeof(d1), "%s/ssd1", p.dir);
    snprintf(d2, sizeof(d2), "%s/ssd2", p.dir);
    cr_assert_eq(mkdir(d1, 0755), 0);
    cr_assert_eq(mkdir(d2, 0755), 0);
    const char *dirs[] = {d1, d2};
    p.gguf_path = path;
    p.qsf_path = malloc(strlen(p.dir) + 16);
    sprintf(p.qsf_path, "%s/model.qsf", p.dir);
    cr_assert_eq(common_gguf_open(path, NULL, &p.gguf, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_model_init(&p.m, p.gguf, &e), COMMON_OK, "%s", e.text);
    struct common_qsf_convert_opts o = {.n_shards = 2, .shard_dirs = dirs};
    cr_assert_eq(common_qsf_convert(p.gguf, &p.m, p.qsf_path, &o, &p.st, &e), COMMON_OK, "%s",
                 e.text);
    cr_assert_eq(common_gguf_open(p.qsf_path, NULL, &p.qsf, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_model_init(&p.mq, p.qsf, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_gguf_n_splits(p.qsf), 3);
    snprintf(f2, sizeof(f2), "%s/model-experts-00002-of-00002.qsf", d2);
    cr_assert_str_eq(common_gguf_split_path(p.qsf, 2), f2);
    for (uint32_t l = 0; l < p.m.hp.n_layer; l++)
        for (uint32_t x = 0; x < p.m.hp.n_expert; x++) {
            struct common_qsf_bundle b;
            cr_assert_eq(common_gguf_bundle(p.qsf, l, x, &b), COMMON_OK);
            cr_assert_eq(b.file, x < 4 ? 1u : 2u, "layer %u expert %u in file %u", l, x, b.file);
        }
    assert_same_model(&p);
    struct common_qsf_stats vs;
    cr_assert_eq(common_qsf_verify(p.qsf, NULL, NULL, &vs, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(vs.file_bytes, p.st.file_bytes);
    /* The second file moved away: refused, naming it. */
    snprintf(other, sizeof(other), "%s/moved.qsf", p.dir);
    cr_assert_eq(rename(f2, other), 0);
    struct common_gguf *g = NULL;
    cr_assert_eq(common_gguf_open(p.qsf_path, NULL, &g, &e), COMMON_ENOENT);
    cr_assert(strstr(e.text, f2), "%s", e.text);
    cr_assert_null(g);
    /* The first file in the place of the second: refused. */
    char f1[4096];
    snprintf(f1, sizeof(f1), "%s/model-experts-00001-of-00002.qsf", d1);
    cr_assert_eq(link(f1, f2), 0);
    cr_assert_eq(common_gguf_open(p.qsf_path, NULL, &g, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "is not bundle file 2"), "%s", e.text);
    cr_assert_eq(unlink(f2), 0);
    /* A bundle file of another model's conversion: refused. */
    FIXTURE_OR_SKIP(q8, "moe-tiny/moe-tiny-q8_0.gguf");
    struct common_gguf *g8 = NULL;
    struct common_model m8;
    cr_assert_eq(common_gguf_open(q8, NULL, &g8, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_model_init(&m8, g8, &e), COMMON_OK, "%s", e.text);
    char again[4096];
    snprintf(again, sizeof(again), "%s/again.qsf", p.dir);
    struct common_qsf_stats st2;
    cr_assert_eq(common_qsf_convert(g8, &m8, again, &o, &st2, &e), COMMON_OK, "%s", e.text);
    common_model_fini(&m8);
    common_gguf_close(g8);
    free(q8);
    snprintf(other, sizeof(other), "%s/again-experts-00002-of-00002.qsf", d2);
    cr_assert_eq(rename(other, f2), 0);
    cr_assert_eq(common_gguf_open(p.qsf_path, NULL, &g, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "another conversion"), "%s", e.text);
    pair_close(&p);
}

/* Reads the whole file at `path`. */
static uint8_t *slurp(const char *path, size_t *len)
{
    char *b = fixture_read_all(path, len);
    cr_assert_not_null(b);
    return (uint8_t *)b;
}

static void put_file(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(b, 1, len, f), len);
    fclose(f);
}

/* Opens the file at `path` with byte `at` flipped; returns the open's result and message. */
static int open_flipped(const char *path, const uint8_t *img, size_t len, size_t at,
                        struct common_gguf **g, struct common_errmsg *e)
{
    uint8_t *b = malloc(len);
    memcpy(b, img, len);
    b[at] ^= 0x5a;
    put_file(path, b, len);
    free(b);
    memset(e, 0, sizeof(*e));
    return common_gguf_open(path, NULL, g, e);
}

Test(qsf, flipped_bytes_are_caught, .timeout = 120)
{
    FIXTURE_OR_SKIP(path, "moe-tiny/moe-tiny-q4_0.gguf");
    struct qsf_pair p = {0};
    pair_open(&p, path, COMMON_QSF_LZ4_AUTO);
    size_t   len = 0;
    uint8_t *img = slurp(p.qsf_path, &len);
    char     bad[4096];
    snprintf(bad, sizeof(bad), "%s/bad.qsf", p.dir);
    struct common_gguf  *g = NULL;
    struct common_errmsg e;
    /* Any byte of the header. */
    for (size_t at = 0; at < 128; at++) {
        int rc = open_flipped(bad, img, len, at, &g, &e);
        cr_assert(rc == COMMON_ECORRUPT || rc == COMMON_ENOTSUP, "header byte %zu: rc %d", at, rc);
        cr_assert_null(g);
    }
    /* The metadata and the index. */
    const struct common_gguf_tensor *t0 = common_gguf_tensor_at(p.qsf, 0);
    uint64_t                         meta_at = COMMON_QSF_ALIGN + 40;
    cr_assert_eq(open_flipped(bad, img, len, meta_at, &g, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "metadata checksum"), "%s", e.text);
    cr_assert_eq(open_flipped(bad, img, len, len - 20, &g, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "index checksum"), "%s", e.text);
    /* A resident tensor: the file opens, verify names the tensor. */
    cr_assert_eq(open_flipped(bad, img, len, t0->offset + 3, &g, &e), COMMON_OK, "%s", e.text);
    struct common_qsf_stats vs;
    cr_assert_eq(common_qsf_verify(g, NULL, NULL, &vs, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, t0->name), "%s", e.text);
    cr_assert_eq(vs.n_bad, 1);
    common_gguf_close(g);
    /* A bundle: verify names the layer and the expert, the fetcher's check fails. */
    struct common_qsf_bundle b;
    cr_assert_eq(common_gguf_bundle(p.qsf, 2, 5, &b), COMMON_OK);
    cr_assert_eq(open_flipped(bad, img, len, b.offset + b.stored / 2, &g, &e), COMMON_OK);
    cr_assert_eq(common_qsf_verify(g, NULL, NULL, &vs, &e), COMMON_ECORRUPT);
    cr_assert(strstr(e.text, "layer 2 expert 5"), "%s", e.text);
    cr_assert(strstr(e.text, "checksum"), "%s", e.text);
    cr_assert_eq(vs.n_bad, 1);
    cr_assert_eq(vs.n_bundles, 32);
    uint8_t *buf = aligned_alloc(COMMON_QSF_ALIGN, b.buf_bytes);
    memcpy(buf + b.read_off, img + b.offset, b.stored);
    buf[b.read_off + b.stored / 2] ^= 0x5a;
    cr_assert_eq(common_qsf_bundle_finish(&b, buf, &e), COMMON_ECORRUPT);
    free(buf);
    common_gguf_close(g);
    /* A file cut short anywhere is refused by the parser (the index is at the end). */
    for (size_t cut = 0; cut < len; cut += len / 97 + 1) {
        struct common_gguf *h = NULL;
        cr_assert_neq(common_qsf_parse(img, cut, &h, NULL), COMMON_OK, "cut at %zu", cut);
        cr_assert_null(h);
    }
    struct common_gguf *whole = NULL;
    cr_assert_eq(common_qsf_parse(img, len, &whole, &e), COMMON_OK, "%s", e.text);
    cr_assert_eq(common_gguf_n_tensors(whole), common_gguf_n_tensors(p.qsf));
    common_gguf_close(whole);
    free(img);
    pair_close(&p);
}
