// Error reporting shared by every layer: library functions return 0 on success or -1
// with a tr_err filled in (a code and a message naming file, line, key or rank).
// Only the CLI prints errors and exits; library code never aborts on bad input.
#pragma once
#include <stdarg.h>

enum tr_err_code {
    TR_OK = 0,
    TR_EINVAL,     // bad argument or bad value in user input
    TR_EIO,        // the operating system refused a read, write, open or rename
    TR_EFORMAT,    // a file or message is malformed (truncated, lying header, bad JSON)
    TR_ENOMEM,     // an allocation failed
    TR_ERANGE,     // an index, id or size is out of range
    TR_ETIMEOUT,   // a peer did not answer in time
    TR_EPEER,      // a peer (worker, service) answered with an error or died
    TR_EDEVICE,    // CUDA, cuBLAS or NCCL reported an error
    TR_EUNSUPPORTED,
    TR_ECANCELED,  // interrupted (Ctrl-C) or shut down on request
};

#define TR_ERR_MSG_MAX 1024

typedef struct tr_err {
    int code;
    char msg[TR_ERR_MSG_MAX];
} tr_err;

// Sets err (if not NULL) and returns -1, so callers can write `return tr_errf(...)`.
int tr_errf(tr_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int tr_verrf(tr_err *err, int code, const char *fmt, va_list ap);
// Prefixes the existing message with context ("loading model/x: " + old message); returns -1.
// A message that already starts with that context is left as it is, so a context is named once.
int tr_err_wrap(tr_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tr_err_clear(tr_err *err);
const char *tr_err_code_name(int code);
