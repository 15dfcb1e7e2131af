/* cli/cmd_convert.c - `sluice convert` (GGUF to QSF, the streaming container) and `sluice verify`
 * (every checksum of a QSF file). */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define CONVERT_PROG "sluice convert"
#define VERIFY_PROG  "sluice verify"

/* A progress line on stderr, redrawn when the whole percent changes. */
struct convert_progress {
    const char *what;
    bool        show; /* stderr is a terminal */
    int         last; /* percent printed, -1 none */
};

static void convert_progress_cb(void *arg, uint64_t done, uint64_t total)
{
    struct convert_progress *p = arg;
    if (!p->show)
        return;
    int pct = total ? (int)((double)done * 100.0 / (double)total) : 100;
    if (pct == p->last)
        return;
    p->last = pct;
    char d[32], t[32];
    fprintf(stderr, "\r%s: %3d%% (%s of %s)", p->what, pct, common_format_size(done, d, sizeof(d)),
            common_format_size(total, t, sizeof(t)));
    fflush(stderr);
}

static double convert_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The counts both commands print. */
static void convert_summary(const struct common_qsf_stats *st, double secs)
{
    char r[32], s[32], f[32], b[32];
    printf("resident:  %llu tensors, %s\n", (unsigned long long)st->n_tensors,
           common_format_size(st->resident_bytes, r, sizeof(r)));
    printf("bundles:   %llu (%llu LZ4), %s stored of %s raw (%.1f%%)\n",
           (unsigned long long)st->n_bundles, (unsigned long long)st->n_lz4,
           common_format_size(st->stored_bytes, s, sizeof(s)),
           common_format_size(st->raw_bytes, b, sizeof(b)),
           st->raw_bytes ? 100.0 * (double)st->stored_bytes / (double)st->raw_bytes : 100.0);
    printf("file:      %s, %.2f s\n", common_format_size(st->file_bytes, f, sizeof(f)), secs);
}

