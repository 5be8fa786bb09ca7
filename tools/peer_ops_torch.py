#!/usr/bin/python3
"""PyTorch peer for bench/ops: times the same matmul and conv2d shapes, forward
and backward, at the given thread count. Prints one JSON object on stdout."""
import json
import os
import statistics
import sys
import time

# OpenBLAS starts its own threads, one per core, unless told otherwise: the
# matmul peer "at 1 thread" then ran on both cores (1024^3: 11.4 ms vs 21.6
# ms on one). Set before torch loads OpenBLAS.
if len(sys.argv) > 1 and "OPENBLAS_NUM_THREADS" not in os.environ:
    os.environ["OPENBLAS_NUM_THREADS"] = sys.argv[1]

import torch  # noqa: E402


def timeit(fn, reps):
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    threads = int(sys.argv[1])
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(),
           "blas": os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")}
    a = torch.randn(1024, 1024, requires_grad=True)
    b = torch.randn(1024, 1024, requires_grad=True)
    dy = torch.randn(1024, 1024)
    with torch.no_grad():
        out["matmul_fwd_ms"] = timeit(lambda: torch.matmul(a, b), reps)
    y = torch.matmul(a, b)
    out["matmul_bwd_ms"] = timeit(lambda: torch.autograd.grad(y, (a, b), dy, retain_graph=True), reps)
    x = torch.randn(64, 32, 28, 28, requires_grad=True)
    conv = torch.nn.Conv2d(32, 64, 3, padding=1, bias=False)
    with torch.no_grad():
        out["conv_fwd_ms"] = timeit(lambda: conv(x), reps)
    yc = conv(x)
    dyc = torch.randn_like(yc)
    out["conv_bwd_ms"] = timeit(
        lambda: torch.autograd.grad(yc, (x, conv.weight), dyc, retain_graph=True), reps)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
