#!/usr/bin/python3
"""bench/mp: the GPT under each way of distributing it, in one run.

One process, then at N ranks (1 thread each, context 64, Adam, untied
head, batch 16 per data-parallel rank or per pipeline; ranks unbound unless
--bind): plain data
parallelism, ZeRO-1, tensor parallelism over the N ranks, pipelines of N
stages (GPipe and 1F1B, and 1F1B interleaved: 2 chunks per rank), and (at 4) 2 data-parallel groups of 2 tensor- or
pipeline-parallel ranks. Prints the job's training tokens/s (global tokens
over the training loop's time) and rank 0's memory as its log reports it:
parameters, optimizer state, the step's planned arena.

For the pipelines, a second short run with --trace measures each stage's
idle fraction (time in pp_recv and the loss broadcast over the step's time,
the last 10 steps) against the schedule's bubble (p-1)/(v·m+p-1) (v chunks
per rank), and the bound: one process's tokens/s x min(the host's measured
concurrency for N processes (N copies of the one-process run at once),
N x (1 - bubble)).

usage: bench/mp.py [--shoal build/shoal] [--ranks 2,4] [--steps 100] [--png docs/mp_bench.png]
                   [--bind cores|layout]
       bench/mp.py --tp-bound   (tensor parallelism against its compute/communication bound)
"""
import glob
import json
import argparse
import os
import subprocess
import tempfile

import gnuplot_chart

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/games/fortunes/cookie"
BIND = []  # shoal run --bind MODE for every multi-rank run (--bind)
MODEL = ["--model", "gpt", "--untied", "--data", "text:" + TEXT, "--layers", "4", "--heads", "4",
         "--dim", "128", "--context", "64"]


def command(binary, ranks, steps, extra, d):
    cmd = [binary, "train"] + MODEL + [
        "--batch", "16", "--optimizer", "adam", "--lr", "0.003", "--max-steps", str(steps),
        "--threads", "1", "--limit-test", "4", "--no-plot", "--no-checkpoints", "--quiet",
        "--out", d] + extra
    if ranks > 1:
        cmd = [binary, "run", "-n", str(ranks)] + BIND + ["--"] + cmd
    return cmd


def tokens_per_s(out):
    final = [l for l in out.splitlines() if "final:" in l][-1]
    return float(final.split(" tok/s")[0].rsplit(" ", 1)[1])


