// The generation scheduler: admission by reserved KV blocks (FIFO over requests, then over a
// request's samples), prefill passes that pack prompts (chunked when longer than a pass),
// decode steps over every running sample, and retirement that frees blocks at once.
// Every pass runs the model's trunk with attention over the paged cache (attention_decode),
// whose arithmetic matches the training forward's row for row.
#include "engine/generate.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/arena.h"
#include "engine/device.h"
#include "engine/heads.h"

// A request while it runs: its prompt's blocks (held until every sample has started from
// them) and the next sample to start.
typedef struct gen_group {
    tr_kv_seq kv;
    int32_t out0;        // first output index
    int32_t next;        // samples before it have started or finished at prefill
    int32_t reserved;    // blocks kept for its next sample to start with
    int32_t sample_res;  // worst-case blocks of one sample
    int32_t done;        // prompt tokens prefilled
    bool holding;        // kv holds the prompt's blocks
    const int32_t *stop; // the request's stop ids sorted and without repeats (the run's copy)
    int32_t n_stop;
} gen_group;

typedef struct gen_run {
    tr_generator *g;
    const tr_gen_request *reqs;
    int32_t n_reqs;
    tr_gen_output *outs;
    tr_rng *rngs;        // one stream per output
    gen_group *groups;
    int32_t next_req;    // requests before it have been admitted
    int32_t head;        // groups before it have started every sample
    int32_t *stop_buf;   // the groups' sorted stop lists
} gen_run;

int32_t tr_gen_sample_blocks(int32_t n_prompt, int32_t max_new_tokens, int32_t block_size) {
    // Positions written: the prompt and every new token but the last (never fed back).
    int64_t written = (int64_t)n_prompt + max_new_tokens - 1;
    int32_t shared = n_prompt / block_size;   // full prompt blocks, never written again
    int32_t total = tr_kv_blocks_for(written, block_size);
    return total > shared ? total - shared : 0;
}

// Drops every recorded decode step.
static void free_graphs(tr_generator *g) {
    for (int32_t i = 0; i < g->n_graphs; i++) g->model->be->ops->graph_free(g->model->be, g->graphs[i].exec);
    g->n_graphs = 0;
}

void tr_generator_free(tr_generator *g) {
    if (g->model) {
        tr_backend *be = g->model->be;
        free_graphs(g);
        tr_dev_free(be, g->dev);
        tr_dev_free(be, g->sample_scratch);
        if (g->vp.model) tr_sample_tp_free(&g->vp);
        tr_dev_free_host(be, g->row_target);
        tr_dev_free_host(be, g->row_lp);
        tr_dev_free_host(be, g->row_draw);
        tr_dev_free_host(be, g->tables_dev);
        tr_dev_free_host(be, g->table_upd);
        tr_dev_free_host(be, g->row_patch);
    }
    tr_kvcache_free(&g->cache);
    free(g->row_ids);
    free(g->row_pos);
    free(g->row_slot);
    free(g->row_len);
    free(g->row_out);
    free(g->fin_reqs);
    free(g->segs);
    free(g->seg_docs);
    free(g->tables);
    free(g->slots);
    free(g->dev_out);
    free(g->dirty);
    memset(g, 0, sizeof *g);
}

static int32_t opts_block_size(const tr_gen_opts *opts) {
    return opts->block_size > 0 ? opts->block_size : 16;
}

static int64_t opts_kv_tokens(const tr_gen_opts *opts) {
    return opts->kv_tokens > 0 ? opts->kv_tokens : 16384;
}

size_t tr_generator_kv_bytes(const tr_model_config *cfg, const tr_gen_opts *opts, tr_dt act) {
    return tr_kvcache_pool_bytes(cfg, opts_block_size(opts), opts_kv_tokens(opts), act);
}

// The backend copies the ops read (one allocation, in 4-byte words, each array 64-byte
// aligned) and the sampler's scratch (or, under tensor parallelism, its vocab-parallel state).
static int alloc_dev(tr_generator *g, size_t rows, size_t tables, tr_err *err) {
    tr_model *m = g->model;
    tr_backend *be = m->be;
    size_t al = 16, off[11], total = 0, draw_words = sizeof(tr_sample_row) / 4;
    size_t upd = (size_t)g->n_table_upd;
    size_t sizes[10] = {rows, rows, tables + upd, tables, rows, rows, rows * draw_words, rows + 1,
                        2 * upd, 1 + 3 * (size_t)g->max_seqs};
    for (int i = 0; i < 10; i++) {
        off[i] = total;
        total += (sizes[i] + al - 1) / al * al;
    }
    off[10] = total;
    total += al;
    if (!(g->dev = tr_dev_alloc(be, total * 4, "generation tables", err))) return -1;
    int32_t *d = g->dev;
    g->d_slot = d + off[0];
    g->d_len = d + off[1];
    g->d_tables = d + off[2];
    g->d_seg_tables = d + off[3];
    g->d_target = d + off[4];
    g->d_lp = (float *)(d + off[5]);
    g->d_draw = (tr_sample_row *)(d + off[6]);
    g->d_seg_docs = d + off[7];
    g->d_table_upd = d + off[8];
    g->d_patch = d + off[9];
    g->d_near = d + off[10];
    // Tensor parallelism: the ranks draw the same ids from their columns of the logits
    // (engine/sample_tp.h), as one rank's sample op would from the whole rows.
    if (m->tp.size > 1) return tr_sample_tp_init(&g->vp, m, g->logit_rows, err);
    size_t scratch = be->ops->sample_scratch_bytes(be, g->logit_rows, m->cfg.vocab_size);
    g->sample_scratch = tr_dev_alloc(be, scratch ? scratch : 4, "sampling scratch", err);
    return g->sample_scratch ? 0 : -1;
}

