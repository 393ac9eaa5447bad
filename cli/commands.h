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
