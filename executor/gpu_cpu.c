/* executor/gpu_cpu.c - the CPU backend of the device interface (cuda/gpu.h),
 * SLUICE_GPU_BACKEND=cpu: the host backend's devices, memory and operations (gpu_host.c), except
 * that what reads the weights and the cache runs on the CPU's own kernels (kernels/kernels.h:
 * executor_quantize_act, executor_matvec, executor_matmul, executor_wsum_f16) over the threads of
 * the context that calls them (gpu_threads): the products over int8 activations (gpu_act_q8,
 * gpu_rmsnorm_q8 and the gpu_matvec_*_q8 family), the float products of F32, F16 and BF16
 * weights, and the attention. It is executor/gpu.c's forward pass on the CPU at the speed of the
 * CPU's kernels: a step towards one forward pass over the interface for both kinds of device.
 *
 * - Its q8 image is the CPU's activation blocks (executor_quantize_act of a weight type of the
 *   activation type), a row every gpu_q8_row_bytes(cols) bytes. Only its own operations read it:
 *   gpu_act_round still gives the values that the image stands for, so gpu.c's other paths agree.
 * - It takes products of any row count (gpu_matvec_any_rows): gpu.c sends a prefill through the
 *   same kernels as a decode step, and the routed experts' items are grouped by expert here, each
 *   expert's weight rows read once for all its items (executor_matmul).
 * - The model's weights are used where they are (gpu_weights_in_place): gpu.c does not copy
 *   them into this backend's memory, which is RAM too.
 * - No graphs: a step runs as it is called. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cuda/gpu.h"
#include "executor.h"
#include "kernels/kernels.h"

#define CPU_MIN_CHUNK 8 /* fewest weight rows handed to a thread at once */
#define CPU_ALIGN     64

/* ---- threads and scratch -------------------------------------------------------------------- */

static _Thread_local struct executor_threadpool *c_pool; /* the calling thread's (gpu_threads) */

static void c_threads(struct executor_threadpool *pool)
{
    c_pool = pool;
}

/* Runs fn over n items on the calling thread's pool, in pieces of about a fraction of a thread's
 * share (at least min_chunk items); on the caller alone when there is one piece. */
static void c_for(int64_t n, int64_t min_chunk, executor_threadpool_fn fn, void *arg)
{
    const uint32_t nth = executor_threadpool_n_threads(c_pool);
    int64_t        chunk = n / ((int64_t)nth * 8);
    chunk = chunk < min_chunk ? min_chunk : chunk;
    if (nth == 1 || n <= chunk)
        fn(arg, 0, n, 0);
    else
        executor_threadpool_for(c_pool, n, chunk, fn, arg);
}

/* The calling thread's scratch, grown as asked and kept for its next call (freed with the
 * thread): two blocks (slot 0 and 1) that a call carves up (c_carve). */
#define CPU_SLOTS 2
struct c_scratch {
    void  *p[CPU_SLOTS];
    size_t cap[CPU_SLOTS];
};
static pthread_key_t  c_key;
static pthread_once_t c_key_once = PTHREAD_ONCE_INIT;
static bool           c_key_ok;

static void c_scratch_free(void *v)
{
    struct c_scratch *s = v;
    for (int i = 0; i < CPU_SLOTS; i++)
        free(s->p[i]);
    free(s);
}

static void c_key_make(void)
{
    c_key_ok = pthread_key_create(&c_key, c_scratch_free) == 0;
}

