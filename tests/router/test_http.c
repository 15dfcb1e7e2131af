/* tests/router/test_http.c - the router's OpenAI-compatible HTTP API against the real daemons
 * (deploy/sluicectl up, sluice-router --http), driven with curl: health, models, completions
 * equal to `sluice run`, streamed chat equal to the whole answer, errors, body limit, API key. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fixture.h"
#include "tjson.h"

#define BIN       SLUICE_BINARY_DIR "/bin"
#define SLUICECTL SLUICE_SOURCE_DIR "/deploy/sluicectl"
#define KEY       "sk-test-0123456789"
#define MAX_BODY  65536

/* The test's temporary directory and its run directory: the fini stops the daemons even when an
 * assertion failed half-way. */
static char *t_dir;
static char  t_run[1024];
static char  t_model[1024];
static char  t_url[256];

/* Runs a shell command (stderr joined to stdout); returns the output (malloc'd) and status. */
static char *sh(const char *cmd, int *status)
{
    size_t n = strlen(cmd) + 16;
    char  *full = malloc(n);
    cr_assert_not_null(full);
    snprintf(full, n, "(%s) 2>&1", cmd);
    char *out = fixture_run(full, status);
    free(full);
    cr_assert_not_null(out, "could not run %s", cmd);
    return out;
}

static void skip_without_tools(void)
{
    const char *bins[] = {BIN "/sluice", BIN "/sluice-fetcher", BIN "/sluice-executor",
                          BIN "/sluice-router"};
    for (size_t i = 0; i < sizeof(bins) / sizeof(bins[0]); i++)
        if (access(bins[i], X_OK) != 0)
            cr_skip_test("%s is not built: skipped", bins[i]);
    int   st;
    char *out = fixture_run("curl --version >/dev/null 2>&1", &st);
    free(out);
    if (st != 0)
        cr_skip_test("curl is not installed: skipped");
}

/* The tiny MoE fixture (q8_0, else f32); without fixtures a MoE from `sluice mkmodel`. */
static void pick_model(void)
{
    const char *rels[] = {"moe-tiny/moe-tiny-q8_0.gguf", "moe-tiny/moe-tiny-f32.gguf"};
    for (size_t i = 0; i < sizeof(rels) / sizeof(rels[0]); i++) {
        char *p = fixture_path(rels[i]);
        if (p) {
            snprintf(t_model, sizeof(t_model), "%s", p);
            free(p);
            return;
        }
    }
    cr_log_info("moe-tiny fixtures absent: serving a `sluice mkmodel --preset tiny` MoE of 4 "
                "experts");
    char cmd[4096];
    int  st;
    snprintf(t_model, sizeof(t_model), "%s/tiny.gguf", t_dir);
    /* A MoE, so that a fetcher serves it as the fixture's (the metrics count its experts). */
    snprintf(cmd, sizeof(cmd),
             "%s/sluice mkmodel -q --preset tiny --n-expert 4 --n-expert-used 2 -o '%s'", BIN,
             t_model);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0, "mkmodel: %s", out);
    free(out);
}

/* Brings up the daemons with `router_args` and reads the HTTP url from RUN_DIR/router.http. */
static void up(const char *router_args)
{
    skip_without_tools();
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    pick_model();
    snprintf(t_run, sizeof(t_run), "%s/run", t_dir);
    char cmd[8192];
    int  st;
    snprintf(cmd, sizeof(cmd),
             "%s up --model '%s' --run-dir '%s' --fetchers 1 --bin '%s' --start-timeout 120 "
             "--router-args '--http 127.0.0.1:0 --http-max-body %d %s'",
             SLUICECTL, t_model, t_run, BIN, MAX_BODY, router_args);
    char *out = sh(cmd, &st);
    cr_assert_eq(st, 0, "sluicectl up: %s", out);
    free(out);
    char path[1100];
    snprintf(path, sizeof(path), "%s/router.http", t_run);
    char *url = fixture_read_all(path, NULL);
    cr_assert_not_null(url, "the router wrote no %s", path);
    url[strcspn(url, "\n")] = '\0';
    cr_assert(strncmp(url, "http://127.0.0.1:", 17) == 0, "url '%s'", url);
    snprintf(t_url, sizeof(t_url), "%s", url);
    free(url);
}

