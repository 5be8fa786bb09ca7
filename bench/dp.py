#!/usr/bin/python3
"""bench/dp: data-parallel training throughput, Shoal vs PyTorch DDP (gloo).

For each model (MLP, CNN, ResNet-20) and rank count (1, 2, 4; 1 thread per
rank, batch 64 per rank, SGD momentum), runs
  shoal run -n N -- shoal train --threads 1 ...   (gradients all-reduced in the graph)
  tools/peer_ddp_torch.py --ranks N --threads 1   (torch DistributedDataParallel, gloo)
one after the other on this host, prints global training images/s side by
side with ratios (Shoal / DDP, and each side's N ranks / its own 1 rank), for 2
ranks also two independent 1-rank Shoal runs side by side (the host's ceiling
for 2 ranks: they share memory bandwidth and caches), and draws a grouped bar
chart (PNG, gnuplot). Ranks above the core count are oversubscribed and the
table says so.

usage: bench/dp.py [--shoal build/shoal] [--models mlp,cnn,resnet] [--ranks 1,2,4]
                   [--png docs/dp_bench.png] [--repeat 1]
       bench/dp.py --ceiling [--models mlp,cnn] [--repeat 3]   # the host's 2-rank ceiling
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import gnuplot_chart

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STEPS = {"mlp": 400, "cnn": 120, "resnet": 30}  # timed steps per run


def epoch_ips(out):
    """Mean images/s over the epochs of a run directory's metrics.jsonl."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(l)["images_per_s"] for l in f if '"kind":"epoch"' in l]
    return sum(rows) / len(rows)


def shoal_ips(binary, model, ranks, data, steps, epochs=1):
    out = tempfile.mkdtemp(prefix="shoal_dp_bench_")
    try:
        cmd = [binary, "run", "-n", str(ranks), "--timeout", "900", "--", binary, "train",
               "--model", model, "--data", data, "--epochs", str(epochs), "--batch", "64",
               "--threads", "1",
               "--optimizer", "momentum", "--lr", "0.02", "--limit-train",
               str(steps * 64 * ranks), "--limit-test", "500", "--out", out, "--quiet",
               "--no-plot", "--no-checkpoints"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return epoch_ips(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def shoal_pair_ips(binary, model, data, steps, epochs=1):
    """Two independent one-rank trainings side by side (no communication):
    the most two ranks can reach on this host, which shares its memory
    bandwidth and caches between them. Returns the sum of their images/s."""
    outs = [tempfile.mkdtemp(prefix="shoal_dp_pair_") for _ in range(2)]
    try:
        procs = []
        for out in outs:
            cmd = [binary, "train", "--model", model, "--data", data, "--epochs", str(epochs), "--batch",
                   "64", "--threads", "1", "--optimizer", "momentum", "--lr", "0.02",
                   "--limit-train", str(steps * 64), "--limit-test", "500", "--out", out,
                   "--quiet", "--no-plot", "--no-checkpoints"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL))
        total = 0.0
        for p, out in zip(procs, outs):
            if p.wait() != 0:
                raise RuntimeError(f"shoal train exited {p.returncode}")
            total += epoch_ips(out)
        return total
    finally:
        for out in outs:
            shutil.rmtree(out, ignore_errors=True)


def torch_ips(model, ranks, data, steps):
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "tools", "peer_ddp_torch.py"), "--model", model,
           "--ranks", str(ranks), "--threads", "1", "--data", data, "--steps", str(steps)]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return json.loads([l for l in p.stdout.splitlines() if l.startswith("{")][-1])


def chart(results, models, ranks, png):
    def commands(d, out):
        tsv = os.path.join(d, "data.tsv")
        with open(tsv, "w") as f:
            for m in models:
                for n in ranks:
                    s, t = results[(m, n)]
                    f.write(f'"{m} x{n}"\t{s:.1f}\t{t:.1f}\n')
        script = f"""
set terminal pngcairo size 1100,480 noenhanced
set output '{out}'
set title 'Data-parallel training, images/s (1 thread per rank, batch 64 per rank; 4 ranks oversubscribe 2 cores)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set ylabel 'images/s (log scale)'
set logscale y
set grid ytics
set key top right
set xtics rotate by -30
plot '{tsv}' using 2:xtic(1) title 'Shoal (graph all-reduce)', '' using 3 title 'PyTorch DDP (gloo)'
"""
        return script

    gnuplot_chart.render(png, commands)


def ceiling(a):
    """What 2 ranks can reach on this host: two processes that never talk,
    computing at once, share its memory bandwidth and caches. 3 epochs of the
    usual steps each, so start-up and end offsets do not let one run alone."""
    print("model   solo img/s   pair img/s (x solo)   2-rank job img/s (x solo, of pair)")
    for m in a.models.split(","):
        for _ in range(a.repeat):
            solo = shoal_ips(a.shoal, m, 1, a.data, STEPS[m], epochs=3)
            pair = shoal_pair_ips(a.shoal, m, a.data, STEPS[m], epochs=3)
            job = shoal_ips(a.shoal, m, 2, a.data, STEPS[m], epochs=3)
            print(f"{m:<7} {solo:>10.0f} {pair:>12.0f} ({pair / solo:.2f}x) {job:>16.0f} "
                  f"({job / solo:.2f}x, {100 * job / pair:.0f}%)", flush=True)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--models", default="mlp,cnn,resnet")
    ap.add_argument("--ranks", default="1,2,4")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "dp_bench.png"))
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the best is kept")
    ap.add_argument("--ceiling", action="store_true",
                    help="instead: per model, --repeat rounds of one rank alone, two independent "
                         "1-rank runs at once, and the 2-rank job, each 3 epochs long (so the pair "
                         "really overlaps); prints img/s and ratios")
    a = ap.parse_args()
    if a.ceiling:
        ceiling(a)
        return
    models = a.models.split(",")
    ranks = [int(r) for r in a.ranks.split(",")]
    cores = os.cpu_count()
    blas = None
    results = {}
    print(f"host: {cores} cores; 1 thread per rank, batch 64 per rank, SGD momentum 0.9")
    hdr = (f"{'model':<7} {'ranks':>5} {'shoal img/s':>12} {'ddp img/s':>10} {'shoal/ddp':>9} "
           f"{'shoal vs 1':>10} {'ddp vs 1':>9}")
    print(hdr)
    for m in models:
        for n in ranks:
            s = max(shoal_ips(a.shoal, m, n, a.data, STEPS[m]) for _ in range(a.repeat))
            peers = [torch_ips(m, n, a.data, STEPS[m]) for _ in range(a.repeat)]
            t = max(p["images_per_s"] for p in peers)
            blas = peers[0]["blas"]
            results[(m, n)] = (s, t)
            s1, t1 = results[(m, ranks[0])]
            note = "  (oversubscribed)" if n > cores else ""
            if n == 2 and ranks[0] == 1:
                pair = max(shoal_pair_ips(a.shoal, m, a.data, STEPS[m]) for _ in range(a.repeat))
                note += f"  (2 independent 1-rank runs: {pair / s1:.2f}x)"
            print(f"{m:<7} {n:>5} {s:>12.0f} {t:>10.0f} {s / t:>8.2f}x {s / s1:>9.2f}x "
                  f"{t / t1:>8.2f}x{note}", flush=True)
    print(f"peer BLAS: {blas}")
    chart(results, models, ranks, a.png)


if __name__ == "__main__":
    main()
