/* executor/cuda/gpu.h - the device backends' C face: device selection, memory, and the kernels
 * of the forward pass. Two backends implement it (struct gpu_backend, at the end): CUDA's (the
 * .cu files of executor/cuda/; absent in a build without CUDA, executor/gpu_none.c) and the
 * host's (executor/gpu_host.c: every operation on the CPU, in host memory, written as plainly
 * as the scalar references, so that executor/gpu.c's forward pass runs and is tested without a
 * device), and the CPU's (executor/gpu_cpu.c: the host's, with the int8 products on the CPU's
 * own kernels and threads). The functions below call the backend of the calling thread's current
 * device (executor/gpu_backend.c): the CPU device's (GPU_DEV_CPU, the CPU's backend) when it is
 * that one, else the process's: the host's when SLUICE_GPU_BACKEND=host is in the environment, the
 * CPU's when it is "cpu", "none" gives none, otherwise CUDA's when built. Without one, gpu_built()
 * is false, gpu_device_count() is 0 and everything else fails but on the CPU device.
 *
 * Pointers named "device" are device memory from gpu_malloc. A thread works on one device at a
 * time, its current one (gpu_select or gpu_use; device 0 before either): memory it allocates is
 * that device's, and every kernel it queues runs on that device's one stream, in call order; a
 * call returns once the work is queued.
 * Kernel calls return 0, or -1 after recording the CUDA error (gpu_last_error). Sizes are in
 * elements unless named bytes; "stride" is the distance between rows in elements. */
#ifndef EXECUTOR_CUDA_GPU_H
#define EXECUTOR_CUDA_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "common.h" /* C linkage in the .cu files too, as common/ is C */

#define GPU_MATVEC_MAX_N 8 /* most activation rows of one gpu_matvec call */

struct gpu_info {
    char   name[128];
    int    cc_major, cc_minor; /* compute capability */
    int    n_sm;
    size_t total_bytes, free_bytes; /* device memory */
};

/* ---- device and memory (executor/cuda/device.cu) ------------------------------------------ */

/* Whether the process has a backend (a build with CUDA, or the host's chosen). */
bool gpu_built(void);
/* Its name, as devices are named ("CUDA" for CUDA0.., "HOST"); "CUDA" when there is none. */
const char *gpu_backend_name(void);
/* Usable devices; 0 with `why` saying why not (built without CUDA, no driver, no device). */
int gpu_device_count(char *why, size_t why_len);
#define GPU_MAX_DEVICES 16 /* devices a process may use at once (CUDA0..CUDA15) */
/* The CPU device, in every build and beside the process's backend's devices: the CPU's kernels
 * (executor/gpu_cpu.c) over host memory, which gpu_select and gpu_use take as any device. A
 * forward pass may run some layers on it and the others on a GPU (executor/gpu.c). */
#define GPU_DEV_CPU GPU_MAX_DEVICES
/* Device dev's name ("CUDA0", "HOST1", "CPU") in buf, which it returns. */
const char *gpu_device_name(int dev, char *buf, size_t len);
/* Makes device `dev` current for the calling thread, creates its streams (once) and fills
 * `info`. Returns 0 or -1 with the reason in `why`. */
int gpu_select(int dev, struct gpu_info *info, char *why, size_t why_len);
/* Makes device `dev`, selected before (by any thread), current for the calling thread: cheap,
 * for each step of a forward pass over several devices. 0, or -1 (error recorded). */
int gpu_use(int dev);
/* The calling thread's current device. */
int gpu_current(void);
/* The last CUDA error recorded by a call of this interface, as one line ("" if none). */
const char *gpu_last_error(void);

/* Whether the backend's int8 products (gpu_matvec_q8, gpu_matvec_ids_q8 ...) take any number of
 * activation rows at the speed of a matmul (the CPU's): then gpu.c sends every step through them,
 * a prefill too, and gpu_matvec_q8's n has no bound. False for CUDA and the host's. */
bool gpu_matvec_any_rows(void);
/* The threads that the kernels the calling thread queues from now on may use, where they run on
 * the CPU (the CPU backend): pool (borrowed, used by this thread alone while it queues), or NULL
 * for the calling thread alone. Others ignore it. */
struct executor_threadpool;
void gpu_threads(struct executor_threadpool *pool);
/* Whether the backend's kernels read host memory as device memory, so that weights which stay
 * in host memory (the model's) are used where they are, not copied (the CPU backend). False for
 * CUDA and for the host's, which copies as CUDA does. */
bool gpu_weights_in_place(void);
/* gpu_weights_in_place of the process's backend (its devices 0..), whatever the thread's. */
bool gpu_backend_in_ram(void);
/* Whether the attention kernels keep their scores in memory of their own (per thread, the
 * CPU's): their `scratch` argument is then not used and may be as small as one float. */
bool gpu_attention_own_scratch(void);

void *gpu_malloc(size_t bytes); /* device memory, NULL (error recorded) when it cannot */
void  gpu_free(void *p);        /* accepts NULL */
int   gpu_upload(void *dst_device, const void *src_host, size_t bytes);
int   gpu_download(void *dst_host, const void *src_device, size_t bytes); /* waits for the stream */
/* gpu_upload without the wait: the copy is queued on the kernel stream and the call returns at
 * once. src_host must lie in memory registered by gpu_host_register (the host backend refuses
 * other memory; CUDA would copy it synchronously) and stay unchanged until the stream has passed
 * the copy (a gpu_sync, gpu_download or event after it). Not during a graph capture. */