static void down(void)
{
    if (!t_dir)
        return;
    if (t_run[0]) {
        char cmd[2048];
        snprintf(cmd, sizeof(cmd), "%s down --run-dir '%s' >/dev/null 2>&1", SLUICECTL, t_run);
        if (system(cmd) != 0)
            fprintf(stderr, "test_http: sluicectl down in %s failed\n", t_run);
    }
    fixture_rmtree(t_dir);
    free(t_dir);
    t_dir = NULL;
    t_run[0] = '\0';
}

/* One HTTP answer: status and body. */
struct answer {
    int   status;
    char *body; /* owned */
};

/* Sends `method path` with `body` (NULL = none; "@FILE" = that file) and the extra curl
 * arguments `extra`; returns the status and the body. */
static struct answer http(const char *method, const char *path, const char *body, const char *extra)
{
    char data[1300] = "", out[1100], cmd[8192];
    snprintf(out, sizeof(out), "%s/answer", t_dir);
    if (body && body[0] == '@') {
        snprintf(data, sizeof(data), "--data-binary '%s'", body);
    } else if (body) {
        char  file[1100];
        FILE *f;
        snprintf(file, sizeof(file), "%s/body.json", t_dir);
        cr_assert_not_null(f = fopen(file, "w"));
        cr_assert_eq(fwrite(body, 1, strlen(body), f), strlen(body));
        cr_assert_eq(fclose(f), 0);
        snprintf(data, sizeof(data), "-H 'Content-Type: application/json' --data-binary '@%s'",
                 file);
    }
    snprintf(cmd, sizeof(cmd), "curl -sS -N -X %s -o '%s' -w '%%{http_code}' %s %s '%s%s'", method,
             out, data, extra ? extra : "", t_url, path);
    int   st;
    char *code = sh(cmd, &st);
    cr_assert_eq(st, 0, "curl failed: %s", code);
    struct answer a = {.status = atoi(code), .body = fixture_read_all(out, NULL)};
    free(code);
    cr_assert_not_null(a.body, "no body from %s %s", method, path);
    return a;
}

/* Asserts an OpenAI error object with `type` (and `code` when not NULL). */
static void assert_error(const struct answer *a, int status, const char *code)
{
    cr_assert_eq(a->status, status, "status %d, body %s", a->status, a->body);
    struct tjson *j = tjson_parse(a->body);
    cr_assert_not_null(j, "error body is not JSON: %s", a->body);
    const struct tjson *e = tjson_get(j, "error");
    cr_assert_not_null(e, "no error object: %s", a->body);
    cr_assert_eq(tjson_get(e, "message")->kind, TJSON_STR);
    cr_assert_str_eq(tjson_get(e, "type")->str, "invalid_request_error");
    cr_assert_not_null(tjson_get(e, "param"));
    const struct tjson *c = tjson_get(e, "code");
    cr_assert_not_null(c);
    if (code)
        cr_assert(c->kind == TJSON_STR && strcmp(c->str, code) == 0, "code in %s", a->body);
    tjson_free(j);
}

/* The text of choices[0] (`text`, or message.content for chat) of a whole answer (malloc'd);
 * its finish_reason must be `finish` ("stop" or "length" when NULL). */
