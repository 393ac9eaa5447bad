// troupe's entry point: global --help/--version and dispatch to one command per file.
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "engine/err.h"
#include "version.h"

int tr_cmd_info(int argc, char **argv);
int tr_cmd_generate(int argc, char **argv);
int tr_cmd_logprobs(int argc, char **argv);
int tr_cmd_preprocess(int argc, char **argv);
int tr_cmd_run(int argc, char **argv);
int tr_cmd_tokenize(int argc, char **argv);
int tr_cmd_worker(int argc, char **argv);

static const tr_command commands[] = {
    {.name = "generate",
     .summary = "sample continuations of prompts (batched, paged KV cache, exact logprobs)",
     .run = tr_cmd_generate},
    {.name = "info",
     .summary = "a checkpoint's configuration, parameter count and training memory",
     .run = tr_cmd_info},
    {.name = "logprobs",
     .summary = "per-token log-probabilities of token sequences under a model",
     .run = tr_cmd_logprobs},
    {.name = "preprocess",
     .summary = "tokenize JSONL into a Megatron indexed dataset (.bin/.idx)",
     .run = tr_cmd_preprocess},
    {.name = "run",
     .summary = "run a recipe: GRPO, PPO, SFT or pretraining with its role workers",
     .run = tr_cmd_run},
    {.name = "tokenize",
     .summary = "JSONL text to token ids and back with a Hugging Face tokenizer.json",
     .run = tr_cmd_tokenize},
    {.name = "worker",
     .summary = "host role workers (policy, reference, critic, reward, generator) for a controller",
     .run = tr_cmd_worker},
    {.name = NULL},   // the end of the table
};

int tr_cli_fail(const char *cmd, const tr_err *err) {
    fprintf(stderr, "troupe %s: error: %s\n", cmd, err && err->msg[0] ? err->msg : "failed");
    return 1;
}

static void usage(FILE *out) {
    fprintf(out,
            "troupe %s: reinforcement learning (GRPO, PPO), SFT and pretraining of transformers\n\n"
            "usage: troupe [--help] [--version] COMMAND [ARGS]\n\ncommands:\n",
            TROUPE_VERSION);
    for (const tr_command *c = commands; c->name; c++) fprintf(out, "  %-12s %s\n", c->name, c->summary);
    fprintf(out, "\n'troupe COMMAND --help' describes a command. Exit status: 0 success, 1 failure,"
                 " 2 usage error.\n");
}

// Output that never reached standard output (a full disk, a closed descriptor) is a failure,
// also for commands that print with plain printf.
static int check_stdout(int rc) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
    if (rc == 0) fprintf(stderr, "troupe: error: writing standard output failed: %s\n",
                         strerror(errno));
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *a = argv[1];
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0 || strcmp(a, "help") == 0) {
        usage(stdout);
        return check_stdout(0);
    }
    if (strcmp(a, "--version") == 0 || strcmp(a, "version") == 0) {
        printf("troupe %s\n", TROUPE_VERSION);
        return check_stdout(0);
    }
    for (const tr_command *c = commands; c->name; c++)
        if (strcmp(c->name, a) == 0) return check_stdout(c->run(argc - 1, argv + 1));
    if (a[0] == '-')
        fprintf(stderr, "troupe: unknown option '%s' (see troupe --help)\n", a);
    else
        fprintf(stderr, "troupe: unknown command '%s' (see troupe --help)\n", a);
    return 2;
}