int   gpu_upload_queued(void *dst_device, const void *src_host, size_t bytes);
int   gpu_memset(void *dst_device, int byte, size_t bytes);
int   gpu_sync(void); /* waits for every queued kernel; 0 or -1 (a kernel failed) */
/* Device memory bandwidth in bytes/s: the best of several device-to-device copies of `bytes`,
 * counting bytes read and written; 0 when it could not be measured. */
double gpu_membw_probe(size_t bytes);

/* SLUICE_GPU_PROFILE (gpu_backend.c): with it set, every operation below waits for the device
 * before and after it and its time goes to a table printed at exit. A region of other code is
 * timed the same way between t0 = gpu_prof_begin() (0 when not profiling) and
 * gpu_prof_end(t0, name, rc), which returns rc. */
uint64_t gpu_prof_begin(void);
int      gpu_prof_end(uint64_t t0, const char *name, int rc);

/* ---- copies beside the kernels (executor/cuda/device.cu) ---------------------------------- */
/* A second stream, the copy stream, carries host-to-device copies beside the kernels' stream.
 * Events order the two: kernels queued after gpu_stream_wait(ev) run once the copies queued
 * before gpu_event_record_copy(ev) are done; copies queued after gpu_copy_wait(ev) start once the
 * kernels queued before gpu_event_record_kernels(ev) are. An event never recorded is done. The
 * host backend runs its copy stream on a thread (its kernels run in the caller, so their events
 * are done when recorded, and gpu_stream_wait blocks the caller). */
struct gpu_event;
struct gpu_event *gpu_event_new(void);                  /* NULL (error recorded) when it cannot */
void              gpu_event_free(struct gpu_event *ev); /* accepts NULL */
/* Queues a copy on the copy stream; src must stay as it is until an event recorded on the copy
 * stream after it is done (gpu_event_sync). */
int gpu_copy_async(void *dst_device, const void *src_host, size_t bytes);
int gpu_event_record_copy(struct gpu_event *ev);
int gpu_event_record_kernels(struct gpu_event *ev);
int gpu_stream_wait(struct gpu_event *ev); /* the kernels queued next wait for ev */
int gpu_copy_wait(struct gpu_event *ev);   /* the copies queued next wait for ev */
int gpu_event_sync(struct gpu_event *ev);  /* the host waits for ev */
/* Events of shared device memory (common.h: common_devmem_event, made by another process or this
 * one): gpu_stream_wait_shared makes the kernels queued next wait for ev, as gpu_stream_wait for
 * a copy's event; gpu_event_record_kernels_shared records ev after the kernels queued so far, so
 * that the process filling the memory they read copies over it only once they are done. The
 * backend and device must be those common_devmem_open chose (the host's emulation with the host
 * backend; CUDA with CUDA, on the same device). Both return 0 or -1 (a device error recorded);
 * gpu_stream_wait_shared also -2 where the backend knows the process recording ev died before its
 * record was done (the host's emulation: its kernels wait at once), so that its copies may not
 * have happened: no device error. */
struct common_devmem_event;
int gpu_stream_wait_shared(struct common_devmem_event *ev);
int gpu_event_record_kernels_shared(struct common_devmem_event *ev);
/* Registers host memory [p, p + bytes) as pinned (page-locked, mapped for the device), so that
 * copies from it are DMA'd without staging and gpu_copy_async returns at once; read_only: it is
 * mapped without write access (CUDA: cudaHostRegisterReadOnly). 0, or -1 (error recorded: the
 * memory stays pageable and copies still work). gpu_host_unregister(p) undoes a registration
 * (before the memory is unmapped). The host backend checks them as CUDA would: the range must
 * be mapped and overlap no registration, and an unregistration must name one. */
int  gpu_host_register(const void *p, size_t bytes, bool read_only);
void gpu_host_unregister(const void *p);
/* Device address space reserved once and backed by memory piece by piece, on demand (CUDA's
 * virtual memory management: cuMemAddressReserve, then cuMemCreate, cuMemMap and cuMemSetAccess
 * per piece). gpu_va_granularity: the size pieces and reservations are multiples of; 0 where
 * the backend or the driver cannot (SLUICE_NO_VMM=1 says so too): allocate plainly instead.
 * gpu_va_reserve: `bytes` of address space (a multiple of it), or NULL (error recorded);
 * gpu_va_map backs [at, at + bytes) inside it with device memory (0, or -1: out of memory, error
 * recorded); gpu_va_unmap gives a mapping's memory back (exactly as mapped); gpu_va_free gives
 * the address space back (nothing mapped in it any more). The host backend reserves with
 * mmap(PROT_NONE) and maps by mprotect, in 64 KiB pieces, so that a read of a piece never mapped
 * faults there as it would on the device. */
size_t gpu_va_granularity(void);
void  *gpu_va_reserve(size_t bytes);
int    gpu_va_map(void *at, size_t bytes);
void   gpu_va_unmap(void *at, size_t bytes);
void   gpu_va_free(void *base, size_t bytes);
/* Nanoseconds the copy stream spent copying, and the kernels spent waiting in gpu_stream_wait,
 * since the process started (CUDA: timing events around each copy and wait, counted once both
 * are done); false when the backend cannot measure them. */