static char *choice_text(const struct answer *a, bool chat, const char *finish)
{
    cr_assert_eq(a->status, 200, "status %d: %s", a->status, a->body);
    struct tjson *j = tjson_parse(a->body);
    cr_assert_not_null(j, "not JSON: %s", a->body);
    cr_assert_str_eq(tjson_get(j, "object")->str, chat ? "chat.completion" : "text_completion");
    const struct tjson *c = tjson_at(tjson_get(j, "choices"), 0);
    cr_assert_not_null(c);
    const char *fr = tjson_get(c, "finish_reason")->str;
    cr_assert(fr && (finish ? strcmp(fr, finish) == 0
                            : strcmp(fr, "stop") == 0 || strcmp(fr, "length") == 0),
              "finish_reason %s", fr ? fr : "null");
    const struct tjson *t =
        chat ? tjson_get(tjson_get(c, "message"), "content") : tjson_get(c, "text");
    cr_assert(t && t->kind == TJSON_STR, "no text in %s", a->body);
    if (chat)
        cr_assert_str_eq(tjson_get(tjson_get(c, "message"), "role")->str, "assistant");
    const struct tjson *u = tjson_get(j, "usage");
    cr_assert_not_null(u, "no usage");
    cr_assert_eq(tjson_get(u, "total_tokens")->num,
                 tjson_get(u, "prompt_tokens")->num + tjson_get(u, "completion_tokens")->num);
    char *text = strdup(t->str);
    tjson_free(j);
    return text;
}

/* ---- tests -------------------------------------------------------------------------------- */

Test(router_http, health_and_models_answer, .timeout = 300, .fini = down)
{
    up("");
    struct answer a = http("GET", "/health", NULL, NULL);
    cr_assert_eq(a.status, 200);
    struct tjson *j = tjson_parse(a.body);
    cr_assert_str_eq(tjson_get(j, "status")->str, "ok");
    tjson_free(j);
    free(a.body);

    a = http("GET", "/v1/models", NULL, NULL);
    cr_assert_eq(a.status, 200, "%s", a.body);
    j = tjson_parse(a.body);
    cr_assert_str_eq(tjson_get(j, "object")->str, "list");
    const struct tjson *m = tjson_at(tjson_get(j, "data"), 0);
    cr_assert_not_null(m, "%s", a.body);
    const char *base = strrchr(t_model, '/') + 1;
    cr_assert_eq(strncmp(tjson_get(m, "id")->str, base, strlen(base) - 5), 0, "id '%s' of '%s'",
                 tjson_get(m, "id")->str, base);
    cr_assert_str_eq(tjson_get(m, "object")->str, "model");
    tjson_free(j);
    free(a.body);
}

Test(router_http, greedy_completion_equals_sluice_run, .timeout = 300, .fini = down)
{
    up("");
    char cmd[4096];
    int  st;
    snprintf(cmd, sizeof(cmd), "%s/sluice run -m '%s' -p 'hello world' -n 12 --temp 0 2>/dev/null",
             BIN, t_model);
    char *single = fixture_run(cmd, &st);
    cr_assert(single && st == 0, "sluice run failed");
    size_t n = strlen(single);
    if (n && single[n - 1] == '\n')
        single[n - 1] = '\0'; /* run ends its text with a newline */

    struct answer a = http(
        "POST", "/v1/completions",
        "{\"prompt\":\"hello world\",\"max_tokens\":12,\"temperature\":0,\"stream\":false}", NULL);
    char *text = choice_text(&a, false, NULL);
    cr_assert_str_eq(text, single, "HTTP '%s' vs sluice run '%s'", text, single);
    free(text);
    free(a.body);
    free(single);
}