int tr_generator_init(tr_generator *g, tr_model *m, const tr_gen_opts *opts, tr_err *err) {
    memset(g, 0, sizeof *g);
    if (m->cfg.head != TR_HEAD_LM)
        return tr_errf(err, TR_EINVAL, "generate: the model (%s) has no LM head",
                       m->cfg.architecture[0] ? m->cfg.architecture : m->cfg.model_type);
    int32_t bs = opts_block_size(opts);
    int64_t kv_tokens = opts_kv_tokens(opts);
    g->model = m;
    g->max_rows = m->max_tokens;
    g->max_seqs = opts->max_seqs > 0 ? opts->max_seqs : 64;
    if (g->max_seqs > g->max_rows) g->max_seqs = g->max_rows;
    int rc = opts->kv_buf ? tr_kvcache_init_in(&g->cache, m->be, &m->lcfg, bs, kv_tokens,
                                               opts->kv_buf, opts->kv_buf_bytes, err)
                          : tr_kvcache_init(&g->cache, m->be, &m->lcfg, bs, kv_tokens, err);
    if (rc != 0) {
        tr_generator_free(g);
        return tr_err_wrap(err, "generate");
    }
    int64_t pool = (int64_t)g->cache.n_blocks * bs;
    int64_t max_len = opts->max_seq_len > 0 ? opts->max_seq_len : pool;
    if (max_len > pool) max_len = pool;
    g->max_seq_len = (int32_t)max_len;
    g->table_cap = tr_kv_blocks_for(max_len, bs);
    // The sampler sorts the rows that top-k/top-p rank, 16 bytes of scratch per logit: its
    // rows are capped so that a memory plan's chunk of thousands of LM-head rows (training's)
    // does not become gigabytes of sort storage (and stays in the sort's int range).
    g->logit_rows = m->logit_rows < TR_GEN_LOGIT_ROWS ? m->logit_rows : TR_GEN_LOGIT_ROWS;
    size_t rows = (size_t)g->max_rows;
    size_t tables = (size_t)g->max_seqs * (size_t)g->table_cap;
    // A decode step changes a row's table by a new last block or its copy on write: two
    // entries a row cover a step; a row moved into a freed slot may take a whole rewrite.
    g->n_table_upd = 2 * g->max_seqs;
    tr_backend *be = m->be;
    // Graphs where the backend records them, without tensor parallelism (its sampler and the
    // vocab-parallel logprob talk to the other ranks between the ops).
    g->record_steps = opts->graphs == TR_GEN_GRAPHS_AUTO && be->ops->graph_begin && m->tp.size == 1;
    g->pad_steps = g->record_steps || opts->graphs == TR_GEN_GRAPHS_PAD;
    g->row_ids = malloc(rows * sizeof(int32_t));
    g->row_pos = malloc(rows * sizeof(int32_t));
    g->row_out = malloc(rows * sizeof(int32_t));
    g->fin_reqs = malloc(rows * sizeof(int32_t));
    g->row_slot = malloc(rows * sizeof(int32_t));
    g->row_len = malloc(rows * sizeof(int32_t));
    g->segs = malloc(rows * sizeof(tr_gen_segment));
    g->seg_docs = malloc((rows + 1) * sizeof(int32_t));
    g->tables = malloc(tables * sizeof(int32_t));
    g->slots = calloc((size_t)g->max_seqs, sizeof(tr_gen_slot));
    g->dev_out = malloc((size_t)g->max_seqs * sizeof(int32_t));
    g->dirty = malloc((size_t)g->max_seqs * sizeof(int32_t));
    if (!g->row_ids || !g->row_pos || !g->row_out || !g->fin_reqs || !g->row_slot || !g->row_len ||
        !g->segs || !g->seg_docs || !g->tables || !g->slots || !g->dev_out || !g->dirty) {
        tr_generator_free(g);
        return tr_errf(err, TR_ENOMEM, "generate: out of memory for %zu-row passes", rows);
    }
    if (!(g->row_target = tr_dev_alloc_host(be, rows * sizeof(int32_t), "sampled ids", err)) ||
        !(g->row_lp = tr_dev_alloc_host(be, rows * sizeof(float), "sampled logprobs", err)) ||
        !(g->row_draw = tr_dev_alloc_host(be, rows * sizeof(tr_sample_row), "sampling rows", err)) ||
        !(g->tables_dev = tr_dev_alloc_host(be, tables * sizeof(int32_t), "block tables", err)) ||
        !(g->table_upd = tr_dev_alloc_host(be, 2 * (size_t)g->n_table_upd * sizeof(int32_t),
                                           "block table updates", err)) ||
        !(g->row_patch = tr_dev_alloc_host(be, (1 + 3 * (size_t)g->max_seqs) * sizeof(int32_t),
                                           "decode row changes", err))) {
        tr_generator_free(g);
        return tr_err_wrap(err, "generate");
    }
    if (alloc_dev(g, rows, tables, err) != 0) {
        tr_generator_free(g);
        return tr_err_wrap(err, "generate");
    }
    return 0;
}

void tr_gen_outputs_free(tr_gen_output *outs, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        free(outs[i].tokens);
        free(outs[i].logprobs);
        outs[i].tokens = NULL;
        outs[i].logprobs = NULL;
        outs[i].n_tokens = 0;
    }
}

static int check_request(const tr_generator *g, const tr_gen_request *r, int32_t i,
                         tr_err *err) {
    const int32_t V = g->model->cfg.vocab_size, bs = g->cache.block_size;
    if (r->n_prompt < 1 || !r->prompt)
        return tr_errf(err, TR_EINVAL, "generate: request %d has an empty prompt", i);
    if (r->n_samples < 1)
        return tr_errf(err, TR_EINVAL, "generate: request %d asks for %d samples", i,
                       r->n_samples);
    if (r->max_new_tokens < 1)
        return tr_errf(err, TR_EINVAL, "generate: request %d: max_new_tokens must be >= 1, "
                       "got %d", i, r->max_new_tokens);
    if (r->min_new_tokens < 0 || r->min_new_tokens > r->max_new_tokens)
        return tr_errf(err, TR_EINVAL, "generate: request %d: min_new_tokens %d is outside 0..max_new_tokens "
                       "(%d)", i, r->min_new_tokens, r->max_new_tokens);
    if (r->n_stop < 0 || (r->n_stop > 0 && !r->stop_ids))
        return tr_errf(err, TR_EINVAL, "generate: request %d: bad stop list", i);
    if (tr_sample_params_check(&r->sampling, err) != 0)
        return tr_err_wrap(err, "generate: request %d", i);
    for (int32_t t = 0; t < r->n_prompt; t++)
        if (r->prompt[t] < 0 || r->prompt[t] >= V)
            return tr_errf(err, TR_ERANGE, "generate: request %d: prompt token %d is id %d, "
                           "outside the vocabulary [0, %d)", i, t, r->prompt[t], V);
    for (int32_t t = 0; t < r->n_stop; t++)
        if (r->stop_ids[t] < 0 || r->stop_ids[t] >= V)
            return tr_errf(err, TR_ERANGE, "generate: request %d: stop id %d is outside the "
                           "vocabulary [0, %d)", i, r->stop_ids[t], V);
    int64_t need = (int64_t)tr_kv_blocks_for(r->n_prompt, bs) +
                   tr_gen_sample_blocks(r->n_prompt, r->max_new_tokens, bs);
    if (need > g->cache.n_blocks)
        return tr_errf(err, TR_ENOMEM, "generate: request %d needs %lld KV blocks of %d tokens "
                       "for its prompt and one sample, the pool has %d; raise the KV token "
                       "budget", i, (long long)need, bs, g->cache.n_blocks);
    int64_t len = (int64_t)r->n_prompt + r->max_new_tokens - 1;
    if (len > g->max_seq_len)
        return tr_errf(err, TR_ERANGE, "generate: request %d: prompt (%d tokens) + "
                       "max_new_tokens (%d) - 1 = %lld exceeds the longest sequence the "
                       "generator holds (%d)", i, r->n_prompt, r->max_new_tokens,
                       (long long)len, g->max_seq_len);
    return 0;
}

