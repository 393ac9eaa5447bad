// JSON text to msgpack through jansson and the message writer (which checks container counts).
#include "roles/json_pack.h"

#include <jansson.h>
#include <string.h>

static void pack_value(tr_msg_writer *w, const char *key, json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        tr_msg_put_map(w, key, (uint32_t)json_object_size(v));
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) pack_value(w, k, x);
        break;
    }
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        tr_msg_put_array(w, key, (uint32_t)n);
        for (size_t i = 0; i < n; i++) pack_value(w, NULL, json_array_get(v, i));
        break;
    }
    case JSON_STRING: tr_msg_put_strn(w, key, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: tr_msg_put_int(w, key, json_integer_value(v)); break;
    case JSON_REAL: tr_msg_put_float(w, key, json_real_value(v)); break;
    case JSON_TRUE: tr_msg_put_bool(w, key, true); break;
    case JSON_FALSE: tr_msg_put_bool(w, key, false); break;
    case JSON_NULL: tr_msg_put_nil(w, key); break;
    }
}

static int pack_text(tr_msg_writer *w, const char *key, const char *json_text, bool object, tr_err *err) {
    json_error_t je;
    // Object keys with NUL bytes cannot be C strings for the writer; jansson refuses them by default.
    json_t *v = json_loads(json_text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
    if (!v) return tr_errf(err, TR_EFORMAT, "JSON at line %d column %d: %s", je.line, je.column, je.text);
    if (object && !json_is_object(v)) {
        json_decref(v);
        return tr_errf(err, TR_EFORMAT, "JSON is not an object");
    }
    pack_value(w, key, v);
    json_decref(v);
    if (w->failed) {
        if (err) *err = w->err;
        return tr_err_wrap(err, "packing JSON");
    }
    return 0;
}

int tr_json_pack(tr_msg_writer *w, const char *key, const char *json_text, tr_err *err) {
    return pack_text(w, key, json_text, false, err);
}

int tr_json_pack_object(tr_msg_writer *w, const char *key, const char *json_text, tr_err *err) {
    return pack_text(w, key, json_text, true, err);
}