bool gpu_copy_times(uint64_t *busy_ns, uint64_t *stall_ns);

/* ---- graphs (executor/cuda/device.cu) ---------------------------------------------------- */
/* The kernels queued between gpu_graph_begin and gpu_graph_end are recorded, not run (a CUDA
 * graph); gpu_graph_launch runs them all again with one call, without the launch gaps between
 * them, each with the arguments it was queued with, over device memory as it is then. Nothing
 * else may use the device between begin and end (no copies, no syncs: the capture fails). The
 * host backend records the calls and makes them again. A backend without graphs would say so in
 * gpu_graphs_supported. */
struct gpu_graph;
bool gpu_graphs_supported(void);
int  gpu_graph_begin(void);
/* Ends the capture: *graph is made (or remade in place); -1 when the capture failed (the
 * kernels queued meanwhile are dropped, *graph unchanged). */
int  gpu_graph_end(struct gpu_graph **graph);
int  gpu_graph_launch(struct gpu_graph *graph);
void gpu_graph_free(struct gpu_graph *graph); /* accepts NULL */

/* ---- weights: dequantize, matvec, matmul (executor/cuda/quant.cu) ------------------------- */
/* `type` is enum common_ggml_type; the types supported are F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4, TQ1_0, TQ2_0 and the three I2_S layouts I2S_Q128,
 * I2S_B32H, I2S_B32F (gpu_type_supported; I2S_Q128's products are unscaled, as on the CPU). A
 * matrix is `rows` rows of `cols` elements, each row `row_bytes` bytes (the GGUF layout, rows
 * contiguous); cols is a multiple of the type's block size. */

bool gpu_type_supported(uint32_t type);

/* out row i (out_stride apart, f32 or f16 as out_f16 says) = row ids[i] of w dequantized, or row
 * i when ids is NULL; i < n_rows. ids is device memory. */
int gpu_dequant_rows(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                     const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                     bool out_f16);

/* y[t * y_stride + r] = sum_c W[r][c] * x[t * x_stride + c] for r < rows, t < n
 * (1 <= n <= GPU_MATVEC_MAX_N); f32 activations and accumulation. */
int gpu_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
               const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride);

/* MoE: n_items products in one launch. Item i multiplies expert ids[i]'s matrix (at
 * w + ids[i] * expert_bytes) with activation row x + (i / x_div) * x_stride into y + i * y_stride
 * (rows outputs). ids is device memory; x_div >= 1 (n_expert_used for the gate/up products of a
 * step's tokens, 1 for down). */
int gpu_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                   int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items, const float *x,
                   int64_t x_stride, int64_t x_div, float *y, int64_t y_stride);

/* out (n rows of cols, row-major f16) = x rows (x_stride apart) as f16. */
int gpu_f32_to_f16(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out);

/* Tensor-core matmul: y[t * y_stride + r] = sum_c w16[r * cols + c] * x16[t * cols + c] for
 * r < rows, t < n, f16 inputs (row-major, contiguous), f32 accumulation and output. cols is a
 * multiple of 32; rows and n any. */
int gpu_gemm_f16(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                 float *y, int64_t y_stride);

/* ---- int8 activations and the int8 matvec (executor/cuda/act.cu, quant.cu) ---------------- */
/* A q8 image of n activation rows of cols values (cols a multiple of 32): each row
 * gpu_q8_row_bytes(cols) bytes, rows contiguous: cols int8 values, then one f32 scale per 32
 * values. Value j of a row times the scale of its 32 is exactly what gpu_act_round gives. */
#ifdef __CUDACC__
#define GPU_HOST_DEVICE __host__ __device__
#else
#define GPU_HOST_DEVICE
#endif
static inline GPU_HOST_DEVICE size_t gpu_q8_row_bytes(int64_t cols)
{
    /* and 4 bytes a 256 to spare: the room the CPU backend's own image needs (its Q8_K blocks,
     * the CPU's, take 292 bytes a 256) */
    return (size_t)cols + (size_t)cols / 32 * sizeof(float) + (size_t)cols / 256 * sizeof(float);
}

/* Writes the q8 image of x rows quantized to act_type (Q8_0, Q8_1 or Q8_K, as gpu_act_round;
 * Q8_K's one scale per 256 stands for each of its eight 32s). */
int gpu_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
               void *q8);

/* Whether gpu_matvec_q8 takes `type`: the quantized types (Q4_0 .. Q8_0, Q2_K .. Q6_K, MXFP4,
 * TQ1_0, TQ2_0, I2_S), whose activations the CPU quantizes to Q8_0, Q8_1 or Q8_K
 * (executor_vec_dot_type). The one list of them: the backends' gpu_type_supported is these and the
 * three float types. */
static inline bool gpu_matvec_q8_supported(uint32_t type)
{
    switch (type) {
    case COMMON_GGML_TYPE_Q4_0:
    case COMMON_GGML_TYPE_Q4_1:
    case COMMON_GGML_TYPE_Q5_0:
    case COMMON_GGML_TYPE_Q5_1:
    case COMMON_GGML_TYPE_Q8_0:
    case COMMON_GGML_TYPE_Q2_K:
    case COMMON_GGML_TYPE_Q3_K:
    case COMMON_GGML_TYPE_Q4_K:
    case COMMON_GGML_TYPE_Q5_K:
    case COMMON_GGML_TYPE_Q6_K:
    case COMMON_GGML_TYPE_MXFP4:
    case COMMON_GGML_TYPE_TQ1_0:
    case COMMON_GGML_TYPE_TQ2_0:
    case COMMON_GGML_TYPE_I2S_Q128:
    case COMMON_GGML_TYPE_I2S_B32H:
    case COMMON_GGML_TYPE_I2S_B32F:
        return true;
    default:
        return false;
    }
}

