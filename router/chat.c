/* router/chat.c - chat templates: recognised by substrings of tokenizer.chat_template, no Jinja. */
#include "router.h"

#include <ctype.h>
#include <string.h>

#define LOG_COMP "router.chat"

static const char *const k_names[ROUTER_CHAT_COUNT] = {
    [ROUTER_CHAT_CHATML] = "chatml",
    [ROUTER_CHAT_LLAMA2] = "llama2",
    [ROUTER_CHAT_LLAMA2_SYS] = "llama2-sys",
    [ROUTER_CHAT_LLAMA2_SYS_BOS] = "llama2-sys-bos",
    [ROUTER_CHAT_LLAMA2_SYS_STRIP] = "llama2-sys-strip",
    [ROUTER_CHAT_LLAMA3] = "llama3",
    [ROUTER_CHAT_MISTRAL_V1] = "mistral-v1",
    [ROUTER_CHAT_MISTRAL_V3] = "mistral-v3",
    [ROUTER_CHAT_MISTRAL_V3_TEKKEN] = "mistral-v3-tekken",
    [ROUTER_CHAT_MISTRAL_V7] = "mistral-v7",
    [ROUTER_CHAT_MISTRAL_V7_TEKKEN] = "mistral-v7-tekken",
    [ROUTER_CHAT_GEMMA] = "gemma",
    [ROUTER_CHAT_PHI3] = "phi3",
    [ROUTER_CHAT_PHI4] = "phi4",
    [ROUTER_CHAT_DEEPSEEK] = "deepseek",
    [ROUTER_CHAT_DEEPSEEK2] = "deepseek2",
    [ROUTER_CHAT_DEEPSEEK3] = "deepseek3",
    [ROUTER_CHAT_CHATGLM4] = "chatglm4",
    [ROUTER_CHAT_GPT_OSS] = "gpt-oss",
    [ROUTER_CHAT_KIMI_K2] = "kimi-k2",
};

const char *router_chat_name(enum router_chat_tmpl t)
{
    return (unsigned)t < ROUTER_CHAT_COUNT ? k_names[t] : "unknown";
}

/* Substring test on a counted string. */
static bool has(const char *s, size_t len, const char *needle)
{
    const size_t n = strlen(needle);
    return n <= len && memmem(s, len, needle, n) != NULL;
}

