/* tests/router/test_chat.c - chat templates: detection and rendering as llama.cpp renders them.
 * Expected texts are llama.cpp's own (tests/test-chat-template.cpp, llm_chat_apply_template). */
#include <criterion/criterion.h>
#include <string.h>

#include "router.h"

/* The conversation of llama.cpp's test-chat-template: system + three user turns. */
static const struct router_chat_msg k_conv[] = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};
#define N_CONV (sizeof(k_conv) / sizeof(k_conv[0]))

static void expect_render(const char *tmpl_src, enum router_chat_tmpl want_tmpl, const char *want)
{
    enum router_chat_tmpl t = ROUTER_CHAT_COUNT;
    cr_assert_eq(router_chat_detect(tmpl_src, strlen(tmpl_src), &t), 0, "not detected: %s",
                 tmpl_src);
    cr_assert_eq(t, want_tmpl, "detected %s, want %s", router_chat_name(t),
                 router_chat_name(want_tmpl));
    struct router_text out = {0};
    cr_assert_eq(router_chat_render(t, k_conv, N_CONV,
                                    &(struct router_chat_opts){.add_generation_prompt = true},
                                    &out),
                 0);
    cr_expect_str_eq(out.ptr, want, "%s rendered:\n%s", router_chat_name(t), out.ptr);
    router_text_fini(&out);
}

Test(router_chat, chatml_renders_like_llama_cpp)
{
    expect_render("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                  "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
                  ROUTER_CHAT_CHATML,
                  "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\n"
                  "Hello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\n"
                  "Who are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
                  "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n"
                  "<|im_start|>assistant\n");
}

Test(router_chat, llama2_renders_like_llama_cpp)
{
    expect_render("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                  "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}",
                  ROUTER_CHAT_LLAMA2,
                  "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are "
                  "you [/INST]   I am an assistant   </s>[INST] Another question [/INST]");
}

Test(router_chat, llama2_sys_bos_renders_like_llama_cpp)
{
    expect_render("{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}"
                  "{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}",
                  ROUTER_CHAT_LLAMA2_SYS_BOS,
                  "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                  "there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] "
                  "Another question [/INST]");
}

Test(router_chat, llama2_sys_strip_renders_like_llama_cpp)
{
    expect_render("{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' "
                  "}}{% elif message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() }}",
                  ROUTER_CHAT_LLAMA2_SYS_STRIP,
                  "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi "
                  "there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another "
                  "question [/INST]");
}

