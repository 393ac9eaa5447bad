// Tensor-parallel shapes: the split of heads, intermediate channels and vocabulary rows over
// the ranks of a group, with the checks that make a split impossible an error up front.
#include "engine/tp.h"

int32_t tr_tp_vocab_begin(int32_t vocab, int32_t size, int32_t r) {
    return (int32_t)((int64_t)vocab * r / size);
}

int32_t tr_tp_seq_begin(int32_t T, int32_t size, int32_t r) {
    return tr_tp_vocab_begin(T, size, r);
}

int32_t tr_tp_seq_max_rows(int32_t T, int32_t size) {
    return (T + size - 1) / size;
}

int tr_tp_init(tr_tp *tp, const tr_model_config *cfg, int32_t size, int32_t rank, tr_err *err) {
    *tp = (tr_tp){0};
    if (size < 1 || rank < 0 || rank >= size)
        return tr_errf(err, TR_EINVAL, "tensor parallel: rank %d of %d", rank, size);
    const int32_t H = cfg->n_heads, KVH = cfg->n_kv_heads;
    if (H % size != 0)
        return tr_errf(err, TR_EINVAL, "tensor parallel: tp %d does not divide the %d query "
                       "heads (num_attention_heads); use a tp that divides %d", size, H, H);
    if (KVH < 1 || H % KVH != 0)
        return tr_errf(err, TR_EINVAL, "tensor parallel: num_attention_heads %d is not a "
                       "multiple of num_key_value_heads %d", H, KVH);
    if (KVH % size != 0 && size % KVH != 0)
        return tr_errf(err, TR_EINVAL, "tensor parallel: the %d key/value heads can neither be "
                       "split over tp %d ranks nor replicated on them (tp must divide them or "
                       "be a multiple of them)", KVH, size);
    if (cfg->intermediate_size % size != 0)
        return tr_errf(err, TR_EINVAL, "tensor parallel: tp %d does not divide "
                       "intermediate_size %d", size, cfg->intermediate_size);
    if (cfg->vocab_size < size)
        return tr_errf(err, TR_EINVAL, "tensor parallel: tp %d exceeds the %d-token vocabulary",
                       size, cfg->vocab_size);
    tp->size = size;
    tp->rank = rank;
    tp->n_heads = H / size;
    if (KVH >= size) {
        tp->n_kv_heads = KVH / size;
        tp->kv_head0 = rank * tp->n_kv_heads;
        tp->kv_replicas = 1;
    } else {
        // Fewer key/value heads than ranks: each is held by size / KVH consecutive ranks,
        // whose query heads are exactly that head's group.
        tp->n_kv_heads = 1;
        tp->kv_replicas = size / KVH;
        tp->kv_head0 = rank / tp->kv_replicas;
    }
    tp->inter = cfg->intermediate_size / size;
    tp->vocab0 = tr_tp_vocab_begin(cfg->vocab_size, size, rank);
    tp->vocab = tr_tp_vocab_begin(cfg->vocab_size, size, rank + 1) - tp->vocab0;
    return 0;
}

tr_model_config tr_tp_local_config(const tr_model_config *cfg, const tr_tp *tp) {
    tr_model_config c = *cfg;
    c.n_heads = tp->n_heads;
    c.n_kv_heads = tp->n_kv_heads;
    c.intermediate_size = tp->inter;
    return c;
}
