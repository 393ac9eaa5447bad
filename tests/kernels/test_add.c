// add against a host loop: every element the float sum of its inputs, bit for bit (one
// rounding), in place on either input and into a third buffer, for sizes of one and several
// tasks, and the same bits for 1 and 3 threads. Backend memory, so guarded mode runs it too.
#include "tests/backend_test.h"
#include "tests/kernels/kernels_test.h"

static void check_add(tr_backend *be, size_t n, int where) {
    float *a = kt_rand(n, 3.0), *b = kt_rand(n, 1e-3), *want = kt_floats(n), *got = kt_floats(n);
    for (size_t i = 0; i < n; i++) want[i] = a[i] + b[i];
    float *da = et_dev(be, a, n * sizeof(float)), *db = et_dev(be, b, n * sizeof(float));
    float *dout = where == 2 ? et_dev(be, NULL, n * sizeof(float)) : where ? db : da;
    be->ops->add(be, dout, da, db, n);
    et_get(be, got, dout, n * sizeof(float));
    CHECKF(kt_same_bits(got, want, n), "add of %zu floats (%s) is not the float sum", n,
           where == 2 ? "into a third buffer" : where ? "in place on b" : "in place on a");
    be->ops->free(be, da);
    be->ops->free(be, db);
    if (where == 2) be->ops->free(be, dout);
    free(a), free(b), free(want), free(got);
}

int main(void) {
    kt_seed(5);
    for (int32_t threads = 1; threads <= 3; threads += 2) {
        tr_backend be;
        kt_backend_dev(&be, threads, TR_F32);
        for (int where = 0; where < 3; where++) {
            check_add(&be, 1, where);
            check_add(&be, 1000, where);
            check_add(&be, 300001, where);   // several tasks
        }
        tr_backend_cpu_free(&be);
    }
    printf("%d checks, %d failures\n", tr_test_checks, tr_test_failures);
    return tr_test_failures || !tr_test_checks;
}
