#!/usr/bin/python3
"""bench/pp_torch: pipeline parallelism on the GPT, Shoal vs PyTorch 1.13, in one run.

The same decoder as bench/mp.py (4 layers x 128, 4 heads, context 64,
untied head, Adam, batch 16 per step, 1 thread per rank) on 2 stages, the
batch in m micro-batches, GPipe and 1F1B:
  shoal run -n 2 -- shoal train ... --pp 2 --pp-schedule S --micro-batches M
  PyTorch: two processes over gloo, the layers cut where Shoal cuts them
  (embeddings and the first 2 blocks | the last 2 blocks, final norm, head
  and loss), activations sent forward and their gradients back with
  isend/recv per micro-batch, the schedule written out by hand (PyTorch
  1.13's own Pipe runs all stages in one process, one device per stage).
Both run the forward of tests/python/gpt_torch.py's GPT; prints tokens/s of
each and their ratio.

usage: bench/pp_torch.py [--shoal build/shoal] [--steps 100]
"""
import argparse
import importlib.util
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


def mpbench():
    spec = importlib.util.spec_from_file_location("mpbench", os.path.join(HERE, "mp.py"))
    m = importlib.util.module_from_spec(spec)
    sys.path.insert(0, HERE)
    spec.loader.exec_module(m)
    return m


def shoal(binary, steps, schedule, micro):
    m = mpbench()
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run(
            m.command(binary, 2, steps, ["--pp", "2", "--pp-schedule", schedule,
                                         "--micro-batches", str(micro)], d),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    cut = [l.strip() for l in out.splitlines() if "* cut" in l]
    return m.tokens_per_s(out), cut[0] if cut else "?"


def stage_forward(w, a, stage, x, h_in):
    """Stage 0: embeddings and blocks [0, L/2); stage 1: the rest and the logits."""
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import gpt_torch as G
    b, t = x.shape
    half = a.layers // 2
    if stage == 0:
        h = w["wte.weight"][x] + w["wpe.weight"][:t]
        return G.blocks(w, h, a, range(0, half))
    h = G.blocks(w, h_in, a, range(half, a.layers))
    h = F.layer_norm(h, (a.dim,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return h @ w["lm_head.weight"].t()


def schedule_order(schedule, stage, stages, micro):
    """(micro-batch, forward?) in the order the stage runs them (mp/pipeline.h)."""
    if schedule == "gpipe":
        return [(i, True) for i in range(micro)] + [(i, False) for i in range(micro)]
    warm = min(stages - stage - 1, micro)
    out = [(i, True) for i in range(warm)]
    for i in range(micro - warm):
        out += [(warm + i, True), (i, False)]
    return out + [(i, False) for i in range(micro - warm, micro)]


def torch_stage(stage, steps, schedule, micro, port, q):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import gpt_torch as G
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=stage, world_size=2)
    x, y, vocab = G.all_windows(TEXT, CONTEXT)
    n = len(x)
    a, w0 = G.initial(LAYERS, HEADS, DIM, CONTEXT, vocab, False)
    half = LAYERS // 2
    mine = [k for k in w0 if (k.startswith("h.") and (int(k.split(".")[1]) < half) == (stage == 0))
            or (stage == 0 and k in ("wte.weight", "wpe.weight"))
            or (stage == 1 and k in ("ln_f.weight", "ln_f.bias", "lm_head.weight"))]
    w = {k: torch.nn.Parameter(w0[k]) for k in mine}
    opt = torch.optim.Adam(w.values(), lr=0.003)
    rows = BATCH // micro
    order = schedule_order(schedule, stage, 2, micro)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(n, generator=g)
    t0 = None
    for s in range(steps + 5):
        if s == 5:
            dist.barrier()
            t0 = time.perf_counter()
        lo = (s * BATCH) % (n - BATCH)
        b = perm[lo: lo + BATCH]
        opt.zero_grad()
        outs, ins, sends = {}, {}, []
        for i, fwd in order:
            xb, yb = x[b[i * rows:(i + 1) * rows]], y[b[i * rows:(i + 1) * rows]]
            if fwd and stage == 0:
                outs[i] = stage_forward(w, a, 0, xb, None)
                sends.append(dist.isend(outs[i].detach().contiguous(), 1, tag=i))
            elif fwd:
                h = torch.empty(rows, CONTEXT, DIM)
                dist.recv(h, 0, tag=i)
                ins[i] = h.requires_grad_()
                logits = stage_forward(w, a, 1, xb, ins[i])
                outs[i] = F.cross_entropy(logits.reshape(-1, a.vocab), yb.reshape(-1)) / micro
            elif stage == 0:
                dy = torch.empty(rows, CONTEXT, DIM)
                dist.recv(dy, 1, tag=1000 + i)
                outs.pop(i).backward(dy)
            else:
                outs.pop(i).backward()
                sends.append(dist.isend(ins.pop(i).grad.contiguous(), 0, tag=1000 + i))
        for r in sends:
            r.wait()
        opt.step()
    dist.barrier()
    secs = time.perf_counter() - t0
    if stage == 0:
        q.put(steps * BATCH * CONTEXT / secs)
    dist.destroy_process_group()


def torch_run(steps, schedule, micro, port):
    return torch_spawn.run(torch_stage, 2, steps, schedule, micro, port)


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    print(f"GPT {LAYERS} layers x {DIM}, {HEADS} heads, context {CONTEXT}, untied, batch {BATCH}, "
          f"Adam, 2 stages x 1 thread, {a.steps} timed steps")
    print("| schedule | micro-batches | Shoal tok/s | PyTorch tok/s | Shoal / PyTorch |")
    print("|---|---|---|---|---|")
    port = 29600
    for schedule, micro in (("gpipe", 4), ("1f1b", 4), ("1f1b", 8)):
        mine, cut = shoal(a.shoal, a.steps, schedule, micro)
        theirs = torch_run(a.steps, schedule, micro, port)
        port += 1
        print(f"| {schedule} | {micro} | {mine:,.0f} | {theirs:,.0f} | {mine / theirs:.2f} |",
              flush=True)
    print(f"(Shoal's cut: {cut})")


if __name__ == "__main__":
    main()
