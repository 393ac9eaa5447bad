// Command-line parsing shared by every troupe command: long options only (--name VALUE,
// --name=VALUE, boolean --flag), declared in a table; unknown options and missing values
// are usage errors (exit 2) with a message naming the option.
#pragma once
#include <stdbool.h>

enum tr_arg_kind { TR_ARG_STR, TR_ARG_INT, TR_ARG_FLOAT, TR_ARG_FLAG, TR_ARG_STR_LIST };

typedef struct tr_arg {
    const char *name;      // without the leading "--"
    enum tr_arg_kind kind;
    void *out;             // const char **, long *, double *, bool *, or tr_str_list *
    const char *metavar;   // e.g. "DIR"; NULL for flags
    const char *help;
    bool required;
    bool seen;             // set by tr_args_parse
} tr_arg;

typedef struct tr_str_list {
    const char *items[64];
    int n;
} tr_str_list;

// Parses argv[1..argc) against the table (terminated by an entry with name == NULL).
// Positional arguments go to pos (up to max_pos). "--help" sets *help and returns 0.
// Returns 0 on success, 2 on a usage error (message printed to stderr, prefixed by cmd).
int tr_args_parse(const char *cmd, int argc, char **argv, tr_arg *table,
                  const char **pos, int max_pos, int *n_pos, bool *help);
// Prints "usage: troupe CMD SYNOPSIS\n\nSUMMARY\n\noptions:\n ..." to stdout.
void tr_args_usage(const char *cmd, const char *synopsis, const char *summary,
                   const tr_arg *table);
