/* tests/common/test_fdpass.c - Unix sockets of this user and descriptors passed over them. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "fixture.h"

/* Fixture state (Criterion fixtures take no arguments). */
static char *t_dir;
static char  t_path[200];

static void fdpass_setup(void)
{
    t_dir = fixture_tmpdir();
    cr_assert_not_null(t_dir);
    snprintf(t_path, sizeof(t_path), "%.150s/x.pool", t_dir);
}

static void fdpass_teardown(void)
{
    fixture_rmtree(t_dir);
    free(t_dir);
}

TestSuite(common_fdpass, .init = fdpass_setup, .fini = fdpass_teardown, .timeout = 20);

/* Listens, connects and accepts: *l, *c (client end), *a (accepted end). */
static void connect_pair(int *l, int *c, int *a)
{
    cr_assert_eq(common_unix_listen(t_path, l), COMMON_OK);
    cr_assert_eq(common_unix_connect(t_path, c), COMMON_OK);
    cr_assert_eq(common_unix_accept(*l, 1000, a), COMMON_OK);
}

Test(common_fdpass, memfd_and_tag_cross_the_socket)
{
    int l, c, a;
    connect_pair(&l, &c, &a);
    struct stat st;
    cr_assert_eq(stat(t_path, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);

    int mfd = memfd_create("pool", MFD_CLOEXEC);
    cr_assert_geq(mfd, 0);
    const char text[] = "expert weights";
    cr_assert_eq(write(mfd, text, sizeof(text)), (ssize_t)sizeof(text));
    cr_assert_eq(common_fd_send(a, mfd, 0x1122334455667788ull), COMMON_OK);
    close(mfd);

    int      got = -1;
    uint64_t tag = 0;
    cr_assert_eq(common_fd_recv(c, &got, &tag, 1000), COMMON_OK);
    cr_assert_eq(tag, 0x1122334455667788ull);
    cr_assert(fcntl(got, F_GETFD) & FD_CLOEXEC);
    char *p = mmap(NULL, sizeof(text), PROT_READ, MAP_SHARED, got, 0);
    cr_assert_neq(p, MAP_FAILED);
    cr_assert_str_eq(p, text);
    munmap(p, sizeof(text));
    close(got);
    close(a);
    close(c);
    close(l);
}

Test(common_fdpass, recv_times_out)
{
    int l, c, a;
    connect_pair(&l, &c, &a);
    int      got = -1;
    uint64_t tag = 0;
    uint64_t t0 = common_now_ns();
    cr_assert_eq(common_fd_recv(c, &got, &tag, 100), COMMON_ETIMEDOUT);
    cr_assert_geq((common_now_ns() - t0) / 1000000u, 90);
    cr_assert_eq(got, -1);
    int conn = -1;
    cr_assert_eq(common_unix_accept(l, 50, &conn), COMMON_ETIMEDOUT);
    close(a);
    close(c);
    close(l);
}

Test(common_fdpass, peer_closed_is_eclosed)
{
    int l, c, a;
    connect_pair(&l, &c, &a);
    close(a);
    int      got = -1;
    uint64_t tag = 0;
    cr_assert_eq(common_fd_recv(c, &got, &tag, 1000), COMMON_ECLOSED);
    close(c);
    close(l);
}

Test(common_fdpass, message_without_descriptor_is_eproto)
{
    int l, c, a;
    connect_pair(&l, &c, &a);
    uint64_t fake = 42;
    cr_assert_eq(write(a, &fake, sizeof(fake)), (ssize_t)sizeof(fake));
    int      got = -1;
    uint64_t tag = 0;
    cr_assert_eq(common_fd_recv(c, &got, &tag, 1000), COMMON_EPROTO);
    cr_assert_eq(got, -1);
    /* A short message with a descriptor is refused too, and the descriptor is not leaked. */
    cr_assert_eq(write(a, "abc", 3), 3);
    cr_assert_eq(common_fd_recv(c, &got, &tag, 1000), COMMON_EPROTO);
    close(a);
    close(c);
    close(l);
}

Test(common_fdpass, path_too_long_is_einval)
{
    char long_path[300];
    memset(long_path, 'p', sizeof(long_path) - 1);
    long_path[0] = '/';
    long_path[sizeof(long_path) - 1] = '\0';
    int fd = -1;
    cr_assert_eq(common_unix_listen(long_path, &fd), COMMON_EINVAL);
    cr_assert_eq(common_unix_connect(long_path, &fd), COMMON_EINVAL);
    cr_assert_eq(common_unix_listen("", &fd), COMMON_EINVAL);
    cr_assert_eq(fd, -1);
}

Test(common_fdpass, live_listener_is_ebusy_and_stale_file_is_replaced)
{
    int l = -1, l2 = -1;
    cr_assert_eq(common_unix_listen(t_path, &l), COMMON_OK);
    cr_assert_eq(common_unix_listen(t_path, &l2), COMMON_EBUSY);
    close(l); /* the file stays behind, as after SIGKILL */
    struct stat st;
    cr_assert_eq(stat(t_path, &st), 0);
    cr_assert_eq(common_unix_listen(t_path, &l2), COMMON_OK);
    int c, a;
    cr_assert_eq(common_unix_connect(t_path, &c), COMMON_OK);
    cr_assert_eq(common_unix_accept(l2, 1000, &a), COMMON_OK);
    close(a);
    close(c);
    close(l2);
}

Test(common_fdpass, connect_to_nothing_is_enoent)
{
    int fd = -1;
    cr_assert_eq(common_unix_connect(t_path, &fd), COMMON_ENOENT);
}
