/* router/cli/cmd_chat.c - `sluice chat`: renders the conversation with the model's template. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"

static void chat_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice chat -m MODEL [options]\n"
            "Chats with a model: each line read from stdin (or -p) is a user turn.\n"
            "  -m, --model PATH     GGUF model\n"
            "  -p, --prompt TEXT    the first user message (else read from stdin)\n"
            "  -s, --system TEXT    a system message\n"
            "  --template NAME      chatml, llama2, llama3, mistral-v7, gemma, phi3, deepseek3,\n"
            "                       ... (default: from tokenizer.chat_template, else chatml)\n"
            "  --dry-run            print the rendered prompt and its token ids, then exit\n"
            "  -h, --help           this help\n");
}

int cli_cmd_chat(int argc, char **argv)
{
    const char *model = NULL, *prompt = NULL, *system = NULL, *tmpl_name = NULL;
    bool        dry_run = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            if (!(prompt = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-s") || !strcmp(a, "--system")) {
            if (!(system = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--template")) {
            if (!(tmpl_name = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--dry-run")) {
            dry_run = true;
        } else {
            fprintf(stderr, "sluice chat: unknown argument %s\n", a);
            chat_usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "sluice chat: need -m MODEL\n");
        chat_usage(stderr);
        return 2;
    }

    int                   rc = 1;
    struct common_errmsg  e = {{0}};
    struct common_gguf   *g = NULL;
    struct router_vocab  *v = NULL;
    struct router_text    text = {0}, line = {0};
    struct router_tokens  toks = {0};
    enum router_chat_tmpl tmpl;
    if (common_gguf_open(model, NULL, &g, &e) < 0 || router_vocab_load(g, &v, &e) < 0) {
        fprintf(stderr, "sluice chat: %s: %s\n", model, e.text);
        goto out;
    }
    if (tmpl_name) {
        if (router_chat_detect(tmpl_name, strlen(tmpl_name), &tmpl) < 0) {
            fprintf(stderr, "sluice chat: unknown template '%s'\n", tmpl_name);
            goto out;
        }
    } else {
        router_chat_for_model(g, &tmpl);
    }

    if (!prompt) {
        /* One line from stdin is the first user turn. */
        int c;
        while ((c = getchar()) != EOF && c != '\n') {
            const char ch = (char)c;
            router_text_append(&line, &ch, 1);
        }
        prompt = line.ptr ? line.ptr : "";
    }
    struct router_chat_msg msgs[2];
    size_t                 n = 0;
    if (system)
        msgs[n++] = (struct router_chat_msg){"system", system};
    msgs[n++] = (struct router_chat_msg){"user", prompt};
    if (router_chat_render(tmpl, msgs, n, &(struct router_chat_opts){.add_generation_prompt = true},
                           &text) < 0 ||
        router_tokenize(v, text.ptr ? text.ptr : "", text.len,
                        &(struct router_tokenize_opts){.add_special = true, .parse_special = true},
                        &toks) < 0) {
        fprintf(stderr, "sluice chat: out of memory\n");
        goto out;
    }
    if (dry_run) {
        printf("template: %s\n%s\n[", router_chat_name(tmpl), text.ptr ? text.ptr : "");
        for (size_t i = 0; i < toks.n; i++)
            printf(i ? ", %d" : "%d", toks.ids[i]);
        printf("]\n");
        rc = 0;
        goto out;
    }
    /* TODO(router-library issue): the interactive loop (sample with struct router_sampler, end
     * turns with struct router_stop) waits for a generation API in executor/executor.h. */
    fprintf(stderr,
            "sluice chat: the prompt is ready (%zu tokens, template %s), but generation "
            "needs the executor's forward pass, which this build does not have yet\n",
            toks.n, router_chat_name(tmpl));
out:
    router_tokens_fini(&toks);
    router_text_fini(&text);
    router_text_fini(&line);
    router_vocab_destroy(v);
    common_gguf_close(g);
    return rc;
}