int router_chat_detect(const char *t, size_t len, enum router_chat_tmpl *out)
{
    for (int i = 0; i < ROUTER_CHAT_COUNT; i++) {
        if (strlen(k_names[i]) == len && memcmp(k_names[i], t, len) == 0) {
            *out = (enum router_chat_tmpl)i;
            return 0;
        }
    }
    /* The order of llama.cpp's llm_chat_detect_template(), restricted to the families here;
     * templates of families not built in (zephyr, command-r, ...) are left unrecognised rather
     * than mistaken for one of these. */
    enum router_chat_tmpl r;
    if (has(t, len, "<|im_start|>")) {
        if (has(t, len, "<end_of_utterance>"))
            return COMMON_ENOENT; /* SmolVLM: not ChatML */
        r = has(t, len, "<|im_sep|>") ? ROUTER_CHAT_PHI4 : ROUTER_CHAT_CHATML;
    } else if ((len >= 7 && memcmp(t, "mistral", 7) == 0) || has(t, len, "[INST]")) {
        if (has(t, len, "[SYSTEM_PROMPT]")) {
            r = ROUTER_CHAT_MISTRAL_V7;
        } else if (has(t, len, "' [INST] ' + system_message") || has(t, len, "[AVAILABLE_TOOLS]")) {
            if (has(t, len, " [INST]"))
                r = ROUTER_CHAT_MISTRAL_V1;
            else if (has(t, len, "\"[INST]\""))
                r = ROUTER_CHAT_MISTRAL_V3_TEKKEN;
            else
                r = ROUTER_CHAT_MISTRAL_V3;
        } else if (has(t, len, "content.strip()")) {
            r = ROUTER_CHAT_LLAMA2_SYS_STRIP;
        } else if (has(t, len, "bos_token + '[INST]")) {
            r = ROUTER_CHAT_LLAMA2_SYS_BOS;
        } else if (has(t, len, "<<SYS>>")) {
            r = ROUTER_CHAT_LLAMA2_SYS;
        } else {
            r = ROUTER_CHAT_LLAMA2;
        }
    } else if (has(t, len, "<|assistant|>") && has(t, len, "<|end|>")) {
        r = ROUTER_CHAT_PHI3;
    } else if (has(t, len, "[gMASK]<sop>")) {
        r = ROUTER_CHAT_CHATGLM4;
    } else if ((has(t, len, "<|assistant|>") && has(t, len, "<|user|>")) ||
               (has(t, len, "<|user|>") && has(t, len, "<|endoftext|>")) ||
               has(t, len, "bos_token + message['role']")) {
        return COMMON_ENOENT; /* glm, falcon3, zephyr, monarch */
    } else if (has(t, len, "<start_of_turn>")) {
        r = ROUTER_CHAT_GEMMA;
    } else if (has(t, len, "### Instruction:") && has(t, len, "<|EOT|>")) {
        r = ROUTER_CHAT_DEEPSEEK;
    } else if (has(t, len, "<|START_OF_TURN_TOKEN|>") && has(t, len, "<|USER_TOKEN|>")) {
        return COMMON_ENOENT; /* command-r */
    } else if (has(t, len, "<|start_header_id|>") && has(t, len, "<|end_header_id|>")) {
        r = ROUTER_CHAT_LLAMA3;
    } else if (has(t, len, "'Assistant: ' + message['content'] + eos_token")) {
        r = ROUTER_CHAT_DEEPSEEK2;
    } else if (has(t, len,
                   "<\xEF\xBD\x9C"
                   "Assistant\xEF\xBD\x9C>") &&
               has(t, len,
                   "<\xEF\xBD\x9C"
                   "User\xEF\xBD\x9C>") &&
               has(t, len,
                   "<\xEF\xBD\x9C"
                   "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>")) {
        r = ROUTER_CHAT_DEEPSEEK3;
    } else if (has(t, len, "<|start|>") && has(t, len, "<|channel|>")) {
        r = ROUTER_CHAT_GPT_OSS;
    } else if (has(t, len, "<|im_assistant|>assistant<|im_middle|>")) {
        r = ROUTER_CHAT_KIMI_K2;
    } else {
        return COMMON_ENOENT;
    }
    *out = r;
    return 0;
}

int router_chat_for_model(const struct common_gguf *g, enum router_chat_tmpl *out)
{
    struct common_gguf_str s;
    if (common_gguf_get_str(g, "tokenizer.chat_template", &s) != 0) {
        COMMON_LOG_WARN(LOG_COMP, "model has no tokenizer.chat_template, using chatml");
        *out = ROUTER_CHAT_CHATML;
        return 0;
    }
    if (router_chat_detect(s.ptr, (size_t)s.len, out) != 0) {
        COMMON_LOG_WARN(LOG_COMP, "chat template not recognised, using chatml");
        *out = ROUTER_CHAT_CHATML;
    }
    return 0;
}

/* Appends NUL-terminated pieces; stops at the first failure. */
struct sink {
    struct router_text *out;
    int                 rc;
};

static void put(struct sink *k, const char *s)
{
    if (k->rc == 0)
        k->rc = router_text_append(k->out, s, strlen(s));
}

/* Appends s without leading and trailing ASCII white space (llama.cpp's trim()). */
static void put_trim(struct sink *k, const char *s)
{
    size_t a = 0, b = strlen(s);
    while (a < b && isspace((unsigned char)s[a]))
        a++;
    while (b > a && isspace((unsigned char)s[b - 1]))
        b--;
    if (k->rc == 0)
        k->rc = router_text_append(k->out, s + a, b - a);
}

