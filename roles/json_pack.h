// JSON to msgpack: prompt records carry their metadata as JSON text, and the reward service
// protocol sends it on as a msgpack map (object -> map, array -> array, string -> str,
// integer -> int, real -> float64, true/false -> bool, null -> nil).
#pragma once
#include "engine/err.h"
#include "roles/msg.h"

// Packs the JSON text as one value into the writer at key (NULL inside arrays). Nesting is
// limited by the writer (TR_MSG_MAX_DEPTH); errors name the JSON line and column.
int tr_json_pack(tr_msg_writer *w, const char *key, const char *json_text, tr_err *err);
// The same, but the text must be a JSON object (packed as a map).
int tr_json_pack_object(tr_msg_writer *w, const char *key, const char *json_text, tr_err *err);
