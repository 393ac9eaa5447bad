#!/usr/bin/env python3
"""Example reward service for troupe (docs/protocol.md, "Reward services").

A ZeroMQ REP socket receives msgpack {"op": "score", "items": [{"prompt", "response",
"meta"}]} and answers {"scores": [...]}: 1.0 when the last number in the response equals
meta["answer"], else 0.0. Malformed requests are answered with {"error": "..."}.

    pip install pyzmq msgpack
    python3 reward_service.py tcp://127.0.0.1:5555

The number rules are those of troupe's numeric_match rule (roles/reward_rule.h): optional
'-' sign (not after a letter, digit, ')' or '.'), ',' thousands groups, decimals, and simple
fractions of integers such as 3/4.
"""
import math
import signal
import sys


def _digits(s, i):
    j = i
    while j < len(s) and _isdigit(s[j]):
        j += 1
    return j - i


def _isdigit(c):
    return "0" <= c <= "9"


def _isalnum(c):
    return _isdigit(c) or "a" <= c <= "z" or "A" <= c <= "Z" or c == "_"


def _plain(s):
    return float(s.replace(",", ""))


def _scan(s, i):
    """Scans the number starting at i; returns (value, end)."""
    start = i
    neg = s[i] == "-"
    if neg:
        i += 1
    int_start = i
    nd = _digits(s, i)
    i += nd
    after_list = int_start >= 2 and s[int_start - 1] == "," and _isdigit(s[int_start - 2])
    if 1 <= nd <= 3 and not after_list:
        while i < len(s) and s[i] == "," and _digits(s, i + 1) == 3:
            i += 4
    if i + 1 < len(s) and s[i] == "." and _isdigit(s[i + 1]):
        i += 1
        i += _digits(s, i)
        return _plain(s[start:i]), i
    if nd > 0 and i + 1 < len(s) and s[i] == "/" and _isdigit(s[i + 1]):
        end = i + 1 + _digits(s, i + 1)
        decimal_after = end + 1 < len(s) and s[end] == "." and _isdigit(s[end + 1])
        den = _plain(s[i + 1:end])
        if not decimal_after and den != 0:
            num = _plain(s[int_start:i])
            return (-num if neg else num) / den, end
    return _plain(s[start:i]), i


def last_number(s):
    """The last number in s, or None."""
    found = None
    i = 0
    while i < len(s):
        c = s[i]
        prev = s[i - 1] if i > 0 else " "
        start = False
        if _isdigit(c):
            start = True
        elif c == "-" and not (_isalnum(prev) or prev in ")."):
            start = (i + 1 < len(s) and _isdigit(s[i + 1])) or (
                i + 2 < len(s) and s[i + 1] == "." and _isdigit(s[i + 2]))
        elif c == "." and not _isdigit(prev) and i + 1 < len(s) and _isdigit(s[i + 1]):
            start = True
        if not start:
            i += 1
            continue
        if c == "-" and s[i + 1] == ".":
            j = i + 2 + _digits(s, i + 2)
            found, i = _plain(s[i:j]), j
        elif c == ".":
            j = i + 1 + _digits(s, i + 1)
            found, i = _plain(s[i:j]), j
        else:
            found, i = _scan(s, i)
    return found


def numbers_equal(a, b, rel_tol=1e-9):
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    return abs(a - b) <= rel_tol * max(1.0, abs(a), abs(b))


def score_item(item):
    answer = item["meta"]["answer"]
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
        raise ValueError("meta.answer must be a number or a string")
    want = float(answer) if not isinstance(answer, str) else last_number(answer)
    if want is None:
        raise ValueError(f"meta.answer {answer!r} holds no number")
    got = last_number(item["response"])
    return 1.0 if got is not None and numbers_equal(got, want) else 0.0


def handle(request):
    if not isinstance(request, dict) or request.get("op") != "score":
        raise ValueError("expected {'op': 'score', 'items': [...]}")
    return {"scores": [score_item(item) for item in request["items"]]}


def main():
    if len(sys.argv) != 2:
        print("usage: reward_service.py ENDPOINT   (e.g. tcp://127.0.0.1:5555)", file=sys.stderr)
        return 2
    import msgpack
    import zmq

    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    sock.bind(sys.argv[1])
    # Wake up now and then: a signal that lands while ZeroMQ is busy does not interrupt recv.
    sock.setsockopt(zmq.RCVTIMEO, 200)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    print("listening on", sock.getsockopt_string(zmq.LAST_ENDPOINT), flush=True)
    try:
        while not stop:
            try:
                raw = sock.recv()
            except zmq.Again:
                continue
            try:
                reply = handle(msgpack.unpackb(raw, raw=False))
            except Exception as e:  # a REP socket must answer every request
                reply = {"error": f"{type(e).__name__}: {e}"}
            sock.send(msgpack.packb(reply, use_bin_type=True))
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(linger=0)
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