static void *c_scratch(int slot, size_t bytes)
{
    (void)pthread_once(&c_key_once, c_key_make);
    if (!c_key_ok)
        return NULL;
    struct c_scratch *s = pthread_getspecific(c_key);
    if (!s) {
        if (!(s = calloc(1, sizeof(*s))))
            return NULL;
        if (pthread_setspecific(c_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < bytes) {
        void *p = NULL;
        if (posix_memalign(&p, CPU_ALIGN, bytes) != 0)
            return NULL;
        free(s->p[slot]);
        s->p[slot] = p;
        s->cap[slot] = bytes;
    }
    return s->p[slot];
}

static size_t c_round(size_t bytes)
{
    return (bytes + CPU_ALIGN - 1) / CPU_ALIGN * CPU_ALIGN;
}

/* The next `bytes` of a scratch block at *at (aligned). */
static void *c_carve(uint8_t **at, size_t bytes)
{
    void *p = *at;
    *at += c_round(bytes);
    return p;
}

static int c_bad(const char *what)
{
    char msg[200];
    snprintf(msg, sizeof(msg), "%s: invalid argument", what);
    return gpu_host_error(msg);
}

/* ---- int8 activations --------------------------------------------------------------------- */

/* A weight type whose activations are act_type (the CPU's kernels quantize by weight type), or 0
 * when act_type is none of the int8 ones. */
static uint32_t c_weight_of(uint32_t act_type)
{
    switch (act_type) {
    case COMMON_GGML_TYPE_Q8_0:
        return COMMON_GGML_TYPE_Q8_0;
    case COMMON_GGML_TYPE_Q8_1:
        return COMMON_GGML_TYPE_Q4_1;
    case COMMON_GGML_TYPE_Q8_K:
        return COMMON_GGML_TYPE_Q4_K;
    default:
        return 0;
    }
}

struct c_act_job {
    uint32_t     wt;
    const float *x;
    int64_t      x_stride, cols;
    uint8_t     *q8;
    size_t       xrb;
};

static void c_act_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    const struct c_act_job *j = arg;
    for (int64_t t = i0; t < i1; t++)
        (void)executor_quantize_act(j->wt, j->x + t * j->x_stride, j->q8 + (size_t)t * j->xrb,
                                    j->cols);
}

static int c_act_q8(uint32_t act_type, const float *x, int64_t x_stride, int64_t n, int64_t cols,
                    void *q8)
{
    static const char what[] = "gpu_act_q8";
    const uint32_t    wt = c_weight_of(act_type);
    if (!x || !q8 || n < 0 || cols < 0 || cols % 32 || x_stride < cols ||
        ((uintptr_t)q8 & 3) != 0 || !wt || (act_type == COMMON_GGML_TYPE_Q8_K && cols % 256) ||
        executor_act_row_size(wt, cols) > gpu_q8_row_bytes(cols))
        return c_bad(what);
    struct c_act_job j = {wt, x, x_stride, cols, q8, gpu_q8_row_bytes(cols)};
    c_for(n, 1, c_act_piece, &j);
    return 0;
}

static int c_rmsnorm_q8(float *y, int64_t y_stride, const float *x, int64_t x_stride,
                        const float *w, int64_t n_rows, int64_t width, float eps, uint32_t act_type,
                        void *q8)
{
    if (y == x && n_rows > 0)
        return c_bad("gpu_rmsnorm_q8");
    return gpu_backend_host()->rmsnorm(y, y_stride, x, x_stride, w, n_rows, width, eps) < 0
               ? -1
               : c_act_q8(act_type, y, y_stride, n_rows, width, q8);
}

/* ---- products ------------------------------------------------------------------------------- */

enum { C_KEEP = GPU_MV_GLU + 1 }; /* products left in the task's tmp */

/* The products of one matrix (and w2: GLU) with n_act activation rows, act_stride bytes apart. */
struct c_task {
    const uint8_t *w, *w2;
    int64_t        rows;
    const uint8_t *act;
    size_t         act_stride;
    int64_t        n_act;
    float         *tmp, *tmp2; /* n_act rows of `rows`: the products before op writes them */
    float         *y;
    int64_t        y_stride;
    const int32_t *out_rows; /* NULL: row j to y + j * y_stride; else y + out_rows[j] * y_stride */
    int            op;       /* GPU_MV_SET, _ADD, _GLU or C_KEEP */
};

struct c_job {
    uint32_t       type;
    int64_t        cols;
    size_t         row_bytes;
    int            n;
    struct c_task *t;
    int64_t       *start; /* n + 1: task k's rows are [start[k], start[k + 1]) of the whole */
};

static void c_products(const struct c_job *j, const uint8_t *w, int64_t r0, int64_t r1,
                       const struct c_task *t, float *y, int64_t y_stride)
{
    if (t->n_act == 1)
        (void)executor_matvec(j->type, j->cols, w, j->row_bytes, r0, r1, t->act, y);
    else
        (void)executor_matmul(j->type, j->cols, w, j->row_bytes, r0, r1, t->act, t->act_stride,
                              t->n_act, y, (size_t)y_stride);
}

static float c_silu_mul(float g, float u)
{
    return g / (1.0f + expf(-g)) * u;
}

static void c_task_rows(const struct c_job *j, const struct c_task *t, int64_t r0, int64_t r1)
{
    if (t->op == GPU_MV_SET && !t->out_rows) {
        c_products(j, t->w, r0, r1, t, t->y, t->y_stride);
        return;
    }
    c_products(j, t->w, r0, r1, t, t->tmp, t->rows);
    if (t->op == GPU_MV_GLU)
        c_products(j, t->w2, r0, r1, t, t->tmp2, t->rows);
    if (t->op == C_KEEP)
        return;
    for (int64_t a = 0; a < t->n_act; a++) {
        float       *y = t->y + (t->out_rows ? (int64_t)t->out_rows[a] : a) * t->y_stride;
        const float *v = t->tmp + a * t->rows, *u = t->tmp2 ? t->tmp2 + a * t->rows : NULL;
        for (int64_t r = r0; r < r1; r++)
            y[r] = t->op == GPU_MV_GLU   ? c_silu_mul(v[r], u[r])
                   : t->op == GPU_MV_ADD ? y[r] + v[r]
                                         : v[r];
    }
}

static void c_job_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    const struct c_job *j = arg;
    for (int k = 0; k < j->n; k++) {
        const int64_t r0 = i0 > j->start[k] ? i0 : j->start[k];
        const int64_t r1 = i1 < j->start[k + 1] ? i1 : j->start[k + 1];
        if (r0 < r1)
            c_task_rows(j, &j->t[k], r0 - j->start[k], r1 - j->start[k]);
    }
}

static void c_job_run(struct c_job *j)
{
    j->start[0] = 0;
    for (int k = 0; k < j->n; k++)
        j->start[k + 1] = j->start[k] + j->t[k].rows;
    c_for(j->start[j->n], CPU_MIN_CHUNK, c_job_piece, j);
}

/* One task's job. */
static int c_run_one(uint32_t type, int64_t cols, size_t row_bytes, struct c_task *t)
{
    int64_t      start[2];
    struct c_job j = {type, cols, row_bytes, 1, t, start};
    c_job_run(&j);
    return 0;
}

/* Whether the CPU's kernels take rows of cols values of `type` in row_bytes (and the q8 image's
 * rows hold their activations). */
