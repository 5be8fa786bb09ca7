#!/usr/bin/python3
"""bench/gpt_train: the character-level GPT trained by Shoal and by PyTorch.

For each size and thread count, trains `shoal train --model gpt --data
text:FILE` for --steps steps, and the same decoder in PyTorch
(tests/python/gpt_torch.py's forward: the same layers, weights as leaf
tensors) on the same windows of the same text, batch 32, Adam. Prints
training tokens/s side by side (the training loop only: no start-up, no
evaluation), one row per (size, threads), and the ratio.

--micro-batches 1,4: each batch also as M micro-batches, gradients
accumulated before one update (Shoal: `--micro-batches M`; PyTorch: M
forward/backward passes of loss / M, then the step), with each process's
peak resident memory (ru_maxrss) beside the speed.

--precision f32,bf16: also in bf16 (Shoal: `--precision bf16`; PyTorch:
the forward under `torch.autocast("cpu", dtype=torch.bfloat16)`), with
Shoal's bf16 over its own f32 in the last column.

--rounds R: each cell R times, the runs of Shoal and PyTorch alternating,
and the median of each (this VM's speed drifts by a third between runs a
minute apart: one run per cell does not settle a ratio near a goal).
--baseline BINARY: another Shoal (an older build) run in the same rounds,
its median and the ratio of --shoal's to it in two more columns.

usage: bench/gpt_train.py [--shoal build/shoal] [--threads 1,2] [--steps 150]
                          [--sizes small,base] [--micro-batches 1] [--precision f32]
                          [--rounds 1] [--baseline BINARY]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/games/fortunes/cookie"
SIZES = {"small": (2, 4, 64), "base": (4, 4, 128)}  # layers, heads, dim
CONTEXT, BATCH = 64, 32


def peer(size, threads, steps, micro, precision):
    """PyTorch's side: prints {"tokens_per_s": ...}."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import gpt_torch as G
    torch.set_num_threads(threads)
    text = open(TEXT, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    train = text[: len(text) - int(len(text) * 0.1)]
    tok = torch.tensor([index[c] for c in train])
    n = (len(tok) - 1) // CONTEXT
    x, y = tok[: n * CONTEXT].view(n, CONTEXT), tok[1 : n * CONTEXT + 1].view(n, CONTEXT)

    class A:
        pass
    a = A()
    a.layers, a.heads, a.dim = SIZES[size]
    a.context, a.vocab, a.tied, a.seed = CONTEXT, len(vocab), True, 0
    with tempfile.TemporaryDirectory() as d:
        a.out = os.path.join(d, "w.safetensors")
        G.init(a)
        w0, _ = G.load(a.out)
    w = {k: v.requires_grad_(True) for k, v in w0.items()}
    opt = torch.optim.Adam(list(w.values()), lr=0.003)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(n, generator=g)
    t0 = None
    for s in range(steps + 5):
        if s == 5:
            t0 = time.perf_counter()  # 5 warm-up steps
        b = perm[(s * BATCH) % (n - BATCH):][:BATCH]
        opt.zero_grad()
        for part in b.chunk(micro):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = G.forward(w, x[part], a).reshape(-1, a.vocab)
            loss = F.cross_entropy(logits.float(), y[part].reshape(-1))
            (loss / micro).backward()
        opt.step()
    secs = time.perf_counter() - t0
    print(json.dumps({"tokens_per_s": steps * BATCH * CONTEXT / secs}))


def run_measured(cmd):
    """(stdout, peak resident MiB) of one child process."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited with {p.returncode}")
    return out, usage.ru_maxrss / 1024


def shoal(binary, size, threads, steps, micro, precision):
    layers, heads, dim = SIZES[size]
    with tempfile.TemporaryDirectory() as d:
        out, rss = run_measured(
            [binary, "train", "--model", "gpt", "--data", "text:" + TEXT, "--layers", str(layers),
             "--heads", str(heads), "--dim", str(dim), "--context", str(CONTEXT), "--batch",
             str(BATCH), "--optimizer", "adam", "--lr", "0.003", "--max-steps", str(steps),
             "--threads", str(threads), "--limit-test", "4", "--no-plot", "--no-checkpoints",
             "--micro-batches", str(micro), "--precision", precision, "--quiet", "--out", d])
    line = [l for l in out.splitlines() if l.startswith("final:")][-1]
    return float(line.split(" tok/s")[0].rsplit(" ", 1)[1]), rss


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--sizes", default="small,base")
    p.add_argument("--micro-batches", default="1")
    p.add_argument("--precision", default="f32")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--baseline")
    p.add_argument("--peer", nargs=4, metavar=("SIZE", "THREADS", "MICRO", "PRECISION"))
    a = p.parse_args()
    if a.peer:
        peer(a.peer[0], int(a.peer[1]), a.steps, int(a.peer[2]), a.peer[3])
        return
    print(f"GPT on {TEXT}, context {CONTEXT}, batch {BATCH}, Adam, {a.steps} steps"
          + (f", median of {a.rounds} alternating runs" if a.rounds > 1 else ""))
    base_cols = " Baseline tok/s | Shoal / baseline |" if a.baseline else ""
    print("| size (layers/heads/dim) | threads | micro-batches | precision | Shoal tok/s | "
          "PyTorch tok/s | Shoal / PyTorch | Shoal / Shoal f32 | Shoal peak RSS | "
          "PyTorch peak RSS |" + base_cols)
    print("|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if a.baseline else ""))
    for size in a.sizes.split(","):
        for t in [int(v) for v in a.threads.split(",")]:
            for m in [int(v) for v in a.micro_batches.split(",")]:
                f32 = None
                for prec in a.precision.split(","):
                    mine, theirs, base = [], [], []
                    for _ in range(a.rounds):
                        mine.append(shoal(a.shoal, size, t, a.steps, m, prec))
                        out, rss = run_measured([sys.executable, __file__, "--peer", size, str(t),
                                                 str(m), prec, "--steps", str(a.steps)])
                        theirs.append((json.loads(out.strip().splitlines()[-1])["tokens_per_s"],
                                       rss))
                        if a.baseline:
                            base.append(shoal(a.baseline, size, t, a.steps, m, prec))
                    (mine, mine_rss), (theirs, theirs_rss) = median(mine), median(theirs)
                    f32 = mine if prec == "f32" else f32
                    own = f"{mine / f32:.2f}x" if f32 else "-"
                    l, h, dm = SIZES[size]
                    row = (f"| {size} ({l}/{h}/{dm}) | {t} | {m} | {prec} | {mine:,.0f} | "
                           f"{theirs:,.0f} | {mine / theirs:.2f}x | {own} | {mine_rss:,.0f} MiB | "
                           f"{theirs_rss:,.0f} MiB |")
                    if a.baseline:
                        b = median(base)[0]
                        row += f" {b:,.0f} | {mine / b:.2f}x |"
                    print(row, flush=True)


def median(runs):
    """The run (tokens/s, RSS) with the median tokens/s (the lower middle one)."""
    return sorted(runs)[(len(runs) - 1) // 2]


if __name__ == "__main__":
    main()