// Attention of one pass: q and k are rotated and this pass's keys and values go into the
// cache in one op, then every row reads its sequence's first row_len slots, its own
// included; in a prefill pass the segments that start a prompt attend within the pass by the
// training forward's kernel (pass_docs), the same bits, without reading their keys back from
// the cache. A decode step (one segment, a table a row: each row a sequence of its own)
// takes the three in one op.
static void gen_attend(void *ctx, tr_model *m, int32_t layer, tr_layer_acts *la, int32_t T) {
    tr_generator *g = ctx;
    const tr_model_config *c = &m->lcfg;   // this tensor-parallel rank's heads
    const size_t es = tr_dt_size(m->act), Q = (size_t)c->n_heads * c->head_dim;
    tr_kv_pages pages = tr_kvcache_layer(&g->cache, layer);
    const tr_gen_segment *s0 = &g->segs[0];
    if (g->pass_docs.n_docs == 0 && g->n_segs == 1 && s0->r0 == 0 && s0->n == T &&
        s0->stride > 0) {
        m->be->ops->attention_decode_rope(m->be, la->att, la->q, la->v, m->qkv_ld, m->d_pos,
                                          m->inv_freq, &pages, g->d_slot, s0->table,
                                          s0->stride, g->d_len, T, c->n_heads);
        return;
    }
    m->be->ops->rope_kv_write(m->be, la->q, la->v, m->qkv_ld, m->d_pos, m->inv_freq, T,
                              c->n_heads, &pages, g->d_slot);
    const bool docs = g->pass_docs.n_docs > 0;
    if (docs)   // every row as a document's; the decode below redoes those that continue one
        m->be->ops->attention_forward(m->be, la->att, la->att_lse, la->q, la->k, la->v,
                                      m->qkv_ld, &g->pass_docs, c->n_heads, c->n_kv_heads,
                                      c->head_dim);
    for (int32_t s = 0; s < g->n_segs; s++) {
        const tr_gen_segment *sg = &g->segs[s];
        if (docs && sg->start == 0) continue;
        m->be->ops->attention_decode(m->be, (char *)la->att + (size_t)sg->r0 * Q * es,
                                     (const char *)la->q + (size_t)sg->r0 * m->qkv_ld * es,
                                     m->qkv_ld, &pages, sg->table, sg->stride,
                                     g->d_len + sg->r0, sg->n, c->n_heads);
    }
}

// The pass's cache slots and attended lengths, for the attention callback's ops.
static void upload_rows(tr_generator *g, const int32_t *slot, const int32_t *len, int32_t n) {
    tr_backend *be = g->model->be;
    be->ops->upload(be, g->d_slot, slot, (size_t)n * sizeof(int32_t));
    be->ops->upload(be, g->d_len, len, (size_t)n * sizeof(int32_t));
}

// Binary search of the group's sorted stop ids: a stop set can be hundreds of ids (a
// benchmark's geometric lengths, every id of a family of end markers), tested for every
// sampled token of every running sample on the host between decode steps.
static bool is_stop(const gen_group *grp, int32_t tok) {
    int32_t lo = 0, hi = grp->n_stop;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (grp->stop[mid] < tok) lo = mid + 1;
        else hi = mid;
    }
    return lo < grp->n_stop && grp->stop[lo] == tok;
}

