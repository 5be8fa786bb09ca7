#!/usr/bin/python3
"""bench/bf16_quality: what bf16 costs the README's GPT in validation bits/char,
in Shoal (`--precision bf16`) and in PyTorch 1.13 (the forward under
`torch.autocast("cpu", dtype=torch.bfloat16)`), each against its own f32 on
the same seeds.

The recipe is the README's: 2 layers, 4 heads, dim 64, context 64, batch 32,
Adam lr 0.003, cosine schedule with 0.3 warm-up epochs, 4 epochs on
/usr/share/games/fortunes/cookie, one thread. PyTorch trains the same decoder
(tests/python/gpt_torch.py) on the same windows in its own shuffled order and
is scored on the same validation split (the last 10% of the text), so the
PyTorch and Shoal columns are comparable only through their bf16 - f32 gaps.

--torch-init: Shoal starts from the very weights PyTorch starts from (gpt_torch.py
init for the seed, through --init-from) instead of its own initialization.

usage: /usr/bin/python3 bench/bf16_quality.py [--seeds 0,1,2,3,4] [--epochs 4]
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/games/fortunes/cookie"
LAYERS, HEADS, DIM, CONTEXT, BATCH, LR, WARMUP = 2, 4, 64, 64, 32, 0.003, 0.3


def torch_bits(seed, epochs, precision):
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
    import gpt_torch as G
    torch.set_num_threads(1)
    text = open(TEXT, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    cut = len(text) - int(len(text) * 0.1)

    def split(part):
        tok = torch.tensor([index[c] for c in part])
        n = (len(tok) - 1) // CONTEXT
        return tok[: n * CONTEXT].view(n, CONTEXT), tok[1: n * CONTEXT + 1].view(n, CONTEXT)
    x, y = split(text[:cut])
    vx, vy = split(text[cut:])
    a, w0 = G.initial(LAYERS, HEADS, DIM, CONTEXT, len(vocab), True, seed)
    w = {k: v.requires_grad_(True) for k, v in w0.items()}
    opt = torch.optim.Adam(list(w.values()), lr=LR)
    spe = x.shape[0] // BATCH
    total, warm = spe * epochs, int(WARMUP * spe)
    g = torch.Generator().manual_seed(seed)
    step = 0
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0], generator=g)
        for i in range(spe):
            lr = LR * (step + 1) / warm if step < warm else \
                0.5 * LR * (1 + math.cos(math.pi * (step - warm) / max(total - warm, 1)))
            for pg in opt.param_groups:
                pg["lr"] = lr
            b = perm[i * BATCH:(i + 1) * BATCH]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                logits = G.forward(w, x[b], a)
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), y[b].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
    with torch.no_grad():
        tot = 0.0
        for i in range(0, vx.shape[0], 256):
            logits = G.forward(w, vx[i:i + 256], a).reshape(-1, a.vocab)
            tot += F.cross_entropy(logits, vy[i:i + 256].reshape(-1), reduction="sum").item()
    return tot / vy.numel() / math.log(2)


def shoal_bits(binary, seed, epochs, precision, torch_init):
    with tempfile.TemporaryDirectory() as d:
        init = []
        if torch_init:
            vocab = len(set(open(TEXT, "rb").read()))
            subprocess.run([sys.executable, os.path.join(ROOT, "tests", "python", "gpt_torch.py"),
                            "init", d + "/init.safetensors", "--vocab", str(vocab), "--layers",
                            str(LAYERS), "--heads", str(HEADS), "--dim", str(DIM), "--context",
                            str(CONTEXT), "--seed", str(seed)], check=True, capture_output=True)
            init = ["--init-from", d + "/init.safetensors"]
        out = subprocess.run(
            [binary, "train", "--model", "gpt", "--data", "text:" + TEXT, "--layers", str(LAYERS),
             "--heads", str(HEADS), "--dim", str(DIM), "--context", str(CONTEXT), "--batch",
             str(BATCH), "--optimizer", "adam", "--lr", str(LR), "--schedule", "cosine",
             "--warmup-epochs", str(WARMUP), "--epochs", str(epochs), "--threads", "1",
             "--seed", str(seed), "--precision", precision, "--no-plot", "--no-checkpoints",
             "--quiet", "--out", d + "/run"] + init, capture_output=True, text=True,
            check=True).stdout
    line = [l for l in out.splitlines() if l.startswith("final:")][-1]
    return float(line.split("validation ")[1].split(" bits")[0])


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--torch-init", action="store_true")
    p.add_argument("--peer", nargs=2, metavar=("SEED", "PRECISION"))
    a = p.parse_args()
    if a.peer:
        print(torch_bits(int(a.peer[0]), a.epochs, a.peer[1]))
        return
    print(f"README GPT, {a.epochs} epochs, validation bits/char"
          f"{', Shoal from PyTorch initial weights' if a.torch_init else ''}")
    print("| seed | Shoal f32 | Shoal bf16 | Shoal gap | PyTorch f32 | PyTorch bf16 | PyTorch gap |")
    print("|---|---|---|---|---|---|---|")
    gaps = {"shoal": [], "torch": []}
    for s in [int(v) for v in a.seeds.split(",")]:
        sf, sb = (shoal_bits(a.shoal, s, a.epochs, pr, a.torch_init) for pr in ("f32", "bf16"))
        tf, tb = (float(subprocess.run([sys.executable, __file__, "--peer", str(s), pr,
                                        "--epochs", str(a.epochs)], capture_output=True,
                                       text=True, check=True).stdout.split()[-1])
                  for pr in ("f32", "bf16"))
        gaps["shoal"].append(sb - sf)
        gaps["torch"].append(tb - tf)
        print(f"| {s} | {sf:.3f} | {sb:.3f} | {sb - sf:+.3f} | {tf:.3f} | {tb:.3f} | "
              f"{tb - tf:+.3f} |", flush=True)
    mean = {k: sum(v) / len(v) for k, v in gaps.items()}
    print(f"| mean | | | {mean['shoal']:+.3f} | | | {mean['torch']:+.3f} |")


if __name__ == "__main__":
    main()
