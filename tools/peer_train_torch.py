#!/usr/bin/python3
"""PyTorch peer for bench/train: trains the same MLP or CNN as `shoal train`
(same layers, init family, batch, SGD-momentum rule, per-step cosine lr,
normalization computed from the data, IDX files read the same way) and
writes one JSON line per epoch to stdout: train images/s (training loop
only) and test accuracy, like Shoal's metrics.jsonl."""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn as nn


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def find(d, split, kind, nd):
    for name in (f"{split}-{kind}-idx{nd}-ubyte", f"{split}-{kind}.idx{nd}-ubyte"):
        for ext in ("", ".gz"):
            p = os.path.join(d, name + ext)
            if os.path.exists(p):
                return p
    raise FileNotFoundError(f"{d}: no {split} {kind}")


def model(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10))


def shoal_init(net):
    """Shoal's init family: Kaiming normal, Xavier uniform classifier, zero bias."""
    for m in net.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    last = [m for m in net.modules() if isinstance(m, nn.Linear)][-1]
    nn.init.xavier_uniform_(last.weight)
    return net


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr = read_idx(find(a.data, "train", "images", 3)).astype(np.float32) / 255.0
    ytr = read_idx(find(a.data, "train", "labels", 1)).astype(np.int64)
    xte = read_idx(find(a.data, "t10k", "images", 3)).astype(np.float32) / 255.0
    yte = read_idx(find(a.data, "t10k", "labels", 1)).astype(np.int64)
    mean, std = float(xtr.mean()), float(xtr.std())
    xtr = torch.from_numpy((xtr - mean) / std).unsqueeze(1)
    xte = torch.from_numpy((xte - mean) / std).unsqueeze(1)
    ytr, yte = torch.from_numpy(ytr), torch.from_numpy(yte)
    net = shoal_init(model(a.model))
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    spe = len(ytr) // a.batch
    total = spe * a.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    lossf = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(a.seed)
    elapsed_train = 0.0
    for epoch in range(a.epochs):
        net.train()
        perm = torch.randperm(len(ytr), generator=g)
        t0 = time.perf_counter()
        for i in range(spe):
            idx = perm[i * a.batch:(i + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = lossf(net(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            sched.step()
        dt = time.perf_counter() - t0
        elapsed_train += dt
        net.eval()
        with torch.no_grad():
            correct = sum(int((net(xte[j:j + 500]).argmax(1) == yte[j:j + 500]).sum())
                          for j in range(0, len(yte), 500))
        print(json.dumps({"kind": "epoch", "epoch": epoch + 1, "images_per_s": spe * a.batch / dt,
                          "train_seconds": dt, "elapsed_train_seconds": elapsed_train,
                          "test_acc": correct / len(yte), "loss": float(loss)}), flush=True)


if __name__ == "__main__":
    main()