static bool is_role(const struct router_chat_msg *m, const char *role)
{
    return strcmp(m->role, role) == 0;
}

static void render_mistral(struct sink *k, enum router_chat_tmpl t,
                           const struct router_chat_msg *msgs, size_t n)
{
    if (t == ROUTER_CHAT_MISTRAL_V7 || t == ROUTER_CHAT_MISTRAL_V7_TEKKEN) {
        const char *sp = t == ROUTER_CHAT_MISTRAL_V7 ? " " : "";
        for (size_t i = 0; i < n; i++) {
            if (is_role(&msgs[i], "system")) {
                put(k, "[SYSTEM_PROMPT]");
                put(k, sp);
                put(k, msgs[i].content);
                put(k, "[/SYSTEM_PROMPT]");
            } else if (is_role(&msgs[i], "user")) {
                put(k, "[INST]");
                put(k, sp);
                put(k, msgs[i].content);
                put(k, "[/INST]");
            } else {
                put(k, sp);
                put(k, msgs[i].content);
                put(k, "</s>");
            }
        }
        return;
    }
    const char *lead = t == ROUTER_CHAT_MISTRAL_V1 ? " " : "";
    const char *trail = t == ROUTER_CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    bool        inside = false;
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            put(k, lead);
            put(k, "[INST]");
            put(k, trail);
            inside = true;
        }
        if (is_role(&msgs[i], "system")) {
            put(k, msgs[i].content);
            put(k, "\n\n");
        } else if (is_role(&msgs[i], "user")) {
            put(k, msgs[i].content);
            put(k, lead);
            put(k, "[/INST]");
        } else {
            put(k, trail);
            if (t == ROUTER_CHAT_MISTRAL_V3)
                put_trim(k, msgs[i].content);
            else
                put(k, msgs[i].content);
            put(k, "</s>");
            inside = false;
        }
    }
}

static void render_llama2(struct sink *k, enum router_chat_tmpl t,
                          const struct router_chat_msg *msgs, size_t n)
{
    const bool sys_ok = t != ROUTER_CHAT_LLAMA2;
    const bool bos_in = t == ROUTER_CHAT_LLAMA2_SYS_BOS;
    const bool strip = t == ROUTER_CHAT_LLAMA2_SYS_STRIP;
    bool       inside = true; /* the BOS at the very start comes from the tokenizer */
    put(k, "[INST] ");
    for (size_t i = 0; i < n; i++) {
        if (!inside) {
            inside = true;
            put(k, bos_in ? "<s>[INST] " : "[INST] ");
        }
        if (is_role(&msgs[i], "system")) {
            put(k, sys_ok ? "<<SYS>>\n" : "");
            strip ? put_trim(k, msgs[i].content) : put(k, msgs[i].content);
            put(k, sys_ok ? "\n<</SYS>>\n\n" : "\n");
        } else if (is_role(&msgs[i], "user")) {
            strip ? put_trim(k, msgs[i].content) : put(k, msgs[i].content);
            put(k, " [/INST]");
        } else {
            strip ? put_trim(k, msgs[i].content) : put(k, msgs[i].content);
            put(k, "</s>");
            inside = false;
        }
    }
}

static void render_gemma(struct sink *k, const struct router_chat_msg *msgs, size_t n, bool gen)
{
    /* Gemma has no system role: system text goes at the top of the next user turn. */
    struct router_text sys = {0};
    for (size_t i = 0; i < n && k->rc == 0; i++) {
        if (is_role(&msgs[i], "system")) {
            struct sink ks = {&sys, 0};
            put_trim(&ks, msgs[i].content);
            k->rc = ks.rc;
            continue;
        }
        const bool model = is_role(&msgs[i], "assistant");
        put(k, "<start_of_turn>");
        put(k, model ? "model" : msgs[i].role);
        put(k, "\n");
        if (sys.len > 0 && !model && !is_role(&msgs[i], "model")) {
            put(k, sys.ptr);
            put(k, "\n\n");
            router_text_clear(&sys);
        }
        put_trim(k, msgs[i].content);
        put(k, "<end_of_turn>\n");
    }
    if (gen)
        put(k, "<start_of_turn>model\n");
    router_text_fini(&sys);
}

