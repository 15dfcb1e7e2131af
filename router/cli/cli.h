/* router/cli/cli.h - the sluice CLI: one entry point per subcommand, shared option helpers. */
#ifndef ROUTER_CLI_CLI_H
#define ROUTER_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Each subcommand gets argv with argv[0] = subcommand name; returns the process exit code. */
int cli_cmd_inspect(int argc, char **argv);
int cli_cmd_mkmodel(int argc, char **argv);
int cli_cmd_tokenize(int argc, char **argv);
int cli_cmd_chat(int argc, char **argv);
int cli_cmd_run(int argc, char **argv);
int cli_cmd_perplexity(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);

/* Parses a decimal unsigned integer in [min, max] for option `name`; prints an error and
 * returns false when it is not one. */
bool cli_parse_u32(const char *name, const char *s, uint32_t min, uint32_t max, uint32_t *out);
bool cli_parse_u64(const char *name, const char *s, uint64_t *out);
bool cli_parse_f32(const char *name, const char *s, float *out);

/* Returns the value following option argv[*i] (advancing *i), or prints an error and returns
 * NULL when it is missing. */
const char *cli_next_arg(int argc, char **argv, int *i);

#endif /* ROUTER_CLI_CLI_H */
