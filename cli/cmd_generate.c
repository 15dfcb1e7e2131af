/* cli/cmd_generate.c - `sluice generate`: a prompt sent to a running
 * router, text streamed back. */
#include "cli.h"

#include <assert.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sluice_client.h"

#define GENERATE_MAX_STOPS 8

static struct sluice_client *volatile generate_client;
static volatile sig_atomic_t generate_interrupts;

static void generate_on_sigint(int sig)
{
    (void)sig;
    if (++generate_interrupts > 1)
        _exit(130); /* a second Ctrl-C: do not wait for the router */
    if (generate_client)
        sluice_client_request_cancel(generate_client);
}

#define GENERATE_PROG "sluice generate"

/* What the command line asked for. */
struct generate_args {
    struct sluice_generate_opts o;           /* the request; strings borrowed from argv */
    const char                 *socket_path; /* --socket: borrowed from argv */
    const char                 *run_dir;     /* --run-dir, else $SLUICE_RUN_DIR: borrowed */
    const char                 *system_msg;  /* --system: borrowed from argv */
    const char                 *stops_v[GENERATE_MAX_STOPS]; /* --stop: borrowed from argv */
    struct common_opt_strs      stops;                       /* --stop: into stops_v */
    bool                        chat;                        /* --chat */
    uint32_t                    router_wait_s;               /* --router-wait */
};

/* The sampling rows, as `sluice run` names them. */
static void generate_sampling_rows(struct common_opt *rows, size_t cap,
                                   struct sluice_generate_opts *o)
{
    const struct common_opt r[] = {
        {.name = "temp",
         .type = COMMON_OPT_F32,
         .target = &o->temp,
         .help = "temperature; 0 = greedy (argmax)",
         .def = "0.8"},
        {.name = "top-k",
         .type = COMMON_OPT_I32,
         .target = &o->top_k,
         .max = 1u << 24,
         .metavar = "K",
         .help = "keep the K most likely tokens; 0 = off",
         .def = "40"},
        {.name = "top-p",
         .type = COMMON_OPT_F32,
         .target = &o->top_p,
         .metavar = "P",
         .help = "nucleus sampling; 1 = off",
         .def = "0.95"},
        {.name = "min-p",
         .type = COMMON_OPT_F32,
         .target = &o->min_p,
         .max = 1,
         .metavar = "P",
         .help = "drop tokens below P * max prob; 0 = off",
         .def = "0.05"},
        {.name = "repeat-penalty",
         .type = COMMON_OPT_F32,
         .target = &o->repeat_penalty,
         .max = 100,
         .help = "penalise repeats of the last 64 tokens; 1 = off",
         .def = "1"},
        {.name = "seed",
         .short_name = "s",
         .type = COMMON_OPT_U64,
         .target = &o->seed,
         .help = "sampling seed; 0 = from the clock",
         .def = "0"},
        {0},
    };
    assert(sizeof(r) <= cap * sizeof(*rows));
    (void)cap;
    memcpy(rows, r, sizeof(r));
}