static bool c_fits(uint32_t type, int64_t cols, size_t row_bytes)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    const size_t                        act = executor_act_row_size(type, cols);
    return gpu_matvec_q8_supported(type) && ti && cols > 0 && cols % 32 == 0 &&
           cols % ti->blck == 0 && (uint64_t)(cols / ti->blck) * ti->type_size <= row_bytes &&
           act > 0 && act <= gpu_q8_row_bytes(cols);
}

static int c_matvec_q8(int op, uint32_t type, const void *w, const void *w2, size_t row_bytes,
                       int64_t rows, int64_t cols, const void *q8, int64_t n, float *y,
                       int64_t y_stride)
{
    static const char what[] = "gpu_matvec_q8: unsupported type or bad arguments";
    if (rows < 0 || n < 1 || (n > 1 && y_stride < rows) || op < GPU_MV_SET || op > GPU_MV_GLU)
        return c_bad(what);
    if (rows == 0)
        return 0;
    if (!c_fits(type, cols, row_bytes) || !w || !q8 || !y || ((uintptr_t)q8 & 3) != 0 ||
        (op == GPU_MV_GLU && !w2))
        return c_bad(what);
    const size_t tmp = op == GPU_MV_SET ? 0 : (size_t)n * (size_t)rows * sizeof(float);
    uint8_t     *s = tmp ? c_scratch(0, 2 * c_round(tmp)) : NULL;
    if (tmp && !s)
        return gpu_host_error("gpu_matvec_q8: out of host memory");
    struct c_task t = {.w = w,
                       .w2 = w2,
                       .rows = rows,
                       .act = q8,
                       .act_stride = gpu_q8_row_bytes(cols),
                       .n_act = n,
                       .tmp = tmp ? c_carve(&s, tmp) : NULL,
                       .tmp2 = op == GPU_MV_GLU ? c_carve(&s, tmp) : NULL,
                       .y = y,
                       .y_stride = y_stride,
                       .op = op};
    return c_run_one(type, cols, row_bytes, &t);
}

static int c_matvec_q8_cat(uint32_t type, int n_mat, const void *const *w, const int64_t *rows,
                           size_t row_bytes, int64_t cols, const void *q8, float *const *y)
{
    static const char what[] = "gpu_matvec_q8_cat: unsupported type or bad arguments";
    if (n_mat < 1 || n_mat > GPU_CAT_MAX || !w || !rows || !y || !q8 ||
        !c_fits(type, cols, row_bytes) || ((uintptr_t)q8 & 3) != 0)
        return c_bad(what);
    struct c_task t[GPU_CAT_MAX];
    for (int i = 0; i < n_mat; i++) {
        if (rows[i] < 1 || !w[i] || !y[i])
            return c_bad(what);
        t[i] = (struct c_task){.w = w[i],
                               .rows = rows[i],
                               .act = q8,
                               .act_stride = gpu_q8_row_bytes(cols),
                               .n_act = 1,
                               .y = y[i],
                               .y_stride = rows[i],
                               .op = GPU_MV_SET};
    }
    int64_t      start[GPU_CAT_MAX + 1];
    struct c_job j = {type, cols, row_bytes, n_mat, t, start};
    c_job_run(&j);
    return 0;
}

/* Items grouped by expert: the calls over routed experts (ids) and over groups. */
struct c_items {
    int32_t *order; /* the items, expert by expert (each expert's in increasing order) */
    int32_t *pos;   /* pos[i]: where item i is in order (its products' row in tmp) */
    int      n_groups;
};

struct c_pair {
    int32_t id, i;
};

static int c_pair_cmp(const void *a, const void *b)
{
    const struct c_pair *x = a, *y = b;
    return x->id != y->id ? (x->id < y->id ? -1 : 1) : (x->i > y->i) - (x->i < y->i);
}

/* The products of the n_items items (item i: expert ids[i]'s matrix, at w + ids[i] *
 * expert_bytes, times activation row i / x_div of q8, rows xrb bytes apart), each expert's weight
 * rows read once for its items: op GPU_MV_SET or _GLU writes item i's row to y + i * y_stride,
 * C_KEEP leaves it in the returned tmp at row it->pos[i] (rows floats a row). Scratch slot 0.
 * NULL (error set) on failure. */
