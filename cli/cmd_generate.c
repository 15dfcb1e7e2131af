/* cli/cmd_generate.c - `sluice generate`: a prompt sent to a running
 * router, text streamed back. */
#include "cli.h"

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

static void generate_usage(FILE *f)
{
    fprintf(f, "usage: sluice generate [--socket PATH | --run-dir DIR] -p PROMPT "
               "[options]\n\n"
               "Sends the prompt to a running sluice-router and prints the generated "
               "text as it\n"
               "comes. The same prompt, options and seed give the same tokens as "
               "`sluice run`.\n\n"
               "  --socket PATH        the router's socket (or an ipc:// / tcp:// url)\n"
               "  --run-dir DIR        run directory: its router.sock       "
               "[$SLUICE_RUN_DIR]\n"
               "  -p, --prompt TEXT    prompt (BOS added)\n"
               "  -n, --n-predict N    tokens to generate; 0 = until EOS or a full "
               "context [128]\n"
               "  --temp X             temperature; 0 = greedy (argmax)     [0.8]\n"
               "  --top-k K            keep the K most likely tokens; 0 = off [40]\n"
               "  --top-p P            nucleus sampling; 1 = off            [0.95]\n"
               "  --min-p P            drop tokens below P * max prob; 0 = off [0.05]\n"
               "  --repeat-penalty X   penalise repeats of the last 64 tokens; 1 = off "
               "[1]\n"
               "  --seed S             sampling seed; 0 = from the clock    [0]\n"
               "  --stop S             stop before this text (up to 8 times)\n"
               "  --chat               send the prompt as a user message rendered with "
               "the\n"
               "                       model's chat template\n"
               "  --system TEXT        with --chat: a system message first\n"
               "  --no-stream          print the text once, when it is complete\n"
               "  --special            parse special-token text (<|im_start|>...) in "
               "the prompt\n"
               "  -h, --help           this text\n\n"
               "Stats go to stderr. Ctrl-C cancels the request (exit 130 once the "
               "router confirms;\n"
               "a second Ctrl-C exits at once). Exit 1 when the router is not running "
               "or refuses\n"
               "the request (the reason is printed), 2 on bad options.\n");
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
    struct sluice_generate_opts o;
    const char                 *socket_path = NULL, *run_dir = getenv("SLUICE_RUN_DIR");
    const char                 *system_msg = NULL;
    const char                 *stops[GENERATE_MAX_STOPS];
    bool                        chat = false;
    uint32_t                    u = 0;
    sluice_generate_opts_init(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            generate_usage(stdout);
            return 0;
        }
        if (strcmp(a, "--chat") == 0) {
            chat = true;
            continue;
        }
        if (strcmp(a, "--no-stream") == 0) {
            o.no_stream = true;
            continue;
        }
        if (strcmp(a, "--special") == 0) {
            o.special = true;
            continue;
        }
        if (a[0] != '-') {
            fprintf(stderr, "error: unexpected argument '%s'\n", a);
            return 2;
        }
        const char *v = cli_next_arg(argc, argv, &i);
        bool        ok = v != NULL;
        if (!ok)
            return 2;
        if (strcmp(a, "--socket") == 0)
            socket_path = v;
        else if (strcmp(a, "--run-dir") == 0)
            run_dir = v;
        else if (strcmp(a, "-p") == 0 || strcmp(a, "--prompt") == 0)
            o.prompt = v;
        else if (strcmp(a, "--system") == 0)
            system_msg = v;
        else if (strcmp(a, "-n") == 0 || strcmp(a, "--n-predict") == 0)
            ok = cli_parse_u32(a, v, 0, 1u << 24, &o.max_tokens);
        else if (strcmp(a, "--temp") == 0)
            ok = cli_parse_f32(a, v, &o.temp);
        else if (strcmp(a, "--top-k") == 0) {
            ok = cli_parse_u32(a, v, 0, 1u << 24, &u);
            o.top_k = (int32_t)u;
        } else if (strcmp(a, "--top-p") == 0)
            ok = cli_parse_f32(a, v, &o.top_p);
        else if (strcmp(a, "--min-p") == 0)
            ok = cli_parse_f32(a, v, &o.min_p);
        else if (strcmp(a, "--repeat-penalty") == 0)
            ok = cli_parse_f32(a, v, &o.repeat_penalty);
        else if (strcmp(a, "--seed") == 0 || strcmp(a, "-s") == 0)
            ok = cli_parse_u64(a, v, &o.seed);
        else if (strcmp(a, "--stop") == 0) {
            if (o.n_stops == GENERATE_MAX_STOPS || !*v || strlen(v) >= 64) {
                fprintf(stderr, "error: --stop takes 1..63 bytes, at most %d times\n",
                        GENERATE_MAX_STOPS);
                return 2;
            }
            stops[o.n_stops++] = v;
        } else {
            fprintf(stderr, "error: unknown option '%s'\n", a);
            generate_usage(stderr);
            return 2;
        }
        if (!ok)
            return 2;
    }
    if (!o.prompt) {
        fprintf(stderr, "error: no prompt (-p TEXT); see sluice generate --help\n");
        return 2;
    }
    if (system_msg && !chat) {
        fprintf(stderr, "error: --system needs --chat\n");
        return 2;
    }
    char path[4096];
    if (!socket_path) {
        if (!run_dir || !*run_dir) {
            fprintf(stderr, "error: no router: give --socket PATH or --run-dir DIR (or set "
                            "SLUICE_RUN_DIR)\n");
            return 2;
        }
        snprintf(path, sizeof(path), "%s/router.sock", run_dir);
        socket_path = path;
    }
    o.stops = stops;
    struct sluice_chat_message msgs[2];
    if (chat) {
        size_t n = 0;
        if (system_msg)
            msgs[n++] = (struct sluice_chat_message){.role = "system", .content = system_msg};
        msgs[n++] = (struct sluice_chat_message){.role = "user", .content = o.prompt};
        o.prompt = NULL;
        o.messages = msgs;
        o.n_messages = n;
    }

    struct sluice_client *c = NULL;
    int                   rc = sluice_client_connect(socket_path, &c);
    if (rc < 0) {
        fprintf(stderr, "error: %s\n", sluice_last_error());
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
        fprintf(stderr, "error: %s\n", sluice_last_error());
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
            fprintf(stderr, "error: %s (%s)\n", res.error, sluice_strerror(res.error_code));
            status = 1;
        } else if (res.reason == SLUICE_STOP_CANCEL) {
            status = 130;
        }
    }
    sluice_client_close(c);
    return status;
}
