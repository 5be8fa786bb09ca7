#!/usr/bin/python3
"""PyTorch DDP worker for bench/elastic.py's torchrun modes: the MLP of
`shoal train --model mlp` on Fashion-MNIST, a global batch split over
WORLD_SIZE ranks, SGD momentum, gloo, 1 thread a rank. Started by
`torchrun --max_restarts K`, the way PyTorch users survive a lost worker:
torchrun stops every worker and starts them all again, and each resumes
from the newest checkpoint (rank 0 writes one every --checkpoint-every
steps, atomically). Writes its pid to --pids/<RANK> (the bench's faults
aim there), metrics.jsonl epoch records and "final: test accuracy X%"."""
import argparse
import datetime
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_train_torch import find, model, read_idx, shoal_init  # noqa: E402


def load(d, split):
    x = read_idx(find(d, split, "images", 3)).astype(np.float32) / 255.0
    y = read_idx(find(d, split, "labels", 1)).astype(np.int64)
    x = (x - x.mean()) / x.std()
    return torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y)


def save(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--global-batch", type=int, default=48)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--collective-timeout", type=float, default=60,
                    help="gloo's deadline for a collective (s): all a frozen peer is found by")
    ap.add_argument("--out", required=True)
    ap.add_argument("--pids", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with open(os.path.join(a.pids, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.collective_timeout))
    os.makedirs(a.out, exist_ok=True)
    xs, ys = load(a.data, "train")
    xt, yt = load(a.data, "t10k")
    torch.manual_seed(0)
    net = shoal_init(model("mlp"))
    ddp = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=0.9)
    ckpt = os.path.join(a.out, "ckpt.pt")
    step = 0
    if os.path.exists(ckpt):
        s = torch.load(ckpt)
        net.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step = s["step"]
        print(f"[{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d}] rank {rank} "
              f"resumed from {ckpt} at step {step}", flush=True)
    b = a.global_batch // world
    spe = len(xs) // a.global_batch
    metrics = open(os.path.join(a.out, "metrics.jsonl"), "a") if rank == 0 else None
    while step < spe * a.epochs:
        epoch = step // spe
        perm = torch.randperm(len(xs), generator=torch.Generator().manual_seed(epoch))
        while step < spe * a.epochs and step // spe == epoch:
            i = (step % spe) * a.global_batch + rank * b
            idx = perm[i:i + b]
            loss = F.cross_entropy(ddp(xs[idx]), ys[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and step % a.checkpoint_every == 0:
                save(ckpt, {"model": net.state_dict(), "opt": opt.state_dict(), "step": step})
        if metrics:
            metrics.write(json.dumps({"kind": "epoch", "epoch": epoch + 1, "step": step}) + "\n")
            metrics.flush()
    if rank == 0:
        with torch.no_grad():
            acc = (net(xt).argmax(1) == yt).float().mean().item()
        print(f"final: test accuracy {100 * acc:.2f}% after {a.epochs} epochs", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
