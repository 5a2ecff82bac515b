"""Per-instruction warp-stall samples of one kernel from an Nsight Compute source-page export.

    ncu --import bwd.ncu-rep --page source --csv --print-source sass > bwd.source.csv   (on the GPU host)
    python3 bench/ncu_stalls.py bwd.source.csv FlashBwdSm90 [--top 40] [--conflicts]

Prints the SASS instructions with the most stall samples (share of the kernel's samples and the
two largest stall reasons), or with --conflicts the shared-memory accesses with N-way bank
conflicts. The kernel is picked by a substring of its name (the export holds every kernel of
the profiled range, one block per kernel).
"""

from __future__ import annotations

import argparse
import csv
import io


def kernel_rows(path: str, name_part: str) -> list[dict[str, str]]:
    blocks: list[list[str]] = []
    for line in open(path).read().split("\n"):
        if line.startswith('"Kernel Name"'):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    for block in blocks:
        if name_part in block[0]:
            rows = list(csv.reader(io.StringIO("\n".join(block[1:]))))
            header = rows[0]
            return [dict(zip(header, r)) for r in rows[1:] if len(r) == len(header)]
    raise SystemExit(f"no kernel whose name contains {name_part!r} in {path}")


def num(row: dict[str, str], key: str) -> float:
    try:
        return float(row.get(key, "").replace(",", ""))
    except ValueError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("kernel", help="substring of the kernel name")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--conflicts", action="store_true")
    a = ap.parse_args()
    rows = kernel_rows(a.csv, a.kernel)
    total = sum(num(r, "Warp Stall Sampling (All Samples)") for r in rows)
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    if a.conflicts:
        for r in rows:
            if num(r, "L1 Conflicts Shared N-Way") > 1.01:
                print(f"{r['Address']:>16} {r['Source'].strip()[:64]:64s} {num(r, 'L1 Conflicts Shared N-Way'):.0f}-way")
        return
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k] if rows else []
    for r in sorted(rows, key=lambda r: -num(r, "Warp Stall Sampling (All Samples)"))[: a.top]:
        share = num(r, "Warp Stall Sampling (All Samples)") / max(total, 1)
        top2 = sorted(((num(r, k), k[6:]) for k in reasons), reverse=True)[:2]
        print(f"{r['Address'][-6:]:>6} {100 * share:5.2f}% {r['Source'].strip()[:60]:60s} "
              + " ".join(f"{k}:{v:.0f}" for v, k in top2))


if __name__ == "__main__":
    main()
