#!/usr/bin/env python3
"""Where a kernel's warps wait, phase by phase, from ncu's source page (SASS with stall samples).

A kernel's SASS is cut into phases at its synchronisation points (block and named barriers, wgmma and cp.async
waits, bulk copies, the first HGMMA of each run of them); each phase gets its share of the stall samples and of the
executed instructions and its three main stall reasons, then the most sampled instructions follow with the one
before each (a stall is charged to the instruction that could not issue). Input: a CSV written by
    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
of a report taken with `--section SourceCounters` (tools/ncu_source.sh does both).
Usage: ncu_phases.py SOURCE.csv [TOP]
"""
import csv
import sys

SAMPLES, EXECUTED = "Warp Stall Sampling (All Samples)", "Instructions Executed"
SYNC_MARKS = ("BAR.SYNC", "BAR.ARV", "DEPBAR", "LDGDEPBAR", "WARPGROUP.DEPBAR", "UBLKRED", "UBLKCP", "SYNCS")


def read_rows(path):
    rows = list(csv.reader(open(path)))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    header = rows[start]
    body = [r for r in rows[start + 1:] if len(r) == len(header)]
    return header, body


def number(text):
    return int(text) if text.strip().lstrip("-").isdigit() else 0


def opcode(sass):
    words = sass.split()
    return words[1] if words and words[0].startswith("@") and len(words) > 1 else (words[0] if words else "")


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    header, body = read_rows(path)
    samples, executed = header.index(SAMPLES), header.index(EXECUTED)
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(header) if h.startswith("stall_") and "Not Issued" not in h]
    base = int(body[0][0], 16)
    offset = lambda r: int(r[0], 16) - base

    # Phase boundaries: each synchronisation instruction that runs (a run of the same one cuts once), and the first
    # HGMMA after one (the descriptor arithmetic between HGMMAs does not end their run).
    cuts, previous = [(0, "entry")], ""
    for r in body:
        if number(r[executed]) == 0:
            continue
        op = opcode(r[1].strip())
        kind = op if op.startswith(SYNC_MARKS) else "HGMMA" if op.startswith("HGMMA") else ""
        if kind and kind != previous:
            cuts.append((offset(r), kind))
        previous = kind or previous
    total_samples = sum(number(r[samples]) for r in body) or 1
    total_executed = sum(number(r[executed]) for r in body) or 1
    print(f"{len(body)} instructions, {total_samples} stall samples, {total_executed} executed (warp level)")
    print(f"{'from':>8} {'phase starts at':24} {'samples':>8} {'instr':>7}  main stall reasons")
    ends = [c[0] for c in cuts[1:]] + [1 << 62]
    for (begin, kind), end in zip(cuts, ends):
        part = [r for r in body if begin <= offset(r) < end]
        s = sum(number(r[samples]) for r in part)
        n = sum(number(r[executed]) for r in part)
        if s == 0 and n == 0:
            continue
        why = sorted(((sum(number(r[i]) for r in part), name) for i, name in reasons), reverse=True)[:3]
        print(f"{begin:#8x} {kind:24} {100 * s / total_samples:7.1f}% {100 * n / total_executed:6.1f}%  " +
              ", ".join(f"{name} {v}" for v, name in why if v))
    print(f"\nmost sampled instructions (offset, samples, main reason, instruction | the one before):")
    order = sorted(range(len(body)), key=lambda k: -number(body[k][samples]))[:top]
    for k in order:
        r = body[k]
        main_reason = max(reasons, key=lambda ir: number(r[ir[0]]))[1]
        before = body[k - 1][1].strip()[:40] if k else ""
        print(f"{offset(r):#8x} {number(r[samples]):7d} {main_reason:14} {r[1].strip()[:60]:60} | {before}")


if __name__ == "__main__":
    main()