Test(router_chat, llama3_renders_like_llama_cpp)
{
    expect_render("{% set content = '<|start_header_id|>' + message['role'] + "
                  "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}",
                  ROUTER_CHAT_LLAMA3,
                  "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
                  "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

Test(router_chat, gemma_renders_like_llama_cpp)
{
    expect_render("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + "
                  "'<end_of_turn>\\n' }}",
                  ROUTER_CHAT_GEMMA,
                  "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
                  "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are "
                  "you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
                  "<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n");
}

Test(router_chat, phi3_renders_like_llama_cpp)
{
    expect_render("{{'<|' + message['role'] + '|>' + '\\n' + message['content'] + '<|end|>\\n' "
                  "}}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
                  ROUTER_CHAT_PHI3,
                  "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n"
                  "<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n"
                  "   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n"
                  "<|assistant|>\n");
}

Test(router_chat, deepseek_coder_renders_like_llama_cpp)
{
    expect_render("{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + "
                  "message['content'] + '\\n<|EOT|>\\n'}}",
                  ROUTER_CHAT_DEEPSEEK,
                  "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n"
                  "<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   "
                  "\n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n");
}

/* From llm_chat_apply_template's mistral-v7 branch: "[SYSTEM_PROMPT] " + system, "[INST] " +
 * user + "[/INST]", " " + assistant + "</s>", no generation prompt. */
Test(router_chat, mistral_v7_renders_like_llama_cpp)
{
    expect_render("{{ '[SYSTEM_PROMPT] ' + system_message + '[/SYSTEM_PROMPT]' }}{{ '[INST] ' }}",
                  ROUTER_CHAT_MISTRAL_V7,
                  "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST]"
                  " Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] "
                  "Another question[/INST]");
}

/* mistral-v3 (tokenizer with [AVAILABLE_TOOLS], no " [INST]"): assistant text is trimmed. */
Test(router_chat, mistral_v3_renders_like_llama_cpp)
{
    expect_render("{{- '[AVAILABLE_TOOLS]' }}{{- '[INST]' + message['content'] + '[/INST]' }}",
                  ROUTER_CHAT_MISTRAL_V3,
                  "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are "
                  "you[/INST] I am an assistant</s>[INST] Another question[/INST]");
}

Test(router_chat, deepseek3_renders_like_llama_cpp)
{
    expect_render("{{'<｜User｜>' + message['content']}}{{'<｜Assistant｜>' + content + "
                  "'<｜end▁of▁sentence｜>'}}",
                  ROUTER_CHAT_DEEPSEEK3,
                  "You are a helpful assistant\n\n<｜User｜>Hello<｜Assistant｜>Hi "
                  "there<｜end▁of▁sentence｜><｜User｜>Who are you<｜Assistant｜>   I am an "
                  "assistant   <｜end▁of▁sentence｜><｜User｜>Another question<｜Assistant｜>");
}

Test(router_chat, chatglm4_renders_like_llama_cpp)
{
    expect_render(
        "[gMASK]<sop>{% for item in messages %}<|{{ item['role'] }}|>", ROUTER_CHAT_CHATGLM4,
        "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi "
        "there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother "
        "question<|assistant|>\n");
}

Test(router_chat, gpt_oss_renders_like_llama_cpp)
{
    expect_render(
        "{{- '<|start|>' + message.role }}{{- '<|channel|>analysis<|message|>' }}",
        ROUTER_CHAT_GPT_OSS,
        "<|start|>system<|message|>You are a helpful assistant<|end|><|start|>user<|message|>"
        "Hello<|end|><|start|>assistant<|message|>Hi there<|return|><|start|>user<|message|>"
        "Who are you<|end|><|start|>assistant<|message|>   I am an assistant   <|return|>"
        "<|start|>user<|message|>Another question<|end|><|start|>assistant");
}

Test(router_chat, kimi_k2_renders_like_llama_cpp)
{
    expect_render(
        "{%- if message['role'] == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>",
        ROUTER_CHAT_KIMI_K2,
        "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|><|im_user|>user"
        "<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>Hi there<|im_end|>"
        "<|im_user|>user<|im_middle|>Who are you<|im_end|><|im_assistant|>assistant<|im_middle|>"
        "   I am an assistant   <|im_end|><|im_user|>user<|im_middle|>Another question<|im_end|>"
        "<|im_assistant|>assistant<|im_middle|>");
}

Test(router_chat, generation_prompt_is_optional)
{
    struct router_text out = {0};
    cr_assert_eq(router_chat_render(ROUTER_CHAT_CHATML, k_conv + 1, 1, NULL, &out), 0);
    cr_expect_str_eq(out.ptr, "<|im_start|>user\nHello<|im_end|>\n");
    router_text_fini(&out);
}

Test(router_chat, unknown_template_is_not_detected)
{
    enum router_chat_tmpl t = ROUTER_CHAT_COUNT;
    const char           *s = "{{ 'User: ' + m }}";
    cr_expect_eq(router_chat_detect(s, strlen(s), &t), COMMON_ENOENT);
    cr_expect_eq(t, ROUTER_CHAT_COUNT, "out must be unchanged");
}

Test(router_chat, names_are_detected_as_templates)
{
    enum router_chat_tmpl t;
    cr_assert_eq(router_chat_detect("llama3", 6, &t), 0);
    cr_expect_eq(t, ROUTER_CHAT_LLAMA3);
    cr_assert_eq(router_chat_detect("mistral-v7-tekken", 17, &t), 0);
    cr_expect_eq(t, ROUTER_CHAT_MISTRAL_V7_TEKKEN);
}

Test(router_chat, render_rejects_bad_input)
{
    struct router_text           out = {0};
    const struct router_chat_msg bad = {"user", NULL};
    cr_expect_eq(router_chat_render(ROUTER_CHAT_CHATML, &bad, 1, NULL, &out), COMMON_EINVAL);
    cr_expect_eq(router_chat_render(ROUTER_CHAT_COUNT, k_conv, 1, NULL, &out), COMMON_EINVAL);
    cr_expect_eq(out.len, 0);
}

/* Renders k_conv with template t and a generation prompt, and compares. */
static void expect_direct(enum router_chat_tmpl t, const char *want)
{
    struct router_text out = {0};
    cr_assert_eq(router_chat_render(t, k_conv, N_CONV,
                                    &(struct router_chat_opts){.add_generation_prompt = true},
                                    &out),
                 0);
    cr_expect_str_eq(out.ptr, want, "%s rendered:\n%s", router_chat_name(t), out.ptr);
    router_text_fini(&out);
}

Test(router_chat, phi4_renders_like_llama_cpp)
{
    expect_direct(ROUTER_CHAT_PHI4,
                  "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>"
                  "user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|>"
                  "<|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>"
                  "   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question"
                  "<|im_end|><|im_start|>assistant<|im_sep|>");
}

Test(router_chat, deepseek2_renders_like_llama_cpp)
{
    expect_direct(
        ROUTER_CHAT_DEEPSEEK2,
        "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi "
        "there<｜end▁of▁sentence｜>User: Who are you\n\nAssistant:    I am an assistant   "
        "<｜end▁of▁sentence｜>User: Another question\n\nAssistant:");
}