def concurrency(binary, n, steps, one):
    """N one-process runs at once: their summed tokens/s over one run's."""
    dirs = [tempfile.TemporaryDirectory() for _ in range(n)]
    procs = [subprocess.Popen(command(binary, 1, steps, [], d.name), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for d in dirs]
    total = sum(tokens_per_s(p.communicate()[0]) for p in procs)
    for d in dirs:
        d.cleanup()
    return total / one


def idle(binary, ranks, extra):
    """Per rank: time waiting in pp_recv and the loss broadcast / step time."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run(command(binary, ranks, 30, extra + ["--trace", d + "/trace.json"], d),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=True)
        fractions = []
        for f in sorted(glob.glob(d + "/trace.rank*.json")):
            ev = json.load(open(f))
            ev = ev["traceEvents"] if isinstance(ev, dict) else ev
            step = sum(e["dur"] for e in ev if e.get("name") == "train_step")
            wait = sum(e["dur"] for e in ev if e.get("name") in ("pp_recv", "comm_broadcast"))
            fractions.append(wait / step)
    return fractions


def run(binary, ranks, steps, extra):
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(command(binary, ranks, steps, extra, d), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, check=True).stdout
    final = [l for l in out.splitlines() if "final:" in l][-1]
    mem = [l for l in out.splitlines() if "memory on rank 0" in l][-1]
    tps = float(final.split(" tok/s")[0].rsplit(" ", 1)[1])
    field = lambda key: int(mem.split(key + " ")[1].split(" ")[0])  # noqa: E731
    return tps, field("parameters"), field("optimizer state"), field("step arena")


def allreduce_s(binary, n, nbytes):
    """`shoal bench comm -n N`: one all-reduce of nbytes (interpolated between
    the table's sizes, linear in bytes as the alpha-beta model is)."""
    out = subprocess.run([binary, "bench", "comm", "-n", str(n), "--max-bytes",
                          str(4 * nbytes), "--seconds", "0.3"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, check=True).stdout
    rows = sorted((int(f[0]), float(f[2]) * 1e-6) for f in
                  (l.split() for l in out.splitlines()) if len(f) >= 6 and f[0].isdigit())
    lo = max(r for r in rows if r[0] <= nbytes)
    hi = min(r for r in rows if r[0] >= nbytes)
    if hi[0] == lo[0]:
        return lo[1]
    return lo[1] + (hi[1] - lo[1]) * (nbytes - lo[0]) / (hi[0] - lo[0])


def tp_bound(a):
    """Tensor parallelism against its compute/communication bound, in one
    run: per step, the one-process compute split over the host's measured
    concurrency, plus 4 all-reduces per layer (2 forward at the row-parallel
    outputs, 2 backward at the column-parallel inputs) of batch x context x
    dim floats, each as long as `shoal bench comm` measures it."""
    tokens = 16 * 64
    act = 16 * 64 * 128 * 4
    one = run(a.shoal, 1, a.steps, [])[0]
    print(f"one process: {one:,.0f} tok/s; all-reduces of {act:,} B, 16 per step")
    print("| layout | ranks | concurrency | all-reduce ms | compute-only bound | bound tokens/s | "
          "measured / bound |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(v) for v in a.ranks.split(",")]:
        c = concurrency(a.shoal, n, a.steps, one)
        ar = allreduce_s(a.shoal, n, act)
        step = tokens / (one * c) + 16 * ar
        bound = tokens / step
        # Sequence parallelism moves the same bytes (a reduce-scatter and an
        # all-gather in place of each all-reduce): the same bound.
        for name, extra in (("", []), (" + sequence parallel", ["--sequence-parallel"])):
            tps = run(a.shoal, n, a.steps, ["--tp", str(n)] + extra)[0]
            print(f"| tensor parallel {n}{name} | {n} | {c:.2f}x | {ar * 1e3:.3f} | "
                  f"{one * c:,.0f} | {bound:,.0f} | {tps / bound:.2f} ({tps:,.0f}) |", flush=True)


def chart(rows, png):
    """Tokens/s and rank 0's memory per layout, side by side (gnuplot)."""
    def commands(d, out):
        tsv = os.path.join(d, "data.tsv")
        with open(tsv, "w") as f:
            for name, n, tps, params, state, arena in rows:
                f.write(f'"{name} ({n})"\t{tps:.0f}\t{params / 1e6:.3f}\t{state / 1e6:.3f}'
                        f'\t{arena / 1e6:.3f}\n')
        script = f"""
set terminal pngcairo size 1400,560 noenhanced
set output '{out}'
set multiplot layout 1,2 title 'GPT 4 x 128 under each layout (ranks); 1 thread per rank, 2 cores'
set style data histograms
set style fill solid 0.85 border -1
set grid ytics
set xtics rotate by 35 right font ',8'
set bmargin 12
set title 'training tokens/s (whole job)'
set yrange [0:*]
set style histogram clustered gap 1
plot '{tsv}' using 2:xtic(1) notitle
set title 'rank 0 memory, MB'
set style histogram rowstacked
set key top right
plot '{tsv}' using 3:xtic(1) title 'parameters', '' using 4 title 'optimizer state', \\
     '' using 5 title 'step arena'
unset multiplot
"""
        return script

    gnuplot_chart.render(png, commands)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--png", default="", help="write a chart of the first table here")
    p.add_argument("--tp-bound", action="store_true",
                   help="only tensor parallelism against its compute/communication bound")
    p.add_argument("--bind", default="none", choices=["none", "cores", "layout"],
                   help="shoal run --bind for the multi-rank runs (cores helps some layouts on "
                        "an oversubscribed host and hurts others; layout: docs/launch.md)")
    p.add_argument("--only", default="",
                   help="comma-separated prefixes: only the layouts whose name starts with one")
    a = p.parse_args()
    if a.bind != "none":
        BIND.extend(["--bind", a.bind])
    if a.tp_bound:
        return tp_bound(a)
    print(f"GPT 4 layers x 128, 4 heads, context 64, untied, batch 16 per data-parallel rank "
          f"(or pipeline), Adam, {a.steps} steps, 1 thread per rank")
    print("| layout | ranks | tokens/s | rank 0: parameters | optimizer state | step arena |")
    print("|---|---|---|---|---|---|")
    rows = [("one process", 1, [])]
    pipes = []
    for n in [int(v) for v in a.ranks.split(",")]:
        rows += [("data parallel", n, []), ("ZeRO-1", n, ["--zero", "1"]),
                 ("ZeRO-2", n, ["--zero", "2"]), ("ZeRO-3", n, ["--zero", "3"]),
                 (f"tensor parallel {n}", n, ["--tp", str(n)])]
        for sched, m, v in (("gpipe", 4, 1), ("1f1b", 4, 1), ("1f1b", 8, 1), ("1f1b", 4, 2),
                            ("1f1b", 8, 2)):
            pipes.append((f"pipeline {n}, {sched}, m={m}" + (f", {v} chunks" if v > 1 else ""),
                          n, m, ["--pp", str(n), "--pp-schedule", sched, "--micro-batches",
                                 str(m), "--pp-virtual", str(v)]))
        if n == 4:
            rows.append(("2 DP groups x TP 2", 4, ["--tp", "2", "--dp", "2"]))
            pipes.append(("2 DP groups x pipeline 2, 1f1b, m=4", 4, 4,
                          ["--pp", "2", "--dp", "2", "--micro-batches", "4"]))
            pipes.append(("pipeline 2 of TP 2, 1f1b, m=4", 4, 4,
                          ["--pp", "2", "--tp", "2", "--micro-batches", "4"]))
    if a.only:
        keep = tuple(a.only.split(","))
        rows = [r for r in rows if r[0] == "one process" or r[0].startswith(keep)]
        pipes = [p for p in pipes if p[0].startswith(keep)]
    one, measured, table = None, {}, []
    for name, n, extra in rows + [(p[0], p[1], p[3]) for p in pipes]:
        tps, params, state, arena = run(a.shoal, n, a.steps, extra)
        one = one or tps
        measured[name] = tps
        table.append((name, n, tps, params, state, arena))
        print(f"| {name} | {n} | {tps:,.0f} | {params:,} B | {state:,} B | {arena:,} B |",
              flush=True)
    if a.png:
        chart(table, a.png)
    print()
    print("| pipeline | stages | bubble (p-1)/(v·m+p-1) | measured idle per stage | "
          "bound tokens/s | measured / bound |")
    print("|---|---|---|---|---|---|")
    ceiling = {}
    for name, n, m, extra in pipes:
        p = int(extra[1])
        if n not in ceiling:
            ceiling[n] = concurrency(a.shoal, n, a.steps, one)
            print(f"(host: {n} one-process runs at once reach {ceiling[n]:.2f}x one)", flush=True)
        v = int(extra[extra.index("--pp-virtual") + 1]) if "--pp-virtual" in extra else 1
        bubble = (p - 1) / (v * m + p - 1)  # v chunks per rank: Megatron's interleaving
        fr = idle(a.shoal, n, extra)
        # Each of the n ranks computes (1 - bubble) of the time, and the host
        # gives at most its measured concurrency.
        bound = one * min(ceiling[n], n * (1 - bubble))
        tps = measured[name]
        print(f"| {name} | {p} | {bubble:.1%} | {', '.join(f'{x:.1%}' for x in fr)} | "
              f"{bound:,.0f} | {tps / bound:.2f} ({tps:,.0f}) |", flush=True)


if __name__ == "__main__":
    main()
