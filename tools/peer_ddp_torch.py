#!/usr/bin/python3
"""PyTorch DistributedDataParallel peer for bench/dp.py: the same MLP, CNN or
ResNet-20 as `shoal train`, batch B per rank, SGD momentum 0.9, 1 thread per
rank, gloo backend, each rank on its own shard of one shared permutation.
--model gpt: the character-level GPT of `shoal train --model gpt` (the layers
of tests/python/gpt_torch.py, --layers/--heads/--dim, context 64) on
--data's text, Adam 0.003, reporting tokens/s.
Starts `--ranks` processes itself (torch.multiprocessing, MASTER_ADDR on
loopback; with --nnodes N --node-rank R --master HOST:PORT, one such
group per host, meeting there) and prints one JSON line (node 0): global training images/s over the timed
steps (after warm-up), and the BLAS libtorch loaded."""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_train_torch import find, model as mlp_or_cnn, read_idx  # noqa: E402


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


def resnet20(classes=10):
    layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    c = 16
    for stage, width in enumerate((16, 32, 64)):
        for blk in range(3):
            layers.append(Block(c, width, 2 if (blk == 0 and stage > 0) else 1))
            c = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, classes)]
    return nn.Sequential(*layers)


class Gpt(nn.Module):
    """tests/python/gpt_torch.py's decoder (weights as named leaves) as a
    module DDP can wrap, initialized as `shoal train --model gpt` does."""

    def __init__(self, a, vocab):
        super().__init__()
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__))), "tests", "python"))
        import gpt_torch as G
        self.G = G
        self.cfg, w0 = G.initial(a.layers, a.heads, a.dim, GPT_CONTEXT, vocab, True, a.seed)
        self.keys = list(w0)
        self.ws = nn.ParameterList([nn.Parameter(w0[k].clone()) for k in self.keys])

    def forward(self, x):
        return self.G.forward(dict(zip(self.keys, self.ws)), x, self.cfg)


GPT_CONTEXT = 64


def text_windows(path):
    """(inputs, targets, vocabulary size): the text's first 90% cut into
    windows of GPT_CONTEXT characters."""
    text = open(path, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    tok = torch.tensor([index[c] for c in text[: len(text) - int(len(text) * 0.1)]])
    n = (len(tok) - 1) // GPT_CONTEXT
    return (tok[: n * GPT_CONTEXT].view(n, GPT_CONTEXT),
            tok[1: n * GPT_CONTEXT + 1].view(n, GPT_CONTEXT), len(vocab))


def worker(local, a, port, q):
    # --nnodes: this process is one of --ranks on node --node-rank; the
    # world is nnodes x ranks, met at --master.
    host, port = (a.master.rsplit(":", 1) if a.master else ("127.0.0.1", port))
    os.environ.update(MASTER_ADDR=host, MASTER_PORT=str(port))
    torch.set_num_threads(a.threads)
    rank, world = a.node_rank * a.ranks + local, a.nnodes * a.ranks
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(a.seed)
    if a.model == "gpt":
        x, y, vocab = text_windows(a.data)
        net = Gpt(a, vocab)
    else:
        x = read_idx(find(a.data, "train", "images", 3)).astype(np.float32) / 255.0
        y = read_idx(find(a.data, "train", "labels", 1)).astype(np.int64)
        x = torch.from_numpy((x - x.mean()) / x.std()).unsqueeze(1)
        y = torch.from_numpy(y)
        net = resnet20() if a.model == "resnet" else mlp_or_cnn(a.model)
    ddp = nn.parallel.DistributedDataParallel(net)
    if a.model == "gpt":
        opt = torch.optim.Adam(ddp.parameters(), lr=0.003)
        ce = nn.CrossEntropyLoss()

        def lossf(logits, target):
            return ce(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=0.9)
        lossf = nn.CrossEntropyLoss()
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(a.seed))
    gb = a.batch * world

    def step(i):
        idx = perm[(i * gb + rank * a.batch) % (len(y) - gb):][:a.batch]
        opt.zero_grad(set_to_none=True)
        lossf(ddp(x[idx]), y[idx]).backward()
        opt.step()

    for i in range(a.warmup):
        step(i)
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(a.warmup, a.warmup + a.steps):
        step(i)
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        q.put(a.steps * gb / dt * (GPT_CONTEXT if a.model == "gpt" else 1))
    dist.destroy_process_group()


def blas_in_use():
    try:
        with open(f"/proc/{os.getpid()}/maps") as f:
            libs = {l.split()[-1] for l in f if "blas" in l.lower() and l.split()[-1].startswith("/")}
        return ", ".join(sorted(os.path.realpath(p) for p in libs)) or "none mapped"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=4, help="--model gpt")
    ap.add_argument("--heads", type=int, default=4, help="--model gpt")
    ap.add_argument("--dim", type=int, default=128, help="--model gpt")
    ap.add_argument("--nnodes", type=int, default=1, help="nodes (hosts), --ranks on each")
    ap.add_argument("--node-rank", type=int, default=0)
    ap.add_argument("--master", default="", help="HOST:PORT of rank 0 (with --nnodes)")
    a = ap.parse_args()
    torch.zeros(64, 64) @ torch.zeros(64, 64)  # map the BLAS libtorch uses
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    mp.start_processes(worker, args=(a, port, q), nprocs=a.ranks, join=True, start_method="spawn")
    if a.node_rank == 0:
        rate = "tokens_per_s" if a.model == "gpt" else "images_per_s"
        print(json.dumps({rate: q.get(), "blas": blas_in_use(),
                          "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
