// The troupe commands: each lives in its own cli/cmd_<name>.c and returns the process exit
// status (0 success, 1 failure, 2 usage error). main.c holds the dispatch table.
#pragma once

typedef struct tr_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);  // argv[0] is the command name
} tr_command;

// Prints "troupe CMD: MESSAGE" for a tr_err and returns 1; used by every command.
struct tr_err;
int tr_cli_fail(const char *cmd, const struct tr_err *err);

// --backend NAME --device N --precision P (NULL: the backend's default): usage errors print a
// message and return 2 (0 when fine).
int tr_cli_backend_check(const char *cmd, const char *kind, long device, const char *precision);
// Starts that backend (threads: cpu's pool), or fills err.
struct tr_backend;
int tr_cli_backend_start(struct tr_backend *be, const char *kind, long device, long threads,
                         const char *precision, struct tr_err *err);
// The --precision option's default: $TROUPE_PRECISION, else NULL (the backend's own).
#define TR_CLI_PRECISION_HELP "fp32 or bf16 weights and activations (default: $TROUPE_PRECISION, " \
                              "else the backend's: cpu fp32, cuda bf16)"
