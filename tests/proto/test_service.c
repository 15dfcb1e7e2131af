/* tests/proto/test_service.c - the daemon skeleton: common messages, pid file, run dir, HELLO. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fixture.h"
#include "proto.h"

/* Fixture state (Criterion fixtures take no arguments). */
static char                 *t_dir;
static char                  t_run[200];
static char                  t_url[300];
static struct proto_service *t_svc;

/* What the test daemon's handlers saw. */
static struct {
    _Atomic int drains;
    _Atomic int attaches;
} t_seen;

static void test_hello(void *arg, struct proto_hello *h)
{
    (void)arg;
    h->n_shards = 1;
    h->shards[0] = (struct proto_shard){.fetcher = 0, .first_expert = 0, .n_experts = 8};
}

static void test_health(void *arg, struct proto_health_reply *h)
{
    (void)arg;
    snprintf(h->message, sizeof(h->message), "test daemon");
}

static void test_stats(void *arg, struct proto_stats_reply *st)
{
    (void)arg;
    proto_stats_add(st, "test.answer", 42);
    proto_stats_addf(st, 7, "test.%s.%u", "item", 3u);
}

static void test_drain(void *arg)
{
    (void)arg;
    atomic_fetch_add(&t_seen.drains, 1);
}

static int test_configure(void *arg, const struct proto_configure *c, struct proto_msg *rep)
{
    (void)arg;
    if (strcmp(c->key, "test.knob") == 0) {
        rep->kind = PROTO_KIND_OK;
        return COMMON_OK;
    }
    return proto_reply_error(rep, COMMON_EINVAL, "unknown key '%s'", c->key);
}

static int test_handle(void *arg, const struct proto_msg *req, struct proto_msg *rep)
{
    (void)arg;
    if (req->kind != PROTO_KIND_ATTACH)
        return proto_reply_error(rep, COMMON_EPROTO, "not here");
    atomic_fetch_add(&t_seen.attaches, 1);
    rep->kind = PROTO_KIND_OK;
    return COMMON_OK;
}

static const struct proto_service_ops t_ops = {
    .hello = test_hello,
    .health = test_health,
    .stats = test_stats,
    .drain = test_drain,
    .configure = test_configure,
    .handle = test_handle,
};

static void svc_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    snprintf(t_run, sizeof(t_run), "%.150s/run", t_dir);
    snprintf(t_url, sizeof(t_url), "ipc://%s/testd.ctl", t_run);
    atomic_store(&t_seen.drains, 0);
    atomic_store(&t_seen.attaches, 0);
}

static void svc_teardown(void)
{
    proto_service_stop(t_svc);
    t_svc = NULL;
    fixture_rmtree(t_dir);
    free(t_dir);
}

TestSuite(proto_service, .init = svc_setup, .fini = svc_teardown, .timeout = 60);

static void start(void)
{
    struct common_errmsg      e = {{0}};
    struct proto_service_opts o = {.run_dir = t_run,
                                   .name = "testd",
                                   .role = PROTO_ROLE_FETCHER,
                                   .model_path = "/models/m.gguf",
                                   .instance = 1234};
    cr_assert_eq(proto_service_start(&o, &t_ops, NULL, &t_svc, &e), COMMON_OK, "%s", e.text);
}

/* One call to the service; returns the reply's kind (the reply is left in *rep). */
static enum proto_kind call(struct proto_msg *req, struct proto_msg *rep)
{
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_call(t_url, req, rep, 5000, &e), COMMON_OK, "%s", e.text);
    return rep->kind;
}

Test(proto_service, hello_names_the_daemon_and_adds_its_shards)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_HELLO}, rep;
    proto_hello_init(&req.u.hello, PROTO_ROLE_EXECUTOR, "executor", 99);
    cr_assert_eq(call(&req, &rep), PROTO_KIND_HELLO);
    struct common_errmsg e = {{0}};
    cr_assert_eq(proto_hello_check(&rep.u.hello, PROTO_ROLE_FETCHER, &e), COMMON_OK, "%s", e.text);
    cr_assert_str_eq(rep.u.hello.name, "testd");
    cr_assert_eq(rep.u.hello.pid, (uint32_t)getpid());
    cr_assert_eq(rep.u.hello.instance, 1234);
    cr_assert_eq(rep.u.hello.n_shards, 1);
    cr_assert_eq(rep.u.hello.shards[0].n_experts, 8);
    proto_msg_clear(&rep);
}

Test(proto_service, hello_of_an_incompatible_version_is_refused)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_HELLO}, rep;
    proto_hello_init(&req.u.hello, PROTO_ROLE_EXECUTOR, "executor", 99);
    req.u.hello.major = PROTO_VERSION_MAJOR + 1;
    cr_assert_eq(call(&req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EPROTO);
    cr_assert(strstr(rep.u.error.message, "protocol"), "%s", rep.u.error.message);
    proto_msg_clear(&rep);
}

