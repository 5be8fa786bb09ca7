#!/usr/bin/python3
"""bench/train: Shoal vs PyTorch on the same training runs, in one process.

For each thread count, trains the MLP (1 epoch) and the CNN (up to 4 epochs,
SGD momentum 0.9, per-step cosine lr) on Fashion-MNIST with batch 64 in
`shoal train` and in tools/peer_train_torch.py, and prints training
images/s and time to 91% test accuracy (training time summed over epochs
until the first epoch-end evaluation at >= 91%) side by side with ratios.

usage: bench/train.py [--shoal build/shoal] [--threads 1,2] [--cnn-epochs 4]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def shoal_run(binary, model, epochs, threads, lr, data):
    out = tempfile.mkdtemp(prefix="shoal_bench_")
    try:
        cmd = [binary, "train", "--model", model, "--data", data, "--epochs", str(epochs),
               "--batch", "64", "--optimizer", "momentum", "--lr", str(lr), "--schedule",
               "cosine", "--threads", str(threads), "--seed", "0", "--out", out, "--quiet",
               "--no-plot", "--no-checkpoints"]
        subprocess.run(cmd, check=True)
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f if '"kind":"epoch"' in l]
        acc = 0.0
        for r in rows:
            acc += r["train_seconds"]
            r["elapsed_train_seconds"] = acc
        return rows
    finally:
        shutil.rmtree(out, ignore_errors=True)


def torch_run(model, epochs, threads, lr, data, openblas_threads):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(openblas_threads))
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "tools", "peer_train_torch.py"), "--model",
           model, "--data", data, "--epochs", str(epochs), "--batch", "64", "--lr", str(lr),
           "--threads", str(threads), "--seed", "0"]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def ips(rows):
    return sum(r["train_seconds"] * r["images_per_s"] for r in rows) / \
        sum(r["train_seconds"] for r in rows)


def time_to(rows, target):
    for r in rows:
        if r["test_acc"] >= target:
            return r["elapsed_train_seconds"], r["epoch"]
    return None, None


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cnn-epochs", type=int, default=4)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    torch_ver = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import torch; print(torch.__version__, 'mkldnn' if torch.backends.mkldnn.is_available() else 'no-mkldnn')"],
        capture_output=True, text=True, check=True).stdout.strip()
    print(f"peer: PyTorch {torch_ver}; libblas.so.3 -> {blas}")
    print(f"shoal: {a.shoal}; batch 64, SGD momentum 0.9, cosine lr; Fashion-MNIST {a.data}")
    print()
    hdr = f"{'model':<5} {'thr':>3} {'shoal img/s':>12} {'torch img/s':>12} {'ratio':>6}   " \
          f"{'shoal t91':>10} {'torch t91':>10} {'ratio':>6}   {'final acc shoal/torch':>22}"
    print(hdr)
    print("-" * len(hdr))
    for t in [int(x) for x in a.threads.split(",")]:
        best_ob = None
        for model, epochs, lr in (("mlp", 1, 0.02), ("cnn", a.cnn_epochs, 0.05)):
            s = shoal_run(a.shoal, model, epochs, t, lr, a.data)
            if best_ob is None:
                # The peer at its best: OpenBLAS's own pthreads compete with
                # torch's OpenMP threads, so try OPENBLAS_NUM_THREADS=1 and =t
                # on the MLP and keep the faster for both models.
                runs = {ob: torch_run(model, epochs, t, lr, a.data, ob) for ob in sorted({1, t})}
                best_ob = max(runs, key=lambda ob: ips(runs[ob]))
                p = runs[best_ob]
                print(f"  (peer at {t} threads: OPENBLAS_NUM_THREADS={best_ob} was fastest: " +
                      ", ".join(f"{ob}: {ips(r):.0f} img/s" for ob, r in runs.items()) + ")")
            else:
                p = torch_run(model, epochs, t, lr, a.data, best_ob)
            s_ips, p_ips = ips(s), ips(p)
            line = f"{model:<5} {t:>3} {s_ips:>12.0f} {p_ips:>12.0f} {s_ips / p_ips:>5.2f}x   "
            if model == "cnn":
                st, se = time_to(s, 0.91)
                pt, pe = time_to(p, 0.91)
                fs = f"{st:.1f}s@e{se}" if st else "not reached"
                p_total = p[-1]["elapsed_train_seconds"]
                # Not reached in the peer's epochs: its time is more than all of them.
                fp = f"{pt:.1f}s@e{pe}" if pt else f">{p_total:.1f}s"
                if st and pt:
                    ratio = f"{st / pt:.2f}x"
                elif st:
                    ratio = f"<{st / p_total:.2f}x"
                else:
                    ratio = "-"
                line += f"{fs:>10} {fp:>10} {ratio:>6}   "
            else:
                line += f"{'':>10} {'':>10} {'':>6}   "
            line += f"{100 * s[-1]['test_acc']:>10.2f}% / {100 * p[-1]['test_acc']:.2f}%"
            print(line, flush=True)
    print("\nt91 = training seconds until the first epoch-end test accuracy >= 91% "
          "(ratio < 1: Shoal faster)")


if __name__ == "__main__":
    sys.exit(main())
