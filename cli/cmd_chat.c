/* cli/cmd_chat.c - `sluice chat`: a conversation rendered with the model's template. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "router.h"

static void chat_usage(FILE *f)
{
    fprintf(f,
            "usage: sluice chat -m MODEL [options]\n\n"
            "Chats with a model, rendering the conversation with its chat template. With -p it\n"
            "answers that one message and exits; otherwise each line read from stdin is a user\n"
            "turn (interactive when stdin is a terminal), until end of input.\n\n"
            "  -m, --model PATH     GGUF model\n"
            "  -p, --prompt TEXT    one user message: answer it and exit\n"
            "  -sys, --system TEXT  a system message\n"
            "  --template NAME      chatml, llama2, llama3, mistral-v7, gemma, phi3, deepseek3,\n"
            "                       ... (default: from tokenizer.chat_template, else chatml)\n"
            "  -n, --n-predict N    most tokens per reply                    [128]\n"
            "  -t, --threads N      threads                                  [physical cores]\n"
            "  -c, --ctx-size N     context for the whole conversation       [model's, <= 4096]\n"
            "  --temp X, --top-k K, --top-p P, --min-p P, --seed S   sampling, as sluice run\n"
            "  --dry-run            print the rendered prompt and its token ids, then "
            "exit\n" CLI_STREAM_USAGE "  -h, --help           this help\n\n"
            "A reply ends at an end-of-generation token or after -n tokens. When the\n"
            "conversation no longer fits the context, chat says so and stops.\n");
}

/* The conversation so far: owned copies of every message. */
struct chat_history {
    struct router_chat_msg *msgs; /* owned: roles are static strings, contents malloc'd */
    size_t                  n;
};

static int chat_add(struct chat_history *h, const char *role, const char *content, size_t len)
{
    struct router_chat_msg *m = realloc(h->msgs, (h->n + 1) * sizeof(*m));
    if (!m)
        return COMMON_ENOMEM;
    h->msgs = m;
    char *txt = malloc(len + 1);
    if (!txt)
        return COMMON_ENOMEM;
    memcpy(txt, content, len);
    txt[len] = '\0';
    h->msgs[h->n++] = (struct router_chat_msg){role, txt};
    return COMMON_OK;
}

static void chat_history_fini(struct chat_history *h)
{
    for (size_t i = 0; i < h->n; i++)
        free((void *)(uintptr_t)h->msgs[i].content);
    free(h->msgs);
}

/* Renders the whole conversation with a generation prompt and tokenizes it. */
static int chat_render(enum router_chat_tmpl tmpl, const struct router_vocab *v,
                       const struct chat_history *h, struct router_text *text,
                       struct router_tokens *toks)
{
    router_text_clear(text);
    router_tokens_clear(toks);
    int rc = router_chat_render(tmpl, h->msgs, h->n,
                                &(struct router_chat_opts){.add_generation_prompt = true}, text);
    if (rc < 0)
        return rc;
    return router_tokenize(
        v, text->ptr ? text->ptr : "", text->len,
        &(struct router_tokenize_opts){.add_special = true, .parse_special = true}, toks);
}

/* Reads one line of stdin (without the newline) into `line`; returns false at end of input. */
static bool chat_read_line(struct router_text *line)
{
    int c;
    router_text_clear(line);
    while ((c = getchar()) != EOF && c != '\n') {
        const char ch = (char)c;
        if (router_text_append(line, &ch, 1) < 0)
            return false;
    }
    return c != EOF || line->len > 0;
}

/* Generates one reply after `prompt` (the rendered conversation). The tokens already in the
 * context are reused when they are a prefix of the prompt; otherwise the context starts over.
 * `in_ctx` mirrors what the context holds. The reply text is appended to `reply`. */
static int chat_reply(struct cli_session *s, const struct router_tokens *prompt,
                      struct router_tokens *in_ctx, uint32_t n_predict, struct router_text *reply)
{
    size_t keep = 0;
    while (keep < in_ctx->n && keep < prompt->n && in_ctx->ids[keep] == prompt->ids[keep])
        keep++;
    if (keep < in_ctx->n || keep == prompt->n) {
        executor_ctx_reset(s->ctx);
        router_sampler_reset(&s->sampler);
        router_tokens_clear(in_ctx);
        keep = 0;
    }
    if (prompt->n - keep > UINT32_MAX)
        return COMMON_ERANGE;
    int rc = cli_session_feed(s, prompt->ids + keep, (uint32_t)(prompt->n - keep));
    if (rc < 0)
        return rc;
    for (size_t i = keep; i < prompt->n; i++)
        if ((rc = router_tokens_push(in_ctx, prompt->ids[i])) < 0)
            return rc;