/* Templates of one shape: PRE role MID content POST per message, then GEN for the reply. */
struct chat_tagged {
    const char *pre, *mid, *post, *gen;
    bool        trim; /* content trimmed of surrounding blanks (llama3) */
};

static void render_tagged(struct sink *k, const struct chat_tagged *tg,
                          const struct router_chat_msg *msgs, size_t n, bool gen)
{
    for (size_t i = 0; i < n; i++) {
        put(k, tg->pre);
        put(k, msgs[i].role);
        put(k, tg->mid);
        if (tg->trim)
            put_trim(k, msgs[i].content);
        else
            put(k, msgs[i].content);
        put(k, tg->post);
    }
    if (gen)
        put(k, tg->gen);
}

/* DeepSeek's three templates: plain-text turns (v1), "User: / Assistant:" (v2), fullwidth-bar
 * tags (v3). */
static void render_deepseek(struct sink *k, enum router_chat_tmpl t,
                            const struct router_chat_msg *msgs, size_t n, bool gen)
{
#define DS_EOS                                                                                     \
    "<\xEF\xBD\x9C"                                                                                \
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DS_USER                                                                                    \
    "<\xEF\xBD\x9C"                                                                                \
    "User\xEF\xBD\x9C>"
#define DS_ASST                                                                                    \
    "<\xEF\xBD\x9C"                                                                                \
    "Assistant\xEF\xBD\x9C>"
    static const char *const sys_post[] = {"", "\n\n", "\n\n"};
    static const char *const user_pre[] = {"### Instruction:\n", "User: ", DS_USER};
    static const char *const user_post[] = {"\n", "\n\n", ""};
    static const char *const asst_pre[] = {"### Response:\n", "Assistant: ", DS_ASST};
    static const char *const asst_post[] = {"\n<|EOT|>\n", DS_EOS, DS_EOS};
    static const char *const gen_text[] = {"### Response:\n", "Assistant:", DS_ASST};
    const int                v = t == ROUTER_CHAT_DEEPSEEK ? 0 : t == ROUTER_CHAT_DEEPSEEK2 ? 1 : 2;
    for (size_t i = 0; i < n; i++) {
        if (is_role(&msgs[i], "system")) {
            put(k, msgs[i].content);
            put(k, sys_post[v]);
        } else if (is_role(&msgs[i], "user")) {
            put(k, user_pre[v]);
            put(k, msgs[i].content);
            put(k, user_post[v]);
        } else if (is_role(&msgs[i], "assistant")) {
            put(k, asst_pre[v]);
            put(k, msgs[i].content);
            put(k, asst_post[v]);
        }
    }
    if (gen)
        put(k, gen_text[v]);
#undef DS_EOS
#undef DS_USER
#undef DS_ASST
}