/* The weight types a backend implements (its gpu_type_supported): F32, F16, BF16 and those of
 * gpu_matvec_q8_supported. */
static inline bool gpu_type_implemented(uint32_t type)
{
    return type == COMMON_GGML_TYPE_F32 || type == COMMON_GGML_TYPE_F16 ||
           type == COMMON_GGML_TYPE_BF16 || gpu_matvec_q8_supported(type);
}

/* As gpu_matvec over the activations of a q8 image (n rows): integer products of the weights'
 * quants and the activations' per 32 (dp4a), scaled in f32. */
int gpu_matvec_q8(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                  const void *q8, int64_t n, float *y, int64_t y_stride);

/* gpu_matvec_q8 of n_mat matrices (1 .. GPU_CAT_MAX) of `type` over the same activation row
 * (one row of a q8 image), in one launch: matrix i, rows[i] rows at w[i] (row_bytes each, cols
 * columns), into y[i]; each output bit for bit gpu_matvec_q8's (attention's q, k and v). */
#define GPU_CAT_MAX 3
int gpu_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                      size_t row_bytes, int64_t cols, const void *q8, float *const *y);

/* gpu_matvec_q8 fused with what follows it: GPU_MV_ADD adds the products to y (y += W . x);
 * GPU_MV_GLU multiplies w (gate) and w2 (up, of the same type and layout) with the same
 * activations and writes silu(gate . x) * (up . x), as gpu_swiglu does, bit for bit. */
enum gpu_mv_op { GPU_MV_SET = 0, GPU_MV_ADD = 1, GPU_MV_GLU = 2 };
int gpu_matvec_q8_op(enum gpu_mv_op op, uint32_t type, const void *w, const void *w2,
                     size_t row_bytes, int64_t rows, int64_t cols, const void *q8, int64_t n,
                     float *y, int64_t y_stride);

/* As gpu_matvec_ids over the rows of a q8 image: item i reads image row i / x_div. */
int gpu_matvec_ids_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                      int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                      const void *q8, int64_t x_div, float *y, int64_t y_stride);
/* The same for gate (wg) and up (wu, the same layout) at once: y item row = silu(gate . x) *
 * (up . x), bit for bit what the two products and gpu_swiglu give. */
int gpu_matvec_ids_glu_q8(uint32_t type, const void *wg, const void *wu, size_t expert_bytes,
                          size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                          int64_t n_items, const void *q8, int64_t x_div, float *y,
                          int64_t y_stride);

/* MoE decode's down products and their weighted sum at once: for each of n_tok tokens, its k
 * items (item t * k + j: expert ids[item]'s matrix times image row item) combined into x row t
 * as gpu_matvec_ids_q8 and then gpu_moe_combine would, bit for bit (x row t += w_0 y_0 + w_1 y_1
 * + .., weights sel_w[item], in slot order). ids and sel_w are device memory. */
int gpu_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                              int64_t rows, int64_t cols, const int32_t *ids, const float *sel_w,
                              int64_t n_tok, int32_t k, const void *q8, float *x, int64_t x_stride);

/* A group of up to GPU_GROUP_MAX activation rows multiplied with one expert's matrix: rows
 * x_row[0..n) of a q8 image, products into rows y_row[0..n) of y. */
#define GPU_GROUP_MAX 8
struct gpu_group {
    int32_t expert, n;
    int32_t x_row[GPU_GROUP_MAX], y_row[GPU_GROUP_MAX];
};

/* MoE prefill: for each group (device memory), expert `expert`'s matrix (at w + expert *
 * expert_bytes) times its activation rows, each weight row read once for the group's rows. */
int gpu_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                         int64_t rows, int64_t cols, const struct gpu_group *groups,
                         int64_t n_groups, const void *q8, float *y, int64_t y_stride);

/* Tensor-core matmul straight from quantized weights (a type of gpu_matvec_q8_supported): as
 * gpu_gemm_f16, with W decoded to f16 chunk by chunk inside the kernel, never written out. cols is
 * a multiple of 32; x16 is 16-byte aligned, rows cols apart. Dense (tiles NULL): activation rows
 * 0..n of x16, output row t at y + t * y_stride (expert_bytes, items, x_div unused). By tiles (MoE
 * prefill; tiles and items in device memory): tile i multiplies expert tiles[i].expert's matrix
 * (at w + expert * expert_bytes) with activation rows items[first + j] / x_div of x16 for
 * j < count <= GPU_MM_TILE, into y rows items[first + j]. */
#define GPU_MM_TILE 32
struct gpu_mm_tile {
    int32_t expert, first, count;
};
int gpu_gemm_q(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes, int64_t rows,
               int64_t cols, const uint16_t *x16, int64_t n, const struct gpu_mm_tile *tiles,
               int64_t n_tiles, const int32_t *items, int32_t x_div, float *y, int64_t y_stride);
/* The same where the number of tiles is known on the device only (gpu_moe_sort's *n_used, device
 * memory): tiles n_used .. n_tiles - 1 of the launch do nothing (n_tiles: the most there can be).
 */