static float *c_by_expert(int op, uint32_t type, const uint8_t *w, const uint8_t *w2,
                          size_t expert_bytes, size_t row_bytes, int64_t rows, int64_t cols,
                          const int32_t *ids, int64_t n_items, const uint8_t *q8, size_t xrb,
                          int64_t x_div, float *y, int64_t y_stride, struct c_items *it)
{
    const size_t n = (size_t)n_items;
    const size_t tmp = n * (size_t)rows * sizeof(float);
    const size_t bytes = c_round(n * sizeof(struct c_pair)) + 2 * c_round(n * sizeof(int32_t)) +
                         c_round(n * sizeof(struct c_task)) + c_round((n + 1) * sizeof(int64_t)) +
                         c_round(n * xrb) + 2 * c_round(tmp);
    uint8_t *s = c_scratch(0, bytes);
    if (!s) {
        (void)gpu_host_error("gpu_matvec_ids_q8: out of host memory");
        return NULL;
    }
    struct c_pair *pr = c_carve(&s, n * sizeof(*pr));
    it->order = c_carve(&s, n * sizeof(int32_t));
    it->pos = c_carve(&s, n * sizeof(int32_t));
    struct c_task *t = c_carve(&s, n * sizeof(*t));
    int64_t       *start = c_carve(&s, (n + 1) * sizeof(int64_t));
    uint8_t       *acts = c_carve(&s, n * xrb);
    float         *tmp1 = c_carve(&s, tmp), *tmp2 = op == GPU_MV_GLU ? c_carve(&s, tmp) : NULL;
    for (int64_t i = 0; i < n_items; i++)
        pr[i] = (struct c_pair){ids[i], (int32_t)i};
    qsort(pr, n, sizeof(*pr), c_pair_cmp);
    int ng = 0;
    for (size_t a = 0; a < n;) {
        size_t b = a;
        while (b < n && pr[b].id == pr[a].id)
            b++;
        const int64_t m = (int64_t)(b - a);
        for (size_t k = a; k < b; k++) {
            it->order[k] = pr[k].i;
            it->pos[pr[k].i] = (int32_t)k;
        }
        const uint8_t *act = q8 + (size_t)(pr[a].i / x_div) * xrb;
        if (m > 1) { /* the group's activation rows side by side, for the matmul */
            for (size_t k = a; k < b; k++)
                memcpy(acts + k * xrb, q8 + (size_t)(pr[k].i / x_div) * xrb, xrb);
            act = acts + a * xrb;
        }
        const size_t off = (size_t)pr[a].id * expert_bytes;
        t[ng++] = (struct c_task){.w = w + off,
                                  .w2 = w2 ? w2 + off : NULL,
                                  .rows = rows,
                                  .act = act,
                                  .act_stride = xrb,
                                  .n_act = m,
                                  .tmp = tmp1 + a * (size_t)rows,
                                  .tmp2 = tmp2 ? tmp2 + a * (size_t)rows : NULL,
                                  .y = y,
                                  .y_stride = y_stride,
                                  .out_rows = it->order + a,
                                  .op = op};
        a = b;
    }
    it->n_groups = ng;
    struct c_job j = {type, cols, row_bytes, ng, t, start};
    c_job_run(&j);
    return tmp1;
}

/* The checks gpu_matvec_ids_q8 and gpu_matvec_ids_combine_q8 share (the host backend's). */
static bool c_ids_ok(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                     int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                     const void *q8)
{
    if (!c_fits(type, cols, row_bytes) || !w || !ids || !q8 || ((uintptr_t)q8 & 3) != 0 ||
        (uint64_t)rows * row_bytes > expert_bytes || n_items > INT32_MAX)
        return false;
    for (int64_t i = 0; i < n_items; i++)
        if (ids[i] < 0)
            return false;
    return true;
}

static int c_matvec_ids_q8(uint32_t type, const void *w, const void *w2, size_t expert_bytes,
                           size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                           int64_t n_items, const void *q8, int64_t x_div, float *y,
                           int64_t y_stride)
{
    static const char what[] = "gpu_matvec_ids_q8: unsupported type or bad arguments";
    if (rows < 0 || n_items < 0 || x_div < 1 || (n_items > 1 && y_stride < rows))
        return c_bad(what);
    if (rows == 0 || n_items == 0)
        return 0;
    if (!y || !c_ids_ok(type, w, expert_bytes, row_bytes, rows, cols, ids, n_items, q8))
        return c_bad(what);
    struct c_items it;
    return c_by_expert(w2 ? GPU_MV_GLU : GPU_MV_SET, type, w, w2, expert_bytes, row_bytes, rows,
                       cols, ids, n_items, q8, gpu_q8_row_bytes(cols), x_div, y, y_stride, &it)
               ? 0
               : -1;
}

struct c_combine_job {
    float         *x;
    int64_t        x_stride, rows, n_tok;
    int32_t        k;
    const float   *sel_w, *y;
    const int32_t *pos;
};

/* x row t += the sum over j, in order, of sel_w[t * k + j] times item t * k + j's products:
 * gpu_moe_combine's order. */
static void c_combine_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    (void)ith;
    const struct c_combine_job *c = arg;
    for (int64_t t = 0; t < c->n_tok; t++) {
        const float   *sw = c->sel_w + t * c->k;
        const int32_t *p = c->pos + t * c->k;
        float         *x = c->x + t * c->x_stride;
        for (int64_t d = i0; d < i1; d++) {
            float acc = sw[0] * c->y[(int64_t)p[0] * c->rows + d];
            for (int32_t j = 1; j < c->k; j++)
                acc = acc + sw[j] * c->y[(int64_t)p[j] * c->rows + d];
            x[d] = acc + x[d];
        }
    }
}

static int c_matvec_ids_combine_q8(uint32_t type, const void *w, size_t expert_bytes,
                                   size_t row_bytes, int64_t rows, int64_t cols, const int32_t *ids,
                                   const float *sel_w, int64_t n_tok, int32_t k, const void *q8,
                                   float *x, int64_t x_stride)
{
    static const char what[] = "gpu_matvec_ids_combine_q8: unsupported type or bad arguments";
    if (k < 1 || n_tok < 0 || rows < 0 || rows > UINT32_MAX || (n_tok > 1 && x_stride < rows))
        return c_bad(what);
    if (rows == 0 || n_tok == 0)
        return 0;
    if (!sel_w || !x || !c_ids_ok(type, w, expert_bytes, row_bytes, rows, cols, ids, n_tok * k, q8))
        return c_bad(what);
    struct c_items it;
    const float   *y = c_by_expert(C_KEEP, type, w, NULL, expert_bytes, row_bytes, rows, cols, ids,
                                   n_tok * k, q8, gpu_q8_row_bytes(cols), 1, NULL, 0, &it);
    if (!y)
        return -1;
    struct c_combine_job c = {x, x_stride, rows, n_tok, k, sel_w, y, it.pos};
    c_for(rows, 64, c_combine_piece, &c);
    return 0;
}

