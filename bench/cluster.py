#!/usr/bin/env python3
"""The cluster module's numbers, in one run (issue 17).

1. Link costs measured here: `shoal bench comm -n 2` over shared memory and
   over TCP loopback; each fitted as t(n) = 2a + n*b for a 2-rank all-reduce
   (a from the 4-byte row, b from the slope up to 64 MiB). Shared memory
   stands for the links inside a node, TCP for a switch; the spine is
   assumed to be TCP at half its bandwidth and twice its latency (this host
   has no spine to measure).
2. `shoal simulate --project` with those costs: ring, halving-doubling and
   the two-level all-reduce at 8..4096 ranks, 8 per node.
3. `shoal simulate` on three setups, every policy on the same trace: 10,000
   jobs on 1,000 nodes (the speed goal: < 1 s on one core), and 3,000 jobs
   on 64 nodes with and without placement cost.

usage: bench/cluster.py [--shoal build/shoal] [--png docs/cluster_bench.png]
"""
import argparse
import os
import subprocess

import gnuplot_chart

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(args, check=True, capture_output=True, text=True, env=e).stdout


def link_cost(shoal, transport):
    out = sh([shoal, "bench", "comm", "-n", "2", "--max-bytes", str(64 << 20), "--seconds", "0.3"],
             {"SHOAL_TRANSPORT": transport})
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0].isdigit():
            rows[int(f[0])] = float(f[2]) * 1e-6
    small, big = rows[4], rows[64 << 20]
    alpha = small / 2
    beta = (big - small) / (64 << 20)
    return alpha, beta, out.splitlines()[0]


def chart(png, projection, sims):
    def commands(d, out):
        for size, rows in projection.items():
            with open(os.path.join(d, f"p{size}.tsv"), "w") as f:
                for r in rows:
                    f.write("\t".join(str(x) for x in r) + "\n")
        with open(os.path.join(d, "sim.tsv"), "w") as f:
            for setup, reps in sims:
                for r in reps:
                    f.write(f'"{setup}: {r["policy"]}"\t{r["util"]}\t{r["goodput"]}\n')
        sizes = list(projection)
        plots = ", ".join(
            f"'{d}/p{s}.tsv' using 1:{c} with linespoints title '{name}, {s / 1e6:g} MB'"
            for s in sizes for c, name in ((2, "ring"), (3, "halving-doubling"), (4, "two-level")))
        script = f"""
set terminal pngcairo size 1400,560 noenhanced
set output '{out}'
set multiplot layout 1,2 title 'Shoal cluster module: projected all-reduce (link costs measured here) and the simulator'
set logscale xy
set xlabel 'ranks (8 per node)'
set ylabel 'all-reduce ms'
set key top left font ',8'
set grid
plot {plots}
unset logscale
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set yrange [0:115]
set ylabel 'percent of chips'
set xlabel ''
set xtics rotate by 35 right font ',8'
set key top center horizontal
set bmargin 10
plot '{d}/sim.tsv' using 2:xtic(1) title 'utilization', '' using 3 title 'goodput'
unset multiplot
"""
        return script

    gnuplot_chart.render(png, commands)


def parse_sim(out):
    reps = []
    for line in out.splitlines():
        f = line.split()
        # (the wait-reason lines under the table start with a policy too)
        if (len(f) > 6 and f[0] in ("fifo-first-fit", "backfill", "backfill-topo", "shoal")
                and f[5].endswith("%")):
            # policy jobs done refused makespan util goodput ...
            reps.append({"policy": f[0], "util": float(f[5].rstrip("%")),
                         "goodput": float(f[6].rstrip("%")), "line": line})
    return reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--png", default="")
    a = p.parse_args()
    ha, hb, hline = link_cost(a.shoal, "auto")
    na, nb, nline = link_cost(a.shoal, "tcp")
    print("## link costs (shoal bench comm -n 2, fitted)")
    print(f"shared memory: alpha {ha * 1e6:.2f} us, {8 / hb / 1e9:.2f} Gbit/s   ({hline})")
    print(f"TCP loopback:  alpha {na * 1e6:.2f} us, {8 / nb / 1e9:.2f} Gbit/s   ({nline})")
    costs = ["--host-alpha-us", f"{ha * 1e6:.3f}", "--host-gbit-s", f"{8 / hb / 1e9:.3f}",
             "--net-alpha-us", f"{na * 1e6:.3f}", "--net-gbit-s", f"{8 / nb / 1e9:.3f}",
             "--spine-alpha-us", f"{2 * na * 1e6:.3f}", "--spine-gbit-s", f"{4 / nb / 1e9:.3f}"]
    proj = sh([a.shoal, "simulate", "--project", "--bytes", "1000000,100000000"] + costs)
    print("\n## shoal simulate --project " + " ".join(costs))
    print(proj)
    projection = {}
    for line in proj.splitlines():
        f = line.split()
        if len(f) >= 6 and f[0].isdigit():
            projection.setdefault(int(f[0]), []).append(
                (int(f[1]), float(f[2]), float(f[3]), float(f[4])))
    sims = []
    for setup, args in (
            ("1000 nodes", []),
            ("64 nodes, same constraints", ["--nodes", "64", "--per-switch", "16", "--jobs", "3000",
                                            "--comm-fraction", "0", "--baseline-adjacency"]),
            ("64 nodes, placement cost", ["--nodes", "64", "--per-switch", "16", "--jobs", "3000"])):
        out = sh([a.shoal, "simulate"] + args)
        print(f"## shoal simulate {' '.join(args)}   ({setup})")
        print(out)
        sims.append((setup, parse_sim(out)))
    if a.png:
        chart(a.png, projection, sims)


if __name__ == "__main__":
    main()
