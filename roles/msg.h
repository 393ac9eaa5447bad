// Wire messages of the roles protocol (docs/protocol.md, v2): msgpack maps for requests
// {v, op, id, args}, replies {v, id, ok, result | error} and tensors {dtype, shape, data}.
// Decoding is strict and zero-copy: strings and tensor data are views into the received
// buffer, which must outlive the decoded tr_msg.
#pragma once
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/err.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the roles protocol sends tensors as raw little-endian bytes; big-endian hosts are not supported"
#endif

#define TR_PROTOCOL_VERSION 2
#define TR_MSG_MAX_BYTES_DEFAULT ((uint64_t)1 << 30)
// A message may hold at most this many msgpack objects (bulk data travels as tensors), so a
// lying header cannot make the decoder allocate more than ~24 bytes per object.
#define TR_MSG_MAX_OBJECTS ((uint64_t)1 << 22)
#define TR_MSG_MAX_DEPTH 24
#define TR_MSG_OP_MAX 32        // op names: [a-z][a-z0-9_]*, at most 31 bytes
#define TR_TENSOR_MAX_DIMS 8

enum tr_dtype { TR_DTYPE_F32, TR_DTYPE_BF16, TR_DTYPE_I32, TR_DTYPE_I64, TR_DTYPE_U8, TR_DTYPE_COUNT };

const char *tr_dtype_name(int dtype);        // "f32", ...; "?" when out of range
int tr_dtype_from_name(const char *s, size_t len);  // -1 when unknown
size_t tr_dtype_size(int dtype);             // bytes per element; 0 when out of range

// A tensor inside a received message. data points into the message buffer and is NOT
// aligned: copy it out with tr_tensor_view_copy (or memcpy) before typed access.
typedef struct tr_tensor_view {
    int dtype;
    int ndim;
    int64_t shape[TR_TENSOR_MAX_DIMS];
    int64_t numel;
    const void *data;
    size_t nbytes;
} tr_tensor_view;

// Copies the tensor into dst (cap bytes) after checking its dtype; -1 naming `what` if the
// dtype differs or dst is too small.
int tr_tensor_view_copy(const tr_tensor_view *t, int dtype, void *dst, size_t cap, const char *what,
                        tr_err *err);

// A string inside a received message: not NUL-terminated.
typedef struct tr_msg_str {
    const char *ptr;
    size_t len;
} tr_msg_str;

// A map or array inside a decoded message, with the path used in error messages
// ("generate: args.prompts[3].tokens: expected tensor, got str").
typedef struct tr_msg_map {
    const msgpack_object *obj;  // MSGPACK_OBJECT_MAP
    char op[TR_MSG_OP_MAX];     // the request's op (or "reply") for error messages
    char path[96];
} tr_msg_map;

typedef struct tr_msg_array {
    const msgpack_object *obj;  // MSGPACK_OBJECT_ARRAY
    char op[TR_MSG_OP_MAX];
    char path[96];
    uint32_t n;
} tr_msg_array;

enum tr_msg_kind { TR_MSG_REQUEST = 1, TR_MSG_REPLY = 2 };

// A decoded message. Requests fill op and args; ok replies fill result; error replies fill
// remote (the peer's error code and message). id 0 is reserved for messages that get no
// reply (heartbeats).
typedef struct tr_msg {
    int kind;
    uint32_t version;
    uint64_t id;
    bool has_id;     // id was read, even if decoding failed later (so an error reply can name it)
    char op[TR_MSG_OP_MAX];
    tr_msg_map args;     // request: "args"; ok reply: "result"
    bool ok;
    tr_err remote;       // error reply: code from the wire code name, message as sent
    msgpack_unpacked unpacked_;  // owns the object tree; strings/bins point into the buffer
} tr_msg;

// Decodes one message from buf (len bytes, at most max_bytes). On failure m is left empty
// (tr_msg_free is still safe) except for has_id/id/op, err names what is wrong, and
// err->code is TR_EFORMAT (malformed), TR_ERANGE (too large, too deep, too many objects) or
// TR_EUNSUPPORTED (another protocol version).
int tr_msg_decode(tr_msg *m, const void *buf, size_t len, uint64_t max_bytes, tr_err *err);
void tr_msg_free(tr_msg *m);

// Checks that buf holds exactly one well-formed msgpack object within the limits above
// (counts that fit in the remaining bytes, string map keys, no ext types). Used by the
// decoder before msgpack-c allocates anything.
int tr_msg_check_msgpack(const void *buf, size_t len, tr_err *err);

