#!/usr/bin/env python3
"""Sums an Nsight Compute raw CSV (ncu --csv --page raw --metrics gpu__time_duration.sum,
dram__bytes.sum) by kernel name: launches, total and mean duration, DRAM bytes and the rate
they were moved at, largest total first; then every launch in order, so one decode step's
sequence can be read off. Usage: tools/ncu_summary.py FILE.csv"""
import csv
import re
import sys

SCALE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6,
         "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
         "KB": 1e3, "MB": 1e6, "GB": 1e9, "B": 1.0}


def short(name):
    """A kernel's name without its parameter list and template arguments."""
    name = re.sub(r"\(.*$", "", name)
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).replace("void ", "").strip()[:60]


def main(path):
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{path}: no CSV header (ncu failed?); first lines:\n" + "\n".join(lines[:10]))
    rows = list(csv.reader(lines[start:]))
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    kname = col.get("Kernel Name", col.get("Function Name"))
    tcol, bcol = col["gpu__time_duration.sum"], col["dram__bytes.sum"]
    tscale, bscale = SCALE.get(units[tcol], 1.0), SCALE.get(units[bcol], 1.0)
    launches, by = [], {}
    for r in data:
        if len(r) <= max(tcol, bcol):
            continue
        try:
            us = float(r[tcol].replace(",", "")) * tscale
            by_ = float(r[bcol].replace(",", "")) * bscale
        except ValueError:
            continue
        name = short(r[kname])
        launches.append((name, us, by_, r[col.get("Grid Size", 0)], r[col.get("Block Size", 0)]))
        e = by.setdefault(name, [0, 0.0, 0.0])
        e[0] += 1
        e[1] += us
        e[2] += by_
    total = sum(e[1] for e in by.values())
    print(f"{len(launches)} launches, {total:.1f} us in all")
    print(f"{'kernel':60} {'n':>5} {'total us':>10} {'mean us':>8} {'MB':>9} {'GB/s':>7}")
    for name, (n, us, b) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{name:60} {n:5d} {us:10.1f} {us / n:8.2f} {b / 1e6:9.2f} {b / us / 1e3 if us else 0:7.0f}")
    print("\nin order: kernel, us, MB, grid, block")
    for name, us, b, grid, block in launches:
        print(f"{name:60} {us:8.2f} {b / 1e6:8.2f} {grid:>14} {block:>12}")


if __name__ == "__main__":
    main(sys.argv[1])
