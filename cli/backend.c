// The --backend/--device/--precision options of the commands that run a model (logprobs,
// generate, info): one checked way to turn them into a started backend, so each command names
// neither.
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "engine/err.h"
#include "kernels/backend.h"

int tr_cli_backend_check(const char *cmd, const char *kind, long device, const char *precision) {
    if (strcmp(kind, "cpu") != 0 && strcmp(kind, "cuda") != 0) {
        fprintf(stderr, "troupe %s: --backend must be cpu or cuda, got '%s'\n", cmd, kind);
        return 2;
    }
    if (precision && strcmp(precision, "fp32") != 0 && strcmp(precision, "bf16") != 0) {
        fprintf(stderr, "troupe %s: --precision must be fp32 or bf16, got '%s'\n", cmd, precision);
        return 2;
    }
    if (device < 0 || device > 1023) {
        fprintf(stderr, "troupe %s: --device must be in 0..1023\n", cmd);
        return 2;
    }
    return 0;
}

int tr_cli_backend_start(tr_backend *be, const char *kind, long device, long threads,
                         const char *precision, tr_err *err) {
    char msg[512];
    tr_backend_opts o = {.kind = kind, .threads = (int32_t)threads, .device = (int32_t)device,
                         .precision = precision};
    if (tr_backend_init(be, &o, msg, sizeof msg) != 0)
        return tr_errf(err, TR_EDEVICE, "%s", msg);
    return 0;
}