int gpu_gemm_q_used(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                    int64_t rows, int64_t cols, const uint16_t *x16,
                    const struct gpu_mm_tile *tiles, int64_t n_tiles, const int32_t *n_used,
                    const int32_t *items, int32_t x_div, float *y, int64_t y_stride);

/* ---- activations as the CPU rounds them (executor/cuda/act.cu) ---------------------------- */

/* out (n rows of cols, contiguous) = x rows quantized to `act_type` (the CPU's
 * executor_vec_dot_type of a weight type: Q8_0, Q8_1, Q8_K, F16 or BF16) exactly as the CPU's
 * kernels quantize activations, expanded back to f32: a matvec over them then computes the
 * CPU's products. */
int gpu_act_round(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                  float *out);

/* ---- the other operations of a layer (executor/cuda/ops.cu) -------------------------------- */

/* y row r = x row r / sqrt(mean(x row r ^ 2) + eps) * w, r < n_rows, rows of `width`; y may
 * be x. The sum of squares in f32 or better. */
int gpu_rmsnorm(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                int64_t n_rows, int64_t width, float eps);
/* gpu_rmsnorm fused with gpu_act_q8 of its output: y as gpu_rmsnorm gives it, and in q8 the
 * image gpu_act_q8(act_type, y, y_stride, n_rows, width, q8) would make of y, bit for bit, in
 * one launch (width a multiple of 32, of 256 for Q8_K; y not x). */
int gpu_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                   int64_t n_rows, int64_t width, float eps, uint32_t act_type, void *q8);
/* y[i] = a[i] + b[i], i < n; y may be a or b. */
int gpu_add(float *y, const float *a, const float *b, int64_t n);
/* y[r * stride + i] += bias[i] for r < n_rows, i < width. */
int gpu_add_bias(float *y, int64_t stride, const float *bias, int64_t n_rows, int64_t width);
/* The same with row r's own bias: bias + ids[r] * width, of the n_bias rows of `bias` (a row
 * whose id is outside 0..n_bias-1 is left as it is). Routed experts' biases (gpt-oss): ids are
 * the items' experts. */
int gpu_add_bias_ids(float *y, int64_t stride, const float *bias, int32_t n_bias,
                     const int32_t *ids, int64_t n_rows, int64_t width);
/* y[r * stride + i] *= s for r < n_rows, i < width (a matrix's per-tensor scale, bitnet). */
int gpu_scale_rows(float *y, int64_t stride, int64_t n_rows, int64_t width, float s);
/* g[i] = silu(g[i]) * u[i] (relu2 false) or max(g[i], 0)^2 * u[i], i < n. */
int gpu_swiglu(float *g, const float *u, int64_t n, bool relu2);
/* gpt-oss's clamped SwiGLU of routed experts (executor_fwd_oai_gate_up) over n_rows rows of
 * `width` (contiguous): with b = gb, c = ub of row r's expert (ids[r] of the n_bias rows of the
 * biases; row 0 for every row when ids is NULL; a row whose id is out of range is left as it
 * is), x = min(g + b, 7), y = clamp(u + c, -7, 7), g = x * sigmoid(1.702 x) * (y + 1). */
int gpu_swiglu_oai(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                   const float *ub, int32_t n_bias, const int32_t *ids);
/* Rotary embedding in place: token t's vector at v + t * tok_stride holds n_heads heads of
 * head_dim; the first n_rot dims of each head rotate by the (cos, sin) pairs of cs + t * n_rot
 * (pair i at cs[t * n_rot + 2i], [.. + 2i + 1]): pairs (2i, 2i+1), or (i, i + n_rot/2) with neox.
 * x0' = x0 * c - x1 * s, x1' = x0 * s + x1 * c. */
int gpu_rope(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
             uint32_t n_rot, const float *cs, bool neox);
/* Where gpu_rope_qk also stores the keys it rotated, and the values, in an f16 KV cache, as
 * gpu_kv_store (pos_dev NULL) or gpu_kv_store_at would after it: k_width = n_head_kv * head_dim
 * (the keys' rows contiguous), v_width = n_head_kv * head_dim_v. */
struct gpu_kv_dst {
    uint16_t       *k_cache, *v_cache;
    const float    *v; /* n_tok rows of v_width, contiguous */
    uint32_t        head_dim_v;
    uint32_t        pos0;
    const uint32_t *pos_dev; /* NULL: pos0 */
};
/* The queries' and keys' RoPE in one launch, each head normalised first where its norm is given:
 * bit for bit gpu_rmsnorm over each head of q (rows of head_dim, weights q_norm) when q_norm is
 * not NULL, the same for k with k_norm, then gpu_rope of q (n_head heads a token, q_stride
 * apart) and of k (n_head_kv heads, k_stride apart), both with the pairs of cs; then, with kv,
 * the cache store (k_stride = n_head_kv * head_dim). */
int gpu_rope_qk(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                const float *cs, bool neox, const float *q_norm, const float *k_norm, float eps,
                const struct gpu_kv_dst *kv);
/* The f16 KV cache of one layer: position p's key at k_cache + p * k_width, value at
 * v_cache + p * v_width. Stores token t's k (k + t * k_width) and v at position pos0 + t. */
