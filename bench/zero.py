#!/usr/bin/python3
"""bench/zero: sharded data parallelism (ZeRO-1) on the GPT, Shoal vs PyTorch 1.13.

At N ranks (1 thread each, batch 16 per rank, context 64, Adam), one after
the other on this host:
  shoal run -n N -- shoal train --model gpt ... --zero 0   (gradients all-reduced)
  shoal run -n N -- shoal train --model gpt ... --zero 1   (ZeRO-1)
  PyTorch DDP (gloo) + torch.optim.Adam
  PyTorch DDP (gloo) + ZeroRedundancyOptimizer(Adam)
the same decoder (tests/python/gpt_torch.py's forward) on the same text.
Prints global training tokens/s and the optimizer state per rank (Shoal: its
log; PyTorch: the bytes of the optimizer's state tensors on rank 0).

usage: bench/zero.py [--shoal build/shoal] [--ranks 2] [--steps 100]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch_spawn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/games/fortunes/cookie"
LAYERS, HEADS, DIM, CONTEXT, BATCH = 4, 4, 128, 64, 16


def shoal(binary, ranks, steps, zero):
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            [binary, "run", "-n", str(ranks), "--", binary, "train", "--model", "gpt", "--data",
             "text:" + TEXT, "--layers", str(LAYERS), "--heads", str(HEADS), "--dim", str(DIM),
             "--context", str(CONTEXT), "--batch", str(BATCH), "--optimizer", "adam", "--lr",
             "0.003", "--max-steps", str(steps), "--threads", "1", "--limit-test", "4",
             "--zero", str(zero), "--no-plot", "--no-checkpoints", "--quiet", "--out", d],
            capture_output=True, text=True, check=True).stdout
    final = [l for l in out.splitlines() if "final:" in l][-1]
    mem = [l for l in out.splitlines() if "optimizer state " in l][-1]
    tps = float(final.split(" tok/s")[0].rsplit(" ", 1)[1])
    state = int(mem.split("optimizer state ")[1].split(" ")[0])
    return tps, state


def torch_rank(rank, ranks, steps, zero, port, q):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import gpt_torch as G
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=ranks)
    x, y, vocab = G.all_windows(TEXT, CONTEXT)
    n = len(x)
    a, w0 = G.initial(LAYERS, HEADS, DIM, CONTEXT, vocab, True)

    class Gpt(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.p = torch.nn.ParameterDict(
                {k.replace(".", "_"): torch.nn.Parameter(v) for k, v in w0.items()})

        def forward(self, xb):
            return G.forward({k: self.p[k.replace(".", "_")] for k in w0}, xb, a)

    model = DDP(Gpt())
    if zero:
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      lr=0.003)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=0.003)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(n, generator=g)
    t0 = None
    for s in range(steps + 5):
        if s == 5:
            dist.barrier()
            t0 = time.perf_counter()
        lo = ((s * ranks + rank) * BATCH) % (n - BATCH)
        b = perm[lo: lo + BATCH]
        loss = F.cross_entropy(model(x[b]).reshape(-1, a.vocab), y[b].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.barrier()
    secs = time.perf_counter() - t0
    state = sum(t.numel() * t.element_size() for st in opt.optim.state.values() if zero
                for t in st.values() if torch.is_tensor(t) and t.dim() > 0) if zero else sum(
        t.numel() * t.element_size() for st in opt.state.values() for t in st.values()
        if torch.is_tensor(t) and t.dim() > 0)
    if rank == 0:
        q.put((steps * BATCH * CONTEXT * ranks / secs, state))
    dist.destroy_process_group()


def torch_run(ranks, steps, zero, port):
    return torch_spawn.run(torch_rank, ranks, ranks, steps, zero, port)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    print(f"GPT {LAYERS} layers x {DIM}, {HEADS} heads, context {CONTEXT}, batch {BATCH}/rank, "
          f"Adam, {a.ranks} ranks x 1 thread, {a.steps} timed steps")
    print("| layout | Shoal tok/s | Shoal optimizer state (rank 0) | PyTorch tok/s | "
          "PyTorch optimizer state (rank 0) | Shoal / PyTorch |")
    print("|---|---|---|---|---|---|")
    for zero in (0, 1):
        mine, mstate = shoal(a.shoal, a.ranks, a.steps, zero)
        theirs, tstate = torch_run(a.ranks, a.steps, zero, 29500 + zero)
        name = "ZeRO-1" if zero else "plain DP"
        print(f"| {name} | {mine:,.0f} | {mstate:,} B | {theirs:,.0f} | {tstate:,} B | "
              f"{mine / theirs:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
