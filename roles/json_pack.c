// JSON text to msgpack through engine/json and the message writer (which checks container
// counts).
#include "roles/json_pack.h"

#include <string.h>

#include "engine/json.h"

static void pack_value(tr_msg_writer *w, const char *key, const tr_json *v) {
    switch (v->type) {
    case TR_JSON_OBJECT:
        tr_msg_put_map(w, key, (uint32_t)v->count);
        for (const tr_json *m = v->child; m; m = m->next) pack_value(w, m->key, m);
        break;
    case TR_JSON_ARRAY:
        tr_msg_put_array(w, key, (uint32_t)v->count);
        for (const tr_json *e = v->child; e; e = e->next) pack_value(w, NULL, e);
        break;
    case TR_JSON_STRING: tr_msg_put_strn(w, key, v->str, v->len); break;
    case TR_JSON_NUMBER:
        if (v->is_int)
            tr_msg_put_int(w, key, v->inum);
        else
            tr_msg_put_float(w, key, v->num);
        break;
    case TR_JSON_BOOL: tr_msg_put_bool(w, key, v->boolean); break;
    case TR_JSON_NULL: tr_msg_put_nil(w, key); break;
    }
}

static int pack_text(tr_msg_writer *w, const char *key, const char *json_text, bool object, tr_err *err) {
    // Object keys with NUL bytes cannot be C strings for the writer: \u0000 is refused.
    tr_json_opts o = {.name = "JSON", .max_depth = TR_JSON_DATA_DEPTH,
                      .flags = TR_JSON_DATA | TR_JSON_NO_NUL};
    tr_json_doc doc;
    if (tr_json_parse_opts(&doc, json_text, strlen(json_text), &o, err)) return -1;
    if (object && doc.root->type != TR_JSON_OBJECT) {
        tr_json_free(&doc);
        return tr_errf(err, TR_EFORMAT, "JSON is not an object");
    }
    pack_value(w, key, doc.root);
    tr_json_free(&doc);
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