    struct router_stop st;
    if ((rc = router_stop_init(&st, s->vocab,
                               &(struct router_stop_opts){.max_tokens = n_predict})) < 0)
        return rc;
    struct router_text piece = {0};
    for (;;) {
        int32_t id;
        if ((rc = cli_session_pick(s, &id)) < 0)
            break;
        router_text_clear(&piece);
        int reason = router_stop_push(&st, id, &piece);
        if (reason < 0) {
            rc = reason;
            break;
        }
        fwrite(piece.ptr, 1, piece.len, stdout);
        fflush(stdout);
        router_text_append(reply, piece.ptr, piece.len);
        if (reason != ROUTER_STOP_NONE)
            break;
        if (cli_session_is_full(s)) {
            fprintf(stderr, "\nchat: the context is full (%u tokens; use -c)\n",
                    executor_ctx_n_past(s->ctx));
            rc = COMMON_ERANGE;
            break;
        }
        if ((rc = cli_session_feed(s, &id, 1)) < 0 || (rc = router_tokens_push(in_ctx, id)) < 0)
            break;
    }
    if (rc >= 0) {
        router_text_clear(&piece);
        router_stop_finish(&st, &piece);
        fwrite(piece.ptr, 1, piece.len, stdout);
        router_text_append(reply, piece.ptr, piece.len);
        printf("\n");
        fflush(stdout);
    }
    router_text_fini(&piece);
    router_stop_fini(&st);
    return rc < 0 ? rc : COMMON_OK;
}

int cli_cmd_chat(int argc, char **argv)
{
    struct cli_session_opts so;
    const char             *prompt = NULL, *system = NULL, *tmpl_name = NULL;
    bool                    dry_run = false;
    cli_session_opts_default(&so);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            chat_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--dry-run")) {
            dry_run = true;
            continue;
        }
        int taken = cli_take_option(argc, argv, &i, &so.stream, &v);
        if (taken == 0)
            taken = cli_session_parse_flag(&so, a, v);
        if (taken < 0)
            return 2;
        if (taken > 0)
            continue;
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt"))
            prompt = v;
        else if (!strcmp(a, "-sys") || !strcmp(a, "--system"))
            system = v;
        else if (!strcmp(a, "--template"))
            tmpl_name = v;
        else {
            fprintf(stderr, "sluice chat: unknown argument %s\n", a);
            chat_usage(stderr);
            return 2;
        }
    }
    if (!so.model) {
        fprintf(stderr, "sluice chat: need -m MODEL\n");
        chat_usage(stderr);
        return 2;
    }

    int                   status = 1;
    struct cli_session    s;
    struct chat_history   hist = {0};
    struct router_text    text = {0}, line = {0}, reply = {0};
    struct router_tokens  toks = {0}, in_ctx = {0};
    enum router_chat_tmpl tmpl;
    bool                  interactive = !prompt && isatty(STDIN_FILENO);
    if (cli_session_open(&s, &so, true) < 0)
        goto out;
    const struct common_gguf *g = executor_model_desc(s.model)->gguf;
    if (tmpl_name) {
        if (router_chat_detect(tmpl_name, strlen(tmpl_name), &tmpl) < 0) {
            fprintf(stderr, "sluice chat: unknown template '%s'\n", tmpl_name);
            goto out;
        }
    } else {
        router_chat_for_model(g, &tmpl);
    }
    if (system && chat_add(&hist, "system", system, strlen(system)) < 0)
        goto out;
    for (;;) {
        if (prompt) {
            if (chat_add(&hist, "user", prompt, strlen(prompt)) < 0)
                goto out;
        } else {
            if (interactive) {
                printf("> ");
                fflush(stdout);
            }
            if (!chat_read_line(&line))
                break;
            if (line.len == 0)
                continue;
            if (chat_add(&hist, "user", line.ptr, line.len) < 0)
                goto out;
        }
        if (chat_render(tmpl, s.vocab, &hist, &text, &toks) < 0) {
            fprintf(stderr, "sluice chat: out of memory\n");
            goto out;
        }
        if (dry_run) {
            printf("template: %s\n%s\n[", router_chat_name(tmpl), text.ptr ? text.ptr : "");
            for (size_t i = 0; i < toks.n; i++)
                printf(i ? ", %d" : "%d", toks.ids[i]);
            printf("]\n");
            status = 0;
            goto out;
        }
        router_text_clear(&reply);
        if (chat_reply(&s, &toks, &in_ctx, so.n_predict, &reply) < 0)
            goto out;
        if (chat_add(&hist, "assistant", reply.ptr ? reply.ptr : "", reply.len) < 0)
            goto out;
        if (prompt)
            break;
    }
    status = 0;
out:
    router_tokens_fini(&in_ctx);
    router_tokens_fini(&toks);
    router_text_fini(&reply);
    router_text_fini(&text);
    router_text_fini(&line);
    chat_history_fini(&hist);
    cli_session_close(&s);
    return status;
}
