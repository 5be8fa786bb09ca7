"""Runs one function per rank in spawned processes, as PyTorch's distributed
examples do; the benches' PyTorch sides (bench/zero.py, bench/pp_torch.py)
share it. `target(rank, *args, queue)` puts its result on the queue (one
rank does); run() returns that result once every rank has exited."""


def run(target, ranks, *args):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    ps = [ctx.Process(target=target, args=(r, *args, q)) for r in range(ranks)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    return q.get()