/* Parses the options; returns 0, or the result to pass to common_opts_exit_status(). */
static int generate_parse(int argc, char **argv, struct generate_args *a)
{
    struct common_opt sampling[7];
    sluice_generate_opts_init(&a->o);
    a->run_dir = getenv("SLUICE_RUN_DIR");
    a->stops = (struct common_opt_strs){.v = a->stops_v, .cap = GENERATE_MAX_STOPS};
    generate_sampling_rows(sampling, sizeof(sampling) / sizeof(sampling[0]), &a->o);
    const struct common_opt rows[] = {
        {.name = "socket",
         .type = COMMON_OPT_STR,
         .target = &a->socket_path,
         .metavar = "PATH",
         .help = "the router's socket (or an ipc:// / tcp:// url)"},
        {.name = "run-dir",
         .type = COMMON_OPT_STR,
         .target = &a->run_dir,
         .metavar = "DIR",
         .help = "run directory: its router.sock",
         .def = "$SLUICE_RUN_DIR"},
        {.name = "prompt",
         .short_name = "p",
         .type = COMMON_OPT_STR,
         .target = &a->o.prompt,
         .help = "prompt (BOS added)",
         .required = true},
        {.name = "n-predict",
         .short_name = "n",
         .type = COMMON_OPT_U32,
         .target = &a->o.max_tokens,
         .max = 1u << 24,
         .help = "tokens to generate; 0 = until EOS or a full context",
         .def = "128"},
        {.name = "stop",
         .type = COMMON_OPT_STRS,
         .target = &a->stops,
         .metavar = "TEXT",
         .help = "stop before this text (1..63 bytes; up to 8 times)"},
        {.name = "chat",
         .type = COMMON_OPT_SWITCH,
         .target = &a->chat,
         .help = "send the prompt as a user message rendered with the model's chat template"},
        {.name = "system",
         .type = COMMON_OPT_STR,
         .target = &a->system_msg,
         .help = "with --chat: a system message first"},
        {.name = "no-stream",
         .type = COMMON_OPT_SWITCH,
         .target = &a->o.no_stream,
         .help = "print the text once, when it is complete"},
        {.name = "special",
         .type = COMMON_OPT_SWITCH,
         .target = &a->o.special,
         .help = "parse special-token text (<|im_start|>...) in the prompt"},
        {.name = "router-wait",
         .type = COMMON_OPT_U32,
         .target = &a->router_wait_s,
         .metavar = "SEC",
         .min = 1,
         .max = 86400,
         .help = "a router that dies mid-request: wait this long for a restarted one, which "
                 "resumes the request, before failing",
         .def = "60"},
        {0},
    };
    const struct common_opt_group groups[] = {{.title = "Sampling options", .opts = sampling}, {0}};
    const struct common_opts_spec spec = {
        .prog = GENERATE_PROG,
        .usage = GENERATE_PROG " [--socket PATH | --run-dir DIR] -p PROMPT [options]",
        .description = "Sends the prompt to a running sluice-router and prints the generated text "
                       "as it comes. The same prompt, options and seed give the same tokens as "
                       "`sluice run`.",
        .epilog = "Stats go to stderr. Ctrl-C cancels the request (exit 130 once the router "
                  "confirms; a second Ctrl-C exits at once). Exit 1 when the router is not "
                  "running or refuses the request (the reason is printed), 2 on bad options.",
        .opts = rows,
        .groups = groups,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return rc;
    for (uint32_t i = 0; i < a->stops.n; i++)
        if (!a->stops_v[i][0] || strlen(a->stops_v[i]) >= 64)
            return common_opts_error(&spec, "--stop takes 1..63 bytes, got '%s'", a->stops_v[i]);
    if (a->system_msg && !a->chat)
        return common_opts_error(&spec, "--system needs --chat");
    if (!a->socket_path && (!a->run_dir || !*a->run_dir))
        return common_opts_error(&spec, "no router: give --socket PATH or --run-dir DIR (or set "
                                        "SLUICE_RUN_DIR)");
    a->o.stops = a->stops_v;
    a->o.n_stops = a->stops.n;
    a->o.resume_wait_s = a->router_wait_s;
    return 0;
}

static int generate_print(void *arg, const char *text, size_t len, const int32_t *tokens,
                          size_t n_tokens)
{
    (void)arg;
    (void)tokens;
    (void)n_tokens;
    if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    return 0;
}

static const char *generate_reason_name(enum sluice_stop r)
{
    switch (r) {
    case SLUICE_STOP_EOS:
        return "eos";
    case SLUICE_STOP_LENGTH:
        return "length";
    case SLUICE_STOP_STRING:
        return "stop string";
    case SLUICE_STOP_CONTEXT:
        return "context full";
    case SLUICE_STOP_CANCEL:
        return "cancelled";
    case SLUICE_STOP_ERROR:
        return "error";
    case SLUICE_STOP_NONE:
        break;
    }
    return "?";
}

int cli_cmd_generate(int argc, char **argv)
{
    struct generate_args a = {0};
    int                  rc = generate_parse(argc, argv, &a);
    if (rc != 0)
        return common_opts_exit_status(rc);
    struct sluice_generate_opts o = a.o;
    const char                 *socket_path = a.socket_path;
    char                        path[4096];
    if (!socket_path) {
        snprintf(path, sizeof(path), "%s/router.sock", a.run_dir);
        socket_path = path;
    }
    struct sluice_chat_message msgs[2];
    if (a.chat) {
        size_t n = 0;
        if (a.system_msg)
            msgs[n++] = (struct sluice_chat_message){.role = "system", .content = a.system_msg};
        msgs[n++] = (struct sluice_chat_message){.role = "user", .content = o.prompt};
        o.prompt = NULL;
        o.messages = msgs;
        o.n_messages = n;
    }

    struct sluice_client *c = NULL;
    if ((rc = sluice_client_connect(socket_path, &c)) < 0) {
        cli_error(GENERATE_PROG, "%s", sluice_last_error());
        return 1;
    }
    generate_client = c;
    struct sigaction sa = {.sa_handler = generate_on_sigint}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    struct sluice_generate_result res;
    rc = sluice_client_generate(c, &o, generate_print, NULL, &res);
    sigaction(SIGINT, &old, NULL);
    generate_client = NULL;
    int status = 0;
    if (rc < 0) {
        fprintf(stdout, "\n");
        fflush(stdout);
        cli_error(GENERATE_PROG, "%s", sluice_last_error());
        status = 1;
    } else {
        printf("\n");
        fflush(stdout);
        double tps = res.n_generated > 1 && res.decode_ms > 0
                         ? (double)(res.n_generated - 1) / (res.decode_ms / 1e3)
                         : 0.0;
        fprintf(stderr,
                "generate: prompt %u tokens in %.1f ms; generated %u tokens, "
                "decode %.2f tok/s; "
                "queued %.1f ms; stop: %s\n",
                res.n_prompt, res.prompt_ms, res.n_generated, tps, res.queue_ms,
                generate_reason_name(res.reason));
        if (res.reason == SLUICE_STOP_ERROR) {
            cli_error(GENERATE_PROG, "%s (%s)", res.error, sluice_strerror(res.error_code));
            status = 1;
        } else if (res.reason == SLUICE_STOP_CANCEL) {
            status = 130;
        }
    }
    sluice_client_close(c);
    return status;
}
