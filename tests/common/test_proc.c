/* tests/common/test_proc.c - a peer's liveness (exited and zombie processes are gone) and ids. */
#include <criterion/criterion.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"

Test(common_proc, live_and_unknown_pids_are_not_gone)
{
    cr_assert_not(common_pid_gone((uint32_t)getpid()));
    cr_assert_not(common_pid_gone(0), "0 means no pid was told");
    cr_assert_not(common_pid_gone(1), "init lives (EPERM or not, it exists)");
}

Test(common_proc, zombie_and_reaped_children_are_gone, .timeout = 10)
{
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0)
        _exit(0);
    /* Not reaped yet: a zombie, which will never answer again. */
    siginfo_t info;
    cr_assert_eq(waitid(P_PID, (id_t)child, &info, WEXITED | WNOWAIT), 0);
    cr_assert(common_pid_gone((uint32_t)child), "a zombie counts as gone");
    cr_assert_eq(waitpid(child, NULL, 0), child);
    cr_assert(common_pid_gone((uint32_t)child), "a reaped child is gone");
}

Test(common_proc, random_ids_are_nonzero_and_differ)
{
    uint64_t a = common_random_id(), b = common_random_id();
    cr_assert_neq(a, 0);
    cr_assert_neq(b, 0);
    cr_assert_neq(a, b);
}
