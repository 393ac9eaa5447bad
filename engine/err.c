// Error formatting: fixed-size message buffers so reporting an error never allocates.
#include "engine/err.h"

#include <stdio.h>
#include <string.h>

int tr_verrf(tr_err *err, int code, const char *fmt, va_list ap) {
    if (!err) return -1;
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    return -1;
}

int tr_errf(tr_err *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    tr_verrf(err, code, fmt, ap);
    va_end(ap);
    return -1;
}

int tr_err_wrap(tr_err *err, const char *fmt, ...) {
    if (!err) return -1;
    char prefix[TR_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (err->code == TR_OK) err->code = TR_EINVAL;
    // Two layers may both name one context (the op a worker ran and the client that sent
    // it, or an op and the engine module of the same name); the reader needs it once.
    size_t pl = strlen(prefix), cap = sizeof err->msg - 1;
    if (pl && !strncmp(err->msg, prefix, pl) && err->msg[pl] == ':' && err->msg[pl + 1] == ' ') return -1;
    // Shift the old message right and put "prefix: " in front, truncating at the end.
    if (pl + 2 > cap) pl = cap - 2;
    size_t ol = strlen(err->msg);
    if (pl + 2 + ol > cap) ol = cap - pl - 2;
    memmove(err->msg + pl + 2, err->msg, ol);
    memcpy(err->msg, prefix, pl);
    err->msg[pl] = ':';
    err->msg[pl + 1] = ' ';
    err->msg[pl + 2 + ol] = '\0';
    return -1;
}

void tr_err_clear(tr_err *err) {
    if (!err) return;
    err->code = TR_OK;
    err->msg[0] = '\0';
}

const char *tr_err_code_name(int code) {
    switch (code) {
    case TR_OK: return "ok";
    case TR_EINVAL: return "invalid";
    case TR_EIO: return "io";
    case TR_EFORMAT: return "format";
    case TR_ENOMEM: return "nomem";
    case TR_ERANGE: return "range";
    case TR_ETIMEOUT: return "timeout";
    case TR_EPEER: return "peer";
    case TR_EDEVICE: return "device";
    case TR_EUNSUPPORTED: return "unsupported";
    case TR_ECANCELED: return "canceled";
    }
    return "unknown";
}
