/* tests/support/fixture.c - locating fixture files, reading them, temporary directories. */
#include "fixture.h"

#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

char *fixture_path(const char *rel)
{
    const char *dir = getenv("SLUICE_FIXTURES");
    if (!dir || !*dir)
        dir = SLUICE_FIXTURES_DIR;
    size_t n = strlen(dir) + strlen(rel) + 2;
    char  *p = malloc(n);
    if (!p)
        return NULL;
    snprintf(p, n, "%s/%s", dir, rel);
    struct stat st;
    if (stat(p, &st) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

char *fixture_read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long sz = ftell(f);
    rewind(f);
    char *buf = sz >= 0 ? malloc((size_t)sz + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)sz, f) != (size_t)sz) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[sz] = '\0';
    if (len)
        *len = (size_t)sz;
    return buf;
}

char *fixture_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    size_t n = strlen(base) + 32;
    char  *p = malloc(n);
    if (!p)
        return NULL;
    snprintf(p, n, "%s/sluice-test-XXXXXX", base);
    if (!mkdtemp(p)) {
        free(p);
        return NULL;
    }
    return p;
}

void fixture_rmtree(const char *dir)
{
    if (!dir)
        return;
    size_t n = strlen(dir) + 16;
    char  *cmd = malloc(n);
    if (!cmd)
        return;
    snprintf(cmd, n, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "fixture_rmtree: could not remove %s\n", dir);
    free(cmd);
}

char *fixture_run(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    if (!p)
        return NULL;
    size_t cap = 1 << 16, len = 0, r;
    char  *out = malloc(cap);
    while (out && (r = fread(out + len, 1, cap - len - 1, p)) > 0) {
        len += r;
        if (cap - len < 4096) {
            char *grown = realloc(out, cap * 2);
            if (!grown) {
                free(out);
                out = NULL;
                break;
            }
            out = grown;
            cap *= 2;
        }
    }
    int st = pclose(p);
    if (out)
        out[len] = '\0';
    *status = st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* The layer of a tensor named blk.N.*, or -1. */
static long fixture_tensor_layer(const char *name)
{
    char *end;
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    long n = strtol(name + 4, &end, 10);
    return end != name + 4 && *end == '.' ? n : -1;
}

int fixture_split_gguf_by_layer(const char *src, const char *dir1, const char *dir2,
                                const char *stem, char *first, size_t len)
{
    struct common_gguf        *g = NULL;
    struct common_gguf_writer *w[2] = {NULL, NULL};
    char                       path[2][1024];
    int                        rc = -1;
    void                      *buf = NULL;
    long                       n_layer = 0;
    snprintf(path[0], sizeof(path[0]), "%s/%s-00001-of-00002.gguf", dir1, stem);
    snprintf(path[1], sizeof(path[1]), "%s/%s-00002-of-00002.gguf", dir2, stem);
    if (common_gguf_open(src, NULL, &g, NULL) != COMMON_OK)
        goto out;
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const long l = fixture_tensor_layer(common_gguf_tensor_at(g, i)->name);
        n_layer = l + 1 > n_layer ? l + 1 : n_layer;
    }
    int32_t count[2] = {0, 0};
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++)
        count[fixture_tensor_layer(common_gguf_tensor_at(g, i)->name) >= n_layer / 2]++;
    for (int k = 0; k < 2; k++) {
        if (common_gguf_writer_create(&w[k], (uint32_t)common_gguf_alignment(g)) != COMMON_OK)
            goto out;
        for (uint64_t i = 0; k == 0 && i < common_gguf_n_kv(g); i++)
            if (common_gguf_writer_copy_kv(w[k], common_gguf_kv_at(g, i)) != COMMON_OK)
                goto out;
        if (common_gguf_writer_set_u32(w[k], "split.no", (uint32_t)k) != COMMON_OK ||
            common_gguf_writer_set_u32(w[k], "split.count", 2) != COMMON_OK ||
            common_gguf_writer_set_i32(w[k], "split.tensors.count", count[0] + count[1]) !=
                COMMON_OK)
            goto out;
    }
    for (int k = 0; k < 2; k++) {
        for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
            const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
            if ((fixture_tensor_layer(t->name) >= n_layer / 2) == (k == 1) &&
                common_gguf_writer_add_tensor(w[k], t->name, t->type, t->n_dims, t->ne) !=
                    COMMON_OK)
                goto out;
        }
        if (common_gguf_writer_begin(w[k], path[k], NULL) != COMMON_OK)
            goto out;
        for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
            const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
            struct common_span s = {.split = t->split, .offset = t->offset, .size = t->size};
            if ((fixture_tensor_layer(t->name) >= n_layer / 2) != (k == 1))
                continue;
            free(buf);
            if (!(buf = malloc(t->size ? t->size : 1)) ||
                common_gguf_read_span(g, &s, buf, NULL) != COMMON_OK ||
                common_gguf_writer_write_data(w[k], buf, t->size, NULL) != COMMON_OK)
                goto out;
        }
        if (common_gguf_writer_finish(w[k], NULL) != COMMON_OK)
            goto out;
    }
    char link[1024];
    snprintf(link, sizeof(link), "%s/%s-00002-of-00002.gguf", dir1, stem);
    if (strcmp(dir1, dir2) != 0 && symlink(path[1], link) != 0)
        goto out;
    snprintf(first, len, "%s", path[0]);
    rc = 0;