static int c_matvec_groups_q8(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                              int64_t rows, int64_t cols, const struct gpu_group *groups,
                              int64_t n_groups, const void *q8, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec_groups_q8: unsupported type or bad arguments";
    if (rows < 0 || n_groups < 0 || (uint64_t)rows * row_bytes > expert_bytes || y_stride < rows)
        return c_bad(what);
    if (rows == 0 || n_groups == 0)
        return 0;
    if (!c_fits(type, cols, row_bytes) || !w || !groups || !q8 || !y || ((uintptr_t)q8 & 3) != 0 ||
        n_groups > INT32_MAX / GPU_GROUP_MAX)
        return c_bad(what);
    for (int64_t i = 0; i < n_groups; i++)
        if (groups[i].expert < 0 || groups[i].n < 1 || groups[i].n > GPU_GROUP_MAX)
            return c_bad(what);
    const size_t xrb = gpu_q8_row_bytes(cols), ng = (size_t)n_groups, nr = ng * GPU_GROUP_MAX;
    const size_t tmp = nr * (size_t)rows * sizeof(float);
    uint8_t     *s =
        c_scratch(0, c_round(ng * sizeof(struct c_task)) + c_round((ng + 1) * sizeof(int64_t)) +
                         c_round(nr * xrb) + c_round(tmp));
    if (!s)
        return gpu_host_error("gpu_matvec_groups_q8: out of host memory");
    struct c_task *t = c_carve(&s, ng * sizeof(*t));
    int64_t       *start = c_carve(&s, (ng + 1) * sizeof(int64_t));
    uint8_t       *acts = c_carve(&s, nr * xrb);
    float         *tmp1 = c_carve(&s, tmp);
    for (size_t i = 0; i < ng; i++) {
        const struct gpu_group *g = &groups[i];
        uint8_t                *a = acts + i * GPU_GROUP_MAX * xrb;
        for (int r = 0; r < g->n; r++)
            memcpy(a + (size_t)r * xrb, (const uint8_t *)q8 + (size_t)g->x_row[r] * xrb, xrb);
        t[i] = (struct c_task){.w = (const uint8_t *)w + (size_t)g->expert * expert_bytes,
                               .rows = rows,
                               .act = a,
                               .act_stride = xrb,
                               .n_act = g->n,
                               .tmp = tmp1 + i * GPU_GROUP_MAX * (size_t)rows,
                               .y = y,
                               .y_stride = y_stride,
                               .out_rows = g->y_row,
                               .op = GPU_MV_SET};
    }
    struct c_job j = {type, cols, row_bytes, (int)ng, t, start};
    c_job_run(&j);
    return 0;
}

/* ---- products over float activations: the float weight types ------------------------------ */

/* Whether the float products of `type` run here: F32, F16 and BF16, whose activations the CPU
 * converts to the weights' own type (others, whose rows are not whole blocks, stay on the host
 * backend's loops). */
static bool c_float_type(uint32_t type)
{
    return type == COMMON_GGML_TYPE_F32 || type == COMMON_GGML_TYPE_F16 ||
           type == COMMON_GGML_TYPE_BF16;
}

/* n rows of x (x_stride apart) converted for weights of `type` into scratch slot 1, rows
 * *arb bytes apart. NULL (error set) when out of memory. */
static uint8_t *c_float_acts(uint32_t type, const float *x, int64_t x_stride, int64_t n,
                             int64_t cols, size_t *arb)
{
    *arb = c_round(executor_act_row_size(type, cols));
    uint8_t *a = c_scratch(1, (size_t)n * *arb);
    if (!a) {
        (void)gpu_host_error("gpu_matvec: out of host memory");
        return NULL;
    }
    struct c_act_job j = {type, x, x_stride, cols, a, *arb};
    c_for(n, 1, c_act_piece, &j);
    return a;
}

static bool c_float_fits(uint32_t type, int64_t cols, size_t row_bytes)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    return c_float_type(type) && ti && cols > 0 && (uint64_t)cols * ti->type_size <= row_bytes;
}

static int c_matvec(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                    const float *x, int64_t x_stride, int64_t n, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec: unsupported type or bad arguments";
    if (!c_float_fits(type, cols, row_bytes))
        return gpu_backend_host()->matvec(type, w, row_bytes, rows, cols, x, x_stride, n, y,
                                          y_stride);
    if (rows < 0 || n < 1 || n > GPU_MATVEC_MAX_N ||
        (n > 1 && (x_stride < cols || y_stride < rows)))
        return c_bad(what);
    if (rows == 0)
        return 0;
    if (!w || !x || !y)
        return c_bad(what);
    size_t         arb;
    const uint8_t *a = c_float_acts(type, x, x_stride, n, cols, &arb);
    if (!a)
        return -1;
    struct c_task t = {.w = w,
                       .rows = rows,
                       .act = a,
                       .act_stride = arb,
                       .n_act = n,
                       .y = y,
                       .y_stride = y_stride,
                       .op = GPU_MV_SET};
    return c_run_one(type, cols, row_bytes, &t);
}

