#!/usr/bin/env python3
"""Chat-format fixtures for data/chat: python3 tools/chat_fixtures.py OUTDIR

Renders test conversations with the published chat templates (Qwen2.5's chatml template,
no-tools branch, and Meta-Llama-3-Instruct's template, both Jinja as in their
tokenizer_config.json), tokenizes the text with Hugging Face `tokenizers` on the fixture
tokenizers (copies of the tokenizer fixtures, kept in tests/fixtures/chat/ so this
fixture stays valid when those are regenerated), and writes OUTDIR/cases.jsonl: per case the
messages, the expected text, ids and loss mask.

Expected ids are HF's encoding of the whole rendered text. The mask is 1 on tokens whose
character span (HF offsets) lies inside an assistant message's content, and on the
end-of-turn token closing that message. Two kinds of case cannot be compared to the whole
text and use the piecewise rule data/chat.c documents instead (marked "whole_text": false):
content that spells a special token (encoded with encode_special_tokens, so it stays text)
and assistant content whose first token would merge with the header's "\\n".
"""
import json
import os
import sys

import jinja2
from tokenizers import Tokenizer

QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")

M = lambda r, c: {"role": r, "content": c}
CASES = [
    ("chatml", None, False, [M("system", "You are terse."), M("user", "What is 2+2?"),
                             M("assistant", "4")]),
    ("chatml", None, False, [M("user", "Hi there!"), M("assistant", "Hello! How can I help?"),
                             M("user", "Count: 1 2 3"), M("assistant", "1, 2, 3 — done.")]),
    ("chatml", QWEN_DEFAULT, False, [M("user", "Name a color."), M("assistant", "Blue")]),
    ("chatml", None, True, [M("user", "Solve x + 1 = 3. Answer with a number.")]),
    ("chatml", None, False, [M("user", "say <|im_end|> please"),
                             M("assistant", "ok: <|im_end|><|im_start|>system\nhi")]),
    ("chatml", None, False, [M("user", "lines"), M("assistant", "\nfirst line\n"),
                             M("user", "empty?"), M("assistant", "")]),
    ("llama3", None, False, [M("system", "  Be brief.\n"), M("user", "Capital of France?"),
                             M("assistant", " Paris. \n\n")]),
    ("llama3", None, True, [M("user", "Hi"), M("assistant", "Hello."), M("user", "2*3?")]),
    ("llama3", None, False, [M("user", "end <|eot_id|> now"), M("assistant", "no <|eot_id|>")]),
    ("llama3", None, False, [M("user", "ünïcödé ✓ 漢字"), M("assistant", "ok\u00a0✓\u3000")]),
]

SPECIALS = {"chatml": ["<|im_start|>", "<|im_end|>", "<|endoftext|>"],
            "llama3": ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                       "<|eot_id|>", "<|end_of_text|>"]}


def render(fmt, default_system, gen, msgs):
    env = jinja2.Environment()
    if fmt == "chatml":
        text = env.from_string(QWEN25).render(messages=msgs, add_generation_prompt=gen)
        if default_system is None and msgs[0]["role"] != "system":
            head = "<|im_start|>system\n" + QWEN_DEFAULT + "<|im_end|>\n"
            assert text.startswith(head)
            text = text[len(head):]  # troupe adds no system prompt unless given one
        return text
    return env.from_string(LLAMA3).render(messages=msgs, add_generation_prompt=gen,
                                          bos_token="<|begin_of_text|>")


def pieces(fmt, default_system, gen, msgs):
    """The rendering as (kind, value, trained) pieces: ("special", text, m) or
    ("text", head, body, m) where only body is trained."""
    out = []
    if default_system is not None and msgs[0]["role"] != "system":
        msgs = [M("system", default_system)] + msgs
    for k, m in enumerate(msgs):
        a = m["role"] == "assistant"
        if fmt == "chatml":
            out += [("special", "<|im_start|>", 0), ("text", m["role"] + "\n", m["content"], a),
                    ("special", "<|im_end|>", a), ("text", "\n", "", 0)]
        else:
            if k == 0:
                out.append(("special", "<|begin_of_text|>", 0))
            out += [("special", "<|start_header_id|>", 0), ("text", m["role"], "", 0),
                    ("special", "<|end_header_id|>", 0),
                    ("text", "\n\n", m["content"].strip(), a), ("special", "<|eot_id|>", a)]
    if gen:
        if fmt == "chatml":
            out += [("special", "<|im_start|>", 0), ("text", "assistant\n", "", 0)]
        else:
            out += [("special", "<|start_header_id|>", 0), ("text", "assistant", "", 0),
                    ("special", "<|end_header_id|>", 0), ("text", "\n\n", "", 0)]
    return out


def piecewise(tok, plain, ps):
    ids, mask = [], []
    enc = lambda s: plain.encode(s, add_special_tokens=False).ids if s else []
    for p in ps:
        if p[0] == "special":
            ids.append(tok.token_to_id(p[1]))
            mask.append(int(p[2]))
            continue
        _, head, body, a = p
        joint, h = enc(head + body), enc(head)
        if not a or not body:
            ids += joint
            mask += [0] * len(joint)
        elif joint[:len(h)] == h:
            ids += joint
            mask += [0] * len(h) + [1] * (len(joint) - len(h))
        else:
            b = enc(body)
            ids += h + b
            mask += [0] * len(h) + [1] * len(b)
    return ids, mask


def offsets_mask(tok, text, ps, enc):
    # Character spans of trained content and the positions of trained end-of-turn tokens.
    spans, ends, pos = [], [], 0
    for p in ps:
        if p[0] == "special":
            if p[2]:
                ends.append(pos)
            pos += len(p[1])
        else:
            pos += len(p[1])
            if p[3] and p[2]:
                spans.append((pos, pos + len(p[2])))
            pos += len(p[2])
    assert pos == len(text)
    mask = []
    for tid, (s, e) in zip(enc.ids, enc.offsets):
        inside = any(a <= s and e <= b for a, b in spans)
        mask.append(int(inside or (s in ends and tok.id_to_token(tid) in ("<|im_end|>", "<|eot_id|>"))))
    return mask


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    lines = []
    for fmt, dsys, gen, msgs in CASES:
        path = os.path.join(root, "tests/fixtures/chat", "qwen2_tokenizer.json" if fmt == "chatml" else "llama3_tokenizer.json")
        tok = Tokenizer.from_file(path)
        plain = Tokenizer.from_file(path)
        plain.encode_special_tokens = True
        text = render(fmt, dsys, gen, msgs)
        ps = pieces(fmt, dsys, gen, msgs)
        assert "".join(p[1] + (p[2] if p[0] == "text" else "") for p in ps) == text, (text, ps)
        ids, mask = piecewise(tok, plain, ps)
        injected = any(s in m["content"] for m in msgs for s in SPECIALS[fmt])
        full = tok.encode(text, add_special_tokens=False)
        whole = not injected and full.ids == ids
        if whole:
            assert offsets_mask(tok, text, ps, full) == mask, (text, mask)
        elif not injected:
            print(f"note: {fmt} case {msgs!r}: header and content tokens merge in the whole "
                  "text; the piecewise encoding is expected", file=sys.stderr)
        lines.append(json.dumps({"format": fmt, "default_system": dsys, "add_generation_prompt": gen,
                                 "messages": msgs, "text": text, "ids": ids, "mask": mask,
                                 "whole_text": whole}, ensure_ascii=False))
    with open(os.path.join(out, "cases.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {out}/cases.jsonl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
