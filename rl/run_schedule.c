// When a run evaluates and checkpoints: the schedules every workflow follows (declared in
// rl/workflow.h), kept apart so they can be checked without starting workers.
#include "rl/workflow.h"

bool tr_run_eval_due(int64_t step, int64_t total, int64_t every) {
    return step == 0 || step == total || (every > 0 && step % every == 0);
}

bool tr_run_save_due(int64_t step, int64_t total, int64_t every) {
    return step == total || (step > 0 && every > 0 && step % every == 0);
}
