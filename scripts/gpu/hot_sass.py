#!/usr/bin/env python3
"""Reads the source page of an Nsight Compute report as CSV (`ncu --import R --page source --csv
--print-source sass`) and prints its header, the 80 instructions with the most warp-stall samples,
then every instruction in address order. Used by scripts/gpu/profile.sh.

usage: hot_sass.py SOURCE.csv
"""
import csv
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    rows = list(csv.reader(open(sys.argv[1], errors="replace")))
    head = next((i for i, r in enumerate(rows) if any("Source" in c for c in r)), None)
    if head is None:
        print("no source table in the report's source page; its first lines:")
        print("\n".join(",".join(r) for r in rows[:20]))
        return
    cols = rows[head]
    body = [r for r in rows[head + 1:] if len(r) == len(cols)]
    samples = next((i for i, c in enumerate(cols) if "Sampling" in c and "All" in c), None)
    print(",".join(cols))
    if samples is not None:
        print("== the 80 instructions with the most warp-stall samples")
        for r in sorted(body, key=lambda r: -num(r[samples]))[:80]:
            print(",".join(r))
    print("== every instruction, in address order")
    for r in body:
        print(",".join(r))


if __name__ == "__main__":
    main()
