/* common/common.h - public front door of common/: errors, logging, ggml types, GGUF, model. */
#ifndef COMMON_COMMON_H
#define COMMON_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ------------------------------------------------------------------------------------------ */
/* Errors (common/err.c)                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Every fallible function returns >= 0 on success and one of these (negative) on failure.
 * Append only: the values travel in wire messages. */
enum common_err {
    COMMON_OK = 0,
    COMMON_EINVAL = -1,    /* invalid argument or malformed input */
    COMMON_ENOMEM = -2,    /* out of memory */
    COMMON_EIO = -3,       /* read/write failure */
    COMMON_EAGAIN = -4,    /* try again later */
    COMMON_ETIMEDOUT = -5, /* deadline passed */
    COMMON_ECLOSED = -6,   /* peer or object closed */
    COMMON_EPROTO = -7,    /* protocol violation */
    COMMON_ECORRUPT = -8,  /* file or segment content is inconsistent */
    COMMON_EBUSY = -9,     /* resource in use */
    COMMON_ENOTSUP = -10,  /* valid but not supported (architecture, type, feature) */
    COMMON_ERANGE = -11,   /* a value is out of the allowed range (prompt longer than ctx) */
    COMMON_ENOENT = -12,   /* no such file, key or tensor */
    COMMON_EDEVICE = -13,  /* the compute device (CUDA) failed: its state is lost */
};

/* Returns a static, human-readable name for a common_err code (never NULL). */
const char *common_strerror(int err);

/* Maps an errno value to a common_err code. */
int common_err_from_errno(int errnum);

/* A caller-owned buffer that a failing function fills with one line saying what is wrong and
 * where (byte offset, key, tensor name). Functions taking a `struct common_errmsg *` accept NULL.
 */
struct common_errmsg {
    char text[512]; /* NUL-terminated; empty when nothing was reported */
};

/* Formats into `e` (if not NULL) and returns `err`, so callers can write
 * `return common_errmsg_set(e, COMMON_ECORRUPT, "...", ...);`. */
