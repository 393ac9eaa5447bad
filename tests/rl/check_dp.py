#!/usr/bin/env python3
"""Compares the checkpoints of two runs (tests/rl/test_dp.sh), with only the standard library.

  check_dp.py close A B TOL   every F32 tensor of A/model.safetensors within TOL of B's,
                              relative to the largest magnitude of B (prints the difference)
  check_dp.py same A B        the same tensors, bit for bit
  check_dp.py metrics A B K.. the metrics.jsonl of two run directories agree on keys K exactly
"""
import json
import struct
import sys
from array import array


def tensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a = array("f")
        a.frombytes(data[t["data_offsets"][0]:t["data_offsets"][1]])
        out[name] = a
    return out


def main():
    mode = sys.argv[1]
    if mode == "metrics":
        rows = []
        for d in sys.argv[2:4]:
            with open(d + "/metrics.jsonl") as f:
                rows.append([json.loads(line) for line in f])
        bad = [(r["step"], k, r.get(k), s.get(k)) for r, s in zip(*rows) for k in sys.argv[4:]
               if r.get(k) != s.get(k)]
        if len(rows[0]) != len(rows[1]) or bad:
            print("metrics differ:", len(rows[0]), len(rows[1]), bad[:5])
            return 1
        return 0
    a, b = tensors(sys.argv[2]), tensors(sys.argv[3])
    if sorted(a) != sorted(b):
        print("tensor names differ")
        return 1
    if mode == "same":
        diff = [k for k in a if a[k].tobytes() != b[k].tobytes()]
        if diff:
            print("not the same bits:", diff[:5])
        return 1 if diff else 0
    tol = float(sys.argv[4])
    num = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
    den = max(abs(y) for k in b for y in b[k])
    rel = num / den
    same = all(a[k].tobytes() == b[k].tobytes() for k in a)
    print("max |a - b| / max |b| = %.3g%s" % (rel, " (the same bits)" if same else ""))
    return 0 if rel <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
