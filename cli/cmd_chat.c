/* cli/cmd_chat.c - `sluice chat`: a conversation rendered with the model's template. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"
#include "router.h"

#define CHAT_PROG "sluice chat"

static const char chat_description[] =
    "Chats with a model, rendering the conversation with its chat template. With -p it answers "
    "that one message and exits; otherwise each line read from stdin is a user turn (interactive "
    "when stdin is a terminal), until end of input.";

static const char chat_epilog[] =
    "A reply ends at an end-of-generation token or after -n tokens. When the conversation no "
    "longer fits the context, chat says so and stops.";

/* What the command line asked for. */
struct chat_args {
    struct cli_session_opts so;        /* shared options; strings borrowed from argv */
    const char             *prompt;    /* -p: borrowed from argv */
    const char             *system;    /* -sys: borrowed from argv */
    const char             *tmpl_name; /* --template: borrowed from argv */
    bool                    dry_run;   /* --dry-run */
};

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int chat_parse(int argc, char **argv, struct chat_args *a)
{
    struct cli_session_table t;
    cli_session_opts_default(&a->so, CHAT_PROG);
    cli_session_table_init(&t, &a->so);
    const struct common_opt rows[] = {
        {.name = "prompt",
         .short_name = "p",
         .type = COMMON_OPT_STR,
         .target = &a->prompt,
         .help = "one user message: answer it and exit"},
        {.name = "system",
         .short_name = "sys",
         .type = COMMON_OPT_STR,
         .target = &a->system,
         .help = "a system message"},
        {.name = "template",
         .type = COMMON_OPT_STR,
         .target = &a->tmpl_name,
         .metavar = "NAME",
         .help = "chatml, llama2, llama3, mistral-v7, gemma, phi3, deepseek3, ...",
         .def = "from tokenizer.chat_template, else chatml"},
        {.name = "dry-run",
         .type = COMMON_OPT_SWITCH,
         .target = &a->dry_run,
         .help = "print the rendered prompt and its token ids, then exit"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = CHAT_PROG,
        .usage = CHAT_PROG " -m MODEL.gguf [-p MESSAGE] [options]",
        .description = chat_description,
        .epilog = chat_epilog,
        .opts = rows,
        .groups = t.groups,
    };
    return common_opts_parse(&spec, argc, argv);
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
            fputc('\n', stderr);
            cli_error(CHAT_PROG, "the context is full (%u tokens; use -c)",
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

/* Picks the template: --template, else the model's. */
static int chat_pick_template(const struct cli_session *s, const char *name,
                              enum router_chat_tmpl *tmpl)
{
    if (!name) {
        router_chat_for_model(executor_model_desc(s->model)->gguf, tmpl);
        return COMMON_OK;
    }
    if (router_chat_detect(name, strlen(name), tmpl) < 0) {
        cli_error(CHAT_PROG, "unknown template '%s'", name);
        return COMMON_EINVAL;
    }
    return COMMON_OK;
}

/* Prints what --dry-run shows: the template, the rendered prompt and its token ids. */
static void chat_print_dry_run(enum router_chat_tmpl tmpl, const struct router_text *text,
                               const struct router_tokens *toks)
{
    printf("template: %s\n%s\n[", router_chat_name(tmpl), text->ptr ? text->ptr : "");
    for (size_t i = 0; i < toks->n; i++)
        printf(i ? ", %d" : "%d", toks->ids[i]);
    printf("]\n");
}

/* Adds the next user turn to the history: -p, else a line of stdin. Returns 1 when one was added,
 * 0 at the end of input, or a negative common_err. */
static int chat_next_turn(struct chat_history *hist, const char *prompt, bool interactive,
                          struct router_text *line)
{
    if (prompt)
        return chat_add(hist, "user", prompt, strlen(prompt)) < 0 ? COMMON_ENOMEM : 1;
    do {
        if (interactive) {
            printf("> ");
            fflush(stdout);
        }
        if (!chat_read_line(line))
            return 0;
    } while (line->len == 0);
    return chat_add(hist, "user", line->ptr, line->len) < 0 ? COMMON_ENOMEM : 1;
}

int cli_cmd_chat(int argc, char **argv)
{
    struct chat_args a = {0};
    int              rc = chat_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);

    int                   status = 1;
    struct cli_session    s;
    struct chat_history   hist = {0};
    struct router_text    text = {0}, line = {0}, reply = {0};
    struct router_tokens  toks = {0}, in_ctx = {0};
    enum router_chat_tmpl tmpl;
    bool                  interactive = !a.prompt && isatty(STDIN_FILENO);
    if (cli_session_open(&s, &a.so, true) < 0)
        goto out;
    if (chat_pick_template(&s, a.tmpl_name, &tmpl) < 0)
        goto out;
    if (a.system && chat_add(&hist, "system", a.system, strlen(a.system)) < 0)
        goto out_nomem;
    for (;;) {
        if ((rc = chat_next_turn(&hist, a.prompt, interactive, &line)) < 0)
            goto out_nomem;
        if (rc == 0)
            break;
        if (chat_render(tmpl, s.vocab, &hist, &text, &toks) < 0)
            goto out_nomem;
        if (a.dry_run) {
            chat_print_dry_run(tmpl, &text, &toks);
            break;
        }
        router_text_clear(&reply);
        if (chat_reply(&s, &toks, &in_ctx, a.so.n_predict, &reply) < 0)
            goto out;
        if (chat_add(&hist, "assistant", reply.ptr ? reply.ptr : "", reply.len) < 0)
            goto out_nomem;
        if (a.prompt)
            break;
    }
    status = 0;
    goto out;
out_nomem:
    cli_error(CHAT_PROG, "out of memory");
out:
    router_tokens_fini(&in_ctx);
    router_tokens_fini(&toks);
    router_text_fini(&reply);
    router_text_fini(&text);
    router_text_fini(&line);
    chat_history_fini(&hist);
    if (cli_session_close(&s) < 0)
        status = 1; /* the trace (--trace-out) was not written */
    return status;
}
