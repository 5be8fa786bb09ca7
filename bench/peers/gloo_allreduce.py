#!/usr/bin/python3
"""Gloo peer for bench/comm.py: torch.distributed (gloo backend, Debian
python3-torch) all_reduce of f32 sum at the same sizes and timing rule as
`shoal bench comm`. Spawns N local processes; rank 0 prints 'bytes time_us'.

    gloo_allreduce.py N [max_bytes] [min_s] [NODES NODE_RANK MASTER_ADDR:PORT]

With the last three, this is one node of NODES running N ranks each (global
rank NODE_RANK*N + local), meeting at MASTER_ADDR:PORT (GLOO_SOCKET_IFNAME
picks the interface, as for PyTorch)."""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(local, n, port, max_bytes, min_s, nodes=1, node_rank=0, addr="127.0.0.1"):
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    rank = node_rank * n + local
    dist.init_process_group("gloo", rank=rank, world_size=nodes * n)
    buf = torch.arange(max_bytes // 4, dtype=torch.float32) % 7
    b = 4
    while b <= max_bytes:
        t = buf[: b // 4]
        for _ in range(3):
            dist.all_reduce(t)
        t0 = time.perf_counter()
        dist.all_reduce(t)
        one = time.perf_counter() - t0
        iters = torch.tensor([min(2000, max(5, int(min_s / max(one, 1e-7))))])
        dist.all_reduce(iters, op=dist.ReduceOp.MAX)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(int(iters)):
            dist.all_reduce(t)
        us = torch.tensor([(time.perf_counter() - t0) * 1e6 / int(iters)], dtype=torch.float64)
        dist.all_reduce(us, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"{b} {float(us):.3f}", flush=True)
        b *= 4
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1])
    max_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 256 << 20
    min_s = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    if len(sys.argv) > 6:
        nodes, node_rank = int(sys.argv[4]), int(sys.argv[5])
        addr, port = sys.argv[6].rsplit(":", 1)
        mp.spawn(run, args=(n, int(port), max_bytes, min_s, nodes, node_rank, addr), nprocs=n,
                 join=True)
    else:
        port = 29000 + os.getpid() % 1000
        mp.spawn(run, args=(n, port, max_bytes, min_s), nprocs=n, join=True)
