// A JSON file read whole and parsed: the pairing of tr_file_read and tr_json_parse that every
// reader of a config, manifest, index or run file needs. Apart from json.c so that the
// parser alone links without file I/O (the fuzz targets build it that way).
#include <stdlib.h>

#include "engine/file.h"
#include "engine/json.h"

int tr_json_parse_file(tr_json_doc *doc, const char *path, const tr_json_opts *opts,
                       tr_err *err) {
    char *text;
    size_t len;
    if (tr_file_read(path, &text, &len, err)) return -1;
    int rc = opts ? tr_json_parse_opts(doc, text, len, opts, err)
                  : tr_json_parse(doc, text, len, path, err);
    free(text);   // the tree holds copies of what it needs
    return rc;
}
