// TROUPE_DEVICE_FAULT (kernels/fault.h): the variable's parsing, an allocation failure at the
// Nth allocation whose purpose matches (device and pinned host alike) with the message a real
// shortage gives, and a device failure at the Nth matching sync point that every later sync
// reports too. On the backend TROUPE_BACKEND names: with CUDA the failure is a real device
// fault, which spoils the process's context, so that case comes last.
#include <stdlib.h>
#include <string.h>

#include "engine/device.h"
#include "tests/backend_test.h"
#include "tests/test.h"

static void check_parse(void) {
    tr_fault f;
    char msg[256];
    CHECK(tr_fault_parse(&f, NULL, msg, sizeof msg) == 0 && f.kind == TR_FAULT_NONE);
    CHECK(tr_fault_parse(&f, "", msg, sizeof msg) == 0 && f.kind == TR_FAULT_NONE);
    CHECK(tr_fault_parse(&f, "error:optimizer step", msg, sizeof msg) == 0);
    CHECK(f.kind == TR_FAULT_ERROR && f.n == 1 && strcmp(f.where, "optimizer step") == 0);
    CHECK(tr_fault_parse(&f, "oom:kv cache:3", msg, sizeof msg) == 0);
    CHECK(f.kind == TR_FAULT_OOM && f.n == 3 && strcmp(f.where, "kv cache") == 0);
    // A sync point's name may hold colons; only a last field of digits is N.
    CHECK(tr_fault_parse(&f, "error:generate: sampling", msg, sizeof msg) == 0);
    CHECK(f.n == 1 && strcmp(f.where, "generate: sampling") == 0);
    CHECK(tr_fault_parse(&f, "error:generate: sampling:12", msg, sizeof msg) == 0);
    CHECK(f.n == 12 && strcmp(f.where, "generate: sampling") == 0);
    CHECK(strcmp(f.spec, "error:generate: sampling:12") == 0);
    static const char *const bad[] = {"error", "error:", "oom::2", "crash:x", "error:x:0",
                                      "Error:x", "oom:x:99999999999", NULL};
    for (int i = 0; bad[i]; i++) {
        msg[0] = '\0';
        CHECKF(tr_fault_parse(&f, bad[i], msg, sizeof msg) != 0 && f.kind == TR_FAULT_NONE,
               "'%s' was accepted", bad[i]);
        CHECKF(strstr(msg, "TROUPE_DEVICE_FAULT") != NULL, "'%s': %s", bad[i], msg);
    }
    // Counting: only matching names of the fault's kind, and true exactly once.
    CHECK(tr_fault_parse(&f, "error:step:2", msg, sizeof msg) == 0);
    CHECK(!tr_fault_hit(&f, TR_FAULT_OOM, "step"));
    CHECK(!tr_fault_hit(&f, TR_FAULT_ERROR, "model set-up"));
    CHECK(!tr_fault_hit(&f, TR_FAULT_ERROR, "optimizer step"));
    CHECK(tr_fault_hit(&f, TR_FAULT_ERROR, "optimizer step"));
    CHECK(!tr_fault_hit(&f, TR_FAULT_ERROR, "optimizer step"));
}

static void check_oom(void) {
    setenv("TROUPE_DEVICE_FAULT", "oom:buffer:3", 1);
    tr_backend be;
    et_backend_in(&be, 1, NULL);
    tr_err err = {0};
    size_t mib = (size_t)1 << 20;
    void *a = tr_dev_alloc(&be, mib, "buffer a", &err);
    void *b = tr_dev_alloc_host(&be, mib, "buffer b", &err);
    void *x = tr_dev_alloc(&be, mib, "something else", &err);
    CHECK(a && b && x);
    void *c = tr_dev_alloc_host(&be, 2 * mib, "buffer c", &err);
    CHECK(c == NULL && err.code == TR_ENOMEM);
    printf("oom: %s\n", err.msg);
    CHECKF(strstr(err.msg, "buffer c: cannot allocate 2.0 MiB of pinned host memory (") == err.msg, "%s", err.msg);
    CHECKF(strstr(err.msg, " MiB free; injected by TROUPE_DEVICE_FAULT=oom:buffer:3)") != NULL, "%s", err.msg);
    // One failure, as a passing shortage: the backend goes on working.
    void *d = tr_dev_alloc(&be, mib, "buffer d", &err);
    CHECK(d != NULL);
    CHECK(tr_dev_sync(&be, "after the shortage", &err) == 0);
    tr_dev_free(&be, a);
    tr_dev_free_host(&be, b);
    tr_dev_free(&be, x);
    tr_dev_free(&be, d);
    tr_backend_free(&be);

    setenv("TROUPE_DEVICE_FAULT", "oom:Adam", 1);
    et_backend_in(&be, 1, NULL);
    CHECK(tr_dev_zalloc(&be, mib, "Adam first moments", &err) == NULL && err.code == TR_ENOMEM);
    CHECKF(strstr(err.msg, "Adam first moments: cannot allocate 1.0 MiB of device memory (") == err.msg,
           "%s", err.msg);
    tr_backend_free(&be);
}

static void check_malformed(void) {
    setenv("TROUPE_DEVICE_FAULT", "error:step:0", 1);
    const char *kind = getenv("TROUPE_BACKEND"), *dev = getenv("TROUPE_DEVICE");
    tr_backend_opts o = {.kind = kind, .threads = 1, .device = dev ? atoi(dev) : 0};
    tr_backend be;
    char msg[512] = "";
    CHECK(tr_backend_init(&be, &o, msg, sizeof msg) != 0 && be.ops == NULL);
    CHECKF(strstr(msg, "TROUPE_DEVICE_FAULT='error:step:0'") != NULL, "%s", msg);
}

static void check_error(void) {
    setenv("TROUPE_DEVICE_FAULT", "error:step:2", 1);
    tr_backend be;
    et_backend_in(&be, 1, NULL);
    tr_err err = {0};
    CHECK(tr_dev_sync(&be, "model set-up", &err) == 0);
    CHECK(tr_dev_sync(&be, "optimizer step", &err) == 0);
    CHECK(tr_dev_sync(&be, "optimizer step", &err) != 0 && err.code == TR_EDEVICE);
    printf("error: %s\n", err.msg);
    CHECKF(strstr(err.msg, "failure before the sync point 'optimizer step': ") != NULL, "%s", err.msg);
    CHECKF(strstr(err.msg, "injected by TROUPE_DEVICE_FAULT=error:step:2") != NULL, "%s", err.msg);
    bool cuda = strcmp(be.ops->name, "cuda") == 0;
    CHECKF(strstr(err.msg, cuda ? "an illegal memory access was encountered" : "simulated device failure"),
           "%s", err.msg);
    // The failure stays, as a real device's does: every later sync reports it.
    tr_err later = {0};
    CHECK(tr_dev_sync(&be, "saving Adam moments", &later) != 0);
    CHECKF(strstr(later.msg, "sync point 'saving Adam moments'") && strstr(later.msg, "injected by"),
           "%s", later.msg);
    tr_backend_free(&be);
}

int main(void) {
    check_parse();
    check_oom();
    check_malformed();
    check_error();
    unsetenv("TROUPE_DEVICE_FAULT");
    return tr_test_summary("test_device_fault");
}