Test(proto_service, hello_check_refuses_the_wrong_role_and_bad_shard_counts)
{
    struct proto_hello   h;
    struct common_errmsg e = {{0}};
    proto_hello_init(&h, PROTO_ROLE_ROUTER, "router", 1);
    cr_assert_eq(proto_hello_check(&h, PROTO_ROLE_ROUTER, &e), COMMON_OK);
    cr_assert_eq(proto_hello_check(&h, -1, &e), COMMON_OK);
    cr_assert_eq(proto_hello_check(&h, PROTO_ROLE_EXECUTOR, &e), COMMON_EPROTO);
    cr_assert(strstr(e.text, "expected a executor") || strstr(e.text, "executor"), "%s", e.text);
    h.n_shards = PROTO_MAX_SHARDS + 1;
    cr_assert_eq(proto_hello_check(&h, -1, &e), COMMON_EPROTO);
}

Test(proto_service, health_and_stats_carry_the_skeleton_and_the_daemon_parts)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_HEALTH}, rep;
    cr_assert_eq(call(&req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_READY);
    cr_assert_eq(rep.u.health.role, PROTO_ROLE_FETCHER);
    cr_assert_eq(rep.u.health.pid, (uint32_t)getpid());
    cr_assert_str_eq(rep.u.health.message, "test daemon");
    proto_msg_clear(&rep);

    req = (struct proto_msg){.kind = PROTO_KIND_STATS};
    cr_assert_eq(call(&req, &rep), PROTO_KIND_STATS_REPLY);
    bool answer = false, item = false, requests = false, uptime = false;
    for (uint32_t i = 0; i < rep.u.stats.n_stats; i++) {
        const struct proto_stat *st = &rep.u.stats.stats[i];
        answer = answer || (strcmp(st->name, "test.answer") == 0 && st->value == 42);
        item = item || (strcmp(st->name, "test.item.3") == 0 && st->value == 7);
        requests = requests || (strcmp(st->name, "ctl.requests") == 0 && st->value >= 1);
        uptime = uptime || strcmp(st->name, "uptime_s") == 0;
    }
    cr_assert(answer && item && requests && uptime);
    proto_msg_clear(&rep);
}

Test(proto_service, drain_then_shutdown_reach_the_daemon_and_the_run_loop)
{
    start();
    cr_assert_not(proto_service_is_draining(t_svc));
    struct proto_msg req = {.kind = PROTO_KIND_DRAIN}, rep;
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    cr_assert(proto_service_is_draining(t_svc));
    cr_assert_not(proto_service_shutdown_requested(t_svc));
    cr_assert_eq(atomic_load(&t_seen.drains), 1);
    req = (struct proto_msg){.kind = PROTO_KIND_HEALTH};
    cr_assert_eq(call(&req, &rep), PROTO_KIND_HEALTH_REPLY);
    cr_assert_eq(rep.u.health.state, PROTO_HEALTH_DRAINING, "draining whatever the daemon says");
    proto_msg_clear(&rep);
    req = (struct proto_msg){.kind = PROTO_KIND_SHUTDOWN};
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    cr_assert(proto_service_shutdown_requested(t_svc));
    cr_assert_eq(proto_service_run(t_svc), PROTO_SERVICE_STOP_MESSAGE);
}

Test(proto_service, configure_sets_the_log_level_and_passes_other_keys_on)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_CONFIGURE}, rep;
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "log.level");
    snprintf(req.u.configure.value, sizeof(req.u.configure.value), "debug");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    cr_assert_eq(common_log_get_level(), COMMON_LOG_LEVEL_DEBUG);
    common_log_set_level(COMMON_LOG_LEVEL_INFO);
    snprintf(req.u.configure.value, sizeof(req.u.configure.value), "loud");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_EINVAL);
    proto_msg_clear(&rep);
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "test.knob");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    snprintf(req.u.configure.key, sizeof(req.u.configure.key), "nope");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_ERROR);
    proto_msg_clear(&rep);
}

Test(proto_service, load_model_accepts_only_the_served_model)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_LOAD_MODEL}, rep;
    snprintf(req.u.load_model.path, sizeof(req.u.load_model.path), "/models/m.gguf");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    snprintf(req.u.load_model.path, sizeof(req.u.load_model.path), "/models/other.gguf");
    cr_assert_eq(call(&req, &rep), PROTO_KIND_ERROR);
    cr_assert_eq(rep.u.error.code, COMMON_ENOTSUP);
    proto_msg_clear(&rep);
}