static void finish_check(const tr_gen_request *r, const gen_group *grp, tr_gen_output *o) {
    if (o->n_tokens > r->min_new_tokens && is_stop(grp, o->tokens[o->n_tokens - 1])) o->finish = TR_GEN_STOP;
    else if (o->n_tokens >= r->max_new_tokens) o->finish = TR_GEN_LENGTH;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

// Request i stops on the same list as request i - 1 (the same pointer and length).
static bool same_stops(const gen_run *run, int32_t i) {
    return i > 0 && run->reqs[i].stop_ids == run->reqs[i - 1].stop_ids &&
           run->reqs[i].n_stop == run->reqs[i - 1].n_stop;
}

// Gives every group its request's stop ids sorted and without repeats, in one buffer; the
// requests of one call usually share one list (the same pointer), which is sorted once.
static int sort_stops(gen_run *run, tr_err *err) {
    int64_t total = 0;
    for (int32_t i = 0; i < run->n_reqs; i++)
        if (!same_stops(run, i)) total += run->reqs[i].n_stop;
    run->stop_buf = malloc((size_t)(total > 0 ? total : 1) * sizeof(int32_t));
    if (!run->stop_buf) return tr_errf(err, TR_ENOMEM, "generate: out of memory for %lld stop ids", (long long)total);
    int64_t off = 0;
    for (int32_t i = 0; i < run->n_reqs; i++) {
        const tr_gen_request *r = &run->reqs[i];
        gen_group *grp = &run->groups[i];
        if (same_stops(run, i)) {
            grp->stop = run->groups[i - 1].stop;
            grp->n_stop = run->groups[i - 1].n_stop;
            continue;
        }
        int32_t *s = run->stop_buf + off, n = 0;
        if (r->n_stop > 0) memcpy(s, r->stop_ids, (size_t)r->n_stop * sizeof(int32_t));
        qsort(s, (size_t)r->n_stop, sizeof(int32_t), cmp_i32);
        for (int32_t j = 0; j < r->n_stop; j++)
            if (n == 0 || s[j] != s[n - 1]) s[n++] = s[j];
        grp->stop = s;
        grp->n_stop = n;
        off += r->n_stop;
    }
    return 0;
}

static void note_blocks(tr_generator *g) {
    int32_t used = g->cache.n_blocks - g->cache.n_free;
    if (used > g->stats.peak_blocks) g->stats.peak_blocks = used;
}

// Blocks free and not promised to anyone.
static int32_t unreserved(const tr_generator *g) { return g->cache.n_free - g->reserved; }

// Starts waiting samples, oldest request first, while slots and blocks allow.
static int start_samples(gen_run *run, tr_err *err) {
    tr_generator *g = run->g;
    while (run->head < run->next_req) {
        gen_group *grp = &run->groups[run->head];
        const tr_gen_request *r = &run->reqs[run->head];
        while (grp->next < r->n_samples &&
               run->outs[grp->out0 + grp->next].finish != TR_GEN_RUNNING)
            grp->next++;
        if (grp->next == r->n_samples) {
            // Every sample has its own references now (or finished at prefill).
            if (grp->holding) tr_kv_seq_release(&g->cache, &grp->kv);
            grp->holding = false;
            g->reserved -= grp->reserved;
            grp->reserved = 0;
            run->head++;
            continue;
        }
        if (g->n_active == g->max_seqs) return 0;
        if (unreserved(g) + grp->reserved < grp->sample_res) return 0;
        g->reserved -= grp->reserved;
        grp->reserved = 0;
        int32_t i = g->n_active;
        tr_gen_slot *s = &g->slots[i];
        tr_kv_seq_init(&s->kv, g->tables + (size_t)i * g->table_cap, g->table_cap);
        if (tr_kv_seq_fork(&g->cache, &s->kv, &grp->kv, err) != 0) return -1;
        s->out = grp->out0 + grp->next;
        s->reserved = grp->sample_res;
        g->reserved += s->reserved;
        g->n_active++;
        grp->next++;
        if (g->n_active > g->stats.peak_seqs) g->stats.peak_seqs = g->n_active;
    }
    return 0;
}

// Row r0 + i's draw for output outs[i] (i < n): the request's sampling parameters and the
// output's stream position.
static void fill_draws(gen_run *run, const int32_t *outs, int32_t n, int32_t r0) {
    tr_generator *g = run->g;
    for (int32_t i = 0; i < n; i++) {
        const tr_gen_request *r = &run->reqs[run->outs[outs[i]].request];
        const tr_rng *rng = &run->rngs[outs[i]];
        g->row_draw[r0 + i] = (tr_sample_row){.temperature = r->sampling.temperature,
                                              .top_k = r->sampling.top_k, .top_p = r->sampling.top_p,
                                              .seed = rng->seed, .counter = rng->counter,
                                              .used = rng->used};
    }
}

// Whether a draw among rows [r0, r0 + n) (filled in row_draw) ranks its logits: the sample
// op sorts only then.
static bool draws_ranked(const tr_generator *g, int32_t r0, int32_t n) {
    return tr_sample_rows_ranked(g->row_draw + r0, n, g->model->tp.vocab);
}

// Queues the draws of rows [r0, r0 + n) from rows [0, n) of m->acts.logits with the backend's
// sample op, which also gives each token's logprob under the unmodified distribution, with
// logsoftmax_forward's arithmetic: the training path's number. Under tensor parallelism each
// rank holds its columns of the rows: the ranks draw together (tr_sample_tp_draw) and the
// logprob is the vocab-parallel log-softmax's. Only ids and logprobs come to the host, by
// download_draws.
static int queue_draws(tr_generator *g, int32_t r0, int32_t n, tr_err *err) {
    tr_model *m = g->model;
    tr_backend *be = m->be;
    be->ops->upload(be, g->d_draw + r0, g->row_draw + r0, (size_t)n * sizeof(tr_sample_row));
    if (m->tp.size == 1) {
        be->ops->sample(be, g->d_target + r0, g->d_lp + r0, m->acts.logits, g->d_draw + r0, n,
                        m->tp.vocab, draws_ranked(g, r0, n), g->sample_scratch, g->d_near);
        return 0;
    }
    // The logprob is the training path's vocab-parallel one, its bits too.
    if (tr_sample_tp_draw(&g->vp, g->d_target + r0, g->d_draw + r0, g->row_draw + r0, n, g->d_near,
                          err) != 0 ||
        tr_lm_head_vp_logprob(m, g->d_target + r0, n, g->d_lp + r0, err) != 0)
        return -1;
    return 0;
}

static void download_draws(tr_generator *g, int32_t n) {
    tr_backend *be = g->model->be;
    be->ops->download(be, g->row_target, g->d_target, (size_t)n * sizeof(int32_t));
    be->ops->download(be, g->row_lp, g->d_lp, (size_t)n * sizeof(float));
}

// After the sync: output outs[i] takes row r0 + i's id and logprob, and its stream moves past
// the draw the op made from its position.
static void take_draws(gen_run *run, const int32_t *outs, int32_t n, int32_t r0) {
    tr_generator *g = run->g;
    for (int32_t i = 0; i < n; i++) {
        tr_gen_output *o = &run->outs[outs[i]];
        const tr_gen_request *r = &run->reqs[o->request];
        if (r->sampling.temperature > 0.0f) tr_sample_uniform(&run->rngs[outs[i]]);
        o->tokens[o->n_tokens] = g->row_target[r0 + i];
        o->logprobs[o->n_tokens] = g->row_lp[r0 + i];
        o->n_tokens++;
        finish_check(r, &run->groups[o->request], o);
    }
}

// Draws the next token of outputs outs[0..n) from rows [0, n) of m->acts.logits, now.
static int draw_rows_now(gen_run *run, const int32_t *outs, int32_t n, tr_err *err) {
    tr_generator *g = run->g;
    g->dev_rows = 0;   // the draws land where a decode step's rows read their tokens
    fill_draws(run, outs, n, 0);
    if (queue_draws(g, 0, n, err) != 0) return -1;
    download_draws(g, n);
    if (tr_dev_sync(g->model->be, "generate: sampling", err) != 0) return -1;
    take_draws(run, outs, n, 0);
    return 0;
}

// Draws the next token of outputs outs[0..n) from the first row of m->acts.logits (the
// prompt's last row: the samples of one prompt), now.
static int sample_rows_same(gen_run *run, const int32_t *outs, int32_t n, tr_err *err) {
    tr_backend *be = run->g->model->be;
    const size_t row = (size_t)run->g->model->tp.vocab * tr_dt_size(run->g->model->act);
    char *logits = run->g->model->acts.logits;
    for (int32_t i = 1; i < n; i++) be->ops->copy(be, logits + (size_t)i * row, logits, row);
    return draw_rows_now(run, outs, n, err);
}

// Logits of rows [r0, r0 + n) of the pass into acts.logits (this rank's columns), in the
// activation dtype, which the sample op reads.
static int pass_logits(tr_generator *g, int32_t r0, int32_t n, tr_err *err) {
    return tr_lm_head_chunk_logits(g->model, r0, n, err);
}

// Samples the first token of each sample of a request from its prompt's last logits row
// (row 0 of m->acts.logits), as many at a time as the logit rows hold.
static int sample_first(gen_run *run, int32_t req, tr_err *err) {
    tr_generator *g = run->g;
    const tr_gen_request *r = &run->reqs[req];
    const gen_group *grp = &run->groups[req];
    const int32_t R = g->logit_rows;
    for (int32_t j0 = 0; j0 < r->n_samples; j0 += R) {
        int32_t n = r->n_samples - j0 < R ? r->n_samples - j0 : R;
        for (int32_t i = 0; i < n; i++) g->row_out[i] = grp->out0 + j0 + i;
        if (sample_rows_same(run, g->row_out, n, err) != 0) return -1;
    }
    return 0;
}

// Logits rows [0, n) (one a request) expanded in place into one row a sample: request i's
// row to rows [off_i, off_i + S_i), off_i = S_0 + .. + S_(i-1) >= i. In reverse order, so
// that no row is overwritten before it is copied.
static void expand_rows(gen_run *run, const int32_t *reqs, int32_t n, int32_t total) {
    tr_backend *be = run->g->model->be;
    const size_t row = (size_t)run->g->model->tp.vocab * tr_dt_size(run->g->model->act);
    char *logits = run->g->model->acts.logits;
    int32_t off = total;
    for (int32_t i = n - 1; i >= 0; i--) {
        off -= run->reqs[reqs[i]].n_samples;
        for (int32_t j = 0; j < run->reqs[reqs[i]].n_samples; j++)
            if (off + j != i)
                be->ops->copy(be, logits + (size_t)(off + j) * row, logits + (size_t)i * row, row);
    }
}

// The requests whose last prompt row ran in this pass sample their first tokens: their last
// rows gathered to the front of lnf (row j from a row >= j, in order: nothing still needed is
// overwritten), then as many requests at a time as the logit rows hold all their samples,
// with one LM-head product, one draw and one wait each. A request with more samples than
// that draws alone, in slices.
static int first_draws(gen_run *run, tr_err *err) {
    tr_generator *g = run->g;
    tr_model *m = g->model;
    const size_t row = (size_t)m->cfg.hidden_size * tr_dt_size(m->act);
    int32_t *fin = g->fin_reqs;
    int32_t k = 0;
    for (int32_t s = 0; s < g->n_segs; s++) {
        const tr_gen_segment *sg = &g->segs[s];
        gen_group *grp = &run->groups[sg->request];
        grp->done += sg->n;
        grp->kv.len = grp->done;
        if (grp->done < run->reqs[sg->request].n_prompt) continue;
        int32_t src = sg->r0 + sg->n - 1;
        if (src != k)
            m->be->ops->copy(m->be, (char *)m->acts.lnf + (size_t)k * row,
                             (char *)m->acts.lnf + (size_t)src * row, row);
        fin[k++] = sg->request;
    }
    const int32_t R = g->logit_rows;
    for (int32_t i0 = 0; i0 < k;) {
        int32_t i1 = i0, rows = 0;
        while (i1 < k && rows + run->reqs[fin[i1]].n_samples <= R)
            rows += run->reqs[fin[i1++]].n_samples;
        if (i1 == i0) {
            if (pass_logits(g, i0, 1, err) != 0 || sample_first(run, fin[i0], err) != 0) return -1;
            i0++;
            continue;
        }
        if (pass_logits(g, i0, i1 - i0, err) != 0) return -1;
        expand_rows(run, fin + i0, i1 - i0, rows);
        int32_t n = 0;
        for (int32_t i = i0; i < i1; i++)
            for (int32_t j = 0; j < run->reqs[fin[i]].n_samples; j++)
                g->row_out[n++] = run->groups[fin[i]].out0 + j;
        if (draw_rows_now(run, g->row_out, n, err) != 0) return -1;
        i0 = i1;
    }
    return 0;
}

// The pass's segments as documents for gen_attend when one of them starts a prompt (its
// rows' positions are the model's, uploaded with the pass).
static void pass_docs_set(tr_generator *g, int32_t n) {
    g->pass_docs.n_docs = 0;
    bool any = false;
    for (int32_t s = 0; s < g->n_segs; s++) {
        g->seg_docs[s] = g->segs[s].r0;
        any = any || g->segs[s].start == 0;
    }
    if (!any) return;
    g->seg_docs[g->n_segs] = n;
    tr_model *m = g->model;
    m->be->ops->upload(m->be, g->d_seg_docs, g->seg_docs, ((size_t)g->n_segs + 1) * sizeof(int32_t));
    g->pass_docs = (tr_doc_layout){.n_tokens = n, .n_docs = g->n_segs, .doc_start = g->d_seg_docs,
                                   .pos = m->d_pos, .prefix = NULL};
}

// Admits requests in order while the pool can hold each one's prompt plus one sample, and
// prefills them in passes of up to max_rows rows. Returns the number admitted, or -1.
static int32_t prefill_round(gen_run *run, tr_err *err) {
    tr_generator *g = run->g;
    tr_model *m = g->model;
    const int32_t bs = g->cache.block_size;
    int32_t first = run->next_req, k = 0;
    int64_t rows = 0;
    while (first + k < run->n_reqs) {
        const tr_gen_request *r = &run->reqs[first + k];
        gen_group *grp = &run->groups[first + k];
        int32_t pb = tr_kv_blocks_for(r->n_prompt, bs);
        if (k > 0 && rows + r->n_prompt > g->max_rows) break;
        if (g->n_active + k == g->max_seqs) break;
        if (unreserved(g) < pb + grp->sample_res) {
            g->stats.waits++;
            break;
        }
        for (int32_t b = 0; b < pb; b++)
            grp->kv.blocks[grp->kv.n_blocks++] = tr_kvcache_alloc(&g->cache);
        grp->holding = true;
        grp->reserved = grp->sample_res;
        g->reserved += grp->reserved;
        rows += r->n_prompt;
        k++;
    }
    note_blocks(g);
    if (k == 0) return 0;
    // Passes: rows of the admitted prompts in order, a prompt split where a pass fills up.
    int32_t cur = first;
    while (cur < first + k) {
        int32_t n = 0;
        g->n_segs = 0;
        for (int32_t q = cur; q < first + k && n < g->max_rows; q++) {
            const tr_gen_request *r = &run->reqs[q];
            gen_group *grp = &run->groups[q];
            if (grp->done == r->n_prompt) continue;
            int32_t take = r->n_prompt - grp->done;
            if (take > g->max_rows - n) take = g->max_rows - n;
            int32_t *table = g->d_seg_tables + (size_t)g->n_segs * g->table_cap;
            m->be->ops->upload(m->be, table, grp->kv.blocks,
                               (size_t)grp->kv.n_blocks * sizeof(int32_t));
            g->segs[g->n_segs++] = (tr_gen_segment){.r0 = n, .n = take, .table = table,
                                                    .stride = 0, .request = q,
                                                    .start = grp->done};
            for (int32_t t = 0; t < take; t++, n++) {
                int32_t p = grp->done + t;
                g->row_ids[n] = r->prompt[p];
                g->row_pos[n] = p;
                g->row_slot[n] = tr_kv_seq_slot(&grp->kv, p, bs);
                g->row_len[n] = p + 1;
            }
        }
        upload_rows(g, g->row_slot, g->row_len, n);
        g->dev_rows = 0;   // the pass writes the rows a decode step continues from
        pass_docs_set(g, n);
        int rc = tr_model_forward_rows(m, g->row_ids, g->row_pos, n, gen_attend, g, err);
        g->pass_docs.n_docs = 0;   // decode steps read every row from the cache
        if (rc != 0) return -1;
        g->stats.passes++;
        g->stats.prefill_tokens += n;
        if (first_draws(run, err) != 0) return -1;
        while (cur < first + k && run->groups[cur].done == run->reqs[cur].n_prompt) cur++;
    }
    run->next_req = first + k;
    return k;
}

static double seconds_between(const struct timespec *a, const struct timespec *b) {
    return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

// The bucket of n: the next power of two, at most cap.
static int32_t bucket(int32_t n, int32_t cap) {
    int32_t b = 1;
    while (b < n && b < cap) b *= 2;
    return b < cap ? b : cap;
}

// The device half of a decode step over the B rows the host prepared: the block-table
// entries that changed (tables_update) and the rows that changed (the rest advanced on the
// device by decode_rows), the trunk, the LM head and the
// draws chunk by chunk, and the downloads of ids and logprobs. What a recorded step replays.
static int queue_decode(tr_generator *g, int32_t B, tr_err *err) {
    tr_model *m = g->model;
    const int32_t U = g->n_table_upd;
    m->be->ops->upload(m->be, g->d_table_upd, g->table_upd, 2 * (size_t)U * sizeof(int32_t));
    m->be->ops->scatter_rows(m->be, g->d_tables, g->d_table_upd + U, g->d_table_upd, U,
                             sizeof(int32_t));
    m->be->ops->upload(m->be, g->d_patch, g->row_patch, (1 + 3 * (size_t)B) * sizeof(int32_t));
    const tr_decode_rows_args rows = {
        .ids = m->d_ids, .pos = m->d_pos, .slot = g->d_slot, .len = g->d_len,
        .doc_start = m->d_doc_start, .emb_ids = m->tp.size > 1 ? m->d_emb_ids : NULL,
        .drawn = g->d_target, .patch = g->d_patch, .tables = g->d_tables, .w = g->table_w,
        .bs = g->cache.block_size, .n = B, .v0 = m->tp.vocab0, .V = m->tp.vocab};
    m->be->ops->decode_rows(m->be, &rows);
    if (tr_model_rows_queue(m, B, gen_attend, g, err) != 0) return -1;
    for (int32_t r0 = 0, R = g->logit_rows; r0 < B; r0 += R) {
        int32_t n = B - r0 < R ? B - r0 : R;
        if (pass_logits(g, r0, n, err) != 0 || queue_draws(g, r0, n, err) != 0) return -1;
    }
    download_draws(g, B);
    return 0;
}

// A failed graph call: the backend's recorded failure, or a plain one if it kept none.
static int graph_failed(tr_backend *be, const char *what, tr_err *err) {
    if (tr_dev_sync(be, what, err) == 0) tr_errf(err, TR_EDEVICE, "%s failed", what);
    return -1;
}

static void drop_oldest_graph(tr_generator *g) {
    g->model->be->ops->graph_free(g->model->be, g->graphs[0].exec);
    memmove(g->graphs, g->graphs + 1, (size_t)(g->n_graphs - 1) * sizeof(tr_gen_graph));
    g->n_graphs--;
}

// The recorded step for B rows of width w, recorded now if the shape was seen once before;
// NULL for a shape's first step, or when the backend declines to record (a debugging mode):
// the caller then queues the step itself.
static int decode_graph(tr_generator *g, int32_t B, int32_t w, void **exec, tr_err *err) {
    tr_model *m = g->model;
    tr_backend *be = m->be;
    *exec = NULL;
    // Recorded pointers go stale when the arena or the KV pool moved.
    if (g->graph_acts != m->arena || g->graph_kv != g->cache.k) {
        free_graphs(g);
        g->graph_acts = m->arena;
        g->graph_kv = g->cache.k;
    }
    // the sort is recorded or not by the draws' parameters (queue_draws), so they key it too
    const bool ranked = draws_ranked(g, 0, B);
    tr_gen_graph *seen = NULL;
    for (int32_t i = 0; i < g->n_graphs && !seen; i++) {
        tr_gen_graph *gr = &g->graphs[i];
        if (gr->rows == B && gr->width == w && gr->ranked == ranked && gr->weights == m->work)
            seen = gr;
    }
    if (seen && seen->exec) {
        *exec = seen->exec;
        return 0;
    }
    // A shape's first step runs op by op and its second is recorded: the backend settles
    // what a recording cannot do on first use (a product's kernel timed among those of equal
    // bits, kernels/cuda/gemm_lt.cu).
    if (!seen) {
        if (g->n_graphs == TR_GEN_GRAPHS) drop_oldest_graph(g);
        g->graphs[g->n_graphs++] = (tr_gen_graph){.rows = B, .width = w, .ranked = ranked,
                                                  .weights = m->work, .exec = NULL};
        return 0;
    }
    int rc = be->ops->graph_begin(be);
    if (rc == 1) {   // not now, nor later in this process: steps run op by op
        g->record_steps = false;
        return 0;
    }
    if (rc != 0) return graph_failed(be, "generate: recording a decode step", err);
    rc = queue_decode(g, B, err);
    void *x = NULL;
    // The recording ends whatever happened, so that the queue runs ops again.
    if (be->ops->graph_end(be, &x) != 0 && rc == 0)
        rc = graph_failed(be, "generate: recording a decode step", err);
    if (rc != 0) {
        if (x) be->ops->graph_free(be, x);
        return -1;
    }
    seen->exec = x;
    g->stats.graphs_recorded++;
    *exec = x;
    return 0;
}

// Row i of the step's patch (kept in row order): token id at position pos (-1: padding).
static void patch_row(tr_generator *g, int32_t i, int32_t id, int32_t pos) {
    int32_t *e = g->row_patch + 1 + 3 * g->row_patch[0]++;
    e[0] = i;
    e[1] = id;
    e[2] = pos;
}

// Row i of a step as padding: token 0 at position 0, writing nothing into the cache (slot
// -1) and reading one slot of the first block its device table row names (a block of the
// pool, whatever it holds: rows past the last rewrite's are zeros, or a retired sample's),
// drawn greedily.
static void pad_row(tr_generator *g, int32_t i) {
    g->row_draw[i] = (tr_sample_row){.temperature = 0.0f, .top_p = 1.0f};
    patch_row(g, i, 0, -1);
}

// The device's block tables for a step of B rows at width w (see tr_generator.tables_dev):
// the entries of the changed rows' tables (dirty) that differ from what the device holds go into
// table_upd for the step to scatter; a new width, or more changes than table_upd holds,
// rewrites every row now instead (rows past B as zeros), and the step's pairs all write the
// dummy area.
static void tables_update(tr_generator *g, int32_t B, int32_t w) {
    const int32_t U = g->n_table_upd;
    int32_t *idx = g->table_upd, *blk = g->table_upd + U, n = 0;
    bool whole = w != g->table_w;
    // Only rows that changed can differ: a row that continues (same output, no block taken)
    // kept its table since the last step's update.
    for (int32_t d = 0; d < g->n_dirty && !whole; d++) {
        const int32_t i = g->dirty[d];
        const tr_kv_seq *kv = &g->slots[i].kv;
        int32_t *row = g->tables_dev + (size_t)i * w;
        for (int32_t j = 0; j < kv->n_blocks; j++) {
            if (row[j] == kv->blocks[j]) continue;
            if (n == U) {
                whole = true;
                break;
            }
            idx[n] = i * w + j;
            blk[n++] = kv->blocks[j];
            row[j] = kv->blocks[j];
        }
    }
    if (whole) {
        tr_backend *be = g->model->be;
        for (int32_t i = 0; i < g->max_seqs; i++) {
            int32_t *row = g->tables_dev + (size_t)i * w, nb = 0;
            if (i < B) {
                nb = g->slots[i].kv.n_blocks;
                memcpy(row, g->slots[i].kv.blocks, (size_t)nb * sizeof(int32_t));
            }
            for (int32_t j = nb; j < w; j++) row[j] = 0;
        }
        be->ops->upload(be, g->d_tables, g->tables_dev,
                        (size_t)g->max_seqs * w * sizeof(int32_t));
        g->table_w = w;
        g->stats.table_rewrites++;
        n = 0;
    }
    g->stats.table_entries += n;
    // distinct dummies past the tables, as the scatter needs
    const int32_t dummy = g->max_seqs * g->table_cap;
    for (int32_t k = n; k < U; k++) {
        idx[k] = dummy + k;
        blk[k] = 0;
    }
}

// Each running sample's row of a decode step: its next cache slot taken (a copy on write
// queued where its last block is shared) and a patch entry where the row did not run the last
// step for the same output (rows advance on the device). *ctx: the keys (and values) the rows
// read.
static int step_rows(gen_run *run, double *ctx, tr_err *err) {
    tr_generator *g = run->g;
    const int32_t B = g->n_active, cont = g->dev_rows;
    g->dev_rows = 0;   // until this step has run
    g->row_patch[0] = 0;
    g->n_dirty = 0;
    for (int32_t i = 0; i < B; i++) {
        tr_gen_slot *s = &g->slots[i];
        const tr_gen_output *o = &run->outs[s->out];
        int32_t pos = s->kv.len;
        int32_t took = tr_kv_seq_prepare(&g->cache, &s->kv, pos, err);
        if (took < 0) return tr_err_wrap(err, "generate: output %d", s->out);
        s->reserved -= took;
        g->reserved -= took;
        s->kv.len = pos + 1;
        const bool moved = i >= cont || g->dev_out[i] != s->out;
        if (moved) patch_row(g, i, o->tokens[o->n_tokens - 1], pos);
        if (moved || took > 0) g->dirty[g->n_dirty++] = i;   // its table may have changed
        g->dev_out[i] = s->out;
        g->row_out[i] = s->out;
        *ctx += pos + 1;
    }
    return 0;
}

// Retires the finished samples; the last running one moves into each freed slot.
static void retire_finished(gen_run *run) {
    tr_generator *g = run->g;
    for (int32_t i = 0; i < g->n_active;) {
        tr_gen_slot *s = &g->slots[i];
        if (run->outs[s->out].finish == TR_GEN_RUNNING) {
            i++;
            continue;
        }
        tr_kv_seq_release(&g->cache, &s->kv);
        g->reserved -= s->reserved;
        s->reserved = 0;
        int32_t last = --g->n_active;
        if (i != last) {
            tr_gen_slot *l = &g->slots[last];
            int32_t *table = g->tables + (size_t)i * g->table_cap;
            memcpy(table, l->kv.blocks, (size_t)l->kv.n_blocks * sizeof(int32_t));
            s->out = l->out;
            s->reserved = l->reserved;
            s->kv = l->kv;
            s->kv.blocks = table;
        }
    }
}

// One decode step: every running sample feeds its last token and samples the next.
static int decode_step(gen_run *run, tr_err *err) {
    tr_generator *g = run->g;
    tr_model *m = g->model;
    const int32_t B = g->n_active;
    struct timespec t0, t_sched, t_retire, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double ctx = 0;   // keys (and values) the step's rows read
    // Rows advance on the device: a row that ran the last step (a decode step, the last pass)
    // for the same output continues there without a word.
    if (step_rows(run, &ctx, err) != 0) return -1;
    tr_kvcache_flush(&g->cache);
    note_blocks(g);
    // The block tables are rows as wide as the widest of this step (or its bucket): a row's
    // capacity (table_cap) covers the longest sequence the pool could hold, and is mostly
    // unused.
    int32_t w = 1;
    for (int32_t i = 0; i < B; i++)
        if (g->slots[i].kv.n_blocks > w) w = g->slots[i].kv.n_blocks;
    int32_t Bp = B;
    if (g->pad_steps) {
        Bp = bucket(B, g->max_seqs);
        w = bucket(w, g->table_cap);
    }
    tables_update(g, B, w);
    fill_draws(run, g->row_out, B, 0);
    for (int32_t i = B; i < Bp; i++) pad_row(g, i);
    if (tr_model_rows_prepare(m, Bp, err) != 0) return -1;
    g->segs[0] = (tr_gen_segment){.r0 = 0, .n = Bp, .table = g->d_tables, .stride = w, .request = -1};
    g->n_segs = 1;
    clock_gettime(CLOCK_MONOTONIC, &t_sched);
    void *exec = NULL;
    if (g->record_steps && decode_graph(g, Bp, w, &exec, err) != 0) return -1;
    if (exec) {
        if (m->be->ops->graph_launch(m->be, exec) != 0)
            return graph_failed(m->be, "generate: replaying a decode step", err);
        g->stats.graph_steps++;
    } else if (queue_decode(g, Bp, err) != 0) {
        return -1;
    }
    if (tr_dev_sync(m->be, "generate: decode step", err) != 0) return -1;
    g->dev_rows = B;
    g->stats.passes++;
    g->stats.decode_steps++;
    g->stats.decode_tokens += B;
    g->stats.padded_rows += Bp - B;
    g->stats.rows_sent += g->row_patch[0];
    const tr_kvcache *c = &g->cache;
    g->stats.decode_bytes += (double)m->layout.total * tr_dt_size(m->wt) +
                             ctx * 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * tr_dt_size(c->dt);
    take_draws(run, g->row_out, B, 0);
    clock_gettime(CLOCK_MONOTONIC, &t_retire);
    retire_finished(run);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    g->stats.decode_seconds += seconds_between(&t0, &t1);
    g->stats.host_seconds += seconds_between(&t0, &t_sched) + seconds_between(&t_retire, &t1);
    return 0;
}

// Returns every block a failed run still holds, so the pool is whole again.
static void release_all(gen_run *run) {
    tr_generator *g = run->g;
    for (int32_t i = 0; i < g->n_active; i++) tr_kv_seq_release(&g->cache, &g->slots[i].kv);
    g->n_active = 0;
    for (int32_t q = 0; q < run->n_reqs; q++)
        if (run->groups[q].holding) tr_kv_seq_release(&g->cache, &run->groups[q].kv);
    g->reserved = 0;
}

// A generator on a worker arena runs only in the generation phase that laid out its model's
// views and its KV pool: a forward or train phase in between overwrote both.
static int check_phase(const tr_generator *g, tr_err *err) {
    const tr_arena *a = g->model->shared;
    if (!a) return 0;
    if (g->shared == a && a->phase == TR_PHASE_GENERATE && a->holder == g->model &&
        a->epoch == g->shared_epoch)
        return 0;
    return tr_errf(err, TR_EINVAL, "generate: the worker arena is in phase %s, not a generation "
                   "phase begun for this generator", tr_arena_phase_name(a->phase));
}

// Each request's group (its prompt's blocks from group_tables, its samples' reservation) and
// its samples' outputs and streams. Returns 0, or -1 with err set (out of memory).
static int start_groups(gen_run *run, int32_t *group_tables, tr_err *err) {
    tr_generator *g = run->g;
    int32_t o = 0;
    int64_t t_off = 0;
    for (int32_t i = 0; i < run->n_reqs; i++) {
        const tr_gen_request *r = &run->reqs[i];
        gen_group *grp = &run->groups[i];
        int32_t pb = tr_kv_blocks_for(r->n_prompt, g->cache.block_size);
        tr_kv_seq_init(&grp->kv, group_tables + t_off, pb);
        t_off += pb;
        grp->out0 = o;
        grp->sample_res = tr_gen_sample_blocks(r->n_prompt, r->max_new_tokens,
                                               g->cache.block_size);
        for (int32_t j = 0; j < r->n_samples; j++, o++) {
            tr_gen_output *out = &run->outs[o];
            memset(out, 0, sizeof *out);
            out->request = i;
            out->sample = j;
            out->finish = TR_GEN_RUNNING;
            out->tokens = malloc((size_t)r->max_new_tokens * sizeof(int32_t));
            out->logprobs = malloc((size_t)r->max_new_tokens * sizeof(float));
            if (!out->tokens || !out->logprobs)
                return tr_errf(err, TR_ENOMEM, "generate: out of memory for the outputs of "
                               "request %d", i);
            tr_rng_init(&run->rngs[o], tr_rng_derive(r->seed, (uint64_t)j));
        }
    }
    return 0;
}

// Prefill rounds and decode steps until every sample has finished. Returns 0, or -1 with err
// set.
static int run_passes(gen_run *run, tr_err *err) {
    tr_generator *g = run->g;
    for (;;) {
        if (start_samples(run, err) != 0) return -1;
        if (run->head == run->next_req && run->next_req < run->n_reqs) {
            int32_t k = prefill_round(run, err);
            if (k < 0) return -1;
            if (k > 0) {
                if (g->on_pass) g->on_pass(g->on_pass_ctx, &g->stats);
                continue;
            }
        }
        if (g->n_active == 0) {
            if (run->next_req == run->n_reqs && run->head == run->n_reqs) return 0;
            // Unreachable when admission works: nothing runs, so the whole pool is free.
            return tr_errf(err, TR_EINVAL, "generate: no request can start (%d of %d KV "
                           "blocks free, %d reserved)", g->cache.n_free, g->cache.n_blocks,
                           g->reserved);
        }
        if (decode_step(run, err) != 0) return -1;
        if (g->on_pass) g->on_pass(g->on_pass_ctx, &g->stats);
    }
}

int tr_generate(tr_generator *g, const tr_gen_request *reqs, int32_t n_reqs,
                tr_gen_output *outs, tr_err *err) {
    memset(&g->stats, 0, sizeof g->stats);
    if (check_phase(g, err) != 0) return -1;
    if (n_reqs < 0) return tr_errf(err, TR_EINVAL, "generate: %d requests", n_reqs);
    int64_t n_out = 0, prompt_blocks = 0;
    for (int32_t i = 0; i < n_reqs; i++) {
        if (check_request(g, &reqs[i], i, err) != 0) return -1;
        n_out += reqs[i].n_samples;
        prompt_blocks += tr_kv_blocks_for(reqs[i].n_prompt, g->cache.block_size);
    }
    if (n_out > INT32_MAX / 2)
        return tr_errf(err, TR_ERANGE, "generate: %lld samples is too many", (long long)n_out);
    gen_run run = {.g = g, .reqs = reqs, .n_reqs = n_reqs, .outs = outs};
    run.rngs = malloc((size_t)(n_out ? n_out : 1) * sizeof(tr_rng));
    run.groups = calloc(n_reqs > 0 ? (size_t)n_reqs : 1, sizeof(gen_group));
    int32_t *group_tables = malloc((size_t)(prompt_blocks ? prompt_blocks : 1) * sizeof(int32_t));
    int rc = 0;
    for (int64_t i = 0; i < n_out; i++) {
        outs[i].tokens = NULL;
        outs[i].logprobs = NULL;
    }
    if (!run.rngs || !run.groups || !group_tables) {
        rc = tr_errf(err, TR_ENOMEM, "generate: out of memory for %lld samples",
                     (long long)n_out);
        goto done;
    }
    if (sort_stops(&run, err) != 0) {
        rc = -1;
        goto done;
    }
    rc = start_groups(&run, group_tables, err);
    // Fresh block tables every call: the pool holds nothing between calls, and the device's
    // copy is rewritten at the first step (so a call's statistics do not depend on the last).
    tr_kvcache_reset(&g->cache);
    g->table_w = 0;
    g->dev_rows = 0;
    int32_t zero = 0, near = 0;
    g->model->be->ops->upload(g->model->be, g->d_near, &zero, sizeof zero);
    g->n_active = 0;
    g->reserved = 0;
    if (rc == 0) rc = run_passes(&run, err);
    if (rc == 0) {
        g->model->be->ops->download(g->model->be, &near, g->d_near, sizeof near);
        rc = tr_dev_sync(g->model->be, "generate", err);
        g->stats.near_draws = near;
    }
done:
    if (rc != 0) {
        release_all(&run);
        tr_gen_outputs_free(outs, n_out);
    }
    free(run.rngs);
    free(run.groups);
    free(run.stop_buf);
    free(group_tables);
    return rc;
}
