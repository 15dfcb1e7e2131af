/* tests/support/fixture.h - locating ../shared/fixtures files and running the CLI from tests. */
#ifndef TESTS_SUPPORT_FIXTURE_H
#define TESTS_SUPPORT_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

/* Returns a malloc'd absolute path of fixture `rel` (e.g. "moe-tiny/moe-tiny-f32.gguf"), or NULL
 * when the fixture directory or the file is missing (SLUICE_FIXTURES overrides the directory). */
char *fixture_path(const char *rel);

/* Skips the running Criterion test with a visible message when the fixture is missing; otherwise
 * returns its malloc'd path. */
#define FIXTURE_OR_SKIP(var, rel)                                                                  \
    char *var = fixture_path(rel);                                                                 \
    if (!var)                                                                                      \
    cr_skip_test("fixture %s not found (../shared/fixtures absent): skipped", rel)

/* Reads a whole file into a malloc'd buffer (NUL-terminated); returns NULL on failure. */
char *fixture_read_all(const char *path, size_t *len);

/* Runs `cmd` with /bin/sh and returns everything it wrote to stdout (malloc'd, NUL-terminated),
 * and in *status its exit status (-1 when a signal ended it). NULL when popen or malloc failed. */
char *fixture_run(const char *cmd, int *status);

/* Forks a peer process joined to this one by a Unix stream socket: the child runs fn(its end)
 * and exits with what fn returns (0 = pass); the parent gets its end in *sock and the child's
 * pid, or -1 when socketpair or fork failed. */
int fixture_fork_peer(int (*fn)(int sock), int *sock);

/* Creates a fresh temporary directory and returns its malloc'd path. */
char *fixture_tmpdir(void);

/* Removes a directory tree made by fixture_tmpdir(). */
void fixture_rmtree(const char *dir);

/* Copies the F32 GGUF model `src` to `dst` with every routed expert weight rounded to a multiple
 * of 1/64: a model whose expert bundles LZ4 compresses (as it does weights with few distinct
 * values), for QSF's LZ4 path. Returns 0, or -1 (src not F32 experts, or an I/O error). */
int fixture_write_coarse_experts(const char *src, const char *dst);

/* Writes the one-file GGUF model `src` as two splits by layer, as llama.cpp's gguf-split does:
 * `dir1`/STEM-00001-of-00002.gguf with the metadata, the tensors outside blocks and those of the
 * first half of the layers, `dir2`/STEM-00002-of-00002.gguf with the rest, and a symlink to the
 * second beside the first (where a split is looked for). The first split's path goes to `first`
 * (len bytes). Returns 0, or -1. */
int fixture_split_gguf_by_layer(const char *src, const char *dir1, const char *dir2,
                                const char *stem, char *first, size_t len);

/* Flips one bit of byte 100 of every expert bundle of `layer` in the QSF file `path`, so that
 * each fails its checksum. Returns how many bundles were changed (0: none, or an error). */
int fixture_flip_bundles(const char *path, uint32_t layer);

#endif /* TESTS_SUPPORT_FIXTURE_H */