int gpu_kv_store(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                 const float *k, const float *v, uint32_t pos0, uint32_t n_tok);
/* Causal attention of n_tok queries at positions pos0.. over the cache: out row t (n_head *
 * head_dim_v) for query row t (n_head * head_dim_k); query head h reads kv head
 * h / (n_head / n_head_kv). Token t sees positions max(0, pos0 + t + 1 - window) .. pos0 + t
 * (window 0 = all). Scores scaled by `scale`, softmax in f32 with the max subtracted. scratch:
 * device floats, at least n_tok * n_head * (pos0 + n_tok). sinks: NULL, or n_head device floats,
 * head h's sink logit (gpt-oss), which takes part in its softmax's max and sum and has no value.
 * v_cache NULL (latent attention, one KV head, head_dim_v <= head_dim_k): a position's values are
 * the first head_dim_v of its key row (the same for gpu_attention_q8, whole q8_0 blocks). */
int gpu_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                  uint32_t n_tok, uint32_t pos0, uint32_t n_head, uint32_t n_head_kv,
                  uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                  float *scratch, const float *sinks);
/* As gpu_kv_store and gpu_attention with the first position read from device memory when the
 * kernels run (*pos_dev), so that a captured graph (gpu_graph_end) serves every position: the
 * caller keeps *pos_dev + n_tok within the cache and, for attention, within row_stride, the
 * scratch floats of each (token, head) (scratch: n_tok * n_head * row_stride floats). */
int gpu_kv_store_at(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, const uint32_t *pos_dev, uint32_t n_tok);
int gpu_attention_at(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                     uint32_t n_tok, const uint32_t *pos_dev, uint32_t row_stride, uint32_t n_head,
                     uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v, float scale,
                     uint32_t window, float *scratch, const float *sinks);
/* The q8_0 KV cache (--cache-type q8_0): position p's key row of k_width values (a multiple of
 * 32) as q8_0 blocks (an f16 scale and 32 int8, 34 bytes) at k_cache + p * k_width / 32 * 34,
 * quantized as the CPU's cache is (gpu_act_q8's Q8_0: d = amax / 127, round half to even); the
 * value row likewise. pos_dev NULL: the first position is pos0, else *pos_dev (a graph). */
/* A sliding-window layer's cache as a ring of `cap` positions (window + n_tok <= cap): position p
 * in cell p % cap of the f16 (q8 false) or q8_0 cache, stored there by gpu_kv_store (or _q8) with
 * the cells as positions; gpu_attention's (or _q8's) result over it, window given. Backends
 * that have it (the CPU's; gpu_attention_ring_supported); others keep the whole context. */
bool gpu_attention_ring_supported(void);
int  gpu_attention_ring(bool q8, float *out, const float *q, const void *k_cache,
                        const void *v_cache, uint32_t n_tok, uint32_t pos0, uint32_t cap,
                        uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                        uint32_t head_dim_v, float scale, uint32_t window, const float *sinks);
int gpu_kv_store_q8(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                    uint32_t n_tok);
/* gpu_attention over the q8_0 cache, as the CPU computes it with one (head dims multiples of 32):
 * the query quantized to q8_0 the same way, each score the sum over blocks, in order, of the
 * block's integer dot times both scales, then scaled; softmax in f32; the output the sum over
 * positions, in order, of the probability times the dequantized value (no f16 rounding). One
 * block per (token, head) whatever the length (no flash or split kernels). pos_dev and
 * row_stride as gpu_attention_at (NULL and 0: pos0, and rows of pos0 + n_tok). */
int gpu_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                     uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                     uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                     float scale, uint32_t window, float *scratch, const float *sinks);
/* MoE routing of n_tok tokens from router logits (n_tok rows of n_expert): probabilities by
 * softmax (gating 0), sigmoid (gating 1) or the logits themselves (gating 2, gpt-oss); selection
 * by top-k of the score probability + bias[e] (bias NULL = none; ties to the lower index);
 * weights = the chosen probabilities (gating 2: their softmax over the k), divided by their sum
 * (clamped below at 6.103515625e-5) when norm, times scale when scale is not 0 or 1. sel and sel_w:
 * n_tok rows of k. With n_group > 1 (DeepSeek V3's group-limited selection) the experts are n_group
 * groups of n_expert / n_group in index order, a group scores the sum of its two best scores (its
 * best alone with one expert a group), and only the experts of the n_group_used best groups (ties
 * to the lower index) are selected from: n_group divides n_expert, is at most 64, n_group_used <
 * n_group, k <= n_group_used * n_expert / n_group. */
#define GPU_ROUTE_MAX_GROUPS 64u
/* Whether gpu_moe_route's group arguments are good (n_group 0 or 1: no groups). */
static inline bool gpu_route_groups_ok(uint32_t n_expert, uint32_t k, uint32_t n_group,
                                       uint32_t n_group_used)
{
    return n_group <= 1 ||
           (n_group <= GPU_ROUTE_MAX_GROUPS && n_expert % n_group == 0 && n_group_used > 0 &&
            n_group_used < n_group && k <= n_group_used * (n_expert / n_group));
}
int gpu_moe_route(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                  uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                  float scale, int32_t *sel, float *sel_w);
/* The n (token, slot) items of a step by expert, on the device: items[] (device) lists the item
 * indices i (sel[i] their experts) expert by expert, each expert's in increasing order, and
 * tiles[] (device) cuts each expert's run into tiles of up to `tile` items in expert order, their
 * number in *n_tiles (device): at most n / tile + n_expert of them. An id outside 0..n_expert-1
 * (which the routing never writes) counts as the nearest expert: the host's sort in gpu.c
 * refuses it instead. */