out:
    free(buf);
    common_gguf_writer_destroy(w[0]);
    common_gguf_writer_destroy(w[1]);
    common_gguf_close(g);
    return rc;
}

int fixture_write_coarse_experts(const char *src, const char *dst)
{
    struct common_gguf        *g = NULL;
    struct common_gguf_writer *w = NULL;
    int                        rc = -1;
    float                     *buf = NULL;
    if (common_gguf_open(src, NULL, &g, NULL) != COMMON_OK ||
        common_gguf_writer_create(&w, (uint32_t)common_gguf_alignment(g)) != COMMON_OK)
        goto out;
    for (uint64_t i = 0; i < common_gguf_n_kv(g); i++)
        if (common_gguf_writer_copy_kv(w, common_gguf_kv_at(g, i)) != COMMON_OK)
            goto out;
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        if (common_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne) != COMMON_OK)
            goto out;
    }
    if (common_gguf_writer_begin(w, dst, NULL) != COMMON_OK)
        goto out;
    for (uint64_t i = 0; i < common_gguf_n_tensors(g); i++) {
        const struct common_gguf_tensor *t = common_gguf_tensor_at(g, i);
        struct common_span s = {.split = t->split, .offset = t->offset, .size = t->size};
        free(buf);
        if (!(buf = malloc(t->size ? t->size : 1)) ||
            common_gguf_read_span(g, &s, buf, NULL) != COMMON_OK)
            goto out;
        if (strstr(t->name, "_exps.weight")) {
            if (t->type != COMMON_GGML_TYPE_F32)
                goto out;
            for (uint64_t k = 0; k < t->size / sizeof(float); k++)
                buf[k] = roundf(buf[k] * 64.0f) / 64.0f;
        }
        if (common_gguf_writer_write_data(w, buf, t->size, NULL) != COMMON_OK)
            goto out;
    }
    rc = common_gguf_writer_finish(w, NULL) == COMMON_OK ? 0 : -1;
out:
    free(buf);
    common_gguf_writer_destroy(w);
    common_gguf_close(g);
    return rc;
}

int fixture_flip_bundles(const char *path, uint32_t layer)
{
    struct common_gguf *g = NULL;
    if (common_gguf_open(path, NULL, &g, NULL) != COMMON_OK)
        return 0;
    FILE *f = fopen(path, "r+b");
    int   n = 0;
    for (uint32_t x = 0; f; x++) {
        struct common_qsf_bundle b;
        if (common_gguf_bundle(g, layer, x, &b) != COMMON_OK)
            break;
        int c;
        if (fseek(f, (long)(b.offset + 100), SEEK_SET) != 0 || (c = fgetc(f)) == EOF ||
            fseek(f, (long)(b.offset + 100), SEEK_SET) != 0 || fputc(c ^ 0x40, f) == EOF) {
            n = 0;
            break;
        }
        n++;
    }
    if (f && fclose(f) != 0)
        n = 0;
    common_gguf_close(g);
    return n;
}

int fixture_fork_peer(int (*fn)(int sock), int *sock)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    if (pid == 0) {
        close(sv[0]);
        _exit(fn(sv[1]));
    }
    close(sv[1]);
    *sock = sv[0];
    return (int)pid;
}