// Typed accessors. Errors name the op and the key path. The _opt variants leave *out
// untouched and return 0 when the key is absent, but a present key of the wrong type is
// an error. Floats accept integers; ints reject floats.
bool tr_msg_has(const tr_msg_map *m, const char *key);
int tr_msg_get_int(const tr_msg_map *m, const char *key, int64_t *out, tr_err *err);
int tr_msg_get_uint(const tr_msg_map *m, const char *key, uint64_t *out, tr_err *err);
int tr_msg_get_float(const tr_msg_map *m, const char *key, double *out, tr_err *err);
int tr_msg_get_bool(const tr_msg_map *m, const char *key, bool *out, tr_err *err);
int tr_msg_get_str(const tr_msg_map *m, const char *key, tr_msg_str *out, tr_err *err);
// Copies into buf with a NUL; a string that does not fit (or holds a NUL) is an error.
int tr_msg_get_str_buf(const tr_msg_map *m, const char *key, char *buf, size_t cap, tr_err *err);
int tr_msg_get_bin(const tr_msg_map *m, const char *key, tr_msg_str *out, tr_err *err);
int tr_msg_get_tensor(const tr_msg_map *m, const char *key, tr_tensor_view *out, tr_err *err);
int tr_msg_get_map(const tr_msg_map *m, const char *key, tr_msg_map *out, tr_err *err);
int tr_msg_get_array(const tr_msg_map *m, const char *key, tr_msg_array *out, tr_err *err);
int tr_msg_get_int_opt(const tr_msg_map *m, const char *key, int64_t *out, tr_err *err);
int tr_msg_get_float_opt(const tr_msg_map *m, const char *key, double *out, tr_err *err);
int tr_msg_get_bool_opt(const tr_msg_map *m, const char *key, bool *out, tr_err *err);
// Fails naming the first key of m that is not in keys (a NULL-terminated list).
int tr_msg_check_keys(const tr_msg_map *m, const char *const *keys, tr_err *err);

int tr_msg_array_int(const tr_msg_array *a, uint32_t i, int64_t *out, tr_err *err);
int tr_msg_array_float(const tr_msg_array *a, uint32_t i, double *out, tr_err *err);
int tr_msg_array_str(const tr_msg_array *a, uint32_t i, tr_msg_str *out, tr_err *err);
int tr_msg_array_tensor(const tr_msg_array *a, uint32_t i, tr_tensor_view *out, tr_err *err);
int tr_msg_array_map(const tr_msg_array *a, uint32_t i, tr_msg_map *out, tr_err *err);

// Wraps a msgpack map (e.g. from another protocol) for the accessors.
int tr_msg_map_wrap(tr_msg_map *out, const msgpack_object *obj, const char *op, const char *path,
                    tr_err *err);

// Message builder. Containers declare their element count up front (msgpack needs it); the
// writer checks every count and key placement and keeps the first error, so a sequence of
// puts can be checked once at tr_msg_writer_finish. Inside a map every put needs a key;
// inside an array the key must be NULL.
typedef struct tr_msg_frame {
    bool is_map;
    uint32_t declared, written;
} tr_msg_frame;

typedef struct tr_msg_writer {
    msgpack_sbuffer buf;
    msgpack_packer pk;
    tr_msg_frame stack[TR_MSG_MAX_DEPTH];
    int depth;
    bool failed;
    tr_err err;
} tr_msg_writer;

void tr_msg_writer_init(tr_msg_writer *w);
void tr_msg_writer_free(tr_msg_writer *w);
// Starts {v, op, id, args: map(n_args)}; the args follow as puts.
void tr_msg_begin_request(tr_msg_writer *w, const char *op, uint64_t id, uint32_t n_args);
// Starts {v, id, ok: true, result: map(n_results)}.
void tr_msg_begin_reply(tr_msg_writer *w, uint64_t id, uint32_t n_results);
// A complete error reply {v, id, ok: false, error: {code, message}}; code is a tr_err code.
void tr_msg_put_error_reply(tr_msg_writer *w, uint64_t id, int code, const char *message);
void tr_msg_put_int(tr_msg_writer *w, const char *key, int64_t v);
void tr_msg_put_uint(tr_msg_writer *w, const char *key, uint64_t v);
void tr_msg_put_float(tr_msg_writer *w, const char *key, double v);
void tr_msg_put_bool(tr_msg_writer *w, const char *key, bool v);
void tr_msg_put_nil(tr_msg_writer *w, const char *key);
void tr_msg_put_str(tr_msg_writer *w, const char *key, const char *s);
void tr_msg_put_strn(tr_msg_writer *w, const char *key, const char *s, size_t len);
void tr_msg_put_bin(tr_msg_writer *w, const char *key, const void *data, size_t len);
void tr_msg_put_tensor(tr_msg_writer *w, const char *key, int dtype, int ndim, const int64_t *shape,
                       const void *data);
void tr_msg_put_map(tr_msg_writer *w, const char *key, uint32_t n);
void tr_msg_put_array(tr_msg_writer *w, const char *key, uint32_t n);
// Checks that every container is complete; on success *data/*len view the writer's buffer
// (valid until the next put or tr_msg_writer_free).
int tr_msg_writer_finish(tr_msg_writer *w, const void **data, size_t *len, tr_err *err);
// Clears the buffer and error so the writer can build another message.
void tr_msg_writer_reset(tr_msg_writer *w);

// Wire error codes are the names of tr_err codes ("invalid", "format", "timeout", ...).
int tr_msg_err_code_from_name(const char *s, size_t len);  // unknown names map to TR_EPEER
