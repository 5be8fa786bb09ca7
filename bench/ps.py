#!/usr/bin/python3
"""bench/ps: parameter-server training throughput, next to all-reduce.

On the CNN (batch 64 per worker, SGD momentum, 1 thread per worker), one
after the other on this host:
  shoal run -n 2 -- shoal train ...                       (all-reduce)
  shoal run --ps 1,2 -- shoal train --dist ps ...          (sync PS)
  shoal run --ps 1,2 -- shoal train --dist ps --ps-mode async
and the two PS modes again with worker 1 slowed by SHOAL_PS_DELAY_MS per
step. Prints the job's training images/s (async: the sum of the workers')
and the lowest test accuracy over the workers, and draws the job's
images/s per run as bars (PNG, gnuplot).

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


def run(shoal, launch, extra, steps, delay_ms=0):
    out = tempfile.mkdtemp(prefix="shoal_ps_bench_")
    train = [shoal, "train", "--model", "cnn", "--batch", "64", "--optimizer", "momentum",
             "--lr", "0.02", "--threads", "1", "--max-steps", str(steps), "--limit-test", "2000",
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
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
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
        ("async PS, 1 server, 2 workers", ["--ps", "1,2"], ["--dist", "ps", "--ps-mode", "async"],
         0, 2),
        (f"sync PS, worker 1 +{a.delay_ms:g} ms/step", ["--ps", "1,2"], ["--dist", "ps"],
         a.delay_ms, 0),
        (f"async PS, worker 1 +{a.delay_ms:g} ms/step", ["--ps", "1,2"],
         ["--dist", "ps", "--ps-mode", "async"], a.delay_ms, 2),
    ]
    results = {}
    print(f"{'run':44s} {'images/s':>9s} {'test acc %':>10s}  (lowest over workers)")
    for name, launch, extra, delay, mult in cases:
        rows, finals = run(a.shoal, launch, extra, a.steps, delay)
        ips, acc = summary(finals, mult)
        results[name] = (ips, acc, rows)
        print(f"{name:44s} {ips:9.0f} {acc:10.2f}", flush=True)
    base = results["all-reduce, 2 ranks"][0]
    for name in results:
        print(f"  {name}: {results[name][0] / base:.2f}x all-reduce")
    if a.png and shutil.which("gnuplot"):
        data = tempfile.NamedTemporaryFile("w", suffix=".dat", delete=False)
        for name, (ips, acc, _) in results.items():
            data.write(f'"{name}" {ips:.0f}\n')
        data.close()
        script = (f"set terminal pngcairo size 1000,520; set output '{a.png}';"
                  "set style data histograms; set style fill solid 0.6; set boxwidth 0.7;"
                  "set ylabel 'job training images/s'; set xtics rotate by -20 font ',9';"
                  "set yrange [0:*]; set key off;"
                  "set title 'CNN, 2 workers (batch 64 each, 1 thread each), 2-core host';"
                  f"plot '{data.name}' using 2:xtic(1), '' using 0:2:2 with labels offset 0,1")
        subprocess.run(["gnuplot", "-e", script], check=True)
        os.unlink(data.name)
        print(f"chart: {a.png}")


if __name__ == "__main__":
    main()
