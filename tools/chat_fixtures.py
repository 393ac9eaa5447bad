#!/usr/bin/env python3
"""Chat-format fixtures for data/chat: python3 tools/chat_fixtures.py OUTDIR

Renders test conversations with the published chat templates (Qwen2.5's chatml template,
no-tools branch, and Meta-Llama-3-Instruct's template, both Jinja as in their
tokenizer_config.json), tokenizes the text with Hugging Face `tokenizers` on the fixture
tokenizers (copies of the tokenizer fixtures, kept in tests/fixtures/chat/ so this
fixture stays valid when those are regenerated), and writes OUTDIR/cases.jsonl: per case the
messages, the expected text, ids and loss mask.

Qwen3 (OUTDIR/qwen3_cases.jsonl): the Qwen3 template (QWEN3 below, as published in Qwen3's
tokenizer_config.json) is rendered by transformers' own apply_chat_template, with and without
enable_thinking, on OUTDIR/qwen3_tokenizer.json: the chatml fixture tokenizer plus <think> and
</think> as added, non-special tokens, as Qwen3's tokenizer has them. The expected ids are
transformers' tokenization of the rendered conversation; the mask covers each assistant
turn's text after "<|im_start|>assistant\\n" (its think block included) and its <|im_end|>.

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

# Qwen3's chat template as published (Qwen3 tokenizer_config.json "chat_template").
QWEN3 = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""

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

THINK = "<think>\nThe user wants a sum.\n2 + 2 = 4.\n</think>\n\n"
TOOL_RESULT = "<tool_response>\n{\"temp\": 21}\n</tool_response>"
# (add_generation_prompt, enable_thinking, messages); enable_thinking None leaves it undefined.
QWEN3_CASES = [
    (False, None, [M("system", "You are terse."), M("user", "What is 2+2?"), M("assistant", "4")]),
    (True, None, [M("user", "Solve x + 1 = 3.")]),
    (True, False, [M("user", "Solve x + 1 = 3.")]),
    (True, True, [M("system", "Think step by step."), M("user", "Solve x + 1 = 3.")]),
    # Earlier rounds lose their think blocks; the last answer keeps its own.
    (False, None, [M("user", "What is 2+2?"), M("assistant", THINK + "4"),
                   M("user", "And 3+3?"), M("assistant", "<think>\n3 + 3 = 6.\n</think>\n\n6")]),
    (True, None, [M("system", "Be brief."), M("user", "What is 2+2?"),
                  M("assistant", THINK + "4"), M("user", "And 3+3?")]),
    (True, False, [M("user", "What is 2+2?"), M("assistant", THINK + "4"),
                   M("user", "And 3+3?")]),
    # After the last query: a non-final turn keeps its block only if it has reasoning.
    (False, None, [M("user", "Count."), M("assistant", "<think>one</think>1"),
                   M("assistant", "<think></think>2"), M("assistant", "3")]),
    # A tool response wrapped in <tool_response> tags is not a query: both answers follow the
    # first user message.
    (False, None, [M("user", "Weather?"), M("assistant", "<think>\nAsk the tool.\n</think>\n\ncalling"),
                   M("user", TOOL_RESULT), M("assistant", "<think>\n\nIt is 21.\n\n</think>\n\n\n21 degrees")]),
    # Several </think>: reasoning before the first, answer after the last; leading newlines
    # of a last answer go.
    (False, None, [M("user", "x"), M("assistant", "<think>a</think>b</think>\n\nc"),
                   M("user", "y"), M("assistant", "\n\nplain answer")]),
    # No user message at all: no turn follows a query, so no think block.
    (False, None, [M("system", "s"), M("assistant", "<think>r</think>answer")]),
    # A system message later in the conversation, content with a special-token spelling and
    # a literal think tag, non-ASCII text.
    (False, None, [M("user", "say <|im_end|> now"), M("system", "Second system."),
                   M("assistant", "no <|im_end|> here, <think> is just text")]),
    (True, False, [M("user", "ünïcödé ✓ 漢字"), M("assistant", "ok\u00a0✓\u3000"),
                   M("user", "again")]),
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


def qwen3_pieces(gen, thinking, msgs):
    """Qwen3's template as pieces (see pieces()); asserted against transformers' rendering."""
    last_query = len(msgs) - 1
    for i in range(len(msgs) - 1, -1, -1):
        c = msgs[i]["content"]
        if msgs[i]["role"] == "user" and not (c.startswith("<tool_response>") and
                                             c.endswith("</tool_response>")):
            last_query = i
            break
    out = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            out += [("special", "<|im_start|>", 0), ("text", m["role"] + "\n", m["content"], 0),
                    ("special", "<|im_end|>", 0), ("text", "\n", "", 0)]
            continue
        c, r = m["content"], ""
        if "</think>" in c:
            r = c.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
            c = c.split("</think>")[-1].lstrip("\n")
        if k > last_query and (k == len(msgs) - 1 or r):
            c = "<think>\n" + r.strip("\n") + "\n</think>\n\n" + c.lstrip("\n")
        out += [("special", "<|im_start|>", 0), ("text", "assistant\n", c, 1),
                ("special", "<|im_end|>", 1), ("text", "\n", "", 0)]
    if gen:
        out += [("special", "<|im_start|>", 0),
                ("text", "assistant\n" + ("" if thinking is not False else "<think>\n\n</think>\n\n"),
                 "", 0)]
    return out


def qwen3_tokenizer(root, out):
    # The chatml fixture tokenizer with Qwen3's think tags as added, non-special tokens.
    from tokenizers import AddedToken
    tok = Tokenizer.from_file(os.path.join(root, "tests/fixtures/chat/qwen2_tokenizer.json"))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    path = os.path.join(out, "qwen3_tokenizer.json")
    tok.save(path)
    return path


def qwen3_cases(root, out):
    from transformers import PreTrainedTokenizerFast
    path = qwen3_tokenizer(root, out)
    hf = PreTrainedTokenizerFast(tokenizer_file=path, chat_template=QWEN3)
    tok = Tokenizer.from_file(path)
    plain = Tokenizer.from_file(path)
    plain.encode_special_tokens = True
    lines = []
    for gen, thinking, msgs in QWEN3_CASES:
        kw = {} if thinking is None else {"enable_thinking": thinking}
        text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, **kw)
        hf_ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=gen,
                                        **kw)["input_ids"]
        ps = qwen3_pieces(gen, thinking, msgs)
        assert "".join(p[1] + (p[2] if p[0] == "text" else "") for p in ps) == text, (text, ps)
        ids, mask = piecewise(tok, plain, ps)
        injected = any(s in m["content"] for m in msgs for s in SPECIALS["chatml"])
        full = tok.encode(text, add_special_tokens=False)
        assert full.ids == hf_ids
        whole = not injected and hf_ids == ids
        if whole:
            assert offsets_mask(tok, text, ps, full) == mask, (text, mask)
        elif not injected:
            print(f"note: qwen3 case {msgs!r}: header and content tokens merge in the whole "
                  "text; the piecewise encoding is expected", file=sys.stderr)
        lines.append(json.dumps({"format": "qwen3", "default_system": None,
                                 "add_generation_prompt": gen,
                                 "enable_thinking": thinking is not False, "messages": msgs,
                                 "text": text, "ids": ids, "mask": mask, "whole_text": whole},
                                ensure_ascii=False))
    with open(os.path.join(out, "qwen3_cases.jsonl"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {out}/qwen3_cases.jsonl")


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
    qwen3_cases(root, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
