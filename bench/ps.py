#!/usr/bin/python3
"""bench/ps: parameter-server training throughput, next to all-reduce.

On the CNN (batch 64 per worker, SGD momentum, 1 thread per worker), one
after the other on this host:
  shoal run -n 2 -- shoal train ...                       (all-reduce)
  shoal run --ps 1,2 -- shoal train --dist ps ...          (sync PS)
  SHOAL_PS_SHM=0 shoal run --ps 1,2 -- ...                  (sync PS, over TCP)
  shoal run --ps 1,2 -- shoal train --dist ps --ps-mode async
and the two PS modes again with worker 1 slowed by SHOAL_PS_DELAY_MS per
step, and async once more with staleness-aware learning rates
(--ps-stale-lr). Prints the job's training images/s (async: the sum of the workers')
and the lowest test accuracy over the workers, and draws (PNG, gnuplot)
the job's images/s per run as bars beside worker 0's test accuracy after
each of the 5 epochs against elapsed time.

usage: bench/ps.py [--shoal build/shoal] [--steps 300] [--delay-ms 40]
                   [--png docs/ps_bench.png]
"""
import argparse
import json
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(shoal, launch, extra, steps, delay_ms=0, env=None):
    out = tempfile.mkdtemp(prefix="shoal_ps_bench_")
    # 5 epochs of `steps` / 5 steps per worker (the training set cut to
    # fit): each epoch ends with a test accuracy, the chart's points.
    train = [shoal, "train", "--model", "cnn", "--batch", "64", "--optimizer", "momentum",
             "--lr", "0.02", "--threads", "1", "--epochs", "5",
             "--limit-train", str(steps // 5 * 64 * 2), "--limit-test", "2000",
             "--no-plot", "--quiet", "--no-checkpoints", "--out", out] + extra
    cmd = [shoal, "run"] + launch + ["--"] + train
    if delay_ms:
        # Worker 1 only (the launcher numbers workers with SHOAL_PS_WORKER_ID);
        # worker 0 writes the metrics the chart shows.
        inner = " ".join(train)
        cmd = [shoal, "run"] + launch + [
            "--", "sh", "-c",
            f'if [ "$SHOAL_PS_WORKER_ID" = 1 ]; then export SHOAL_PS_DELAY_MS={delay_ms}; fi; '
            f"exec {inner}"]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, **(env or {})))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    shutil.rmtree(out, ignore_errors=True)
    # "[worker 1] final: test accuracy 86.60% after ..., 4229 img/s, 4.7 s"
    finals = []
    for line in p.stdout.splitlines():
        if "final: test accuracy" in line:
            acc = float(line.split("test accuracy ")[1].split("%")[0])
            ips = float(line.split(" img/s")[0].rsplit(" ", 1)[1])
            finals.append((acc, ips))
    return rows, finals


def summary(finals, per_worker):
    """The job's images/s: sync and all-reduce runs report the job's (summed
    over ranks); async workers each report their own."""
    ips = sum(f[1] for f in finals) if per_worker else finals[0][1]
    return ips, min(f[0] for f in finals)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--delay-ms", type=float, default=40)
    ap.add_argument("--png", default="")
    a = ap.parse_args()
    # Async epochs report one worker's images/s (each keeps its own count):
    # the job's is twice that with 2 workers.
    cases = [
        ("all-reduce, 2 ranks", ["-n", "2"], [], 0, 0),
        ("sync PS, 1 server, 2 workers", ["--ps", "1,2"], ["--dist", "ps"], 0, 0),
        ("sync PS over TCP (SHOAL_PS_SHM=0)", ["--ps", "1,2"], ["--dist", "ps"], 0, 0,
         {"SHOAL_PS_SHM": "0"}),
        ("async PS, 1 server, 2 workers", ["--ps", "1,2"], ["--dist", "ps", "--ps-mode", "async"],
         0, 2),
        (f"sync PS, worker 1 +{a.delay_ms:g} ms/step", ["--ps", "1,2"], ["--dist", "ps"],
         a.delay_ms, 0),
        (f"async PS, worker 1 +{a.delay_ms:g} ms/step", ["--ps", "1,2"],
         ["--dist", "ps", "--ps-mode", "async"], a.delay_ms, 2),
        (f"async PS --ps-stale-lr, worker 1 +{a.delay_ms:g} ms/step", ["--ps", "1,2"],
         ["--dist", "ps", "--ps-mode", "async", "--ps-stale-lr"], a.delay_ms, 2),
    ]
    results = {}
    print(f"{'run':44s} {'images/s':>9s} {'test acc %':>10s}  (lowest over workers)")
    for name, launch, extra, delay, mult, *env in cases:
        rows, finals = run(a.shoal, launch, extra, a.steps, delay, env[0] if env else None)
        ips, acc = summary(finals, mult)
        results[name] = (ips, acc, rows)
        print(f"{name:44s} {ips:9.0f} {acc:10.2f}", flush=True)
    base = results["all-reduce, 2 ranks"][0]
    for name in results:
        print(f"  {name}: {results[name][0] / base:.2f}x all-reduce")
    if a.png and shutil.which("gnuplot"):
        chart(results, a.png)


def chart(results, png):
    """Left: each job's training images/s. Right: worker 0's test accuracy
    after each epoch against the job's elapsed seconds."""
    bars = tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False)
    for name, (ips, _, _) in results.items():
        bars.write(f'"{name}" {ips:.0f}\n')
    bars.close()
    lines = tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False)
    for name, (_, _, rows) in results.items():
        lines.write(f'"{name}"\n')
        for r in rows:
            if r.get("kind") == "epoch":
                lines.write(f'{r["elapsed_seconds"]:.2f} {100 * r["test_acc"]:.2f}\n')
        lines.write("\n\n")
    lines.close()
    n = len(results)
    script = (f"set terminal pngcairo size 1400,560 noenhanced; set output '{png}';"
              "set multiplot layout 1,2 title 'CNN, 2 workers (batch 64 each, 1 thread each), "
              "2-core host';"
              "set style data histograms; set style fill solid 0.6; set boxwidth 0.7;"
              "set ylabel 'job training images/s'; set xtics rotate by -25 font ',9';"
              "set yrange [0:*]; set key off; set title 'throughput';"
              f"plot '{bars.name}' using 2:xtic(1), '' using 0:2:2 with labels offset 0,1;"
              "set style data linespoints; set xtics norotate font ',10'; set key bottom right font ',9';"
              "set xlabel 'seconds since start'; set ylabel 'test accuracy % (worker 0)';"
              "set yrange [*:*]; set title 'accuracy over time';"
              f"plot for [i=0:{n - 1}] '{lines.name}' index i using 1:2 with linespoints "
              "title columnheader(1);"
              "unset multiplot")
    subprocess.run(["gnuplot", "-e", script], check=True)
    os.unlink(bars.name)
    os.unlink(lines.name)
    print(f"chart: {png}")

if __name__ == "__main__":
    main()
