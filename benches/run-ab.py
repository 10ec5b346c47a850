#!/usr/bin/env python3
"""Paired A/B of `fencelog run -- /bin/true` where the two builds may leave
different logs behind (a change to when snapshots are written, say): each build
runs on a log of its own, both logs warmed with the same number of runs, then
the two alternate run by run (A then B, B then A), each run timed from its
spawn to its exit. Prints each side's p50 and the p50 of the paired
differences (B - A), in ms, and the snapshots each log holds at the end.

(The supervise bench's `--cli-a` pairs two builds on one log, which is right
for a change to what a run does, and wrong for a change to what a run leaves
for the next: both sides would share it.)

Usage, from the repository's root:
    python3 benches/run-ab.py OLD/fencelog NEW/fencelog [PAIRS [WARM_RUNS]]
A control: the same build on both sides.
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    a, b = sys.argv[1], sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    warm = int(sys.argv[4]) if len(sys.argv) > 4 else 300
    os.makedirs("target/bench-tmp", exist_ok=True)
    d = tempfile.mkdtemp(prefix="run-ab", dir="target/bench-tmp")
    try:
        exe, err = {}, {}
        for side, path in (("a", a), ("b", b)):
            # Copies, as installed binaries are (see `copy_of_this_build` in supervise.rs).
            exe[side] = os.path.join(d, side)
            shutil.copy(path, exe[side])
            subprocess.run([exe[side], "init", "--dir", f"{d}/log-{side}"], stdout=subprocess.DEVNULL, check=True)
            err[side] = open(f"{d}/stderr-{side}", "w")

        def one(side):
            t = time.perf_counter()
            subprocess.run(
                [exe[side], "run", "--dir", f"{d}/log-{side}", "--", "/bin/true"],
                stdout=subprocess.DEVNULL,
                stderr=err[side],
                check=True,
            )
            return (time.perf_counter() - t) * 1000

        for _ in range(warm):
            one("a")
            one("b")
        ta, tb = [], []
        for i in range(pairs):
            if i % 2 == 0:
                ta.append(one("a"))
                tb.append(one("b"))
            else:
                tb.append(one("b"))
                ta.append(one("a"))
        diff = [y - x for x, y in zip(ta, tb)]
        print(
            f"a p50 {statistics.median(ta):.3f} ms, b p50 {statistics.median(tb):.3f} ms, "
            f"b - a paired p50 {statistics.median(diff):.3f} ms ({pairs} pairs after {warm} warm-up runs each)"
        )
        for side in ("a", "b"):
            err[side].close()
            said = open(f"{d}/stderr-{side}").read()
            snaps = sorted(os.listdir(f"{d}/log-{side}/snapshots"))
            print(f"{side}: snapshots at the end {snaps}; stderr: {said[:300] or 'nothing'}")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