Test(router_http, streamed_chat_equals_whole_answer, .timeout = 300, .fini = down)
{
    up("");
    const char *msgs = "\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                       "{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                       "\"max_tokens\":10,\"temperature\":0";
    char        body[1024];
    snprintf(body, sizeof(body), "{%s}", msgs);
    struct answer whole = http("POST", "/v1/chat/completions", body, NULL);
    char         *content = choice_text(&whole, true, NULL);
    free(whole.body);

    snprintf(body, sizeof(body), "{%s,\"stream\":true}", msgs);
    struct answer s = http("POST", "/v1/chat/completions", body, NULL);
    cr_assert_eq(s.status, 200, "%s", s.body);
    /* Events: "data: {chunk}\n\n" ..., then "data: [DONE]\n\n". */
    char  *joined = calloc(1, strlen(s.body) + 1);
    bool   done = false, finished = false, usage = false;
    size_t n_chunks = 0;
    char  *save = NULL;
    cr_assert_not_null(joined);
    for (char *ev = strtok_r(s.body, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
        cr_assert(strncmp(ev, "data: ", 6) == 0, "not an event line: '%s'", ev);
        cr_assert(!done, "data after [DONE]");
        if (strcmp(ev + 6, "[DONE]") == 0) {
            done = true;
            continue;
        }
        struct tjson *j = tjson_parse(ev + 6);
        cr_assert_not_null(j, "chunk is not JSON: %s", ev);
        cr_assert_str_eq(tjson_get(j, "object")->str, "chat.completion.chunk");
        const struct tjson *c = tjson_at(tjson_get(j, "choices"), 0);
        const struct tjson *t = tjson_get(tjson_get(c, "delta"), "content");
        if (t) {
            cr_assert_eq(t->kind, TJSON_STR);
            strcat(joined, t->str);
        }
        const struct tjson *f = tjson_get(c, "finish_reason");
        if (f && f->kind == TJSON_STR) {
            cr_assert(strcmp(f->str, "length") == 0 || strcmp(f->str, "stop") == 0);
            finished = true;
            usage = tjson_get(j, "usage") != NULL;
        }
        n_chunks++;
        tjson_free(j);
    }
    cr_assert(done, "no [DONE]");
    cr_assert(finished && usage, "no final chunk with finish_reason and usage");
    cr_assert_geq(n_chunks, 2);
    cr_assert_str_eq(joined, content, "streamed '%s' vs whole '%s'", joined, content);
    free(joined);
    free(content);
    free(s.body);
}

Test(router_http, bad_requests_get_error_objects_and_server_goes_on, .timeout = 300, .fini = down)
{
    up("");
    struct answer a = http("POST", "/v1/completions", "{\"prompt\": \"hi\", ", NULL);
    assert_error(&a, 400, NULL);
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\": 42}", NULL);
    assert_error(&a, 400, NULL);
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", NULL);
    assert_error(&a, 400, NULL);
    free(a.body);
    a = http("POST", "/v1/chat/completions", "{\"prompt\": \"hi\"}", NULL);
    assert_error(&a, 400, NULL); /* no messages */
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\": \"hi\", \"model\": \"no-such-model\"}", NULL);
    assert_error(&a, 404, "model_not_found");
    free(a.body);
    a = http("GET", "/v1/nothing", NULL, NULL);
    assert_error(&a, 404, NULL);
    free(a.body);
    a = http("GET", "/v1/completions", NULL, NULL);
    assert_error(&a, 405, NULL);
    free(a.body);

    /* Still serving. */
    a = http("GET", "/health", NULL, NULL);
    cr_assert_eq(a.status, 200, "%s", a.body);
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\":\"hello\",\"max_tokens\":3,\"temperature\":0}",
             NULL);
    free(choice_text(&a, false, NULL));
    free(a.body);
}

Test(router_http, oversized_body_gets_413, .timeout = 300, .fini = down)
{
    up("");
    char  path[1100];
    FILE *f;
    snprintf(path, sizeof(path), "%s/big.json", t_dir);
    cr_assert_not_null(f = fopen(path, "w"));
    fputs("{\"prompt\":\"", f);
    for (int i = 0; i < MAX_BODY; i++)
        fputc('a', f);
    fputs("\"}", f);
    cr_assert_eq(fclose(f), 0);
    char arg[1200];
    snprintf(arg, sizeof(arg), "@%s", path);
    struct answer a = http("POST", "/v1/completions", arg, NULL);
    assert_error(&a, 413, NULL);
    free(a.body);
    a = http("GET", "/health", NULL, NULL);
    cr_assert_eq(a.status, 200, "%s", a.body);
    free(a.body);
}

