/* cli/cmd_tokenize.c - `sluice tokenize`: text to token ids, like llama-tokenize. */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "router.h"

static void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: sluice tokenize -m MODEL [options] [TEXT]\n"
               "Prints the tokens of TEXT as the model's tokenizer makes them.\n"
               "  -m, --model PATH  GGUF model (only its tokenizer.* metadata is read)\n"
               "  -f, --file PATH   read the text from a file instead of TEXT\n"
               "  --ids             print only the ids, as [id, id, ...]\n"
               "  --no-bos          do not add BOS / EOS even if the model asks for them\n"
               "  --special         recognise control-token text such as <|im_start|>\n"
               "  --bench           encode the text repeated to ~1 MiB and print MB/s\n"
               "  -h, --help        this help\n");
}

/* Prints bytes between quotes as llama-tokenize does (raw, the terminal renders UTF-8). */
static void print_piece(const char *p, size_t n)
{
    fputc('\'', stdout);
    fwrite(p, 1, n, stdout);
    fputc('\'', stdout);
}

static int tokenize_bench(const struct router_vocab *v, const char *text, size_t len,
                          const struct router_tokenize_opts *o)
{
    const size_t target = (size_t)1 << 20;
    if (len == 0) {
        fprintf(stderr, "sluice tokenize: --bench needs a non-empty text\n");
        return 1;
    }
    struct router_text big = {0};
    while (big.len < target) {
        if (router_text_append(&big, text, len) < 0) {
            fprintf(stderr, "sluice tokenize: out of memory\n");
            router_text_fini(&big);
            return 1;
        }
    }
    struct router_tokens toks = {0};
    double               best = 1e30;
    for (int run = 0; run < 3; run++) {
        router_tokens_clear(&toks);
        const uint64_t t0 = common_now_ns();
        if (router_tokenize(v, big.ptr, big.len, o, &toks) < 0) {
            fprintf(stderr, "sluice tokenize: out of memory\n");
            break;
        }
        const double s = (double)(common_now_ns() - t0) / 1e9;
        if (s < best)
            best = s;
    }
    printf("bench: %zu bytes -> %zu tokens in %.1f ms (best of 3): %.2f MB/s\n", big.len, toks.n,
           best * 1e3, (double)big.len / 1e6 / best);
    router_tokens_fini(&toks);
    router_text_fini(&big);
    return 0;
}

int cli_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *file = NULL, *text = NULL;
    bool        ids_only = false, no_bos = false, special = false, bench = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            tokenize_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            if (!(model = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            if (!(file = cli_next_arg(argc, argv, &i)))
                return 2;
        } else if (!strcmp(a, "--ids")) {
            ids_only = true;
        } else if (!strcmp(a, "--no-bos")) {
            no_bos = true;
        } else if (!strcmp(a, "--special")) {
            special = true;
        } else if (!strcmp(a, "--bench")) {
            bench = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "sluice tokenize: unknown option %s\n", a);
            tokenize_usage(stderr);
            return 2;
        } else if (!text) {
            text = a;
        } else {
            fprintf(stderr, "sluice tokenize: one TEXT only (quote it)\n");
            return 2;
        }
    }
    if (!model || (!text && !file) || (text && file)) {
        fprintf(stderr, "sluice tokenize: need -m MODEL and either TEXT or -f FILE\n");
        tokenize_usage(stderr);
        return 2;
    }

    int                  rc = 1;
    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    struct router_vocab *v = NULL;
    char                *buf = NULL;
    size_t               len = 0;
    if (file) {
        FILE *f = fopen(file, "rb");
        if (!f) {
            fprintf(stderr, "sluice tokenize: cannot open %s\n", file);
            return 1;
        }
        struct router_text t = {0};
        char               chunk[65536];
        size_t             n;
        while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0) {
            if (router_text_append(&t, chunk, n) < 0)
                break;
        }
        fclose(f);
        buf = t.ptr ? t.ptr : calloc(1, 1);
        len = t.len;
    } else {
        len = strlen(text);
    }
    if (common_gguf_open(model, NULL, &g, &e) < 0 || router_vocab_load(g, &v, &e) < 0) {
        fprintf(stderr, "sluice tokenize: %s: %s\n", model, e.text);
        goto out;
    }
    const char                       *in = file ? buf : text;
    const struct router_tokenize_opts o = {.add_special = !no_bos, .parse_special = special};
    if (bench) {
        rc = tokenize_bench(v, in, len, &o);
        goto out;
    }
    struct router_tokens toks = {0};
    if (router_tokenize(v, in, len, &o, &toks) < 0) {
        fprintf(stderr, "sluice tokenize: out of memory\n");
        goto out;
    }
    if (ids_only) {
        fputc('[', stdout);
        for (size_t i = 0; i < toks.n; i++)
            printf(i ? ", %d" : "%d", toks.ids[i]);
        fputs("]\n", stdout);
    } else {
        const struct router_detok_opts dopts = {.render_special = true};
        for (size_t i = 0; i < toks.n; i++) {
            const char *p;
            size_t      n;
            router_token_piece(v, toks.ids[i], &dopts, &p, &n);
            printf("%6d -> ", toks.ids[i]);
            print_piece(p, n);
            fputc('\n', stdout);
        }
    }
    router_tokens_fini(&toks);
    rc = 0;
out:
    free(buf);
    router_vocab_destroy(v);
    common_gguf_close(g);
    return rc;
}