int router_chat_render(enum router_chat_tmpl t, const struct router_chat_msg *msgs, size_t n,
                       const struct router_chat_opts *o, struct router_text *out)
{
    static const struct chat_tagged chatml = {"<|im_start|>", "\n", "<|im_end|>\n",
                                              "<|im_start|>assistant\n", false};
    static const struct chat_tagged phi4 = {"<|im_start|>", "<|im_sep|>", "<|im_end|>",
                                            "<|im_start|>assistant<|im_sep|>", false};
    static const struct chat_tagged phi3 = {"<|", "|>\n", "<|end|>\n", "<|assistant|>\n", false};
    static const struct chat_tagged llama3 = {
        "<|start_header_id|>", "<|end_header_id|>\n\n", "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n", true};
    const struct router_chat_opts dflt = {0};
    if (!o)
        o = &dflt;
    if ((unsigned)t >= ROUTER_CHAT_COUNT || (n && !msgs))
        return COMMON_EINVAL;
    for (size_t i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content)
            return COMMON_EINVAL;
    }
    const size_t start = out->len;
    struct sink  k = {out, 0};
    const bool   gen = o->add_generation_prompt;
    switch (t) {
    case ROUTER_CHAT_CHATML:
        render_tagged(&k, &chatml, msgs, n, gen);
        break;
    case ROUTER_CHAT_PHI4:
        render_tagged(&k, &phi4, msgs, n, gen);
        break;
    case ROUTER_CHAT_PHI3:
        render_tagged(&k, &phi3, msgs, n, gen);
        break;
    case ROUTER_CHAT_LLAMA3:
        render_tagged(&k, &llama3, msgs, n, gen);
        break;
    case ROUTER_CHAT_MISTRAL_V1:
    case ROUTER_CHAT_MISTRAL_V3:
    case ROUTER_CHAT_MISTRAL_V3_TEKKEN:
    case ROUTER_CHAT_MISTRAL_V7:
    case ROUTER_CHAT_MISTRAL_V7_TEKKEN:
        render_mistral(&k, t, msgs, n);
        break;
    case ROUTER_CHAT_LLAMA2:
    case ROUTER_CHAT_LLAMA2_SYS:
    case ROUTER_CHAT_LLAMA2_SYS_BOS:
    case ROUTER_CHAT_LLAMA2_SYS_STRIP:
        render_llama2(&k, t, msgs, n);
        break;
    case ROUTER_CHAT_GEMMA:
        render_gemma(&k, msgs, n, gen);
        break;
    case ROUTER_CHAT_DEEPSEEK:
    case ROUTER_CHAT_DEEPSEEK2:
    case ROUTER_CHAT_DEEPSEEK3:
        render_deepseek(&k, t, msgs, n, gen);
        break;
    case ROUTER_CHAT_CHATGLM4:
        /* [gMASK]<sop> then <|role|>\ncontent for each message, <|assistant|>\n to generate */
        put(&k, "[gMASK]<sop>");
        for (size_t i = 0; i < n; i++) {
            put(&k, "<|");
            put(&k, msgs[i].role);
            put(&k, "|>\n");
            put(&k, msgs[i].content);
        }
        if (gen)
            put(&k, "<|assistant|>\n");
        break;
    case ROUTER_CHAT_GPT_OSS:
        /* Harmony: <|start|>role<|message|>content, then <|return|> after the assistant's
         * messages and <|end|> after the others; <|start|>assistant to generate */
        for (size_t i = 0; i < n; i++) {
            put(&k, "<|start|>");
            put(&k, msgs[i].role);
            put(&k, "<|message|>");
            put(&k, msgs[i].content);
            put(&k, strcmp(msgs[i].role, "assistant") == 0 ? "<|return|>" : "<|end|>");
        }
        if (gen)
            put(&k, "<|start|>assistant");
        break;
    case ROUTER_CHAT_KIMI_K2:
        /* a header per known role, then content<|im_end|>; other roles get no header, as in
         * llama.cpp */
        for (size_t i = 0; i < n; i++) {
            static const char *const heads[][2] = {
                {"system", "<|im_system|>system<|im_middle|>"},
                {"user", "<|im_user|>user<|im_middle|>"},
                {"assistant", "<|im_assistant|>assistant<|im_middle|>"},
                {"tool", "<|im_system|>tool<|im_middle|>"},
            };
            for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++)
                if (is_role(&msgs[i], heads[h][0]))
                    put(&k, heads[h][1]);
            put(&k, msgs[i].content);
            put(&k, "<|im_end|>");
        }
        if (gen)
            put(&k, "<|im_assistant|>assistant<|im_middle|>");
        break;
    case ROUTER_CHAT_COUNT:
        return COMMON_EINVAL;
    }
    if (k.rc < 0) {
        out->len = start;
        if (out->ptr)
            out->ptr[start] = '\0';
    }
    return k.rc;
}
