/* tests/fuzz/fuzz_model.c - libFuzzer target: the executor's model loading on any bytes (a GGUF
 * written to a memory file, then executor_model_open: the description, the I2_S layouts told by
 * size and rebuilt, the per-tensor scales, the norms converted to f32). Nothing may read out of
 * bounds, whatever the sizes, types and shapes claim. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common.h"
#include "executor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int fd = -1;
    if (fd < 0 && (fd = memfd_create("fuzz_model", 0)) < 0)
        return 0;
    if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size)
        return 0;
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    executor_kernels_init();
    struct executor_model *m = NULL;
    struct common_errmsg   e;
    if (executor_model_open(path, NULL, &m, &e) == 0)
        executor_model_destroy(m);
    return 0;
}
