// TROUPE_DEVICE_FAULT's parsing and counting (fault.h), shared by both backends and the
// engine's allocations, so that every place that injects reads the variable the same way.
#include "kernels/fault.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tr_fault_parse(tr_fault *f, const char *spec, char *msg, size_t cap) {
    memset(f, 0, sizeof *f);
    if (!spec || !spec[0]) return 0;
    const char *colon = strchr(spec, ':');
    size_t kl = colon ? (size_t)(colon - spec) : 0;
    tr_fault_kind kind = kl == 5 && !strncmp(spec, "error", 5) ? TR_FAULT_ERROR
                       : kl == 3 && !strncmp(spec, "oom", 3) ? TR_FAULT_OOM : TR_FAULT_NONE;
    // WHERE may hold colons itself ("generate: sampling"): only a last field of digits is N.
    const char *where = colon ? colon + 1 : "";
    size_t wl = strlen(where);
    long n = 1;
    const char *last = strrchr(where, ':');
    if (last && last[1] && strspn(last + 1, "0123456789") == strlen(last + 1)) {
        n = strtol(last + 1, NULL, 10);
        wl = (size_t)(last - where);
    }
    if (kind == TR_FAULT_NONE || wl == 0 || wl >= sizeof f->where || n < 1 || n > INT32_MAX ||
        strlen(spec) >= sizeof f->spec) {
        snprintf(msg, cap, "TROUPE_DEVICE_FAULT='%s': want KIND:WHERE[:N], KIND error or oom, "
                 "WHERE a sync point's or an allocation's name (under %zu bytes), N >= 1",
                 spec, sizeof f->where);
        return -1;
    }
    f->kind = kind;
    f->n = (int32_t)n;
    memcpy(f->where, where, wl);
    f->where[wl] = '\0';
    snprintf(f->spec, sizeof f->spec, "%s", spec);
    return 0;
}

bool tr_fault_hit(tr_fault *f, tr_fault_kind kind, const char *name) {
    if (f->kind != kind || f->seen >= f->n || !name || !strstr(name, f->where)) return false;
    return ++f->seen == f->n;
}