int cli_cmd_convert(int argc, char **argv)
{
    const char             *files_v[2];
    struct common_opt_strs  files = {.v = files_v, .cap = 2};
    const char             *lz4 = "auto";
    uint32_t                shards = 0;
    const char             *dirs_v[64];
    struct common_opt_strs  dirs = {.v = dirs_v, .cap = 64};
    const struct common_opt rows[] = {
        {.name = "lz4",
         .type = COMMON_OPT_STR,
         .target = &lz4,
         .metavar = "WHEN",
         .help = "LZ4-compress a bundle: auto (where it saves at least 10%), never, always "
                 "(where it saves anything) [auto]"},
        {.name = "shards",
         .type = COMMON_OPT_U32,
         .target = &shards,
         .metavar = "N",
         .help = "write the bundles to N files, file k holding the experts fetcher daemon k of N "
                 "serves (sluicectl up --fetchers N), so each file can sit on its own device "
                 "[0: in OUT]"},
        {.name = "shard-dir",
         .type = COMMON_OPT_STRS,
         .target = &dirs,
         .metavar = "DIR",
         .help = "directory of the next bundle file (give it once per file; default: beside "
                 "OUT)"},
        {0},
    };
    const struct common_opts_spec spec = {
        .prog = CONVERT_PROG,
        .usage = CONVERT_PROG " [options] IN.gguf OUT.qsf",
        .description =
            "Rewrites a GGUF model as QSF, sluice's streaming container: each routed expert's "
            "gate, up and down contiguous in one 4 KiB-aligned bundle (one read per expert), "
            "resident tensors grouped, a checksum on the header, the index, every tensor and "
            "every bundle. Every command takes the QSF file like the GGUF one. Writes OUT.tmp "
            "and renames it when done.",
        .opts = rows,
        .positional = &files,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return common_opts_exit_status(rc);
    if (files.n != 2)
        return common_opts_exit_status(common_opts_error(&spec, "give IN.gguf and OUT.qsf"));
    struct common_qsf_convert_opts o = {.progress = convert_progress_cb};
    if (strcmp(lz4, "auto") == 0)
        o.lz4 = COMMON_QSF_LZ4_AUTO;
    else if (strcmp(lz4, "never") == 0)
        o.lz4 = COMMON_QSF_LZ4_NEVER;
    else if (strcmp(lz4, "always") == 0)
        o.lz4 = COMMON_QSF_LZ4_ALWAYS;
    else
        return common_opts_exit_status(
            common_opts_error(&spec, "--lz4: want auto, never or always, not '%s'", lz4));
    if (dirs.n && dirs.n != shards)
        return common_opts_exit_status(common_opts_error(
            &spec, "--shard-dir given %zu times for --shards %u: give it once per file",
            (size_t)dirs.n, shards));
    if (shards == 1 || shards > 64)
        return common_opts_exit_status(
            common_opts_error(&spec, "--shards: want 2..64 bundle files, not %u", shards));
    o.n_shards = shards;
    o.shard_dirs = dirs.n ? dirs_v : NULL;
    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    struct common_model  m;
    if ((rc = common_gguf_open(files_v[0], NULL, &g, &e)) != COMMON_OK) {
        cli_error_path(CONVERT_PROG, files_v[0], rc, &e);
        return 1;
    }
    if ((rc = common_model_init(&m, g, &e)) != COMMON_OK) {
        cli_error_path(CONVERT_PROG, files_v[0], rc, &e);
        common_gguf_close(g);
        return 1;
    }
    struct convert_progress p = {.what = "converting", .show = isatty(2), .last = -1};
    struct common_qsf_stats st;
    o.progress_arg = &p;
    double t0 = convert_now_s();
    rc = common_qsf_convert(g, &m, files_v[1], &o, &st, &e);
    if (p.last >= 0)
        fputc('\n', stderr);
    common_model_fini(&m);
    common_gguf_close(g);
    if (rc != COMMON_OK) {
        cli_error(CONVERT_PROG, "%s", e.text[0] ? e.text : common_strerror(rc));
        return 1;
    }
    printf("wrote %s\n", files_v[1]);
    convert_summary(&st, convert_now_s() - t0);
    return 0;
}

int cli_cmd_verify(int argc, char **argv)
{
    const char                   *files_v[1];
    struct common_opt_strs        files = {.v = files_v, .cap = 1};
    const struct common_opt       rows[] = {{0}};
    const struct common_opts_spec spec = {
        .prog = VERIFY_PROG,
        .usage = VERIFY_PROG " FILE.qsf",
        .description = "Reads a whole QSF file and checks every checksum (header, metadata, "
                       "index, each resident tensor, each expert bundle) and that every LZ4 "
                       "bundle decodes. Exits 1 naming the first bad tensor or bundle.",
        .opts = rows,
        .positional = &files,
    };
    int rc = common_opts_parse(&spec, argc, argv);
    if (rc != 0)
        return common_opts_exit_status(rc);
    if (files.n != 1)
        return common_opts_exit_status(common_opts_error(&spec, "give one FILE.qsf"));
    struct common_errmsg e = {{0}};
    struct common_gguf  *g = NULL;
    if ((rc = common_gguf_open(files_v[0], NULL, &g, &e)) != COMMON_OK) {
        cli_error_path(VERIFY_PROG, files_v[0], rc, &e);
        return 1;
    }
    if (!common_gguf_is_qsf(g)) {
        cli_error(VERIFY_PROG, "%s: not a QSF file (sluice convert makes one)", files_v[0]);
        common_gguf_close(g);
        return 1;
    }
    struct convert_progress p = {.what = "verifying", .show = isatty(2), .last = -1};
    struct common_qsf_stats st;
    double                  t0 = convert_now_s();
    rc = common_qsf_verify(g, convert_progress_cb, &p, &st, &e);
    if (p.last >= 0)
        fputc('\n', stderr);
    common_gguf_close(g);
    double secs = convert_now_s() - t0;
    if (rc == COMMON_OK || rc == COMMON_ECORRUPT)
        convert_summary(&st, secs);
    fflush(stdout);
    if (rc != COMMON_OK) {
        cli_error(VERIFY_PROG, "%s: %llu bad: %s", files_v[0], (unsigned long long)st.n_bad,
                  e.text[0] ? e.text : common_strerror(rc));
        return 1;
    }
    printf("%s: every checksum holds\n", files_v[0]);
    return 0;
}
