// Per-step metrics of a run: run_dir/metrics.jsonl (one JSON object per step, "step" first,
// appended, flushed and fsync'd at every commit so a crash loses nothing already logged),
// optional TensorBoard event files under run_dir/tensorboard/, and a progress line on stderr
// with step/total, reward, eval accuracy and ETA.
#pragma once
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "engine/err.h"
#include "rl/tfevents.h"

// A PPO step logs about 70 (memory and plan per role among them): room to grow.
#define TR_METRICS_MAX_KEYS 128
#define TR_METRICS_KEY_MAX 48

typedef struct tr_metrics_opts {
    const char *run_dir;
    const char *workflow;   // shown in the progress line
    int64_t total_steps;
    int64_t resume_step;    // -1: a fresh log; else keep only records with step <= this
    bool tensorboard;
    bool progress;
    FILE *progress_out;     // NULL: stderr
} tr_metrics_opts;

typedef struct tr_metrics {
    char path[4096];
    FILE *f;
    bool tb_on;
    tr_tfevents tb;
    bool progress;
    FILE *progress_out;
    char workflow[32];
    int64_t total_steps;
    // Progress and ETA: measured from open, over the steps committed since.
    double t_open;
    int64_t first_step, steps_done;
    double last_eval;        // NAN until an eval/accuracy was logged
    int64_t last_eval_step;
    // The record being built.
    int64_t step;
    int32_t n;
    char keys[TR_METRICS_MAX_KEYS][TR_METRICS_KEY_MAX];
    double values[TR_METRICS_MAX_KEYS];
} tr_metrics;

// Opens (creates) run_dir/metrics.jsonl for appending. With resume_step >= 0 the file is
// first rewritten (atomically) without the records of steps after resume_step and without
// a torn last line, and TensorBoard gets a session start at resume_step + 1.
int tr_metrics_open(tr_metrics *m, const tr_metrics_opts *o, tr_err *err);
void tr_metrics_close(tr_metrics *m);

// Starts the record of step (drops an uncommitted one).
void tr_metrics_begin(tr_metrics *m, int64_t step);
// Sets key (replacing an earlier value of the same key in this record). Non-finite values
// are written as null. Fails only when the record is full or the key too long.
int tr_metrics_set(tr_metrics *m, const char *key, double value, tr_err *err);
// The value of key in the current record, or NAN.
double tr_metrics_get(const tr_metrics *m, const char *key);
// Appends the record as one line, flushes and fsyncs it, writes the TensorBoard event and
// prints the progress line.
int tr_metrics_commit(tr_metrics *m, tr_err *err);

// The progress line for the current record (what commit prints), into buf.
void tr_metrics_progress_line(const tr_metrics *m, double now, char *buf, size_t cap);

// Monotonic seconds, for phase timings.
double tr_metrics_now(void);
