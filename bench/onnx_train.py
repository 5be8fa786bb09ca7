#!/usr/bin/python3
"""bench/onnx_train: models exported from PyTorch, trained by Shoal and by PyTorch.

For each model (the project's CNN on Fashion-MNIST 28x28; torchvision's
resnet18 at 3x32x32 on random images, an .npz; with --models zoo, every
model of tests/python/zoo.py as well) and thread count, exports the
PyTorch module to ONNX (tests/python/onnx_export.py), trains it with
`shoal train --model model.onnx`, and trains the same PyTorch module in this
script's peer mode: same data, batch 64, SGD momentum 0.9, constant lr, one
epoch of --images images. Prints training images/s side by side (the
training loop only: no start-up, no evaluation).

usage: bench/onnx_train.py [--shoal build/shoal] [--threads 1,2] [--images 6400]
                           [--models cnn,resnet18|zoo]
"""
import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FASHION = "/usr/share/datasets/fashion-mnist"


def load_data(data, limit):
    """x float32 [n, C, H, W] normalized by the training set, y int64 [n]."""
    import numpy as np
    if data.endswith(".npz"):
        z = np.load(data)
        x, y = z["x_train"][:limit], z["y_train"][:limit]
    else:
        def idx(name):
            b = gzip.open(os.path.join(FASHION, name)).read()
            k = b[3]
            dims = [int.from_bytes(b[4 + 4 * i:8 + 4 * i], "big") for i in range(k)]
            return np.frombuffer(b, np.uint8, offset=4 + 4 * k).reshape(dims)
        x = idx("train-images-idx3-ubyte.gz")[:limit, None]
        y = idx("train-labels-idx1-ubyte.gz")[:limit]
    x = x.astype(np.float32) / 255.0
    return (x - x.mean()) / x.std(), y.astype(np.int64)


def peer(model, data, threads, images, batch):
    """PyTorch's side: one epoch of `images`, printing {"images_per_s": ...}."""
    import torch
    import torch.nn as nn
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from onnx_export import build
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    net, _ = build(model)
    x, y = load_data(data, images)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    net.train()
    steps = len(x) // batch
    t0 = None
    for s in range(steps):
        if s == 2:  # first two steps warm the allocator and oneDNN's primitive cache
            t0 = time.perf_counter()
        xb, yb = x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(net(xb), yb).backward()
        opt.step()
    dt = time.perf_counter() - t0
    print(json.dumps({"images_per_s": (steps - 2) * batch / dt}))


def shoal(binary, onnx, data, threads, images, batch, env=None):
    out = tempfile.mkdtemp(prefix="shoal_bench_onnx_")
    try:
        subprocess.run([binary, "train", "--model", onnx, "--data", data, "--epochs", "1",
                        "--batch", str(batch), "--optimizer", "momentum", "--lr", "0.01",
                        "--threads", str(threads), "--limit-train", str(images),
                        "--limit-test", "256", "--out", out, "--quiet", "--no-plot",
                        "--no-checkpoints"], check=True, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, **(env or {})))
        with open(os.path.join(out, "metrics.jsonl")) as f:
            rows = [json.loads(l) for l in f if '"kind":"epoch"' in l]
        return rows[-1]["images_per_s"]
    finally:
        shutil.rmtree(out, ignore_errors=True)


def torch_ips(model, data, threads, images, batch):
    best = 0.0
    # OpenBLAS's own threads fight torch's (docs/BENCHMARKS.md): the peer
    # gets the faster of 1 and `threads`.
    for ob in sorted({1, threads}):
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(ob))
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--peer", model, "--data",
                            data, "--threads", str(threads), "--images", str(images),
                            "--batch", str(batch)], check=True, capture_output=True, text=True,
                           env=env)
        best = max(best, json.loads(p.stdout.strip().splitlines()[-1])["images_per_s"])
    return best


ZOO = ("cnn,resnet18,mobilenet_v2,lenet,mixer,conv1d,conv3d,pool3d,convt3d,dwsep,gru,lstm,vit,mnasnet0_5,"
       "squeezenet1_1,shufflenet_v2_x0_5,mobilenet_v3_small")


def input_shape(model):
    """The model's input shape at export (tests/python/onnx_export.py's build)."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    from onnx_export import build
    return build(model)[1]


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--images", type=int, default=6400)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default="cnn,resnet18",
                    help="comma-separated, or 'zoo' for every model of tests/python/zoo.py "
                    "and the ones above")
    ap.add_argument("--shoal-env", action="append", default=[], metavar="K=V",
                    help="set for Shoal's runs only (e.g. GOMP_SPINCOUNT=10000: PyTorch keeps "
                    "its own OpenMP settings)")
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        peer(a.peer, a.data, int(a.threads), a.images, a.batch)
        return
    import numpy as np
    work = tempfile.mkdtemp(prefix="shoal_bench_onnx_")
    try:
        rng = np.random.default_rng(0)
        rgb = os.path.join(work, "rgb32.npz")
        np.savez(rgb, x_train=rng.integers(0, 256, (a.images, 3, 32, 32), dtype=np.uint8),
                 y_train=rng.integers(0, 10, a.images), x_test=rng.integers(
                     0, 256, (256, 3, 32, 32), dtype=np.uint8), y_test=rng.integers(0, 10, 256))
        print("| model | input | threads | Shoal img/s | PyTorch img/s | ratio |")
        print("|---|---|---|---|---|---|")
        for model in (ZOO if a.models == "zoo" else a.models).split(","):
            d = os.path.join(work, model)
            subprocess.run([sys.executable, os.path.join(ROOT, "tests", "python",
                                                         "onnx_export.py"), model, d],
                           check=True, capture_output=True)
            data = "fashion-mnist" if input_shape(model)[1] == 1 else rgb
            shape = "1x28x28" if data == "fashion-mnist" else "3x32x32"
            for t in [int(v) for v in a.threads.split(",")]:
                s = shoal(a.shoal, os.path.join(d, "model.onnx"), data, t, a.images, a.batch,
                          dict(kv.split("=", 1) for kv in a.shoal_env))
                p = torch_ips(model, data if data != "fashion-mnist" else "idx", t, a.images,
                              a.batch)
                print(f"| {model} | {shape} | {t} | {s:,.0f} | {p:,.0f} | **{s / p:.2f}x** |",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
