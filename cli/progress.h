// Progress on stderr for commands that can run for minutes (logprobs, generate): one line
// redrawn in place four times a second when stderr is a terminal; with --progress, a plain
// line every 10 seconds otherwise; nothing with --quiet. Standard output is never touched.
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct tr_progress {
    const char *cmd;     // "logprobs"
    const char *unit;    // "sequences"
    bool on, tty;
    bool drawn;          // an unfinished in-place line is on the terminal
    double start, last;
} tr_progress;

// force: --progress was given; quiet: --quiet was given (wins).
void tr_progress_init(tr_progress *p, const char *cmd, const char *unit, bool force, bool quiet);
// Whether a line is due now; cheap, so callers gather their numbers only when it is.
bool tr_progress_due(const tr_progress *p);
// "troupe CMD: DONE/TOTAL UNIT (P%), TOKENS tokens, R tokens/s, ETA S s"; final: the last line,
// with the elapsed time instead of the ETA, printed whether due or not.
void tr_progress_show(tr_progress *p, int64_t done, int64_t total, int64_t tokens, bool final);
// Ends an in-place line, so that an error message starts on a line of its own.
void tr_progress_end(tr_progress *p);