int common_errmsg_set(struct common_errmsg *e, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------------------------------ */
/* Logging (common/log.c)                                                                      */
/* ------------------------------------------------------------------------------------------ */

enum common_log_level {
    COMMON_LOG_LEVEL_ERR = 3,
    COMMON_LOG_LEVEL_WARN = 4,
    COMMON_LOG_LEVEL_INFO = 6,
    COMMON_LOG_LEVEL_DEBUG = 7,
};

/* Sets/gets the process-wide level (process singleton; set before threads start). */
void                  common_log_set_level(enum common_log_level level);
enum common_log_level common_log_get_level(void);
/* Parses "err", "warn", "info", "debug"; returns 0 or COMMON_EINVAL. */
int common_log_parse_level(const char *s, enum common_log_level *out);
/* The same as an option callback (common_opt_parse_fn, struct common_opt's `parse`): `arg`
 * points at an enum common_log_level. Every daemon's --log-level uses it. */
int common_log_level_opt(void *arg, const char *value, struct common_errmsg *e);

/* Writes one line "TIME LEVEL component message" to stderr, TIME being the UTC wall clock in
 * ISO 8601 with milliseconds ("2026-11-24T01:28:34.123Z") and LEVEL one of ERR, WARN, INFO,
 * DEBUG; newlines in the message become spaces and a line is cut at 1023 bytes. Thread-safe:
 * one write() per line, so lines of concurrent threads and processes do not interleave. */
void common_log_write(enum common_log_level level, const char *component, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define COMMON_LOG_AT(lvl, comp, ...)                                                              \
    do {                                                                                           \
        if ((int)(lvl) <= (int)common_log_get_level())                                             \
            common_log_write((lvl), (comp), __VA_ARGS__);                                          \
    } while (0)
#define COMMON_LOG_ERR(comp, ...)   COMMON_LOG_AT(COMMON_LOG_LEVEL_ERR, comp, __VA_ARGS__)
#define COMMON_LOG_WARN(comp, ...)  COMMON_LOG_AT(COMMON_LOG_LEVEL_WARN, comp, __VA_ARGS__)
#define COMMON_LOG_INFO(comp, ...)  COMMON_LOG_AT(COMMON_LOG_LEVEL_INFO, comp, __VA_ARGS__)
#define COMMON_LOG_DEBUG(comp, ...) COMMON_LOG_AT(COMMON_LOG_LEVEL_DEBUG, comp, __VA_ARGS__)

/* ------------------------------------------------------------------------------------------ */
/* Sizes and small helpers (common/util.c)                                                     */
/* ------------------------------------------------------------------------------------------ */

/* Parses "123", "4K", "1.5G", "2GiB", "512MB" (binary multiples) into bytes.
 * Returns 0 or COMMON_EINVAL / COMMON_ERANGE. */
int common_parse_size(const char *s, uint64_t *out);

/* Formats bytes as "1.50 GiB" into buf; returns buf. */
const char *common_format_size(uint64_t bytes, char *buf, size_t len);

/* Overflow-checked arithmetic: return false on overflow (and leave *out unchanged). */
bool common_add_u64(uint64_t a, uint64_t b, uint64_t *out);
bool common_mul_u64(uint64_t a, uint64_t b, uint64_t *out);

/* Monotonic clock in nanoseconds. */
uint64_t common_now_ns(void);

/* True when process `pid` has exited or is a zombie (killed, not yet reaped by its parent): a
 * peer that will never answer again. False for 0 (no pid known) and for a live process, also one
 * of another user. (common/proc.c) */
bool common_pid_gone(uint32_t pid);
/* The first page of [p, p + bytes) that this process has not mapped, or NULL when all of it is
 * mapped (mincore; what a device's registration of host memory refuses). (common/proc.c) */
const void *common_unmapped_page(const void *p, size_t bytes);
/* A random non-zero 64-bit id (getrandom; the clock and pid when that fails): instance ids that
 * tell a restarted daemon from its predecessor, request ids. */
uint64_t common_random_id(void);

/* Makes sure `dir` is a run directory the daemons may trust: created with mode 0700 when absent
 * (its parent must exist), else a real directory (not a symbolic link) owned by this user without
 * any group or other permission. Nothing is changed on an existing directory. Returns 0,
 * COMMON_EINVAL (a message says what is wrong: not a directory, another owner, open to others),
 * or the mapped errno (COMMON_ENOENT, COMMON_EIO), with a message naming `dir`. (common/proc.c) */
int common_run_dir_prepare(const char *dir, struct common_errmsg *e);

/* Writes this process's pid as "PID\n" to the file `name` of run directory `dir` atomically: a
 * temporary file created with O_EXCL | O_NOFOLLOW (mode 0600) in the directory, then renamed over
 * `name`, so a reader never sees a partial file and no symbolic link planted in the directory
 * is followed. Returns 0, or COMMON_EINVAL (bad name), COMMON_EIO with a message. */
int common_pid_file_write(const char *dir, const char *name, struct common_errmsg *e);
/* Removes the pid file `name` of `dir` when it still holds this process's pid (a successor's is
 * left alone). Never follows a symbolic link. */
void common_pid_file_remove(const char *dir, const char *name);

/* ------------------------------------------------------------------------------------------ */
/* ggml tensor types (common/ggml_type.c)                                                      */
/* ------------------------------------------------------------------------------------------ */

/* ggml type ids as stored in GGUF tensor infos (ids of removed types are left out). */
enum common_ggml_type {
    COMMON_GGML_TYPE_F32 = 0,
    COMMON_GGML_TYPE_F16 = 1,
    COMMON_GGML_TYPE_Q4_0 = 2,
    COMMON_GGML_TYPE_Q4_1 = 3,
    COMMON_GGML_TYPE_Q5_0 = 6,
    COMMON_GGML_TYPE_Q5_1 = 7,
    COMMON_GGML_TYPE_Q8_0 = 8,
    COMMON_GGML_TYPE_Q8_1 = 9,
    COMMON_GGML_TYPE_Q2_K = 10,
    COMMON_GGML_TYPE_Q3_K = 11,
    COMMON_GGML_TYPE_Q4_K = 12,
    COMMON_GGML_TYPE_Q5_K = 13,
    COMMON_GGML_TYPE_Q6_K = 14,
    COMMON_GGML_TYPE_Q8_K = 15,
    COMMON_GGML_TYPE_IQ2_XXS = 16,
    COMMON_GGML_TYPE_IQ2_XS = 17,
    COMMON_GGML_TYPE_IQ3_XXS = 18,
    COMMON_GGML_TYPE_IQ1_S = 19,
    COMMON_GGML_TYPE_IQ4_NL = 20,
    COMMON_GGML_TYPE_IQ3_S = 21,
    COMMON_GGML_TYPE_IQ2_S = 22,
    COMMON_GGML_TYPE_IQ4_XS = 23,
    COMMON_GGML_TYPE_I8 = 24,
    COMMON_GGML_TYPE_I16 = 25,
    COMMON_GGML_TYPE_I32 = 26,
    COMMON_GGML_TYPE_I64 = 27,
    COMMON_GGML_TYPE_F64 = 28,
    COMMON_GGML_TYPE_IQ1_M = 29,
    COMMON_GGML_TYPE_BF16 = 30,
    COMMON_GGML_TYPE_TQ1_0 = 34,
    COMMON_GGML_TYPE_TQ2_0 = 35,
    COMMON_GGML_TYPE_I2_S = 36, /* BitNet's 2-bit ternary (Microsoft's ggml fork): three layouts */
    COMMON_GGML_TYPE_MXFP4 = 39,
    COMMON_GGML_TYPE_FILE_COUNT = 40, /* one past the largest id a GGUF file may hold */
    /* Kernel-only types (never in a file): the three layouts of an I2_S tensor as the kernels
     * read them (executor/model.c picks one per tensor; docs/kernels.md "I2_S"). Codes c (2
     * bits) are the weights c - 1 (0 -> -1, 1 -> 0, 2 -> +1; 3, never written, reads +2). */
    COMMON_GGML_TYPE_I2S_Q128 = 40, /* Microsoft's layout: 128 elements in 32 bytes, no scale */
    COMMON_GGML_TYPE_I2S_B32H = 41, /* 32 elements: 8 bytes of codes, an f16 scale */
    COMMON_GGML_TYPE_I2S_B32F = 42, /* 32 elements: 8 bytes of codes, an f32 scale */
    COMMON_GGML_TYPE_COUNT = 43,    /* one past the largest id known */
};

/* Layout of one ggml type: `blck` elements are stored in `type_size` bytes. */
struct common_ggml_type_info {
    const char *name;      /* "q4_0", ...: static */
    uint32_t    blck;      /* elements per block */
    uint32_t    type_size; /* bytes per block */
};

/* Returns the layout of type id `type`, or NULL when the id is unknown or removed. */
const struct common_ggml_type_info *common_ggml_type_get(uint32_t type);

/* Finds a type by its name ("q4_0", "Q4_K", "f16"; case-insensitive). Returns 0 or
 * COMMON_EINVAL. */
int common_ggml_type_from_name(const char *name, uint32_t *out);

/* Bytes of one row of `n` elements of `type`; returns 0 or COMMON_EINVAL (unknown type, or `n`
 * not a multiple of the block size) or COMMON_ERANGE (overflow). */
int common_ggml_row_size(uint32_t type, uint64_t n, uint64_t *out);

/* ------------------------------------------------------------------------------------------ */
/* GGUF reader (common/gguf.c)                                                                 */
/* ------------------------------------------------------------------------------------------ */

#define COMMON_GGUF_MAGIC         0x46554747u /* "GGUF" read as a little-endian u32 */
#define COMMON_GGUF_MAX_DIMS      4
#define COMMON_GGUF_DEFAULT_ALIGN 32u

enum common_gguf_vtype {
    COMMON_GGUF_UINT8 = 0,
    COMMON_GGUF_INT8 = 1,
    COMMON_GGUF_UINT16 = 2,
    COMMON_GGUF_INT16 = 3,
    COMMON_GGUF_UINT32 = 4,
    COMMON_GGUF_INT32 = 5,
    COMMON_GGUF_FLOAT32 = 6,
    COMMON_GGUF_BOOL = 7,
    COMMON_GGUF_STRING = 8,
    COMMON_GGUF_ARRAY = 9,
    COMMON_GGUF_UINT64 = 10,
    COMMON_GGUF_INT64 = 11,
    COMMON_GGUF_FLOAT64 = 12,
    COMMON_GGUF_VTYPE_COUNT,
};

/* A string inside the parsed header: not NUL-terminated, may contain any bytes. */
struct common_gguf_str {
    const char *ptr; /* borrowed: valid while the struct common_gguf lives */
    uint64_t    len;
};

/* One metadata value. Scalars are decoded; arrays keep their element type and count. */
struct common_gguf_value {
    uint32_t type; /* enum common_gguf_vtype */
    union {
        uint64_t               u64; /* every unsigned integer type and BOOL */
        int64_t                i64; /* every signed integer type */
        double                 f64; /* FLOAT32 and FLOAT64 */
        struct common_gguf_str str; /* STRING */
        struct {
            uint32_t    type; /* element type; never ARRAY (nested arrays rejected) */
            uint64_t    n;    /* element count */
            const void *data; /* borrowed: packed little-endian elements (numeric) */
            const struct common_gguf_str *strs; /* borrowed: n strings (STRING arrays only) */
        } arr;
    } v;
};

struct common_gguf_kv {
    const char              *key; /* borrowed, NUL-terminated (keys never contain NUL) */
    struct common_gguf_value value;
    uint64_t                 file_offset; /* byte offset of the key in its file */
};

struct common_gguf_tensor {
    const char *name;                     /* borrowed, NUL-terminated */
    uint32_t    n_dims;                   /* 1..4 */
    uint64_t    ne[COMMON_GGUF_MAX_DIMS]; /* elements per dim, ggml order; unused dims are 1 */
    uint32_t    type;                     /* enum common_ggml_type */
    uint32_t    split;                    /* index of the file (split) holding the data */
    uint64_t    offset;                   /* absolute byte offset of the data in that file */
    uint64_t    size;                     /* bytes of data */
};

/* A parsed GGUF model: one file or all the splits of a split model. Opaque. */
struct common_gguf;

struct common_gguf_opts {
    bool     no_splits;        /* open only the named file even if it is a split (false = follow) */
    uint64_t max_header_bytes; /* refuse headers larger than this; 0 = 1 GiB */
};

/* Opens and parses `path` (and, unless opts->no_splits, the other files of a split model named
 * NAME-0000K-of-0000N.gguf). Every count, length, offset and size is checked against the file.
 * On success *out owns open file descriptors and the parsed header; free with
 * common_gguf_close(). Returns 0, or COMMON_ENOENT / COMMON_EIO (file), COMMON_ECORRUPT (bad or
 * truncated content), COMMON_ENOTSUP (unsupported version or tensor type), COMMON_ENOMEM, with a
 * message in `e`. `opts` may be NULL. Thread-safe for distinct objects. */
int common_gguf_open(const char *path, const struct common_gguf_opts *opts,
                     struct common_gguf **out, struct common_errmsg *e);

/* Parses a GGUF image held in memory (the first `len` bytes of a file of `file_size` bytes; pass
 * file_size = len for a whole file). Used by tests and the fuzzer. Copies what it keeps.
 * Same returns as common_gguf_open(). */
int common_gguf_parse(const void *buf, size_t len, uint64_t file_size, struct common_gguf **out,
                      struct common_errmsg *e);

/* Frees everything; accepts NULL. */
void common_gguf_close(struct common_gguf *g);

uint32_t common_gguf_version(const struct common_gguf *g);
uint64_t common_gguf_alignment(const struct common_gguf *g);

/* Key/value access. Index order is file order (split 0 only for split models). */
uint64_t                     common_gguf_n_kv(const struct common_gguf *g);
const struct common_gguf_kv *common_gguf_kv_at(const struct common_gguf *g, uint64_t i);
/* Returns the kv named `key`, or NULL. */
const struct common_gguf_kv *common_gguf_find(const struct common_gguf *g, const char *key);

/* Typed getters: return 0, COMMON_ENOENT when the key is absent, COMMON_EINVAL when its type
 * cannot be converted without loss (integers accept any integer type in range; floats accept
 * FLOAT32/FLOAT64 and integers). *out is unchanged on failure. */
int common_gguf_get_u32(const struct common_gguf *g, const char *key, uint32_t *out);
int common_gguf_get_u64(const struct common_gguf *g, const char *key, uint64_t *out);
int common_gguf_get_i64(const struct common_gguf *g, const char *key, int64_t *out);
int common_gguf_get_f32(const struct common_gguf *g, const char *key, float *out);
int common_gguf_get_bool(const struct common_gguf *g, const char *key, bool *out);
int common_gguf_get_str(const struct common_gguf *g, const char *key, struct common_gguf_str *out);
/* Array access: returns 0 and fills *out with the array value if `key` is an array whose
 * element type is `elem_type`; COMMON_ENOENT / COMMON_EINVAL otherwise. */
int common_gguf_get_arr(const struct common_gguf *g, const char *key, uint32_t elem_type,
                        const struct common_gguf_value **out);

/* Reads element i of a numeric array value as double / int64 (no bounds check beyond assert). */
double  common_gguf_arr_f64(const struct common_gguf_value *arr, uint64_t i);
int64_t common_gguf_arr_i64(const struct common_gguf_value *arr, uint64_t i);

/* Returns a static name for a value type ("uint32", "string", "array", ...). */
const char *common_gguf_vtype_name(uint32_t type);
/* Bytes of one scalar of value type `type`; 0 for STRING, ARRAY and unknown types. */
uint64_t common_gguf_vtype_size(uint32_t type);

/* Tensors, in file order across splits. */
uint64_t                         common_gguf_n_tensors(const struct common_gguf *g);
const struct common_gguf_tensor *common_gguf_tensor_at(const struct common_gguf *g, uint64_t i);
/* Returns the tensor named `name`, or NULL. */
const struct common_gguf_tensor *common_gguf_tensor_find(const struct common_gguf *g,
                                                         const char               *name);

/* Files (splits). For a model parsed from memory there is one split with fd -1. */
uint32_t    common_gguf_n_splits(const struct common_gguf *g);
const char *common_gguf_split_path(const struct common_gguf *g, uint32_t split);
/* Returns the open read-only descriptor of a split (owned by g; do not close), or -1. */
int      common_gguf_split_fd(const struct common_gguf *g, uint32_t split);
uint64_t common_gguf_split_size(const struct common_gguf *g, uint32_t split);
/* Byte offset where the tensor data section of a split starts. */
uint64_t common_gguf_split_data_offset(const struct common_gguf *g, uint32_t split);
/* Checks that every open split still has the size it had when opened (a file truncated under a
 * running daemon makes its reads fail). Returns 0, or COMMON_EIO with the file named in e. */
int common_gguf_check_files(const struct common_gguf *g, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* GGUF writer (common/gguf_write.c)                                                           */
/* ------------------------------------------------------------------------------------------ */

/* Builds a GGUF v3 file: metadata and tensor infos are collected in memory, then the header is
 * written and the caller streams each tensor's data in info order. Memory use is the header
 * only, so files of tens of GB are written with bounded memory. Opaque. */
struct common_gguf_writer;

int  common_gguf_writer_create(struct common_gguf_writer **out, uint32_t alignment);
void common_gguf_writer_destroy(struct common_gguf_writer *w);

/* Metadata setters; keys are copied. Return 0, COMMON_EINVAL (duplicate key) or COMMON_ENOMEM. */
int common_gguf_writer_set_u32(struct common_gguf_writer *w, const char *key, uint32_t v);
int common_gguf_writer_set_i32(struct common_gguf_writer *w, const char *key, int32_t v);
int common_gguf_writer_set_u64(struct common_gguf_writer *w, const char *key, uint64_t v);
int common_gguf_writer_set_f32(struct common_gguf_writer *w, const char *key, float v);
int common_gguf_writer_set_bool(struct common_gguf_writer *w, const char *key, bool v);
int common_gguf_writer_set_str(struct common_gguf_writer *w, const char *key, const char *v);
/* Arrays: numeric arrays take `n` packed little-endian elements of `elem_type`; string arrays
 * take `n` struct common_gguf_str. Data is copied. */
int common_gguf_writer_set_arr(struct common_gguf_writer *w, const char *key, uint32_t elem_type,
                               const void *data, uint64_t n);
/* Copies one kv (any type, including arrays) from a parsed file. */
int common_gguf_writer_copy_kv(struct common_gguf_writer *w, const struct common_gguf_kv *kv);

/* Declares a tensor; offsets are assigned in call order. Returns 0, COMMON_EINVAL or
 * COMMON_ENOMEM. */
int common_gguf_writer_add_tensor(struct common_gguf_writer *w, const char *name, uint32_t type,
                                  uint32_t n_dims, const uint64_t *ne);
/* Same with the data's size given: only for I2_S, whose layouts differ in size (`bytes` at
 * least the 2-bit codes' ne[0] * ... / 4); bytes 0 = the size the type's table gives. */
int common_gguf_writer_add_tensor_sized(struct common_gguf_writer *w, const char *name,
                                        uint32_t type, uint32_t n_dims, const uint64_t *ne,
                                        uint64_t bytes);

/* The header as it would be written (magic, metadata, tensor infos, padding to the alignment)
 * in *out (malloc'd, *len bytes), for a container that embeds it (QSF). 0 or COMMON_ENOMEM. */
int common_gguf_writer_image(const struct common_gguf_writer *w, uint8_t **out, size_t *len);
/* Tensor i's offset in the data section and its bytes, as declared. 0 or COMMON_EINVAL. */
int common_gguf_writer_tensor_place(const struct common_gguf_writer *w, uint64_t i,
                                    uint64_t *offset, uint64_t *size);
/* Bytes of the data section the declared tensors take (padding included). */
uint64_t common_gguf_writer_data_size(const struct common_gguf_writer *w);

/* Opens `path`, writes the header and padding. Then call common_gguf_writer_write_data() with
 * every tensor's bytes in declaration order (any number of calls per tensor), and finish with
 * common_gguf_writer_finish(). Return 0 or COMMON_EIO / COMMON_EINVAL with a message. */
int common_gguf_writer_begin(struct common_gguf_writer *w, const char *path,
                             struct common_errmsg *e);
int common_gguf_writer_write_data(struct common_gguf_writer *w, const void *data, size_t len,
                                  struct common_errmsg *e);
int common_gguf_writer_finish(struct common_gguf_writer *w, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* Model description (common/model.c)                                                          */
/* ------------------------------------------------------------------------------------------ */

enum common_arch {
    COMMON_ARCH_LLAMA = 0,
    COMMON_ARCH_QWEN2,
    COMMON_ARCH_QWEN3,
    COMMON_ARCH_QWEN2MOE,
    COMMON_ARCH_QWEN3MOE,
    COMMON_ARCH_OLMOE,
    COMMON_ARCH_DEEPSEEK2,
    COMMON_ARCH_GLM4MOE,
    COMMON_ARCH_GPTOSS,
    COMMON_ARCH_BITNET,      /* llama.cpp's bitnet: sub-norms, per-tensor scales, SwiGLU */
    COMMON_ARCH_BITNET_B158, /* Microsoft's bitnet-b1.58 (BitNet b1.58 2B-4T): ReLU^2 FFN */
    COMMON_ARCH_COUNT,
};

/* Tensor roles inside one transformer block. */
enum common_layer_role {
    COMMON_ROLE_ATTN_NORM = 0,
    COMMON_ROLE_ATTN_Q,
    COMMON_ROLE_ATTN_K,
    COMMON_ROLE_ATTN_V,
    COMMON_ROLE_ATTN_OUT,
    COMMON_ROLE_ATTN_Q_BIAS,
    COMMON_ROLE_ATTN_K_BIAS,
    COMMON_ROLE_ATTN_V_BIAS,
    COMMON_ROLE_ATTN_Q_NORM,
    COMMON_ROLE_ATTN_K_NORM,
    COMMON_ROLE_FFN_NORM,
    COMMON_ROLE_FFN_GATE,
    COMMON_ROLE_FFN_UP,
    COMMON_ROLE_FFN_DOWN,
    COMMON_ROLE_FFN_GATE_INP,
    COMMON_ROLE_FFN_GATE_EXPS,
    COMMON_ROLE_FFN_UP_EXPS,
    COMMON_ROLE_FFN_DOWN_EXPS,
    COMMON_ROLE_FFN_GATE_INP_SHEXP,
    COMMON_ROLE_FFN_GATE_SHEXP,
    COMMON_ROLE_FFN_UP_SHEXP,
    COMMON_ROLE_FFN_DOWN_SHEXP,
    /* Multi-head latent attention (deepseek2) and its router bias. */
    COMMON_ROLE_ATTN_Q_A,        /* (n_embd -> q_lora_rank) */
    COMMON_ROLE_ATTN_Q_A_NORM,   /* (q_lora_rank) */
    COMMON_ROLE_ATTN_Q_B,        /* (q_lora_rank -> n_head * head_dim_k_mla) */
    COMMON_ROLE_ATTN_KV_A_MQA,   /* (n_embd -> kv_lora_rank + n_rot) */
    COMMON_ROLE_ATTN_KV_A_NORM,  /* (kv_lora_rank) */
    COMMON_ROLE_ATTN_K_B,        /* per head (nope -> kv_lora_rank): absorbed into the query */
    COMMON_ROLE_ATTN_V_B,        /* per head (kv_lora_rank -> head_dim_v_mla) */
    COMMON_ROLE_FFN_EXP_PROBS_B, /* (n_expert) selection bias of the router */
    /* gpt-oss: biases on the attention output, the router and the experts; attention sinks. */
    COMMON_ROLE_ATTN_OUT_BIAS,      /* (n_embd) */
    COMMON_ROLE_ATTN_SINKS,         /* (n_head) a logit per head that takes part in the softmax */
    COMMON_ROLE_FFN_GATE_INP_BIAS,  /* (n_expert) */
    COMMON_ROLE_FFN_GATE_EXPS_BIAS, /* (n_ff_exp, n_expert) */
    COMMON_ROLE_FFN_UP_EXPS_BIAS,   /* (n_ff_exp, n_expert) */
    COMMON_ROLE_FFN_DOWN_EXPS_BIAS, /* (n_embd, n_expert) */
    /* bitnet: RMSNorms before the output and down projections, and per-tensor scales {1} that
     * multiply a projection's output (llama.cpp's wq_s ... ffn_down_s). */
    COMMON_ROLE_ATTN_SUB_NORM, /* (n_head * head_dim_v) */
    COMMON_ROLE_FFN_SUB_NORM,  /* (n_ff) */
    COMMON_ROLE_ATTN_Q_SCALE,
    COMMON_ROLE_ATTN_K_SCALE,
    COMMON_ROLE_ATTN_V_SCALE,
    COMMON_ROLE_ATTN_OUT_SCALE,
    COMMON_ROLE_FFN_GATE_SCALE,
    COMMON_ROLE_FFN_UP_SCALE,
    COMMON_ROLE_FFN_DOWN_SCALE,
    COMMON_ROLE_COUNT,
};

/* Model-wide tensor roles. */
enum common_global_role {
    COMMON_GROLE_TOKEN_EMBD = 0,
    COMMON_GROLE_OUTPUT_NORM,
    COMMON_GROLE_OUTPUT, /* absent when the head is tied to token_embd */
    COMMON_GROLE_ROPE_FREQS,
    COMMON_GROLE_COUNT,
};

/* The three matrices of one routed expert. */
enum common_expert_part {
    COMMON_EXPERT_GATE = 0,
    COMMON_EXPERT_UP,
    COMMON_EXPERT_DOWN,
    COMMON_EXPERT_PART_COUNT,
};

struct common_hparams {
    uint32_t n_vocab;         /* tokens */
    uint32_t n_ctx_train;     /* trained context length */
    uint32_t n_embd;          /* model width */
    uint32_t n_layer;         /* transformer blocks */
    uint32_t n_head;          /* query heads */
    uint32_t n_head_kv;       /* key/value heads (GQA) */
    uint32_t head_dim_k;      /* key/query head width (n_embd / n_head unless key_length set) */
    uint32_t head_dim_v;      /* value head width */
    uint32_t n_rot;           /* rotary dims per head */
    uint32_t n_ff;            /* dense FFN width (0 for pure MoE) */
    uint32_t n_expert;        /* routed experts per layer (0 = dense) */
    uint32_t n_expert_used;   /* experts picked per token */
    uint32_t n_ff_exp;        /* routed expert FFN width */
    uint32_t n_ff_shexp;      /* shared expert FFN width (0 = none) */
    uint32_t rope_neox;       /* 1 = NeoX ordering (halves), 0 = normal (adjacent pairs) */
    uint32_t norm_topk_prob;  /* 1 = renormalise the top-k gate weights */
    float    rope_freq_base;  /* theta */
    float    rope_freq_scale; /* 1 / linear scaling factor */
    float    rms_eps;         /* RMSNorm epsilon */
    /* YaRN (rope.scaling.type yarn), as llama.cpp's context derives it; ext 0 = off. */
    float    yarn_ext_factor;  /* 1 with YaRN, else 0 */
    float    yarn_attn_factor; /* magnitude of the rotated pairs before YaRN's own correction */
    float    yarn_beta_fast, yarn_beta_slow;
    uint32_t n_ctx_orig_yarn; /* rope.scaling.original_context_length */
    float    yarn_log_mul;    /* deepseek2: mscale_all_dim (0 = none) */
    float    attn_scale;      /* KQ scale; 0 = 1 / sqrt(head_dim_k) */
    /* Multi-head latent attention (deepseek2; all 0 otherwise). The cache holds one "head" of
     * head_dim_k = kv_lora_rank + n_rot (the latent and the rotary key) and head_dim_v =
     * kv_lora_rank; queries are absorbed into the latent with attn_k_b. */
    uint32_t n_lora_q;       /* q_lora_rank; 0 = one attn_q projection */
    uint32_t n_lora_kv;      /* kv_lora_rank */
    uint32_t head_dim_k_mla; /* per-head query width before absorption (nope + rope) */
    uint32_t head_dim_v_mla; /* per-head value width after attn_v_b */
    /* Routing beyond softmax-top-k (deepseek2). */
    uint32_t n_layer_dense_lead;   /* leading layers with a dense FFN */
    uint32_t n_expert_shared;      /* shared experts (their FFN is n_ff_shexp wide) */
    uint32_t expert_gating;        /* enum common_expert_gating */
    float    expert_weights_scale; /* multiplies the routed weights; 0 or 1 = none */
    uint32_t n_expert_groups;      /* group-limited top-k: groups (0/1 = none) */
    uint32_t n_group_used;         /* groups kept per token */
    /* gpt-oss: sliding-window attention on some layers, the clamped SwiGLU of its experts. */
    uint32_t n_swa;      /* window in positions (0 = none) */
    uint32_t swa_period; /* layer il slides when il % period < period - 1 (0 = every layer) */
    bool     swiglu_oai; /* experts: min(g, 7) * sigmoid(1.702 g) * (clamp(u, -7, 7) + 1) */
    /* bitnet: attn_sub_norm / ffn_sub_norm before the output and down projections. */
    bool sub_norms;
    bool ffn_relu2; /* bitnet-b1.58: the FFN is relu(g)^2 * u instead of silu(g) * u */
};

/* Most expert groups a model may have (DeepSeek V3 has 8). */
#define COMMON_MAX_EXPERT_GROUPS 64u

/* How router logits become expert probabilities. */
enum common_expert_gating {
    COMMON_GATING_SOFTMAX = 0,
    COMMON_GATING_SIGMOID,        /* DeepSeek V3: sigmoid scores, a bias for selection only */
    COMMON_GATING_SOFTMAX_WEIGHT, /* gpt-oss: top-k of the logits, softmax over the k chosen */
};

/* Where one expert part lives in the model files. */
struct common_span {
    uint32_t split;  /* file index (common_gguf_split_fd) */
    uint32_t type;   /* enum common_ggml_type of the data */
    uint64_t offset; /* absolute byte offset in that file */
    uint64_t size;   /* bytes */
    uint64_t rows;   /* rows of the matrix slice */
    uint64_t cols;   /* elements per row */
};

struct common_model_layer {
    int64_t tensor[COMMON_ROLE_COUNT]; /* tensor index in the gguf, -1 when absent */
};

/* A model description on top of a parsed GGUF: architecture, hyper-parameters, tensor roles,
 * expert geometry and byte totals. */
struct common_model {
    const struct common_gguf  *gguf; /* borrowed: must outlive the model */
    enum common_arch           arch;
    const char                *arch_name; /* static */
    struct common_hparams      hp;
    int64_t                    global[COMMON_GROLE_COUNT]; /* tensor indices, -1 when absent */
    struct common_model_layer *layers;                     /* owned: n_layer entries */
    uint64_t                   bytes_total;                /* all tensor data */
    uint64_t                   bytes_resident;             /* everything but routed experts */
    uint64_t                   bytes_experts;              /* all routed expert tensors */
    uint64_t bytes_expert_bundle; /* largest gate+up+down of one expert in one layer */
    uint64_t bytes_active;        /* touched per token: resident (minus unused embedding rows)
                                     + n_expert_used bundles per layer */
    uint64_t bytes_unused;        /* tensors of blocks past n_layer (glm4moe's next-token
                                     prediction layers): never read */
    bool ffn_streamed;            /* a dense model whose FFN is streamed as one expert per layer
                                     (common_model_stream_dense) */
};

/* Returns the static name of an architecture ("llama", ...). */
const char *common_arch_name(enum common_arch arch);
/* Writes the supported architectures as "llama, qwen2, ..." into buf (len bytes, truncated to
 * fit); returns buf. For messages and --help. */
const char *common_arch_list(char *buf, size_t len);
/* Finds the architecture named by name[0..len); false when none is. */
bool common_arch_from_name(const char *name, size_t len, enum common_arch *out);
/* True for architectures whose layers always have routed experts (qwen2moe, ...). */
bool common_arch_is_moe(enum common_arch arch);
/* Returns the GGUF tensor suffix of a layer role ("attn_q.weight", ...). */
const char *common_layer_role_name(enum common_layer_role role);

/* Describes the model in `g`: reads general.architecture and its hyper-parameter keys, assigns
 * tensor roles, checks shapes against the hyper-parameters. Returns 0, COMMON_ENOTSUP (unknown
 * architecture, named in e), COMMON_ECORRUPT (missing key or tensor, inconsistent shape, named),
 * COMMON_ENOMEM. Free with common_model_fini(). */
int common_model_init(struct common_model *m, const struct common_gguf *g, struct common_errmsg *e);
void common_model_fini(struct common_model *m);

/* True when the model has routed experts. */
bool common_model_is_moe(const struct common_model *m);
/* True when layer `il` has routed experts (not one of the leading dense layers of deepseek2). */
bool common_model_layer_is_moe(const struct common_model *m, uint32_t il);
/* True when layer `il` attends to a sliding window of hp.n_swa positions (gpt-oss). */
bool common_hparams_layer_is_swa(const struct common_hparams *hp, uint32_t il);
/* Positions the KV cache keeps for layer `il`: n_ctx, or for a sliding layer a ring of the window
 * plus one batch (min(n_ctx, n_swa + n_batch)): a batch's queries still see their whole window
 * after the batch's own positions are stored. */
uint32_t common_kv_layer_positions(const struct common_hparams *hp, uint32_t n_ctx,
                                   uint32_t n_batch, uint32_t il);
/* True for tensor `index` of a block the forward pass does not run (glm4moe's next-token
 * prediction layers, blk.N with N >= n_layer): not loaded, not counted as resident. */
bool common_model_tensor_is_unused(const struct common_model *m, uint64_t index);

/* Presents a dense model's FFN as one routed "expert" per layer, always chosen with weight 1, so
 * that the streaming machinery (the fetcher's plan and pool, the executor's expert source) reads
 * it from storage under a memory budget: n_expert = n_expert_used = 1, n_ff_exp = n_ff, each
 * layer's ffn_gate/up/down in the expert roles, the byte totals recomputed (the FFN leaves the
 * resident bytes); sets ffn_streamed. Returns 0, or COMMON_EINVAL for a model with experts. */
int common_model_stream_dense(struct common_model *m);

/* Where part `part` of expert `expert` of layer `layer` lives. Returns 0, or COMMON_EINVAL for a
 * dense model or layer, or out-of-range arguments. */
int common_model_expert_span(const struct common_model *m, uint32_t layer, uint32_t expert,
                             enum common_expert_part part, struct common_span *out);

/* Reads the bytes of `span` (a tensor or one expert part of model `g`) into `dst`, which holds
 * at least span->size bytes, with blocking pread calls. Returns 0, or COMMON_EINVAL (no open file
 * for the split), COMMON_EIO with a message naming the file, offset and errno (a short read is an
 * error; `dst` is then undefined). Thread-safe: pread does not move the file offset. */
int common_gguf_read_span(const struct common_gguf *g, const struct common_span *span, void *dst,
                          struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* QSF, sluice's streaming container (common/qsf.c reads, common/qsf_write.c converts)          */
/* ------------------------------------------------------------------------------------------ */

/* A QSF file holds a GGUF model laid out for streaming (docs/qsf.md has the byte layout): a
 * checksummed header; the model's metadata and tensor infos as an embedded GGUF image; the
 * resident tensors, each with a checksum; and every routed expert of every layer as one bundle
 * (its gate, up and down parts contiguous, 4 KiB aligned, one read), each with a checksum over its
 * stored bytes and, where that saves enough, LZ4-compressed. common_gguf_open() opens a QSF file
 * like a GGUF one: the accessors above see the same metadata and tensors. */
#define COMMON_QSF_MAGIC      0x31465351u /* "QSF1" read as a little-endian u32 */
#define COMMON_QSF_VERSION    1u
#define COMMON_QSF_ALIGN      4096u /* bundles, regions and the header page */
#define COMMON_QSF_PART_ALIGN 64u   /* parts inside a bundle */

enum common_qsf_codec {
    COMMON_QSF_RAW = 0, /* stored as is */
    COMMON_QSF_LZ4 = 1, /* one LZ4 block (liblz4), decoded in place in the slot */
};

/* Where one bundle lives and how a reader lays it out in memory. */
struct common_qsf_bundle {
    uint64_t offset; /* file offset of the stored bytes (aligned) */
    uint64_t stored; /* stored bytes (compressed size for LZ4) */
    uint64_t raw;    /* bytes once decoded: the three parts */
    uint64_t hash;   /* XXH3-64 (xxHash, seed 0) of the stored bytes */
    uint32_t codec;  /* enum common_qsf_codec */
    uint32_t file;   /* the file holding it: 0 the main file, k a bundle file (split k) */
    uint64_t part_off[COMMON_EXPERT_PART_COUNT];  /* parts' offsets in the decoded bundle */
    uint64_t part_size[COMMON_EXPERT_PART_COUNT]; /* parts' bytes (0: the layer lacks it) */
    uint64_t read_off;  /* where to read the stored bytes in a buffer (aligned; 0 for RAW, the
                           in-place decoding position for LZ4) */
    uint64_t buf_bytes; /* buffer bytes the read and the decoding need (aligned) */
};

/* True when `g` was opened from a QSF file. */
bool common_gguf_is_qsf(const struct common_gguf *g);
/* True when tensor `index` of a QSF file lives in bundles (a routed expert weight): its bytes are
 * reached through common_gguf_bundle(), not as one tensor. False for GGUF files. */
bool common_gguf_tensor_bundled(const struct common_gguf *g, uint64_t index);
/* The bundle of expert `expert` of layer `layer`. Returns 0, COMMON_ENOENT when `g` is not QSF
 * or the layer has no routed experts, COMMON_EINVAL out of range. */
int common_gguf_bundle(const struct common_gguf *g, uint32_t layer, uint32_t expert,
                       struct common_qsf_bundle *out);
/* Largest buf_bytes of any bundle (0 for GGUF). */
uint64_t common_gguf_bundle_buf_max(const struct common_gguf *g);
/* Checks the stored bytes of bundle `b` read to buf + b->read_off against its checksum and
 * decodes them in place, leaving the raw parts at buf (which holds b->buf_bytes). Returns 0, or
 * COMMON_ECORRUPT with a message (checksum mismatch, LZ4 block that does not decode). */
int common_qsf_bundle_finish(const struct common_qsf_bundle *b, uint8_t *buf,
                             struct common_errmsg *e);
/* Checks the bytes of tensor `index` (at `data`, t->size bytes) against its checksum in a QSF
 * file; always 0 for GGUF files and bundled tensors. COMMON_ECORRUPT names the tensor. */
int common_gguf_check_tensor(const struct common_gguf *g, uint64_t index, const void *data,
                             struct common_errmsg *e);
/* XXH3-64 (xxHash's 64-bit XXH3, seed 0), QSF's checksum. */
uint64_t common_qsf_hash(const void *data, size_t len);
/* True when the file at `path` starts with the QSF magic (false when unreadable). */
bool common_qsf_file_is(const char *path);
/* Parses a whole QSF file image held in memory (tests and the fuzzer): header, metadata, index
 * and every region bound are checked as common_gguf_open() checks them; data is not read. */
int common_qsf_parse(const void *buf, size_t len, struct common_gguf **out,
                     struct common_errmsg *e);

/* Progress of a long QSF job: `done` of `total` bytes. */
typedef void (*common_qsf_progress_fn)(void *arg, uint64_t done, uint64_t total);

/* What a conversion wrote or a verification read. */
struct common_qsf_stats {
    uint64_t n_tensors;      /* resident tensors */
    uint64_t resident_bytes; /* their bytes */
    uint64_t n_bundles;      /* expert bundles */
    uint64_t n_lz4;          /* of which LZ4-compressed */
    uint64_t raw_bytes;      /* bundles' decoded bytes */
    uint64_t stored_bytes;   /* bundles' stored bytes */
    uint64_t file_bytes;     /* the whole file */
    uint64_t n_bad;          /* verify: tensors and bundles whose checksum or decoding failed */
};

enum common_qsf_lz4 {
    COMMON_QSF_LZ4_AUTO = 0, /* compress a bundle only where it saves at least 10% */
    COMMON_QSF_LZ4_NEVER,    /* store every bundle raw */
    COMMON_QSF_LZ4_ALWAYS,   /* compress every bundle that gets smaller at all */
};

struct common_qsf_convert_opts {
    enum common_qsf_lz4 lz4;
    /* Bundle files: 0 or 1 = every bundle in the main file; N >= 2 = N bundle files, file k
     * holding experts [(k-1)*E/N, k*E/N) of every layer (the experts fetcher daemon k-1 of N
     * serves), in shard_dirs[k-1] (NULL = beside the main file) so each can sit on its own
     * device. */
    uint32_t               n_shards;
    const char *const     *shard_dirs;
    common_qsf_progress_fn progress; /* NULL: none */
    void                  *progress_arg;
};

/* Writes model `m` (opened from `in`, GGUF or QSF) to `path` as QSF, through `path`.tmp renamed
 * at the end, so a failed conversion leaves no partial file. Memory is bounded by one bundle
 * (twice, for LZ4) and a copy buffer. Returns 0 with *st filled, or an error with a message. */
int common_qsf_convert(const struct common_gguf *in, const struct common_model *m, const char *path,
                       const struct common_qsf_convert_opts *o, struct common_qsf_stats *st,
                       struct common_errmsg *e);

/* Reads every resident tensor and bundle of QSF file `g` and checks every checksum (and that
 * each LZ4 bundle decodes). Returns 0 when all hold; COMMON_ECORRUPT with the first bad one
 * named in `e` (st->n_bad counts them all); COMMON_EINVAL when `g` is not QSF; COMMON_EIO. */
int common_qsf_verify(const struct common_gguf *g, common_qsf_progress_fn progress, void *arg,
                      struct common_qsf_stats *st, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* Inference context layout: the sizes the executor allocates and the plan counts              */
/* (common/ctx_layout.c)                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* KV cache element types. */
enum common_cache_type {
    COMMON_CACHE_F16 = 0, /* llama.cpp's default: K and V stored as f16 */
    COMMON_CACHE_Q8_0,    /* K and V as q8_0 blocks (head widths must be multiples of 32) */
};

/* Parses "f16" / "q8_0" (either case); returns 0 or COMMON_EINVAL. */
int common_cache_type_parse(const char *s, enum common_cache_type *out);
/* The same as an option parser (struct common_opt's parse, the enum at arg): the commands' and
 * the daemons' --cache-type, with "expects f16 or q8_0, got ..." in e. */
int common_cache_type_opt(void *arg, const char *v, struct common_errmsg *e);
/* Static name of a cache type ("f16", "q8_0"). */
const char *common_cache_type_name(enum common_cache_type t);

/* The scratch buffers of one inference context (the executor's struct executor_ctx), in the
 * order the layout table lists them. Buffers marked MoE exist only for models with experts. */
enum common_ctx_buf {
    COMMON_CTX_X = 0,       /* (n_batch, n_embd) f32 residual stream */
    COMMON_CTX_XN,          /* (n_batch, n_embd) f32 normalised input of a block */
    COMMON_CTX_Q,           /* (n_batch, n_head * head_dim_k) f32 */
    COMMON_CTX_K,           /* (n_batch, n_head_kv * head_dim_k) f32 */
    COMMON_CTX_V,           /* (n_batch, n_head_kv * head_dim_v) f32 */
    COMMON_CTX_ATT,         /* (n_batch, n_head * head_dim_v) f32 attention output */
    COMMON_CTX_TMP,         /* (n_batch, n_embd) f32 block output */
    COMMON_CTX_GATE,        /* (n_batch, n_ff_max) f32 FFN gate */
    COMMON_CTX_UP,          /* (n_batch, n_ff_max) f32 FFN up */
    COMMON_CTX_ACT0,        /* (n_batch, act_row) bytes: activations in a vec_dot type */
    COMMON_CTX_ACT1,        /* as ACT0 (q, k and v may need three types) */
    COMMON_CTX_ACT2,        /* as ACT0 */
    COMMON_CTX_ROPE,        /* (n_batch, n_rot) f32 cos, sin pairs */
    COMMON_CTX_TH_SCORES,   /* (n_threads, att_heads, n_ctx) f32 attention scores per thread */
    COMMON_CTX_TH_P16,      /* (n_threads, n_ctx) f16 probabilities per thread */
    COMMON_CTX_TH_Q,        /* (n_threads, att_heads, th_q_bytes) queries in the cache's dot type */
    COMMON_CTX_TH_V,        /* (n_threads, head_dim_v) f32 dequantized V row */
    COMMON_CTX_ROUTER,      /* MoE: (n_batch, n_expert) f32 gate logits */
    COMMON_CTX_SEL,         /* MoE: (n_batch, n_expert_used) i32 chosen experts */
    COMMON_CTX_SEL_W,       /* MoE: (n_batch, n_expert_used) f32 their weights */
    COMMON_CTX_EX_COUNT,    /* MoE: (n_expert) i32 tokens per expert */
    COMMON_CTX_EX_START,    /* MoE: (n_expert + 1) i32 offsets into EX_ITEMS */
    COMMON_CTX_EX_ITEMS,    /* MoE: (n_batch, n_expert_used) i32 items by expert */
    COMMON_CTX_GX,          /* MoE: (n_batch, n_embd) f32 rows gathered for one expert */
    COMMON_CTX_MOE_OUT,     /* MoE: (n_batch, n_expert_used, n_embd) f32 expert outputs */
    COMMON_CTX_EX_ORDER,    /* MoE: (n_expert) i32 compute order */
    COMMON_CTX_PRED_LOGITS, /* MoE: (n_batch, n_expert) f32 selection scores (scratch) */
    COMMON_CTX_PRED_GATE,   /* MoE: (n_batch, n_expert_used) i32 gate predictor's guess */
    COMMON_CTX_PREV_SEL,    /* MoE: (n_layer, n_expert_used) i32 last token's choices */
    COMMON_CTX_HAVE_PREV,   /* MoE: (n_layer) bytes */
    COMMON_CTX_HINT_MARK,   /* MoE: (n_expert) u32 hint stamps */
    COMMON_CTX_MLA_QA,      /* MLA: (n_batch, q_lora_rank) f32 low-rank query */
    COMMON_CTX_MLA_Q,  /* MLA: (n_batch, n_head * head_dim_k_mla) f32 query before absorption */
    COMMON_CTX_MLA_KV, /* MLA: (n_batch, kv_lora_rank + n_rot) f32 latent and rotary key */
    COMMON_CTX_MLA_O,  /* MLA: (n_batch, n_head * head_dim_v_mla) f32 expanded values */
    COMMON_CTX_SH_OUT, /* MoE with a shared expert: (n_batch, n_embd) f32 its output */
    COMMON_CTX_BUF_COUNT,
};

#define COMMON_CTX_ALIGN 64u /* every scratch buffer is allocated in multiples of this */
/* Heads of one token that latent attention (one shared K/V row per position) runs together, so
 * each cached row is read once for all of them: att_heads = min(n_head, this) with latent
 * attention, else 1. */
#define COMMON_CTX_MLA_HEADS   16u
#define COMMON_CTX_DEFAULT_CTX 4096u /* n_ctx when neither the caller nor the model caps it */
#define COMMON_CTX_MAX_CTX     (1u << 24)

struct common_ctx_layout_opts {
    uint32_t               n_ctx;           /* KV positions; 0 = min(context_length, 4096) */
    uint32_t               n_batch;         /* tokens per forward batch; 0 = 512 (at most n_ctx) */
    uint32_t               n_threads;       /* threads with per-thread scratch; 0 = 1 */
    enum common_cache_type cache_type;      /* 0 = f16 */
    uint32_t               n_device_layers; /* the last layers, whose KV lives on a device (-ngl):
                                               none in this layout; 0 = every layer's is here */
};

/* What one context allocates: the KV cache and every scratch buffer. The executor allocates
 * exactly these sizes and the memory plan adds them up, so the two cannot drift apart. */
struct common_ctx_layout {
    uint32_t               n_ctx, n_batch, n_threads; /* resolved from the options */
    enum common_cache_type cache_type;                /* as given */
    uint64_t               kv_k_head_bytes;           /* one kv head of one position's K row */
    uint64_t               kv_v_head_bytes;        /* q8_0: one kv head of one position's V row */
    uint32_t               kv_layers;              /* layers [0, kv_layers) have KV here */
    uint64_t               kv_k_bytes, kv_v_bytes; /* the K and V arrays of those layers */
    uint64_t               act_row_bytes;          /* bytes per token row of ACT0..2 */
    uint64_t               th_q_bytes;             /* bytes of one query in TH_Q */
    uint32_t               att_heads;              /* queries per thread in TH_Q, TH_SCORES */
    uint64_t               buf[COMMON_CTX_BUF_COUNT]; /* bytes of each buffer; 0 = not allocated */
    uint64_t               kv_bytes;                  /* kv_k_bytes + kv_v_bytes */
    uint64_t               scratch_bytes; /* sum of buf, each rounded up to COMMON_CTX_ALIGN */
    uint64_t               logits_bytes;  /* one row of n_vocab f32 logits (the caller's) */
};

/* Static name of a buffer ("x", "th_scores", ...). */
const char *common_ctx_buf_name(enum common_ctx_buf b);

/* Computes the layout of a context for hyper-parameters `hp` and options `o` (NULL = defaults).
 * Returns 0, or COMMON_EINVAL with a message (n_ctx out of 1..2^24, a q8_0 cache with head widths
 * that are not multiples of 32, an unknown cache type) or COMMON_ERANGE (a size overflows).
 * *out is unchanged on failure. Pure function. */
int common_ctx_layout_compute(const struct common_hparams         *hp,
                              const struct common_ctx_layout_opts *o, struct common_ctx_layout *out,
                              struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* JSON writer (common/json.c)                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* A valid UTF-8 copy of the `len` bytes of `s` (NUL-terminated, its length in *out_len when not
 * NULL) for a JSON library: a byte that is no part of a valid sequence becomes the code point of
 * its value (U+0080..U+00FF), so any bytes make a string. Malloc'd; NULL when out of memory. */
char *common_utf8_repair(const char *s, size_t len, size_t *out_len);

/* ------------------------------------------------------------------------------------------ */
/* Unix sockets and descriptor passing (common/fdpass.c)                                       */
/* ------------------------------------------------------------------------------------------ */

/* Listens on the Unix stream socket `path` (mode 0600; a stale socket file left by a dead
 * process is replaced, a live one is COMMON_EBUSY). Returns 0 (*fd set), COMMON_EINVAL (path too
 * long), COMMON_EBUSY, COMMON_EIO. */
int common_unix_listen(const char *path, int *fd);
/* Connects to `path`. Returns 0 (*fd set), COMMON_EINVAL, COMMON_ENOENT (no such socket or
 * nobody listening), COMMON_EIO. */
int common_unix_connect(const char *path, int *fd);
/* Accepts one connection from a process of this user (others are closed and skipped), waiting
 * up to timeout_ms (< 0 = forever). Returns 0 (*conn set), COMMON_ETIMEDOUT, COMMON_EIO. */
int common_unix_accept(int listen_fd, int timeout_ms, int *conn);
/* Sends descriptor `fd` and a 64-bit tag over connected socket `sock` (SCM_RIGHTS). Returns 0 or
 * COMMON_EIO. */
int common_fd_send(int sock, int fd, uint64_t tag);
/* Receives a descriptor and its tag, waiting up to timeout_ms. Returns 0 (*fd is new and
 * close-on-exec), COMMON_ETIMEDOUT, COMMON_EPROTO (no descriptor or a short message: anything
 * received is closed), COMMON_ECLOSED (peer closed), COMMON_EIO. */
int common_fd_recv(int sock, int *fd, uint64_t *tag, int timeout_ms);
/* The same for a message of `len` bytes (len > 0) with a descriptor when fd >= 0: send returns 0,
 * COMMON_EIO; receive fills buf and *fd (-1 when the message carried none) and returns 0,
 * COMMON_ETIMEDOUT, COMMON_EPROTO (a message of another length: its descriptor is closed),
 * COMMON_ECLOSED, COMMON_EIO. */
int common_fd_send_bytes(int sock, int fd, const void *data, size_t len);
int common_fd_recv_bytes(int sock, int *fd, void *buf, size_t len, int timeout_ms);

/* ------------------------------------------------------------------------------------------ */
/* Command-line options: one table-driven parser for every binary (common/opts.c)              */
/* ------------------------------------------------------------------------------------------ */

/* A program describes its options as tables of rows (designated initializers, zero = default)
 * and hands them to common_opts_parse(), which converts and range-checks every value, writes it
 * through the row's target and prints --help from the same tables:
 *
 *     static const char *const io_names[] = {"uring", "pread", "mmap", NULL};
 *     const struct common_opt rows[] = {
 *         {.name = "model", .short_name = "m", .type = COMMON_OPT_STR, .target = &o.model,
 *          .metavar = "PATH", .help = "GGUF model", .required = true},
 *         {.name = "threads", .short_name = "t", .type = COMMON_OPT_U32, .target = &o.n_threads,
 *          .min = 1, .max = 256, .help = "threads", .def = "physical cores"},
 *         {.name = "io", .type = COMMON_OPT_CHOICE, .target = &o.io, .choices = io_names,
 *          .choice_values = io_modes, .help = "expert reads"},
 *         {.name = "ids", .type = COMMON_OPT_SWITCH, .target = &o.ids, .help = "print ids"},
 *         {0},
 *     };
 *     int rc = common_opts_parse(&(struct common_opts_spec){.prog = "sluice run", .opts = rows,
 *                                                           .groups = shared_groups},
 *                                argc, argv);
 *     if (rc != 0)
 *         return common_opts_exit_status(rc); // 0 after --help, 2 for a usage error
 *
 * Accepted forms: "--name VALUE", "--name=VALUE", "-s VALUE", "-s=VALUE"; a short name is a whole
 * word (llama.cpp's "-ngl", "-sys"), so short switches are not bundled ("-ab" is not "-a -b") and
 * values are not glued ("-t4" is unknown). The word after an option taking a value is its value
 * even when it starts with '-'. "--" ends the options; "-" alone is a positional. Options and
 * positionals may mix unless spec->stop_at_positional. The last occurrence of a scalar wins.
 * "-h" and "--help" are built in (a row may not use them).
 *
 * Exit status convention of every sluice binary and subcommand: 0 success (and --help), 1 a
 * runtime failure, 2 a usage error (bad option, bad value, missing argument). */

/* What a row's value is, and what its `target` points at. */
enum common_opt_type {
    COMMON_OPT_SWITCH = 1, /* bool: set true; takes no value ("--ids") */
    COMMON_OPT_SWITCH_OFF, /* bool: set false; takes no value ("--no-bos" beside a "--bos" row) */
    COMMON_OPT_BOOL,       /* bool: value on|off, true|false, yes|no or 1|0 */
    COMMON_OPT_STR,        /* const char *: the value itself, borrowed from argv */
    COMMON_OPT_STRS,       /* struct common_opt_strs: each occurrence appends one value */
    COMMON_OPT_U32,        /* uint32_t: decimal digits only */
    COMMON_OPT_U64,        /* uint64_t: decimal digits only */
    COMMON_OPT_I32,        /* int32_t: optional '-', then decimal digits */
    COMMON_OPT_I64,        /* int64_t: optional '-', then decimal digits */
    COMMON_OPT_F32,        /* float: a finite decimal number ("0.7", "1e-3") */
    COMMON_OPT_SIZE,       /* uint64_t bytes: "4096", "512M", "1.5G" (common_parse_size) */
    COMMON_OPT_CHOICE,     /* int, uint32_t or an int-sized enum: one of `choices` */
    COMMON_OPT_U32_LIST,   /* struct common_opt_u32_list: "16,64,128"; a repeat replaces it */
    COMMON_OPT_CALLBACK,   /* anything: `parse(target, value, e)` converts the value */
};

/* Converts `value` for a COMMON_OPT_CALLBACK row; `arg` is the row's target. Returns >= 0 to
 * accept it, or a negative common_err. On failure write into `e` what was expected, phrased to
 * follow the option name, e.g. "expects I/N with 0 <= I < N, got '3/2'": the parser prints
 * "PROG: error: --shard expects I/N ...". An empty `e` prints "--shard: invalid value '3/2'".
 * COMMON_ENOMEM is passed on as is; any other failure is a usage error (COMMON_EINVAL). */
typedef int (*common_opt_parse_fn)(void *arg, const char *value, struct common_errmsg *e);

/* A fixed-capacity list of strings: repeated options (COMMON_OPT_STRS) and positionals. */
struct common_opt_strs {
    const char **v;   /* borrowed: `cap` slots; the strings are borrowed from argv */
    uint32_t     cap; /* slots in v; one more value is a usage error */
    uint32_t     n;   /* slots filled; the parser appends after what is there */
};

/* A list of numbers given as one comma-separated value ("16,64,128"). */
struct common_opt_u32_list {
    uint32_t *v;   /* borrowed: `cap` slots, written by the parser */
    uint32_t  cap; /* most items accepted */
    uint32_t  n;   /* items of the last occurrence */
};

/* One option. Rows end with a zeroed row (name NULL). */
struct common_opt {
    const char *name;            /* long name without dashes ("model"); NULL ends the table */
    const char *short_name;      /* single-dash name without the dash ("m", "sys"); NULL = none */
    enum common_opt_type type;   /* what the value is */
    void                *target; /* borrowed: receives the value (type above); NULL = check the
                                    value, then drop it (e.g. --config, read before parsing) */
    double min; /* numbers, sizes, list items: smallest accepted; 0 by default, so a row taking
                   negative numbers sets a negative min */
    double max; /* numbers, sizes, list items: largest accepted; 0 = the type's largest (floats:
                   any finite value). Integer limits are exact up to 2^53 */
    const char *const  *choices;       /* CHOICE: names, NULL-terminated; static */
    const int          *choice_values; /* CHOICE: value of each name; NULL = the name's index */
    common_opt_parse_fn parse;         /* CALLBACK: converts the value */
    const char         *metavar;       /* value name in --help ("PATH"); NULL = from the type: "N",
                                          "X", "SIZE", "TEXT", "N,N,...", choices joined by '|' */
    const char *help;                  /* description for --help; wrapped; '\n' forces a break */
    const char *def;                   /* shown as "[def]" after the help text; NULL = nothing */
    bool        required; /* absent after parsing: a usage error; "(required)" in help */
    bool       *seen;     /* borrowed: set true when the option is given; NULL = none */
};

/* A titled table of rows, e.g. the streaming options that four subcommands share. */
struct common_opt_group {
    const char              *title; /* heading in --help ("Streaming options"); NULL = "Options" */
    const struct common_opt *opts;  /* borrowed: rows; NULL ends an array of groups */
};

/* A program: its tables, its help text and where output goes. */
struct common_opts_spec {
    const char *prog;        /* name in messages and the default usage line ("sluice bench") */
    const char *usage;       /* usage line after "usage: "; NULL = "PROG [options]" */
    const char *description; /* text after the usage line; NULL = none. Lines longer than 100
                                columns are wrapped, shorter ones kept as written */
    const char              *epilog; /* text after the options, wrapped the same way; NULL = none */
    const struct common_opt *opts;   /* borrowed: the program's own rows, listed first (under
                                        "Options"); NULL = none */
    const struct common_opt_group *groups; /* borrowed: more tables, up to a group with NULL opts;
                                              NULL = none */
    struct common_opt_strs *positional;    /* borrowed: receives the positional arguments in
                                              order; NULL = a positional is a usage error */
    bool stop_at_positional; /* the first positional ends the options: every later word is a
                                positional (a subcommand and its own options) */
    FILE *out;               /* --help is printed here; NULL = stdout */
    FILE *err;               /* usage errors are printed here; NULL = stderr */
};

/* common_opts_parse() printed --help: the caller exits with status 0. */
#define COMMON_OPTS_HELP 1
/* Most rows a program may have in all its tables (a programming error beyond: assert). */
#define COMMON_OPTS_MAX_ROWS 256
/* --help is wrapped at this column. */
#define COMMON_OPTS_HELP_WIDTH 100

/* Parses argv[1..argc-1] (argv[0] is the program or subcommand name and is skipped) against
 * spec's tables, writing each value through its row's target and setting its `seen`.
 * Returns:
 *   0                 every option was valid: run;
 *   COMMON_OPTS_HELP  "-h" or "--help" was given and the help was printed to spec->out: exit 0;
 *   COMMON_EINVAL     a usage error, printed to spec->err as two lines,
 *                         PROG: error: MESSAGE
 *                         Try 'PROG --help' for more information.
 *                     with MESSAGE one of "unknown option '--x'", "option '--temp' needs a value",
 *                     "option '--ids' takes no value", "--temp expects a number in [0, 100], got
 *                     'abc'", "option '--model' is required", "unexpected argument 'x'": exit 2;
 *   COMMON_ENOMEM     from a callback, printed: exit 1.
 * Values are written as they are parsed: after a failure, targets before the bad word may be
 * set. Allocates nothing; strings stored are borrowed from argv. No global state: thread-safe
 * for calls with distinct targets and streams. */
int common_opts_parse(const struct common_opts_spec *spec, int argc, char *const *argv);

/* The exit status for a non-zero result of common_opts_parse(): 0 for COMMON_OPTS_HELP, 2 for
 * COMMON_EINVAL, 1 for anything else. */
int common_opts_exit_status(int rc);

/* Shares as llama.cpp's --tensor-split takes them ("3,1" or "3/1"): at most cap numbers >= 0, one
 * of them above 0, into out (*n of them; out untouched on failure). COMMON_OK, or COMMON_EINVAL
 * with e saying what was expected (a COMMON_OPT_CALLBACK's message). */
int common_opts_parse_shares(const char *v, float *out, uint32_t cap, uint32_t *n,
                             struct common_errmsg *e);
/* n_items (layers) divided in proportion to n shares (equal ones when they sum to 0 or less),
 * as llama.cpp splits layers over devices: part k gets the items from start[k] to start[k + 1]
 * (n + 1 entries written, start[0] = 0, start[n] = n_items), item i going to the first part
 * whose shares so far exceed i / n_items of the total. */
void common_shares_starts(const double *share, uint32_t n, uint32_t n_items, uint32_t *start);

/* Prints the help generated from spec's tables to `f`: "usage: ...", the description, each
 * group's title and aligned rows "  -m, --model PATH   help text   [default]", the epilog. */
void common_opts_help(const struct common_opts_spec *spec, FILE *f);

/* Reports a usage error found after parsing (two options that exclude each other, a missing
 * positional) in the parser's style: "PROG: error: MESSAGE" and the "Try 'PROG --help'" line on
 * spec->err. Returns COMMON_EINVAL, so callers write `return common_opts_exit_status(
 * common_opts_error(&spec, "give either -p or --prompt-ids, not both"));`. */
int common_opts_error(const struct common_opts_spec *spec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Parses a comma-separated list of decimal numbers in [min, max] ("16,64,128") into out->v,
 * setting out->n. Returns 0, COMMON_EINVAL (an empty item, a non-number, a number out of range)
 * or COMMON_ERANGE (more than out->cap items), with a message in `e` phrased to follow an option
 * name ("expects comma-separated numbers in [1, 4096], got '16,,64' (item 2 is empty)"). On
 * failure out->v and out->n are unchanged. Allocates nothing. */
int common_opt_parse_u32_list(const char *s, uint32_t min, uint32_t max,
                              struct common_opt_u32_list *out, struct common_errmsg *e);

/* ------------------------------------------------------------------------------------------ */
/* Configuration files (common/config.c)                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Daemons take a config file (--config FILE) and then their command line, which overrides it.
 * One file serves a whole deployment:
 *
 *     # global keys: every daemon reads them
 *     model = /var/lib/sluice/models/model.gguf
 *     [fetcher]
 *     ram-budget = 8G
 *     [executor]
 *     threads = 8
 *     [router]
 *     template = "chatml # not a comment"
 *
 * Each line is blank, a comment, a section header "[fetcher]", "[executor]" or "[router]", a
 * "key = value" line or a key alone (a switch). A key is a long option name without its dashes
 * ('_' is read as '-'). A daemon reads the keys before the first section header and those of its
 * own section; other sections are checked, then skipped; an unknown section name is an error. A
 * section may appear more than once. '#' starts a comment only at the start of a line, after a
 * key or a section header, at the start of a value or after a quoted value: anywhere else it is
 * part of the value, so `model = /m/a#b.gguf` keeps it. A value is the rest of the line with
 * surrounding blanks removed, or a double-quoted string where \" and \\ stand for " and \ (any
 * other backslash is an error), and where only blanks or a comment may follow the closing quote.
 * An empty value is written "". Every error names the file and the line: "config FILE:LINE: ...".
 */

/* Turns the global keys and those of `section` ("fetcher", "executor", "router"; NULL = the
 * global keys only) into option words placed before the command line's (whose --config FILE is
 * dropped): {argv[0], "--key", "value", ..., argv[1..]}. Returns 0 (*out_argc, *out_argv: one
 * malloc'd block, free() it), COMMON_ENOENT / COMMON_EIO (file), COMMON_EINVAL (a bad line,
 * named with its number in e; or an unknown `section`), COMMON_ENOMEM. The out-parameters are
 * unchanged on failure. */
int common_config_argv(const char *path, const char *section, int argc, char **argv, int *out_argc,
                       char ***out_argv, struct common_errmsg *e);
/* Finds "--config FILE" (or "--config=FILE") in argv; returns FILE or NULL. */
const char *common_config_find(int argc, char **argv);
/* The config step of every daemon's main: when argv names --config FILE, reads its global keys
 * and those of `section` with common_config_argv() into *owned (free() it) and points *out_argv
 * at it; otherwise *out_argv is argv and *owned NULL. A bad or missing file prints "PROG: error:
 * config FILE:LINE: ..." on stderr; --config without a value prints "PROG: error: option
 * '--config' needs a value" and the "Try 'PROG --help'" line. Returns 0 or the negative
 * common_err (COMMON_EINVAL: exit 2; others: exit 1, see common_opts_exit_status()). */
int common_config_load(const char *prog, const char *section, int argc, char **argv, int *out_argc,
                       char ***out_argv, char ***owned);

/* ------------------------------------------------------------------------------------------ */
/* Device memory two processes share (common/devmem.c; library common_devmem)                  */
/* ------------------------------------------------------------------------------------------ */

/* The VRAM expert tier's device side (DESIGN section 8): device memory that one process makes
 * and another maps, copies from host memory on the process's own copy stream, and events that
 * order copies and kernels across processes. A fetcher makes a device pool and fills it; the
 * executor maps the same memory and computes from it once the fetcher's events are done.
 *
 * Two backends, chosen as the executor's are (SLUICE_GPU_BACKEND): CUDA's (common/devmem_cuda.c,
 * in builds with CUDA: virtual memory management with POSIX descriptors as shareable handles,
 * cudaIpc event handles, a stream of its own) and the host's emulation (common/devmem_host.c):
 * device memory is shared host memory (a memfd), copies run on a thread in queue order, and an
 * event is a pair of counters in a shared page, waited on as a futex. So the tier's logic and its
 * handshake run in CI without a device. "none" gives neither.
 *
 * What crosses to the other process is a struct common_devmem_handle: a descriptor (passed with
 * common_fd_send; -1 when there is none) and up to 64 opaque bytes. A receiver treats both as
 * untrusted: a descriptor of the wrong kind or size, or bytes that name no event, give
 * COMMON_EINVAL or COMMON_EDEVICE with a message, never a fault.
 *
 * CUDA does not survive fork(): a process forks before it opens the backend. Functions are
 * thread-safe; a piece or an event is used by one thread at a time, and an event is recorded by
 * one process only (its maker, or the one importer that records it), as each side of the tier
 * records its own. Errors: 0 or a negative common_err with the message in `e` (may be NULL). */

struct common_devmem_piece; /* a piece of device memory, made here or imported */
struct common_devmem_event; /* an event either process records and the other waits for */

#define COMMON_DEVMEM_BLOB 64
struct common_devmem_handle {
    int      fd;  /* a descriptor the receiver owns once imported; -1 = none */
    uint32_t len; /* bytes of blob used */
    uint8_t  blob[COMMON_DEVMEM_BLOB];
};

/* Opens the backend on device `dev` (the host's emulation has SLUICE_GPU_HOST_DEVICES of them,
 * HOST0 without it) and makes it the calling thread's device: pieces and events made after are
 * that device's, and pieces mapped are given it access. The first call creates the copy stream
 * (copy_async's, on that device). Calls for other devices, or again, are allowed: each makes
 * its device the thread's. COMMON_ENOTSUP when no backend is there (a build without CUDA, no
 * driver, SLUICE_GPU_BACKEND=none), with the reason. */
int common_devmem_open(int dev, struct common_errmsg *e);
/* common_devmem_open for a device the process opened before, without asking the driver again
 * about it: only makes it the calling thread's device (a thread serving the pools of several
 * devices, record by record). Opens it when it was not. */
int common_devmem_select(int dev, struct common_errmsg *e);
/* The backend opened: "HOST" or "CUDA"; NULL before common_devmem_open succeeded. */
const char *common_devmem_backend(void);
/* Devices the host's emulation has (HOST0..): SLUICE_GPU_HOST_DEVICES, 1 to 8; 1 without it (or
 * with another value). The executor's host backend has as many. */
#define COMMON_HOST_MAX_DEVICES 8
int common_host_device_count(void);
/* The size pieces and address reservations are multiples of (CUDA: the device's granularity
 * for shareable allocations; the host: the page size times 16). 0 before open. */
size_t common_devmem_granularity(void);

/* Address space for pieces: `bytes` (a multiple of the granularity) reserved, nothing behind it
 * (a read there faults on the host). Returns the base or NULL with e set. */
void *common_devmem_reserve(size_t bytes, struct common_errmsg *e);
/* Gives the reservation back; nothing may be mapped in it any more. Accepts NULL. */
void common_devmem_unreserve(void *base, size_t bytes);

/* A new piece of `bytes` of device memory (a multiple of the granularity), its contents
 * undefined. */
int common_devmem_piece_create(size_t bytes, struct common_devmem_piece **out,
                               struct common_errmsg *e);
/* Its handle for another process: h->fd is a new descriptor the caller sends and then closes. */
int common_devmem_piece_export(const struct common_devmem_piece *p, struct common_devmem_handle *h,
                               struct common_errmsg *e);
/* The piece a handle names, `bytes` long as its maker said (checked against the memory where
 * the backend can). Takes h->fd on success and on failure (closed either way). */
int common_devmem_piece_import(struct common_devmem_handle *h, size_t bytes,
                               struct common_devmem_piece **out, struct common_errmsg *e);
/* Maps the piece at `at`, granularity-aligned inside a reservation, readable and writable by
 * the device (and on the host backend by the CPU, as device pointers are there). A piece is
 * mapped at most once per process. The memory stays while any process maps or holds it: a
 * maker that dies leaves an importer's mapping intact. */
int  common_devmem_piece_map(struct common_devmem_piece *p, void *at, struct common_errmsg *e);
/* Unmaps (the address space stays reserved) if mapped, and frees this process's hold. Accepts
 * NULL. */
void common_devmem_piece_destroy(struct common_devmem_piece *p);
size_t common_devmem_piece_bytes(const struct common_devmem_piece *p);

/* Queues a copy of `bytes` from host memory to mapped device memory on this process's copy
 * stream; `src` must stay unchanged until an event recorded after it is done. */
int common_devmem_copy_async(void *dst, const void *src, size_t bytes, struct common_errmsg *e);
/* Nanoseconds this process's copy stream has spent copying so far (CUDA: from timing events
 * around each copy, counted as they complete; a copy whose events are still in flight when the
 * ring of pairs comes round again is not counted). false (0) before open. */
bool common_devmem_copy_time(uint64_t *busy_ns);
/* Registers mapped host memory [p, p + bytes) as pinned for the copy stream (CUDA:
 * cudaHostRegister), so that copies from it are DMA'd without staging; refused (COMMON_EINVAL)
 * when part of it is not mapped or is registered already; the memory must stay mapped until
 * common_devmem_host_unregister(p). Copies from unregistered memory work too, slower. */
int  common_devmem_host_register(const void *p, size_t bytes, struct common_errmsg *e);
void common_devmem_host_unregister(const void *p);

/* A new event, made here (exportable), not yet recorded: it counts as done. */
int common_devmem_event_create(struct common_devmem_event **out, struct common_errmsg *e);
int common_devmem_event_export(const struct common_devmem_event *ev,
                               struct common_devmem_handle *h, struct common_errmsg *e);
/* The event a handle names (takes h->fd, as common_devmem_piece_import). */
int common_devmem_event_import(struct common_devmem_handle *h, struct common_devmem_event **out,
                               struct common_errmsg *e);
/* Records ev after the copies queued on this process's copy stream so far: it is done once they
 * are. A wait sees the last record made before it. */
int common_devmem_event_record(struct common_devmem_event *ev, struct common_errmsg *e);
/* The copies queued on this process's copy stream after this call start once ev is done. */
int common_devmem_event_wait(struct common_devmem_event *ev, struct common_errmsg *e);
/* The calling thread waits until ev is done. */
int common_devmem_event_sync(struct common_devmem_event *ev, struct common_errmsg *e);
/* Whether ev is done now (an error counts as done: the sync that follows reports it). */
bool common_devmem_event_is_done(struct common_devmem_event *ev);
void common_devmem_event_destroy(struct common_devmem_event *ev); /* accepts NULL */
/* The backend's own event behind ev, for a device backend's kernel stream to wait for or record
 * (executor/cuda: cudaEvent_t); NULL on the host's emulation, whose waits are
 * common_devmem_event_sync. */
void *common_devmem_event_native(struct common_devmem_event *ev);

/* Sends a handle (its bytes, its descriptor) over the Unix stream socket `sock` with a caller's
 * tag saying what it is; the caller still owns h->fd. Receives one: 0 (*h filled: h->fd is the
 * caller's), or COMMON_EPROTO (a message that is no handle: its descriptor closed),
 * COMMON_ETIMEDOUT, COMMON_ECLOSED, COMMON_EIO, as common_fd_recv_bytes. */
int common_devmem_handle_send(int sock, const struct common_devmem_handle *h, uint64_t tag);
int common_devmem_handle_recv(int sock, struct common_devmem_handle *h, uint64_t *tag,
                              int timeout_ms);

/* ------------------------------------------------------------------------------------------ */
/* Shared-memory rings (common/ring.c)                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Single-producer/single-consumer rings of records of at most `slot_bytes` bytes, living in a
 * shared segment that two processes (or threads) map: the header below, then n_slots slots of
 * common_ring_stride() bytes each. Indices are free-running 32-bit counters masked on access.
 * Everything in the segment is untrusted: each side checks the header on attach and each index
 * difference on every operation, and answers COMMON_ECORRUPT rather than read out of bounds.
 * C only (the header uses <stdatomic.h>); C++ callers do not see this section. */
#ifndef __cplusplus
#include <stdalign.h>
#include <stdatomic.h>

#define COMMON_RING_MAGIC          0x474e5253u /* "SRNG" read as a little-endian u32 */
#define COMMON_RING_VERSION        1u
#define COMMON_RING_MAX_SLOT_BYTES (1u << 20) /* largest record */
#define COMMON_RING_MAX_SLOTS      (1u << 24) /* largest slot count */

/* The first bytes of a ring segment. The `_waiting` words let a side that sleeps on a futex ask
 * its peer for a FUTEX_WAKE, so a peer that never sleeps costs no system calls. Each is a counter
 * written only by the side that sleeps: odd while it is about to sleep or asleep, even otherwise.
 */
struct common_ring_hdr {
    uint32_t magic;                    /* COMMON_RING_MAGIC */
    uint32_t version;                  /* COMMON_RING_VERSION */
    uint32_t slot_bytes;               /* largest record in bytes, 1..COMMON_RING_MAX_SLOT_BYTES */
    uint32_t n_slots;                  /* power of two, 1..COMMON_RING_MAX_SLOTS */
    alignas(64) _Atomic uint32_t head; /* records pushed; written only by the producer */
    _Atomic uint32_t cons_waiting;     /* odd while the consumer sleeps on head; written only by
                                          the consumer, read by the producer */
    alignas(64) _Atomic uint32_t tail; /* records popped; written only by the consumer */
    _Atomic uint32_t prod_waiting;     /* odd while the producer sleeps on tail; written only by
                                          the producer, read by the consumer */
};

/* One side's view of a ring. Each side attaches its own; the producer calls only the push
 * functions on it, the consumer only the pop functions. The numbers are copies checked at attach
 * time and never re-read from the segment. */
struct common_ring {
    struct common_ring_hdr *hdr;        /* mapped: the segment's header; its mapper unmaps it */
    unsigned char          *slots;      /* mapped: n_slots * stride bytes right after the header */
    uint32_t                slot_bytes; /* largest record */
    uint32_t                n_slots;    /* power of two */
    uint32_t                stride;     /* bytes per slot: length word + padded record */
    uint32_t tail_seen;  /* producer side: last tail read (no newer than the real tail) */
    uint32_t head_seen;  /* consumer side: last head read (no newer than the real head) */
    uint32_t cons_woken; /* producer side: odd cons_waiting value whose sleep a FUTEX_WAKE ended */
    uint32_t prod_woken; /* consumer side: odd prod_waiting value whose sleep a FUTEX_WAKE ended */
};

/* Bytes of one slot for records of up to `slot_bytes` bytes (8-byte length word, record padded
 * to 8 bytes), or 0 when slot_bytes is 0 or above COMMON_RING_MAX_SLOT_BYTES. */
uint32_t common_ring_stride(uint32_t slot_bytes);

/* Bytes of a segment holding a ring of `n_slots` slots of `slot_bytes`, or 0 when the arguments
 * are out of range (n_slots not a power of two, zero or too large). */
size_t common_ring_bytes(uint32_t slot_bytes, uint32_t n_slots);

/* Formats an empty ring in the first common_ring_bytes() bytes of `mem` (64-byte aligned, as
 * mmap gives). Must
 * complete before a peer attaches (format, then fork or announce the segment). Returns 0, or
 * COMMON_EINVAL when n_slots is not a power of two, an argument is out of range or `len` is too
 * small. Not thread-safe with users of the same memory. */
int common_ring_init(void *mem, size_t len, uint32_t slot_bytes, uint32_t n_slots);

/* Fills *out to use the ring formatted in `mem` (`len` mapped bytes) after checking that its
 * magic, version, slot size and count equal what the caller expects, that the segment fits in
 * `len` and that head - tail <= n_slots. Returns 0, COMMON_EINVAL (bad arguments, `mem` not
 * 64-byte aligned) or
 * COMMON_ECORRUPT (any mismatch); *out is unchanged on failure. `mem` must outlive *out. */
int common_ring_attach(void *mem, size_t len, uint32_t slot_bytes, uint32_t n_slots,
                       struct common_ring *out);

/* Producer: copies `len` bytes of `rec` into the next slot and publishes it. Non-blocking; wakes
 * a sleeping consumer. Returns 0, COMMON_EAGAIN when the ring is full, COMMON_EINVAL when len is
 * above slot_bytes (empty records are allowed), COMMON_ECORRUPT when the indices in the segment are
 * inconsistent. */
int common_ring_push(struct common_ring *r, const void *rec, size_t len);

/* As common_ring_push(), but leaves a sleeping consumer asleep: the record is seen at the
 * consumer's next wake-up (a later common_ring_push() or its own timeout). For records that are
 * not urgent (a release), so that they cost the peer no wake-up of their own. */
int common_ring_push_quiet(struct common_ring *r, const void *rec, size_t len);

/* Consumer: copies the oldest record into `rec` (`cap` bytes) and frees its slot. Non-blocking;
 * wakes a sleeping producer. Returns the record length (>= 0), COMMON_EAGAIN when the ring is
 * empty, COMMON_EINVAL when the record is longer than `cap` (it stays in the ring),
 * COMMON_ECORRUPT when the indices or the slot's length word are inconsistent. */
int common_ring_pop(struct common_ring *r, void *rec, size_t cap);

/* Blocking variants: spin briefly, then sleep on a futex in the segment (shared between
 * processes) until the peer moves its index or `timeout_ms` passes (< 0 waits forever, 0 does not
 * sleep). Same returns as the non-blocking ones, with COMMON_ETIMEDOUT instead of COMMON_EAGAIN,
 * and COMMON_EIO if the futex call fails for another reason. */
int common_ring_push_wait(struct common_ring *r, const void *rec, size_t len, int timeout_ms);
int common_ring_pop_wait(struct common_ring *r, void *rec, size_t cap, int timeout_ms);

/* A file-backed shared mapping in a private runtime directory. */
struct common_ring_segment {
    void  *mem;   /* mapped: MAP_SHARED, read-write; unmapped by common_ring_segment_close() */
    size_t bytes; /* mapped length */
    char  *path;  /* owned: set on the creating side only; close unlinks this file */
};

/* Creates `dir` with mode 0700 when missing, then the file `dir`/`name` (mode 0600, `bytes`
 * long, zero-filled) and maps it shared. Returns 0, COMMON_EINVAL (name empty or containing '/',
 * bytes 0, or `dir` not a directory owned by this user, or open to group or others),
 * COMMON_EBUSY (the file exists), COMMON_EIO / COMMON_ENOMEM. The caller formats it with
 * common_ring_init(). *seg is unchanged on failure. */
int common_ring_segment_create(const char *dir, const char *name, size_t bytes,
                               struct common_ring_segment *seg);

/* Maps an existing segment created by another process, with the same checks on `dir`; the file
 * must be a regular file owned by this user without group/other permissions. Returns 0,
 * COMMON_EINVAL, COMMON_ENOENT, COMMON_ECORRUPT (shorter than a ring header), COMMON_EIO. The
 * mapping covers the file's size at open time; attach checks the ring fits in it. */
int common_ring_segment_open(const char *dir, const char *name, struct common_ring_segment *seg);

/* Unmaps; on the creating side also removes the file. Accepts a zeroed or closed segment. */
void common_ring_segment_close(struct common_ring_segment *seg);

/* ------------------------------------------------------------------------------------------ */
/* Expert pool segment: layout and reader side (common/pool_view.c)                            */
/* ------------------------------------------------------------------------------------------ */

/* The fetcher's expert pool is one shared segment that the executor maps read-only in another
 * process, so its layout is an ABI between two daemons, checked on attach like a ring header.
 * The fetcher (fetcher/pool.c) is the only writer: it claims, fills and evicts slots under its
 * own mutex. Any process may read READY slots seqlock style through a struct common_pool_view:
 * common_pool_read_begin() before using the bytes, common_pool_read_valid() after. Everything in
 * the segment is untrusted by a reader: indices and offsets are range-checked on every read. */

#define COMMON_POOL_MAGIC   0x4c505353u /* "SSPL" read as a little-endian u32 */
#define COMMON_POOL_VERSION 2u
/* O_DIRECT granularity: slots, part regions inside slots and direct reads are aligned to it. */
#define COMMON_POOL_ALIGN 4096u
/* Key part meaning "the whole bundle" (gate, up and down of one expert in one slot). */
#define COMMON_POOL_BUNDLE COMMON_EXPERT_PART_COUNT
/* Part index asking for the whole slot (state READY) rather than one part. */
#define COMMON_POOL_WHOLE   COMMON_EXPERT_PART_COUNT
#define COMMON_POOL_NO_SLOT UINT32_MAX

/* Slot states. Eviction only takes FREE slots and unpinned READY slots. */
enum common_pool_slot_state {
    COMMON_POOL_SLOT_FREE = 0, /* no key; may be claimed */
    COMMON_POOL_SLOT_LOADING,  /* claimed by a loader; parts become readable one by one */
    COMMON_POOL_SLOT_READY,    /* every part loaded */
    COMMON_POOL_SLOT_FAILED,   /* load failed while pinned: becomes FREE on the last release */
};

/* What a slot holds: part 0..2 (one matrix) or COMMON_POOL_BUNDLE (all three). */
struct common_pool_key {
    uint32_t layer;
    uint32_t expert;
    uint32_t part;
};

/* Segment layout (all offsets from the segment start, nothing in it is a pointer):
 *   [0, table_off)              struct common_pool_hdr
 *   [table_off, index_off)      n_slots x struct common_pool_slot
 *   [index_off, data_off)       n_layer * n_expert * 4 x _Atomic uint32_t: slot + 1, 0 = absent
 *   [data_off, segment_bytes)   n_slots x slot_bytes of data, COMMON_POOL_ALIGN-aligned */
struct common_pool_hdr {
    uint32_t magic;         /* COMMON_POOL_MAGIC */
    uint32_t version;       /* COMMON_POOL_VERSION */
    uint32_t n_slots;       /* slots in the table and the data region */
    uint32_t n_layer;       /* key space: layers */
    uint32_t n_expert;      /* key space: experts per layer */
    uint32_t policy;        /* the writer's eviction policy (informational for readers) */
    uint64_t slot_bytes;    /* bytes per slot, multiple of COMMON_POOL_ALIGN */
    uint64_t segment_bytes; /* whole segment */
    uint64_t table_off;     /* slot table */
    uint64_t index_off;     /* key index */
    uint64_t data_off;      /* slot data */
    /* READY slots given a new key so far. The writer increments it (release); readers load it
     * (acquire) to tell a pool under eviction pressure from a settled one. */
    _Atomic uint64_t evictions;
};

/* One slot of the table. The writer changes it under its mutex; the atomics are what readers of
 * other processes may look at. */
struct common_pool_slot {
    /* Release stores by the writer; pair with the acquire loads in common_pool_read_begin() and
     * common_pool_read_valid(). */
    _Atomic uint32_t state;      /* enum common_pool_slot_state */
    _Atomic uint32_t gen;        /* bumped whenever the slot gets a new key or goes FREE */
    _Atomic uint32_t pins;       /* loans outstanding (writer process only) */
    _Atomic uint32_t ready_mask; /* bit p: part p readable while LOADING */
    uint32_t         layer;      /* key, valid unless FREE */
    uint32_t         expert;
    uint32_t         part;
    uint32_t         origin; /* loader's tag (a fetcher priority) */
    uint32_t         n_uses; /* acquires since the key was loaded */
    uint32_t         pad;
    uint64_t         last_use;  /* writer's tick of the latest acquire or the claim */
    uint64_t         lfu_tick;  /* tick at which lfu_score was last decayed */
    double           lfu_score; /* decayed use count (LFU policy) */
    uint64_t         part_off[COMMON_EXPERT_PART_COUNT];  /* from the slot start */
    uint64_t         part_size[COMMON_EXPERT_PART_COUNT]; /* bytes */
};

/* Fills the offsets and segment_bytes of `h` from its n_slots, n_layer, n_expert and slot_bytes.
 * Returns 0 or COMMON_EINVAL on overflow. Pure function. */
int common_pool_layout(struct common_pool_hdr *h);

/* A process's view of a pool segment: where its parts lie in this process's mapping. The writer
 * binds one over the segment it created; a reader gets one from common_pool_view_attach(). */
struct common_pool_view {
    uint8_t                 *base;      /* mapped: the segment (see map_owned) */
    uint64_t                 map_bytes; /* length of the mapping */
    bool                     map_owned; /* attached: common_pool_view_detach() unmaps base */
    struct common_pool_hdr  *hdr;       /* borrowed: into base */
    struct common_pool_slot *slots;     /* borrowed: into base */
    _Atomic uint32_t        *index;     /* borrowed: into base */
    uint8_t                 *data;      /* borrowed: into base */
    /* Copies of the header's numbers taken when the view was made: a reader never re-reads them
     * from a segment that another process writes. */
    uint32_t n_slots, n_layer, n_expert;
    uint64_t slot_bytes;
};

/* True when `k` lies in the key space of the pool (layer, expert, part <= COMMON_POOL_BUNDLE). */
bool common_pool_key_ok(const struct common_pool_view *v, const struct common_pool_key *k);
/* Position of key `k` (checked with common_pool_key_ok) in the key index. */
uint64_t common_pool_key_index(const struct common_pool_view *v, const struct common_pool_key *k);

/* Points the view's parts into `base`, whose header is already laid out (the writer's side).
 * `base` stays owned by the caller. */
void common_pool_view_bind(struct common_pool_view *v, uint8_t *base, uint64_t map_bytes);

/* Maps the segment behind `fd` (the fetcher's pool memfd, handed over a Unix socket) read-only
 * and checks its header: magic, version, slot size, slot count and offsets against the segment
 * size. Returns 0, COMMON_ECORRUPT (mismatch, named in e), COMMON_EIO (fstat/mmap failed),
 * COMMON_ENOMEM. *v is unchanged on failure. */
int common_pool_view_attach(int fd, struct common_pool_view *v, struct common_errmsg *e);
/* Unmaps an attached view (a bound one is left to its owner); accepts a zeroed view. */
void common_pool_view_detach(struct common_pool_view *v);

uint32_t common_pool_n_slots(const struct common_pool_view *v);
uint64_t common_pool_slot_bytes(const struct common_pool_view *v);
/* Start of slot `slot`'s bytes (COMMON_POOL_ALIGN-aligned) in this process's mapping. */
uint8_t *common_pool_slot_data(const struct common_pool_view *v, uint32_t slot);

/* A part of a slot lent to a reader (pinned by the writer's own readers, or read seqlock style
 * by another process). */
struct common_pool_loan {
    uint32_t       slot; /* slot index */
    uint32_t       gen;  /* slot generation when lent; see common_pool_loan_is_valid() */
    const uint8_t *data; /* borrowed: the part's bytes in the mapping */
    uint64_t       size; /* bytes at data */
};

/* Seqlock read side: fills *out for a READY slot holding `key` (part 0..2, or COMMON_POOL_WHOLE)
 * and returns 0, else COMMON_ENOENT (absent, not READY, or a torn read of a slot being reused),
 * COMMON_EINVAL (bad key). After copying or using the bytes, common_pool_read_valid() tells
 * whether the slot was not reused meanwhile. Lock-free; any thread. */
int  common_pool_read_begin(const struct common_pool_view *v, const struct common_pool_key *key,
                            uint32_t part, struct common_pool_loan *out);
bool common_pool_read_valid(const struct common_pool_view *v, const struct common_pool_loan *l);
/* True while the generation of the loaned slot is unchanged (the bytes are those lent). */
bool common_pool_loan_is_valid(const struct common_pool_view *v, const struct common_pool_loan *l);
/* READY slots evicted (given a new key) since the pool was created. A reader that sees it
 * unchanged over a while knows the pool is settled. */
uint64_t common_pool_evictions(const struct common_pool_view *v);
#endif /* __cplusplus */

#endif /* COMMON_COMMON_H */