Test(router_http, api_key_is_required_when_set, .timeout = 300, .fini = down)
{
    up("--api-key " KEY);
    struct answer a = http("GET", "/v1/models", NULL, NULL);
    assert_error(&a, 401, "invalid_api_key");
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2}",
             "-H 'Authorization: Bearer sk-wrong'");
    assert_error(&a, 401, "invalid_api_key");
    free(a.body);
    a = http("GET", "/v1/models", NULL, "-H 'Authorization: Bearer " KEY "'");
    cr_assert_eq(a.status, 200, "%s", a.body);
    free(a.body);
    a = http("POST", "/v1/completions", "{\"prompt\":\"hi\",\"max_tokens\":2,\"temperature\":0}",
             "-H 'Authorization: Bearer " KEY "'");
    free(choice_text(&a, false, NULL));
    free(a.body);
    a = http("GET", "/health", NULL, NULL); /* probes need no key */
    cr_assert_eq(a.status, 200, "%s", a.body);
    free(a.body);
}

/* The real `openai` client of the npm registry (deploy/setup.sh installs it in build-npm/):
 * models, a whole and a streamed greedy chat completion, a completion, an unknown model. Its
 * answers equal those curl gets. */
Test(router_http, openai_npm_client_agrees_with_curl, .timeout = 300, .fini = down)
{
    const char *mods = SLUICE_SOURCE_DIR "/build-npm/node_modules";
    int         st;
    char       *out = fixture_run("node --version >/dev/null 2>&1", &st);
    free(out);
    if (st != 0)
        cr_skip_test("node is not installed: skipped (deploy/setup.sh installs it)");
    if (access(SLUICE_SOURCE_DIR "/build-npm/node_modules/openai", R_OK) != 0)
        cr_skip_test("the npm package openai is not in build-npm/: skipped (run deploy/setup.sh)");
    up("");
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "SLUICE_URL='%s' NODE_PATH='%s' node '" SLUICE_SOURCE_DIR
             "/tests/router/openai_sdk.cjs' 2>&1",
             t_url, mods);
    out = fixture_run(cmd, &st);
    cr_assert(out && st == 0, "openai client: %s", out ? out : "(no output)");
    struct tjson *j = tjson_parse(out);
    cr_assert_not_null(j, "not JSON: %s", out);
    const char *whole = tjson_get(j, "whole")->str;
    cr_expect_str_eq(tjson_get(j, "streamed")->str, whole, "streamed vs whole");
    cr_expect_str_eq(tjson_get(j, "whole_finish")->str, "length");
    cr_expect_str_eq(tjson_get(j, "stream_finish")->str, "length");
    cr_expect_eq(tjson_get(tjson_get(j, "usage"), "completion_tokens")->num, 10.0);
    cr_expect_eq(tjson_get(tjson_get(j, "not_found"), "status")->num, 404.0);
    cr_expect_str_eq(tjson_get(tjson_get(j, "not_found"), "code")->str, "model_not_found");
    /* The same requests through curl. */
    struct answer a = http("POST", "/v1/chat/completions",
                           "{\"messages\":[{\"role\":\"system\",\"content\":\"You are terse.\"},"
                           "{\"role\":\"user\",\"content\":\"Tell me a story.\"}],"
                           "\"max_tokens\":10,\"temperature\":0}",
                           NULL);
    char         *content = choice_text(&a, true, NULL);
    cr_expect_str_eq(whole, content, "openai client '%s' vs curl '%s'", whole, content);
    free(content);
    free(a.body);
    a = http("POST", "/v1/completions",
             "{\"prompt\":\"hello world\",\"max_tokens\":8,\"temperature\":0}", NULL);
    char *text = choice_text(&a, false, NULL);
    cr_expect_str_eq(tjson_get(j, "completion")->str, text);
    free(text);
    free(a.body);
    tjson_free(j);
    free(out);
}

