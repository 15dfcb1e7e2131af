/* tests/fuzz/fuzz_config.c - libFuzzer target: config files, and their words through the option
 * parser. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Process singleton: a sink for the parser's messages, opened once. */
static FILE *g_null;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const sections[] = {NULL, "fetcher", "executor", "router"};
    if (size == 0)
        return 0;
    if (!g_null)
        g_null = fopen("/dev/null", "w");
    /* The first byte picks the section; the rest is the file. */
    int fd = memfd_create("fuzz-config", MFD_CLOEXEC);
    if (fd < 0)
        return 0;
    if (size > 1 && write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    char                *argv[] = {"fuzz", "--threads", "2", NULL};
    int                  out_argc = 0;
    char               **out_argv = NULL;
    struct common_errmsg e = {{0}};
    int rc = common_config_argv(path, sections[data[0] % 4], 3, argv, &out_argc, &out_argv, &e);
    close(fd);
    if (rc != COMMON_OK)
        return 0;
    /* What a daemon does with the words: one table of every value type. */
    const char                *model = NULL, *name = NULL;
    uint32_t                   threads = 0, slots = 0;
    uint64_t                   budget = 0;
    float                      temp = 0.0f;
    bool                       flag = false;
    int32_t                    seed = 0;
    uint32_t                   list_v[8];
    struct common_opt_u32_list list = {.v = list_v, .cap = 8};
    static const char *const   modes[] = {"auto", "uring", "pread", NULL};
    int                        mode = 0;
    const struct common_opt    rows[] = {
           {.name = "model", .short_name = "m", .type = COMMON_OPT_STR, .target = &model},
           {.name = "name", .type = COMMON_OPT_STR, .target = &name},
           {.name = "threads",
            .short_name = "t",
            .type = COMMON_OPT_U32,
            .target = &threads,
            .min = 1,
            .max = 256},
           {.name = "pool-slots", .type = COMMON_OPT_U32, .target = &slots},
           {.name = "ram-budget", .type = COMMON_OPT_SIZE, .target = &budget, .min = 1},
           {.name = "temp", .type = COMMON_OPT_F32, .target = &temp, .max = 100},
           {.name = "verbose", .type = COMMON_OPT_SWITCH, .target = &flag},
           {.name = "seed", .type = COMMON_OPT_I32, .target = &seed, .min = -1},
           {.name = "n-prompt", .short_name = "p", .type = COMMON_OPT_U32_LIST, .target = &list},
           {.name = "io", .type = COMMON_OPT_CHOICE, .target = &mode, .choices = modes},
           {.name = "config", .type = COMMON_OPT_STR},
           {0},
    };
    const struct common_opts_spec spec = {
        .prog = "fuzz", .opts = rows, .out = g_null, .err = g_null};
    (void)common_opts_parse(&spec, out_argc, out_argv);
    free(out_argv);
    return 0;
}
