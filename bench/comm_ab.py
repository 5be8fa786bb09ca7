#!/usr/bin/python3
"""bench/comm_ab: two builds' small all-reduces, alternated, split by mode.

On this 2-core VM a 2-rank all-reduce of 1-4 KiB over shared memory is
bimodal: a run lands near 2-3 us when the two ranks' spinning overlaps and
near 9-10 us when it does not, and which one a run gets is decided by the
scheduler, not by the code. A median over a few rounds compares how often
each build was lucky. This runs the builds alternately, many rounds, and
reports each mode apart (each build going first in half the rounds) (how many rounds fell in it, its median and
quartiles), which is what a change to the code can move.

usage: bench/comm_ab.py BEFORE/shoal AFTER/shoal [--rounds 60] [--split-us 6]
       [--max-bytes 4096] [--env NAME=VALUE ...]   (env for the AFTER build)
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys


def one_run(shoal, max_bytes, env):
    out = subprocess.run(
        [shoal, "run", "-n", "2", "--", shoal, "bench", "comm", "--max-bytes",
         str(max_bytes), "--seconds", "0.3"],
        capture_output=True, text=True, timeout=120, env=env, check=True).stdout
    times = {}
    for line in out.splitlines():
        f = line.split()
        # "[rank 0]  bytes  count  time(us) ..."
        if len(f) >= 5 and f[0] == "[rank" and f[2].isdigit():
            times[int(f[2])] = float(f[4])
    return times


def summary(values, split):
    low = sorted(v for v in values if v < split)
    high = sorted(v for v in values if v >= split)

    def mode(v):
        if not v:
            return "-"
        q = statistics.quantiles(v, n=4) if len(v) > 2 else [v[0], v[0], v[-1]]
        return f"{len(v)} at {statistics.median(v):.2f} ({q[0]:.1f}-{q[2]:.1f})"

    return mode(low), mode(high), statistics.mean(values)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--split-us", type=float, default=6.0)
    ap.add_argument("--max-bytes", type=int, default=4096)
    ap.add_argument("--env", action="append", default=[])
    a = ap.parse_args()
    after_env = dict(os.environ)
    for kv in a.env:
        k, _, v = kv.partition("=")
        after_env[k] = v
    seen = collections.defaultdict(list)
    for r in range(a.rounds):
        builds = [("before", a.before, os.environ), ("after", a.after, after_env)]
        # Each build goes first in half the rounds: a run's mode can depend
        # on what ran just before it.
        for name, shoal, env in builds if r % 2 == 0 else builds[::-1]:
            for size, t in one_run(shoal, a.max_bytes, env).items():
                if size >= 1024:
                    seen[(size, name)].append(t)
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, end="\r")
    print(f"| bytes | build | low mode: rounds at median (IQR) us "
          f"| high mode (>= {a.split_us:g} us) | mean |")
    print("|---|---|---|---|---|")
    for (size, name), v in sorted(seen.items()):
        low, high, mean = summary(v, a.split_us)
        print(f"| {size} | {name} | {low} | {high} | {mean:.2f} |")


if __name__ == "__main__":
    main()