static int c_matvec_ids(uint32_t type, const void *w, size_t expert_bytes, size_t row_bytes,
                        int64_t rows, int64_t cols, const int32_t *ids, int64_t n_items,
                        const float *x, int64_t x_stride, int64_t x_div, float *y, int64_t y_stride)
{
    static const char what[] = "gpu_matvec_ids: unsupported type or bad arguments";
    if (!c_float_fits(type, cols, row_bytes))
        return gpu_backend_host()->matvec_ids(type, w, expert_bytes, row_bytes, rows, cols, ids,
                                              n_items, x, x_stride, x_div, y, y_stride);
    if (rows < 0 || n_items < 0 || x_div < 1 || (uint64_t)rows * row_bytes > expert_bytes ||
        (n_items > x_div && x_stride < cols) || (n_items > 1 && y_stride < rows) ||
        n_items > INT32_MAX)
        return c_bad(what);
    if (rows == 0 || n_items == 0)
        return 0;
    if (!w || !ids || !x || !y)
        return c_bad(what);
    for (int64_t i = 0; i < n_items; i++)
        if (ids[i] < 0)
            return c_bad(what);
    size_t         arb;
    const uint8_t *a = c_float_acts(type, x, x_stride, (n_items - 1) / x_div + 1, cols, &arb);
    struct c_items it;
    return a && c_by_expert(GPU_MV_SET, type, w, NULL, expert_bytes, row_bytes, rows, cols, ids,
                            n_items, a, arb, x_div, y, y_stride, &it)
               ? 0
               : -1;
}

/* ---- attention ------------------------------------------------------------------------------ */

/* gpu_attention and gpu_attention_q8 on the CPU: an item is a token and a group of the query
 * heads that read one KV head (at most CPU_ATT_GROUP of them, a divisor of the heads a KV head
 * serves, whatever the step's tokens: a head's result does not depend on the batch), over the
 * threads. The group's scores are one pass of the CPU's dot kernels over the cached keys (the
 * queries rounded to f16, or quantized to q8_0); the softmax is the host backend's (f32, the max
 * subtracted); the values' weighted sums take the probabilities rounded to f16 (the f16 cache,
 * executor_wsum_f16) or as they are (q8_0), each cached row read once for the group. */
#define CPU_ATT_GROUP 4
struct c_att_job {
    float         *out;
    const float   *q;
    const uint8_t *k, *v; /* the caches, bytes */
    uint32_t       n_head, gqa, grp, hk, hv, pos0, window;
    uint32_t       cap; /* positions in the caches, a ring (position p in cell p % cap); 0: all */
    size_t         k_pos, v_pos, k_head, v_head; /* bytes: a position's row, a head in it */
    float          scale;
    int64_t        sc_stride; /* floats between a group's score rows (in th) */
    const float   *sinks;
    bool           q8;
    uint8_t       *th; /* per thread: th_bytes of queries (grp, q_bytes apart), a value row and
                        * the group's score rows */
    size_t         th_bytes, q_bytes;
};

static void c_att_piece(void *arg, int64_t i0, int64_t i1, uint32_t ith)
{
    const struct c_att_job *j = arg;
    uint8_t                *qb = j->th + (size_t)ith * j->th_bytes;
    float                  *vrow = (float *)(void *)(qb + (size_t)j->grp * j->q_bytes);
    float                  *sc = (float *)(void *)(qb + (size_t)j->grp * j->q_bytes +
                                  c_round((size_t)j->hv * sizeof(float)));
    const uint32_t          kt = j->q8 ? COMMON_GGML_TYPE_Q8_0 : COMMON_GGML_TYPE_F16;
    const uint32_t          per_tok = j->n_head / j->grp;
    for (int64_t it = i0; it < i1; it++) {
        const uint32_t t = (uint32_t)(it / per_tok), h0 = (uint32_t)(it % per_tok) * j->grp;
        const uint32_t kvh = h0 / j->gqa, last = j->pos0 + t + 1;
        const uint32_t lo = j->window && last > j->window ? last - j->window : 0, nk = last - lo;
        const int64_t  row0 = (int64_t)t * j->n_head + h0; /* the group's first (token, head) */
        float         *o = j->out + (size_t)row0 * j->hv;
        for (uint32_t i = 0; i < j->grp; i++) {
            const float *qv = j->q + (size_t)(row0 + i) * j->hk;
            uint8_t     *qi = qb + (size_t)i * j->q_bytes;
            if (j->q8) {
                (void)executor_quantize_act(COMMON_GGML_TYPE_Q8_0, qv, qi, j->hk);
            } else {
                uint16_t *q16 = (uint16_t *)(void *)qi;
                for (uint32_t d = 0; d < j->hk; d++)
                    q16[d] = executor_fp32_to_fp16(qv[d]);
            }
        }
        /* positions lo .. last - 1 in cells c0 .. c0 + na - 1, then (a ring that wraps) 0 .. nb -
         * 1; their scores at sc[p] either way */
        const uint32_t c0 = j->cap ? lo % j->cap : lo;
        const uint32_t na = j->cap && nk > j->cap - c0 ? j->cap - c0 : nk, nb = nk - na;
        const uint8_t *kb = j->k + kvh * j->k_head;
        for (int seg = 0; seg < 2; seg++) {
            const uint32_t n_s = seg ? nb : na, cell = seg ? 0 : c0, p0 = seg ? lo + na : lo;
            if (n_s == 0)
                continue;
            const uint8_t *ks = kb + (size_t)cell * j->k_pos;
            if (j->grp == 1)
                (void)executor_matvec(kt, j->hk, ks, j->k_pos, 0, n_s, qb, sc + p0);
            else
                (void)executor_matmul(kt, j->hk, ks, j->k_pos, 0, n_s, qb, j->q_bytes, j->grp,
                                      sc + p0, (size_t)j->sc_stride);
        }
        for (uint32_t i = 0; i < j->grp; i++) {
            float       *s = sc + i * j->sc_stride;
            const float *sink = j->sinks ? &j->sinks[h0 + i] : NULL;
            float        mx = sink ? *sink : -INFINITY, total = 0.0f;
            for (uint32_t p = lo; p < last; p++)
                mx = fmaxf(mx, s[p] *= j->scale);
            for (uint32_t p = lo; p < last; p++) {
                s[p] = expf(s[p] - mx);
                total += s[p];
            }
            if (sink)
                total += expf(*sink - mx);
            const float inv = 1.0f / total;
            for (uint32_t p = lo; p < last; p++)
                s[p] =
                    j->q8 ? s[p] * inv : executor_fp16_to_fp32(executor_fp32_to_fp16(s[p] * inv));
        }
        memset(o, 0, (size_t)j->grp * j->hv * sizeof(*o));
        const uint8_t *vb = j->v + kvh * j->v_head;
        if (!j->q8) { /* the sums in order of position, a segment after the other */
            (void)executor_wsum_f16(j->hv, na,
                                    (const uint16_t *)(const void *)(vb + (size_t)c0 * j->v_pos),
                                    j->v_pos, sc + lo, (size_t)j->sc_stride, j->grp, o, j->hv);
            if (nb)
                (void)executor_wsum_f16(j->hv, nb, (const uint16_t *)(const void *)vb, j->v_pos,
                                        sc + lo + na, (size_t)j->sc_stride, j->grp, o, j->hv);
            continue;
        }
        for (uint32_t p = lo; p < last; p++) {
            const size_t cell = j->cap ? p % j->cap : p;
            (void)executor_dequantize_row(COMMON_GGML_TYPE_Q8_0, vb + cell * j->v_pos, vrow, j->hv);
            for (uint32_t i = 0; i < j->grp; i++) {
                const float pr = sc[i * j->sc_stride + p];
                float      *oi = o + (size_t)i * j->hv;
                for (uint32_t d = 0; d < j->hv; d++)
                    oi[d] += pr * vrow[d];
            }
        }
    }
}