int gpu_moe_sort(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile, int32_t *items,
                 struct gpu_mm_tile *tiles, int32_t *n_tiles);
/* x row t (width ne) += sum over j < k, in order j = 0.., of sel_w[t * k + j] * y row (t * k + j);
 * t < n_tok. */
int gpu_moe_combine(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                    uint32_t ne);
/* A gated shared expert (qwen2moe): x row t (width ne) = y row t * s + x row t, s = the sigmoid
 * of gate[t] computed as llama.cpp does, silu(g) / g (0.5 at g = 0); t < n_tok. */
int gpu_gated_add(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne);
/* dst row i (width, dst_stride apart) = src row rows[i] (src_stride apart), i < n; rows is device
 * memory, or NULL: src row i (a strided copy). */
int gpu_gather_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                    const int32_t *rows, int64_t n, int64_t width);
/* dst row rows[i] = src row i, i < n; rows is device memory. */
int gpu_scatter_rows(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                     const int32_t *rows, int64_t n, int64_t width);

/* ---- backends ----------------------------------------------------------------------------- */

/* A backend: each member does what the function of the same name above does (alloc: gpu_malloc,
 * release: gpu_free, fill: gpu_memset). */
struct gpu_backend {
    const char *name;
    int (*device_count)(char *why, size_t why_len);
    int (*select)(int dev, struct gpu_info *info, char *why, size_t why_len);
    int (*use)(int dev);
    int (*current)(void);
    const char *(*last_error)(void);
    void *(*alloc)(size_t bytes);
    void (*release)(void *p);
    int (*upload)(void *dst_device, const void *src_host, size_t bytes);
    int (*upload_queued)(void *dst_device, const void *src_host, size_t bytes);
    int (*download)(void *dst_host, const void *src_device, size_t bytes);
    int (*fill)(void *dst_device, int byte, size_t bytes);
    int (*sync)(void);
    double (*membw_probe)(size_t bytes);
    struct gpu_event *(*event_new)(void);
    void (*event_free)(struct gpu_event *ev);
    int (*copy_async)(void *dst_device, const void *src_host, size_t bytes);
    int (*event_record_copy)(struct gpu_event *ev);
    int (*event_record_kernels)(struct gpu_event *ev);
    int (*stream_wait)(struct gpu_event *ev);
    int (*stream_wait_shared)(struct common_devmem_event *ev);
    int (*event_record_kernels_shared)(struct common_devmem_event *ev);
    int (*copy_wait)(struct gpu_event *ev);
    int (*event_sync)(struct gpu_event *ev);
    int (*host_register)(const void *p, size_t bytes, bool read_only);
    size_t (*va_granularity)(void); /* NULL: no virtual memory management */
    void *(*va_reserve)(size_t bytes);
    int (*va_map)(void *at, size_t bytes);
    void (*va_unmap)(void *at, size_t bytes);
    void (*va_free)(void *base, size_t bytes);
    void (*host_unregister)(const void *p);
    bool (*copy_times)(uint64_t *busy_ns, uint64_t *stall_ns);
    bool matvec_any_rows;                              /* gpu_matvec_any_rows */
    bool weights_in_place;                             /* gpu_weights_in_place */
    bool attention_own_scratch;                        /* gpu_attention_own_scratch */
    void (*threads)(struct executor_threadpool *pool); /* NULL: gpu_threads does nothing */
    /* NULL where the backend has no graphs */
    int (*graph_begin)(void);
    int (*graph_end)(struct gpu_graph **graph);
    int (*graph_launch)(struct gpu_graph *graph);
    void (*graph_free)(struct gpu_graph *graph);
    bool (*type_supported)(uint32_t type);
    int (*dequant_rows)(uint32_t type, const void *w, size_t row_bytes, int64_t cols,
                        const int32_t *ids, int64_t n_rows, void *out, int64_t out_stride,
                        bool out_f16);
    int (*matvec)(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                  const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride);
    int (*matvec_ids)(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                      int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                      const float *x, int64_t x_stride, int64_t x_div, float *y, int64_t y_stride);
    int (*f32_to_f16)(const float *x, int64_t x_stride, int64_t n, int64_t cols, uint16_t *out);
    int (*gemm_f16)(const uint16_t *w16, int64_t rows, int64_t cols, const uint16_t *x16, int64_t n,
                    float *y, int64_t y_stride);
    /* n_used: NULL, or gpu_gemm_q_used's count of tiles in device memory */
    int (*gemm_q)(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes, int64_t rows,
                  int64_t cols, const uint16_t *x16, int64_t n, const struct gpu_mm_tile *tiles,
                  int64_t n_tiles, const int32_t *n_used, const int32_t *items, int32_t x_div,
                  float *y, int64_t y_stride);
    int (*act_round)(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                     float *out);
    int (*act_q8)(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                  void *q8);
    int (*matvec_q8)(int op, uint32_t type, const void *w, const void *w2, size_t row_bytes,
                     int64_t rows, int64_t cols, const void *q8, int64_t n, float *y,
                     int64_t y_stride);
    int (*matvec_q8_cat)(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                         size_t row_bytes, int64_t cols, const void *q8, float *const *y);
    /* w2 NULL: gpu_matvec_ids_q8; else gpu_matvec_ids_glu_q8 */
    int (*matvec_ids_q8)(uint32_t type, const void *w, const void *w2, size_t expert_bytes,
                         size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                         int64_t n_items, const void *q8, int64_t x_div, float *y,
                         int64_t y_stride);
    int (*matvec_ids_combine_q8)(uint32_t type, const void *w, size_t expert_bytes,
                                 size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                                 const float *sel_w, int64_t n_tok, int32_t k, const void *q8,
                                 float *x, int64_t x_stride);
    int (*matvec_groups_q8)(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                            int64_t rows, int64_t cols, const struct gpu_group *groups,
                            int64_t n_groups, const void *q8, float *y, int64_t y_stride);
    int (*rmsnorm)(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                   int64_t n_rows, int64_t width, float eps);
    int (*rmsnorm_q8)(float *y, int64_t y_stride, const float *x, int64_t x_stride, const float *w,
                      int64_t n_rows, int64_t width, float eps, uint32_t act_type, void *q8);
    int (*add)(float *y, const float *a, const float *b, int64_t n);
    /* ids NULL: the same bias row for every row (n_bias 1) */
    int (*add_bias)(float *y, int64_t stride, const float *bias, int32_t n_bias, const int32_t *ids,
                    int64_t n_rows, int64_t width);
    int (*scale_rows)(float *y, int64_t stride, int64_t n_rows, int64_t width, float s);
    int (*swiglu)(float *g, const float *u, int64_t n, bool relu2);
    int (*swiglu_oai)(float *g, const float *u, int64_t n_rows, int64_t width, const float *gb,
                      const float *ub, int32_t n_bias, const int32_t *ids);
    int (*rope)(float *v, int64_t n_tok, int64_t tok_stride, uint32_t n_heads, uint32_t head_dim,
                uint32_t n_rot, const float *cs, bool neox);
    int (*rope_qk)(float *q, int64_t q_stride, uint32_t n_head, float *k, int64_t k_stride,
                   uint32_t n_head_kv, int64_t n_tok, uint32_t head_dim, uint32_t n_rot,
                   const float *cs, bool neox, const float *q_norm, const float *k_norm, float eps,
                   const struct gpu_kv_dst *kv);
    /* pos_dev NULL: pos0; else *pos_dev (row_stride: the attention scratch's, 0 = pos0 + n_tok) */
    int (*kv_store)(uint16_t *k_cache, uint16_t *v_cache, uint32_t k_width, uint32_t v_width,
                    const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                    uint32_t n_tok);
    int (*attention)(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                     uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                     uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                     float scale, uint32_t window, float *scratch, const float *sinks);
    int (*kv_store_q8)(void *k_cache, void *v_cache, uint32_t k_width, uint32_t v_width,
                       const float *k, const float *v, uint32_t pos0, const uint32_t *pos_dev,
                       uint32_t n_tok);
    int (*attention_q8)(float *out, const float *q, const void *k_cache, const void *v_cache,
                        uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                        uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                        uint32_t head_dim_v, float scale, uint32_t window, float *scratch,
                        const float *sinks);
    /* NULL where the backend has no rings (gpu_attention_ring) */
    int (*attention_ring)(bool q8, float *out, const float *q, const void *k_cache,
                          const void *v_cache, uint32_t n_tok, uint32_t pos0, uint32_t cap,
                          uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                          uint32_t head_dim_v, float scale, uint32_t window, const float *sinks);
    int (*moe_route)(const float *logits, const float *bias, uint32_t n_tok, uint32_t n_expert,
                     uint32_t k, uint32_t n_group, uint32_t n_group_used, int gating, bool norm,
                     float scale, int32_t *sel, float *sel_w);
    int (*moe_sort)(const int32_t *sel, uint32_t n, uint32_t n_expert, int32_t tile, int32_t *items,
                    struct gpu_mm_tile *tiles, int32_t *n_tiles);
    int (*moe_combine)(float *x, const float *y, const float *sel_w, uint32_t n_tok, uint32_t k,
                       uint32_t ne);
    int (*gated_add)(float *x, const float *y, const float *gate, uint32_t n_tok, uint32_t ne);
    int (*gather_rows)(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                       const int32_t *rows, int64_t n, int64_t width);
    int (*scatter_rows)(float *dst, int64_t dst_stride, const float *src, int64_t src_stride,
                        const int32_t *rows, int64_t n, int64_t width);
};

/* CUDA's backend (NULL in a build without CUDA), the host's and the CPU's. */
const struct gpu_backend *gpu_backend_cuda(void);
const struct gpu_backend *gpu_backend_host(void);
const struct gpu_backend *gpu_backend_cpu(void);
/* The CPU's backend as the CPU device (GPU_DEV_CPU), beside the process's backend: its one
 * device is one of the host backend's, after HOST0.. (gpu_host_cpu_device). */
const struct gpu_backend *gpu_backend_cpu_device(void);
/* The host backend's device for the CPU device (the one after HOST0..), turned on. */
int gpu_host_cpu_device(void);
/* Records msg as the host backend's error of the calling thread (gpu_last_error of the host and
 * CPU backends, which share it); returns -1. */
int gpu_host_error(const char *msg);

#ifdef __cplusplus
}
#endif

#endif /* EXECUTOR_CUDA_GPU_H */