/* The value of the first sample of `metric` (its name and labels as written) in a Prometheus
 * text; NAN when absent. */
static double prom_value(const char *text, const char *metric)
{
    size_t      n = strlen(metric);
    const char *p = text;
    while ((p = strstr(p, metric)) != NULL) {
        if ((p == text || p[-1] == '\n') && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p += n;
    }
    return NAN;
}

/* GET /metrics: Prometheus text with the requests, tokens, queue, the fetchers' pool and storage
 * figures and every daemon up; the counters move with a completion. */
Test(router_http, metrics_count_requests_and_tokens, .timeout = 300, .fini = down)
{
    up("");
    char extra[1200], hdr[1100];
    snprintf(hdr, sizeof(hdr), "%s/headers", t_dir);
    snprintf(extra, sizeof(extra), "-D '%s'", hdr);
    struct answer a = http("GET", "/metrics", NULL, extra);
    cr_assert_eq(a.status, 200, "%s", a.body);
    char *headers = fixture_read_all(hdr, NULL);
    cr_assert(headers && strstr(headers, "Content-Type: text/plain; version=0.0.4"), "%s",
              headers ? headers : "(no headers)");
    free(headers);
    const double done0 = prom_value(a.body, "sluice_requests_total{state=\"done\"}");
    const double gen0 = prom_value(a.body, "sluice_tokens_total{kind=\"generated\"}");
    cr_assert(done0 >= 0 && gen0 >= 0, "no request or token counters:\n%s", a.body);
    free(a.body);
    a = http("POST", "/v1/completions",
             "{\"prompt\":\"hello world\",\"max_tokens\":7,\"temperature\":0}", NULL);
    cr_assert_eq(a.status, 200, "%s", a.body);
    free(a.body);
    a = http("GET", "/metrics", NULL, NULL);
    cr_assert_eq(a.status, 200, "%s", a.body);
    const char *body = a.body;
    cr_expect(strstr(body, "# TYPE sluice_requests_total counter\n") != NULL, "%s", body);
    cr_expect_eq(prom_value(body, "sluice_requests_total{state=\"done\"}"), done0 + 1, "%s", body);
    const double gen = prom_value(body, "sluice_tokens_total{kind=\"generated\"}");
    cr_expect(gen > gen0 && gen <= gen0 + 7, "generated %g after %g:\n%s", gen, gen0, body);
    cr_expect_eq(prom_value(body, "sluice_queue_depth"), 0.0);
    cr_expect_eq(prom_value(body, "sluice_up{daemon=\"router\"}"), 1.0);
    cr_expect_eq(prom_value(body, "sluice_up{daemon=\"executor\"}"), 1.0, "%s", body);
    cr_expect_eq(prom_value(body, "sluice_up{daemon=\"fetcher-0\"}"), 1.0, "%s", body);
    const double hit = prom_value(body, "sluice_expert_hit_rate");
    cr_expect(hit >= 0.0 && hit <= 1.0, "hit rate %g", hit);
    cr_expect(prom_value(body, "sluice_storage_read_bytes_total") > 0.0, "%s", body);
    cr_expect(prom_value(body, "sluice_generated_tokens_per_second") > 0.0, "%s", body);
    cr_expect(prom_value(body, "sluice_stat{daemon=\"executor\",name=\"steps\"}") > 0.0, "%s",
              body);
    cr_expect_eq(prom_value(body, "sluice_batch_sequences"), 1.0, "one request, one sequence:\n%s",
                 body);
    /* Every sample line is NAME[{LABELS}] VALUE with a finite value. */
    for (const char *l = body; *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : l + strlen(l)) {
        if (*l == '#' || *l == '\n')
            continue;
        const char *sp = strchr(l, ' ');
        cr_assert(sp && sp < strchr(l, '\n'), "bad line: %.80s", l);
        char *end;
        cr_assert(isfinite(strtod(sp + 1, &end)) && *end == '\n', "bad value: %.80s", l);
    }
    free(a.body);
}