static int c_attend(bool q8, float *out, const float *q, const void *k_cache, const void *v_cache,
                    uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                    uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k, uint32_t head_dim_v,
                    float scale, uint32_t window, float *scratch, const float *sinks, uint32_t cap)
{
    const char *what = q8 ? "gpu_attention_q8" : "gpu_attention";
    if (pos_dev) {
        pos0 = *pos_dev;
        if ((uint64_t)pos0 + n_tok > row_stride)
            return c_bad(what);
    }
    (void)scratch; /* the scores are in the threads' own memory (attention_own_scratch) */
    if (!out || !q || !k_cache || (!v_cache && (n_head_kv != 1 || head_dim_v > head_dim_k)) ||
        n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || head_dim_k == 0 ||
        head_dim_v == 0 || head_dim_k > 4096 || head_dim_v > 4096 ||
        (q8 && (head_dim_k % 32 || head_dim_v % 32)) || (uint64_t)pos0 + n_tok > INT32_MAX ||
        (uint64_t)n_tok * n_head > INT32_MAX ||
        (cap && (!window || (uint64_t)window + n_tok > cap)))
        return c_bad(what);
    if (n_tok == 0)
        return 0;
    /* bytes of a cache row of w values, of a head of d values in it */
    const size_t k_w = (size_t)n_head_kv * head_dim_k, v_w = (size_t)n_head_kv * head_dim_v;
#define C_BYTES(n) (q8 ? (size_t)(n) / 32 * 34 : (size_t)(n)*2)
    const uint32_t nth = executor_threadpool_n_threads(c_pool), gqa = n_head / n_head_kv;
    uint32_t       grp = gqa < CPU_ATT_GROUP ? gqa : CPU_ATT_GROUP;
    while (gqa % grp)
        grp--;
    const size_t q_bytes = c_round((size_t)head_dim_k * 2); /* an f16 query, or its q8_0 blocks */
    const int64_t sc_stride = pos_dev ? (int64_t)row_stride : (int64_t)pos0 + n_tok;
    const size_t  th_bytes = grp * q_bytes + c_round((size_t)head_dim_v * 4) +
                            c_round((size_t)grp * (size_t)sc_stride * sizeof(float));
    uint8_t     *th = c_scratch(0, nth * th_bytes);
    if (!th)
        return gpu_host_error("gpu_attention: out of host memory");
    struct c_att_job j = {.out = out,
                          .q = q,
                          .k = k_cache,
                          .v = v_cache ? v_cache : k_cache,
                          .n_head = n_head,
                          .gqa = gqa,
                          .grp = grp,
                          .hk = head_dim_k,
                          .hv = head_dim_v,
                          .pos0 = pos0,
                          .window = window,
                          .cap = cap,
                          .k_pos = C_BYTES(k_w),
                          .v_pos = v_cache ? C_BYTES(v_w) : C_BYTES(k_w),
                          .k_head = C_BYTES(head_dim_k),
                          .v_head = v_cache ? C_BYTES(head_dim_v) : C_BYTES(head_dim_k),
                          .scale = scale,
                          .sc_stride = sc_stride,
                          .sinks = sinks,
                          .q8 = q8,
                          .th = th,
                          .th_bytes = th_bytes,
                          .q_bytes = q_bytes};
#undef C_BYTES
    c_for((int64_t)n_tok * (n_head / grp), 1, c_att_piece, &j);
    return 0;
}

