// Hugging Face checkpoint directories: config.json plus model.safetensors, or shards
// model-0000i-of-0000n.safetensors with model.safetensors.index.json, plus tokenizer files.
// Loading fills the flat parameter buffer of tr_param_layout and checks every tensor;
// saving builds the whole directory under a temporary name and renames it into place.
#pragma once
#include <stdbool.h>
#include <stdint.h>

#include "engine/config.h"
#include "engine/err.h"
#include "engine/params.h"
#include "engine/safetensors.h"

typedef struct tr_ckpt_save_opts {
    enum tr_st_dtype dtype;      // TR_ST_F32 or TR_ST_BF16
    uint64_t max_shard_bytes;    // 0: one model.safetensors; else shards of at most this many
                                 // bytes (a larger tensor gets a shard of its own)
    const char *tokenizer_dir;   // copy tokenizer files from here; NULL: none
} tr_ckpt_save_opts;

// Files tr_checkpoint_save copies from tokenizer_dir when present (NULL-terminated).
extern const char *const tr_ckpt_tokenizer_files[];

// Reads DIR/config.json.
int tr_checkpoint_load_config(const char *dir, tr_model_config *cfg, tr_err *err);
// Reads DIR/config.json and requires a causal LM (not a score or value model); `what` names
// the use in the error ("generate needs a causal LM").
int tr_checkpoint_load_lm_config(const char *dir, const char *what, tr_model_config *cfg,
                                 tr_err *err);

// Loads the weights of DIR into buf (layout->total floats, layout built from cfg); padding
// between tensors is zeroed. Every tensor of the layout must be present with its shape;
// tensors the model does not have are errors, except rotary inv_freq buffers and, for a
// tied model, an lm_head.weight equal to the embedding. buf == NULL only validates (headers,
// names, shapes, dtypes) without reading data.
int tr_checkpoint_load(const char *dir, const tr_model_config *cfg,
                       const tr_param_layout *layout, float *buf, tr_err *err);
// Same, but loads only the transformer body (model.*): head tensors of the file (lm_head,
// score) are ignored and the head's part of buf is left untouched, so a critic or reward
// model can start from a policy checkpoint.
int tr_checkpoint_load_backbone(const char *dir, const tr_model_config *cfg,
                                const tr_param_layout *layout, float *buf, tr_err *err);

// Receives one tensor of a checkpoint being loaded: d->numel values of dtype dt (F32, BF16 or
// F16; an F64 file arrives narrowed to F32) at data, unaligned, valid until it returns.
typedef int (*tr_ckpt_sink)(void *ctx, const tr_tensor_desc *d, const void *data,
                            enum tr_st_dtype dt, tr_err *err);
// Loads like tr_checkpoint_load (or _backbone), with the same checks, handing each tensor to
// sink as the file holds it, so the caller can move raw bytes to a device and convert there.
int tr_checkpoint_load_to(const char *dir, const tr_model_config *cfg,
                          const tr_param_layout *layout, bool backbone_only, tr_ckpt_sink sink,
                          void *ctx, tr_err *err);

// Writes cfg, the weights and (optionally) tokenizer files as an HF directory DIR. Everything
// is written to DIR.tmp.<pid> first and renamed into place; an existing DIR (which must hold
// a config.json, or be empty) is replaced as a whole only after the new one is complete.
int tr_checkpoint_save(const char *dir, const tr_model_config *cfg,
                       const tr_param_layout *layout, const float *buf,
                       const tr_ckpt_save_opts *opts, tr_err *err);
