/* common/ggml_type.c - the table of ggml tensor types: names, block sizes, bytes per block. */
#include "common.h"

#include <strings.h>

/* Indexed by type id; ids of removed types have a NULL name. */
static const struct common_ggml_type_info type_table[COMMON_GGML_TYPE_COUNT] = {
    [COMMON_GGML_TYPE_F32] = {"f32", 1, 4},
    [COMMON_GGML_TYPE_F16] = {"f16", 1, 2},
    [COMMON_GGML_TYPE_Q4_0] = {"q4_0", 32, 18},
    [COMMON_GGML_TYPE_Q4_1] = {"q4_1", 32, 20},
    [COMMON_GGML_TYPE_Q5_0] = {"q5_0", 32, 22},
    [COMMON_GGML_TYPE_Q5_1] = {"q5_1", 32, 24},
    [COMMON_GGML_TYPE_Q8_0] = {"q8_0", 32, 34},
    [COMMON_GGML_TYPE_Q8_1] = {"q8_1", 32, 36},
    [COMMON_GGML_TYPE_Q2_K] = {"q2_K", 256, 84},
    [COMMON_GGML_TYPE_Q3_K] = {"q3_K", 256, 110},
    [COMMON_GGML_TYPE_Q4_K] = {"q4_K", 256, 144},
    [COMMON_GGML_TYPE_Q5_K] = {"q5_K", 256, 176},
    [COMMON_GGML_TYPE_Q6_K] = {"q6_K", 256, 210},
    [COMMON_GGML_TYPE_Q8_K] = {"q8_K", 256, 292},
    [COMMON_GGML_TYPE_IQ2_XXS] = {"iq2_xxs", 256, 66},
    [COMMON_GGML_TYPE_IQ2_XS] = {"iq2_xs", 256, 74},
    [COMMON_GGML_TYPE_IQ3_XXS] = {"iq3_xxs", 256, 98},
    [COMMON_GGML_TYPE_IQ1_S] = {"iq1_s", 256, 50},
    [COMMON_GGML_TYPE_IQ4_NL] = {"iq4_nl", 32, 18},
    [COMMON_GGML_TYPE_IQ3_S] = {"iq3_s", 256, 110},
    [COMMON_GGML_TYPE_IQ2_S] = {"iq2_s", 256, 82},
    [COMMON_GGML_TYPE_IQ4_XS] = {"iq4_xs", 256, 136},
    [COMMON_GGML_TYPE_I8] = {"i8", 1, 1},
    [COMMON_GGML_TYPE_I16] = {"i16", 1, 2},
    [COMMON_GGML_TYPE_I32] = {"i32", 1, 4},
    [COMMON_GGML_TYPE_I64] = {"i64", 1, 8},
    [COMMON_GGML_TYPE_F64] = {"f64", 1, 8},
    [COMMON_GGML_TYPE_IQ1_M] = {"iq1_m", 256, 56},
    [COMMON_GGML_TYPE_BF16] = {"bf16", 1, 2},
    [COMMON_GGML_TYPE_TQ1_0] = {"tq1_0", 256, 54},
    [COMMON_GGML_TYPE_TQ2_0] = {"tq2_0", 256, 66},
    [COMMON_GGML_TYPE_I2_S] = {"i2_s", 32, 8},
    [COMMON_GGML_TYPE_MXFP4] = {"mxfp4", 32, 17},
    [COMMON_GGML_TYPE_I2S_Q128] = {"i2_s:q128", 128, 32},
    [COMMON_GGML_TYPE_I2S_B32H] = {"i2_s:b32h", 32, 10},
    [COMMON_GGML_TYPE_I2S_B32F] = {"i2_s:b32f", 32, 12},
};

const struct common_ggml_type_info *common_ggml_type_get(uint32_t type)
{
    if (type >= COMMON_GGML_TYPE_COUNT || !type_table[type].name)
        return NULL;
    return &type_table[type];
}

int common_ggml_type_from_name(const char *name, uint32_t *out)
{
    for (uint32_t t = 0; t < COMMON_GGML_TYPE_FILE_COUNT; t++) {
        if (type_table[t].name && strcasecmp(type_table[t].name, name) == 0) {
            *out = t;
            return COMMON_OK;
        }
    }
    return COMMON_EINVAL;
}

int common_ggml_row_size(uint32_t type, uint64_t n, uint64_t *out)
{
    const struct common_ggml_type_info *ti = common_ggml_type_get(type);
    if (!ti || n % ti->blck != 0)
        return COMMON_EINVAL;
    uint64_t r;
    if (!common_mul_u64(n / ti->blck, ti->type_size, &r))
        return COMMON_ERANGE;
    *out = r;
    return COMMON_OK;
}