static int c_attention(float *out, const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                       uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev, uint32_t row_stride,
                       uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                       uint32_t head_dim_v, float scale, uint32_t window, float *scratch,
                       const float *sinks)
{
    return c_attend(false, out, q, k_cache, v_cache, n_tok, pos0, pos_dev, row_stride, n_head,
                    n_head_kv, head_dim_k, head_dim_v, scale, window, scratch, sinks, 0);
}

static int c_attention_q8(float *out, const float *q, const void *k_cache, const void *v_cache,
                          uint32_t n_tok, uint32_t pos0, const uint32_t *pos_dev,
                          uint32_t row_stride, uint32_t n_head, uint32_t n_head_kv,
                          uint32_t head_dim_k, uint32_t head_dim_v, float scale, uint32_t window,
                          float *scratch, const float *sinks)
{
    return c_attend(true, out, q, k_cache, v_cache, n_tok, pos0, pos_dev, row_stride, n_head,
                    n_head_kv, head_dim_k, head_dim_v, scale, window, scratch, sinks, 0);
}

static int c_attention_ring(bool q8, float *out, const float *q, const void *k_cache,
                            const void *v_cache, uint32_t n_tok, uint32_t pos0, uint32_t cap,
                            uint32_t n_head, uint32_t n_head_kv, uint32_t head_dim_k,
                            uint32_t head_dim_v, float scale, uint32_t window, const float *sinks)
{
    return c_attend(q8, out, q, k_cache, v_cache, n_tok, pos0, NULL, 0, n_head, n_head_kv,
                    head_dim_k, head_dim_v, scale, window, NULL, sinks, cap);
}

/* ---- the backend ---------------------------------------------------------------------------- */

static int c_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    if (gpu_backend_host()->select(dev, info, why, why_len) < 0)
        return -1;
    if (info) {
        const int n = gpu_backend_host()->device_count(NULL, 0);
        snprintf(info->name, sizeof(info->name), "host memory, the CPU's kernels");
        if (n > 1)
            snprintf(info->name + strlen(info->name), sizeof(info->name) - strlen(info->name),
                     " (%d of %d)", dev + 1, n);
    }
    return 0;
}

static pthread_once_t     c_once = PTHREAD_ONCE_INIT;
static struct gpu_backend c_be;

static void c_make(void)
{
    c_be = *gpu_backend_host();
    c_be.select = c_select;
    c_be.graph_begin = NULL; /* the calls below are not recorded: no graphs */
    c_be.graph_end = NULL;
    c_be.graph_launch = NULL;
    c_be.graph_free = NULL;
    c_be.matvec_any_rows = true;
    c_be.weights_in_place = true;
    c_be.attention_own_scratch = true;
    c_be.threads = c_threads;
    c_be.act_q8 = c_act_q8;
    c_be.rmsnorm_q8 = c_rmsnorm_q8;
    c_be.matvec_q8 = c_matvec_q8;
    c_be.matvec_q8_cat = c_matvec_q8_cat;
    c_be.matvec_ids_q8 = c_matvec_ids_q8;
    c_be.matvec_ids_combine_q8 = c_matvec_ids_combine_q8;
    c_be.matvec_groups_q8 = c_matvec_groups_q8;
    c_be.matvec = c_matvec;
    c_be.matvec_ids = c_matvec_ids;
    c_be.attention = c_attention;
    c_be.attention_q8 = c_attention_q8;
    c_be.attention_ring = c_attention_ring;
}

const struct gpu_backend *gpu_backend_cpu(void)
{
    (void)pthread_once(&c_once, c_make);
    return &c_be;
}

/* ---- the CPU device: this backend beside another one ------------------------------------------
 * The same operations on one device of the host backend's, the one after its HOST0.. (so that
 * the host backend's check of whose memory an operation uses tells them apart), whatever the
 * device number the caller gives. */

static int cd_device_count(char *why, size_t why_len)
{
    (void)why;
    (void)why_len;
    return 1;
}

static int cd_select(int dev, struct gpu_info *info, char *why, size_t why_len)
{
    (void)dev;
    if (gpu_backend_host()->select(gpu_host_cpu_device(), info, why, why_len) < 0)
        return -1;
    if (info)
        snprintf(info->name, sizeof(info->name), "host memory, the CPU's kernels");
    return 0;
}

static int cd_use(int dev)
{
    (void)dev;
    return gpu_backend_host()->use(gpu_host_cpu_device());
}

static int cd_current(void)
{
    return 0;
}

static pthread_once_t     cd_once = PTHREAD_ONCE_INIT;
static struct gpu_backend cd_be;

static void cd_make(void)
{
    cd_be = *gpu_backend_cpu();
    cd_be.name = "CPU";
    cd_be.device_count = cd_device_count;
    cd_be.select = cd_select;
    cd_be.use = cd_use;
    cd_be.current = cd_current;
}

const struct gpu_backend *gpu_backend_cpu_device(void)
{
    (void)pthread_once(&cd_once, cd_make);
    return &cd_be;
}