Test(proto_service, other_messages_go_to_the_daemon_handler)
{
    start();
    struct proto_msg req = {.kind = PROTO_KIND_ATTACH}, rep;
    cr_assert_eq(call(&req, &rep), PROTO_KIND_OK);
    cr_assert_eq(atomic_load(&t_seen.attaches), 1);
    req = (struct proto_msg){.kind = PROTO_KIND_POLL};
    cr_assert_eq(call(&req, &rep), PROTO_KIND_ERROR);
    proto_msg_clear(&rep);
}

Test(proto_service, pid_file_holds_the_pid_and_goes_at_stop)
{
    start();
    char path[300];
    snprintf(path, sizeof(path), "%s/testd.pid", t_run);
    char *txt = fixture_read_all(path, NULL);
    cr_assert_not_null(txt);
    cr_assert_eq(strtol(txt, NULL, 10), (long)getpid());
    free(txt);
    struct stat st;
    cr_assert_eq(lstat(path, &st), 0);
    cr_assert(S_ISREG(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0600);
    char sock[300];
    snprintf(sock, sizeof(sock), "%s/testd.ctl", t_run);
    cr_assert_eq(access(sock, F_OK), 0);
    proto_service_stop(t_svc);
    t_svc = NULL;
    cr_assert_neq(access(path, F_OK), 0, "pid file removed");
    cr_assert_neq(access(sock, F_OK), 0, "socket file removed");
}

Test(proto_service, pid_file_never_follows_a_planted_link)
{
    cr_assert_eq(mkdir(t_run, 0700), 0);
    char target[300], link[300];
    snprintf(target, sizeof(target), "%s/victim", t_dir);
    snprintf(link, sizeof(link), "%s/testd.pid", t_run);
    FILE *f = fopen(target, "w");
    fputs("precious\n", f);
    fclose(f);
    cr_assert_eq(symlink(target, link), 0);
    start();
    char *txt = fixture_read_all(target, NULL);
    cr_assert_str_eq(txt, "precious\n", "the link's target is untouched");
    free(txt);
    struct stat st;
    cr_assert_eq(lstat(link, &st), 0);
    cr_assert(S_ISREG(st.st_mode), "the link was replaced by the pid file");
}

Test(proto_service, pid_file_of_another_process_is_left_at_stop)
{
    start();
    char path[300];
    snprintf(path, sizeof(path), "%s/testd.pid", t_run);
    FILE *f = fopen(path, "w");
    fputs("1\n", f);
    fclose(f);
    proto_service_stop(t_svc);
    t_svc = NULL;
    cr_assert_eq(access(path, F_OK), 0, "a successor's pid file stays");
}

Test(proto_service, run_dir_open_to_others_or_a_link_is_refused)
{
    struct common_errmsg      e = {{0}};
    struct proto_service_opts o = {.run_dir = t_run, .name = "testd"};
    cr_assert_eq(mkdir(t_run, 0755), 0);
    cr_assert_eq(proto_service_start(&o, &t_ops, NULL, &t_svc, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "0700"), "%s", e.text);
    struct stat st;
    cr_assert_eq(stat(t_run, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0755, "an existing directory is never chmod'ed");
    cr_assert_eq(rmdir(t_run), 0);
    char real[300];
    snprintf(real, sizeof(real), "%s/real", t_dir);
    cr_assert_eq(mkdir(real, 0700), 0);
    cr_assert_eq(symlink(real, t_run), 0);
    cr_assert_eq(proto_service_start(&o, &t_ops, NULL, &t_svc, &e), COMMON_EINVAL);
    cr_assert(strstr(e.text, "symbolic link"), "%s", e.text);
    o.name = "a/b";
    cr_assert_eq(proto_service_start(&o, &t_ops, NULL, &t_svc, &e), COMMON_EINVAL);
}

Test(proto_service, run_dir_is_created_0700_when_absent)
{
    start();
    struct stat st;
    cr_assert_eq(stat(t_run, &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
    cr_assert_eq(st.st_mode & 0777, 0700);
}

Test(proto_service, second_service_on_a_live_socket_is_busy)
{
    start();
    struct common_errmsg      e = {{0}};
    struct proto_service     *two = NULL;
    struct proto_service_opts o = {.run_dir = t_run, .name = "testd", .no_pidfile = true};
    cr_assert_eq(proto_service_start(&o, &t_ops, NULL, &two, &e), COMMON_EBUSY, "%s", e.text);
    cr_assert_null(two);
    struct proto_msg req = {.kind = PROTO_KIND_HEALTH}, rep;
    cr_assert_eq(call(&req, &rep), PROTO_KIND_HEALTH_REPLY, "the first one still answers");
    proto_msg_clear(&rep);
}
