// SFT data: conversations from `messages` and from ShareGPT `conversations` give the ids and
// loss mask that HF tokenizers + the published template give (tests/fixtures/chat cases);
// truncation and dropping follow the documented policy; packing keeps every sample once,
// whole, with positions and targets as tr_doc_layout and the loss expect; bad records fail
// with file:line.
#include "data/chat.h"
#include "data/jsonl.h"
#include "data/sft.h"
#include "data/tokenizer.h"
#include "engine/file.h"
#include "tests/test.h"

#define MAX_CASES 8

typedef struct ref {
    int32_t ids[128];
    uint8_t mask[128];
    size_t n;
} ref;

static const char *share_role(const char *r) {
    return strcmp(r, "user") == 0 ? "human" : strcmp(r, "assistant") == 0 ? "gpt" : "system";
}

int main(void) {
    const char *dir = tr_test_tmpdir();
    tr_err err = {0};
    tr_tokenizer *tok = NULL;
    CHECKF(tr_tokenizer_load(&tok, tr_test_src("tests/fixtures/chat/qwen2_tokenizer.json"), &err) == 0,
           "%s", err.msg);
    if (!tok) return tr_test_summary("test_sft");
    tr_chat_format chat;
    CHECK(tr_chat_format_init(&chat, "chatml", tok, &err) == 0);

    // The chatml reference cases without a generation prompt or default system, written out
    // as SFT files in both schemas.
    ref refs[MAX_CASES];
    int nref = 0;
    char pm[600], ps[600];
    snprintf(pm, sizeof pm, "%s/messages.jsonl", dir);
    snprintf(ps, sizeof ps, "%s/sharegpt.jsonl", dir);
    FILE *fm = fopen(pm, "w"), *fs = fopen(ps, "w");
    tr_jsonl r;
    CHECK(tr_jsonl_open(&r, tr_test_src("tests/fixtures/chat/cases.jsonl"), &err) == 0);
    tr_json_doc doc;
    while (tr_jsonl_next(&r, &doc, &err) == 1) {
        const tr_json *c = doc.root, *gen = tr_json_get(c, "add_generation_prompt");
        if (strcmp(tr_json_get(c, "format")->str, "chatml") == 0 &&
            !(tr_json_is(gen, TR_JSON_BOOL) && gen->boolean) &&
            tr_json_is(tr_json_get(c, "default_system"), TR_JSON_NULL) && nref < MAX_CASES) {
            const tr_json *msgs = tr_json_get(c, "messages");
            tr_json_writer a, b;
            tr_json_writer_init(&a, 0);
            tr_json_writer_init(&b, 0);
            tr_json_begin_object(&a);
            tr_json_key(&a, "messages");
            tr_json_value(&a, msgs);
            tr_json_end_object(&a);
            tr_json_begin_object(&b);
            tr_json_key(&b, "conversations");
            tr_json_begin_array(&b);
            for (const tr_json *m = msgs->child; m; m = m->next) {
                tr_json_begin_object(&b);
                tr_json_key(&b, "from");
                tr_json_string(&b, share_role(tr_json_get(m, "role")->str));
                tr_json_key(&b, "value");
                tr_json_value(&b, tr_json_get(m, "content"));
                tr_json_end_object(&b);
            }
            tr_json_end_array(&b);
            tr_json_key(&b, "id");
            tr_json_string(&b, "extra fields are ignored");
            tr_json_end_object(&b);
            const char *sa, *sb;
            size_t la, lb;
            CHECK(tr_json_writer_finish(&a, &sa, &la, &err) == 0 &&
                  tr_json_writer_finish(&b, &sb, &lb, &err) == 0);
            fprintf(fm, "%s\n\n", sa);  // blank lines between records are skipped
            fprintf(fs, "%s\r\n", sb);
            tr_json_writer_free(&a);
            tr_json_writer_free(&b);
            ref *rf = &refs[nref++];
            const tr_json *ids = tr_json_get(c, "ids"), *mask = tr_json_get(c, "mask");
            rf->n = (size_t)ids->count;
            const tr_json *iv = ids->child, *mv = mask->child;
            for (size_t k = 0; iv && mv && k < 128; k++, iv = iv->next, mv = mv->next) {
                rf->ids[k] = (int32_t)iv->inum;
                rf->mask[k] = (uint8_t)mv->inum;
            }
        }
        tr_json_free(&doc);
    }
    tr_jsonl_close(&r);
    fclose(fm);
    fclose(fs);
    CHECK(nref == 4);

    tr_sft_dataset dm, ds;
    CHECKF(tr_sft_load(&dm, pm, &chat, 0, TR_SFT_DROP, &err) == 0, "%s", err.msg);
    CHECKF(tr_sft_load(&ds, ps, &chat, 0, TR_SFT_DROP, &err) == 0, "%s", err.msg);
    CHECK(dm.n == nref && ds.n == nref);
    for (int i = 0; i < nref && i < dm.n && i < ds.n; i++) {
        int64_t a = dm.off[i], n = dm.off[i + 1] - a;
        CHECKF(n == (int64_t)refs[i].n, "case %d: %lld tokens, reference %zu", i, (long long)n, refs[i].n);
        CHECK(n == ds.off[i + 1] - ds.off[i]);
        int same = n == (int64_t)refs[i].n;
        for (int64_t k = 0; same && k < n; k++)
            same = dm.ids[a + k] == refs[i].ids[k] && dm.mask[a + k] == refs[i].mask[k] &&
                   ds.ids[ds.off[i] + k] == refs[i].ids[k] && ds.mask[ds.off[i] + k] == refs[i].mask[k];
        CHECKF(same, "case %d differs from the HF reference", i);
        CHECK(dm.line[i] == 1 + 2 * i && ds.line[i] == 1 + i);
    }

    // Length policy at max_len = 40 (the reference lengths are 39, 66, 59, 45).
    tr_sft_dataset dd, dt;
    CHECK(tr_sft_load(&dd, pm, &chat, 40, TR_SFT_DROP, &err) == 0);
    CHECK(dd.n == 1 && dd.n_dropped == 3 && dd.off[1] == 39);
    CHECK(tr_sft_load(&dt, pm, &chat, 40, TR_SFT_TRUNCATE, &err) == 0);
    CHECK(dt.n == 4 && dt.n_truncated == 3);
    for (int i = 0; i < dt.n; i++) {
        int64_t a = dt.off[i], n = dt.off[i + 1] - a;
        CHECK(n == (refs[i].n < 40 ? (int64_t)refs[i].n : 40));
        CHECK(memcmp(dt.ids + a, refs[i].ids, (size_t)n * 4) == 0 && memcmp(dt.mask + a, refs[i].mask, (size_t)n) == 0);
    }
    // Cut so short that no trained token is left: the sample is skipped and counted.
    tr_sft_dataset du;
    CHECK(tr_sft_load(&du, pm, &chat, 8, TR_SFT_TRUNCATE, &err) == 0);
    CHECK(du.n == 0 && du.n_untrained == 4);
    tr_sft_free(&du);
    tr_sft_free(&dd);

    // Packing: many samples (the four, repeated) into rows of 128 tokens.
    tr_sft_dataset big = {0};
    tr_chat_msg msgs[4];
    for (int rep = 0; rep < 25; rep++)
        for (int i = 0; i < 4; i++) {
            char u[64], a[64];
            snprintf(u, sizeof u, "question %d of round %d", i, rep);
            snprintf(a, sizeof a, "answer %d", rep * 7 + i);
            msgs[0] = (tr_chat_msg){"user", u, strlen(u)};
            msgs[1] = (tr_chat_msg){"assistant", a, strlen(a)};
            CHECK(tr_sft_add(&big, &chat, msgs, 2, 128, TR_SFT_DROP, rep * 4 + i + 1, &err) == 0);
        }
    CHECK(big.n == 100);
    int32_t pad = chat.eos;
    tr_sft_packing p1, p2, p3;
    CHECK(tr_sft_pack(&p1, &big, 128, true, 5, &err) == 0);
    CHECK(tr_sft_pack(&p2, &big, 128, true, 5, &err) == 0);
    CHECK(tr_sft_pack(&p3, &big, 128, true, 6, &err) == 0);
    CHECK(p1.n_rows == p2.n_rows && memcmp(p1.items, p2.items, 100 * sizeof *p1.items) == 0);
    CHECK(memcmp(p1.items, p3.items, 100 * sizeof *p1.items) != 0);
    int seen[100] = {0};
    int64_t real = 0;
    int rows_ok = 1;
    tr_sft_row row;
    CHECK(tr_sft_row_init(&row, 128, &err) == 0);
    for (int64_t rr = 0; rr < p1.n_rows; rr++) {
        CHECK(tr_sft_row_fill(&big, &p1, rr, pad, &row, &err) == 0);
        int64_t k0 = p1.row_off[rr], k1 = p1.row_off[rr + 1];
        rows_ok &= row.doc_start[0] == 0 && row.doc_start[row.n_docs] == 128;
        rows_ok &= row.n_docs == (int32_t)(k1 - k0) + (row.n_real < 128);
        for (int64_t k = k0; k < k1; k++) {
            int64_t s = p1.items[k], a = big.off[s], n = big.off[s + 1] - a;
            int32_t d = (int32_t)(k - k0), t0 = row.doc_start[d];
            seen[s]++;
            rows_ok &= row.doc_start[d + 1] - t0 == n;
            for (int64_t i = 0; i < n; i++) {
                rows_ok &= row.ids[t0 + i] == big.ids[a + i] && row.pos[t0 + i] == i;
                int32_t want = (i + 1 < n && big.mask[a + i + 1]) ? big.ids[a + i + 1] : -1;
                rows_ok &= row.targets[t0 + i] == want;
            }
        }
        real += row.n_real;
        for (int32_t t = row.n_real; t < 128; t++)
            rows_ok &= row.ids[t] == pad && row.targets[t] == -1 && row.pos[t] == t - row.n_real;
    }
    CHECK(rows_ok);
    int once = 1;
    for (int i = 0; i < 100; i++) once &= seen[i] == 1;
    CHECK(once);
    CHECK(real == big.off[100]);
    // First fit: a sample sits in a later row only because it fit in no earlier row, and
    // rows only fill up, so at the end every earlier row lacks room for it.
    int64_t fill[128] = {0};
    int ff = p1.n_rows <= 64;  // all rows inside the open window
    for (int64_t rr = 0; rr < p1.n_rows; rr++)
        for (int64_t k = p1.row_off[rr]; k < p1.row_off[rr + 1]; k++)
            fill[rr] += big.off[p1.items[k] + 1] - big.off[p1.items[k]];
    for (int64_t rr = 0; rr < p1.n_rows; rr++)
        for (int64_t k = p1.row_off[rr]; k < p1.row_off[rr + 1]; k++)
            for (int64_t q = 0; q < rr; q++)
                ff &= fill[q] + (big.off[p1.items[k] + 1] - big.off[p1.items[k]]) > 128;
    CHECK(ff);
    printf("packing: %lld tokens in %lld rows of 128 (%.1f%% full)\n", (long long)big.off[100],
           (long long)p1.n_rows, 100.0 * (double)big.off[100] / (128.0 * (double)p1.n_rows));
    tr_sft_packing one;
    CHECK(tr_sft_pack(&one, &big, 128, false, 5, &err) == 0 && one.n_rows == 100);
    tr_sft_packing_free(&one);
    CHECK(tr_sft_pack(&one, &big, 16, true, 5, &err) == -1 && strstr(err.msg, "row length 16"));
    tr_sft_packing_free(&one);
    tr_sft_row_free(&row);
    tr_sft_packing_free(&p1);
    tr_sft_packing_free(&p2);
    tr_sft_packing_free(&p3);
    tr_sft_free(&big);

    // Bad records name the file and line.
    struct { const char *body, *want; } bad[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n{\"messages\": [{\"role\": \"user\", \"content\": 5}]}\n",
         "bad.jsonl:2: messages[0].content must be a string, got number"},
        {"{\"conversations\": [{\"from\": \"bot\", \"value\": \"x\"}]}\n",
         "bad.jsonl:1: conversations[0].from 'bot' is not human, gpt or system"},
        {"\n{\"text\": \"no chat here\"}\n", "bad.jsonl:2: missing field 'messages'"},
        {"{\"messages\": {\"role\": \"user\"}}\n", "bad.jsonl:1: field 'messages' must be an array, got object"},
        {"{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}\n", "bad.jsonl:1: messages[0].role 'tool'"},
        {"{\"messages\": [{\"content\": \"x\"}]}\n", "bad.jsonl:1: messages[0]: missing field 'role'"},
        {"{\"messages\": [}\n", "bad.jsonl:1:"},
    };
    char pb[600];
    snprintf(pb, sizeof pb, "%s/bad.jsonl", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK(tr_file_write_atomic(pb, bad[i].body, strlen(bad[i].body), &err) == 0);
        tr_sft_dataset x;
        CHECK(tr_sft_load(&x, pb, &chat, 0, TR_SFT_DROP, &err) == -1);
        CHECKF(strstr(err.msg, bad[i].want) != NULL, "'%s' lacks '%s'", err.msg, bad[i].want);
    }
    tr_sft_dataset x;
    CHECK(tr_sft_load(&x, "/nonexistent/sft.jsonl", &chat, 0, TR_SFT_DROP, &err) == -1 &&
          strstr(err.msg, "/nonexistent/sft.jsonl"));
    tr_sft_free(&dm);
    tr_sft_free(&ds);
    tr_sft_free(&dt);
    tr_tokenizer_free(tok);
    return tr_test_summary("test_sft");
}
