"""PyTorch's side of the GPT equivalence test (tests/cli/gpt_cli_test.cc).

The same decoder as Shoal's --model gpt (src/train/model_gpt.cc), written
with torch.nn.functional, and the same text windows as --data text:FILE
(src/train/text.cc). Run by Debian's python3 with its python3-torch.

    gpt_torch.py init OUT.safetensors --vocab V --layers L --heads H --dim D --context T
        PyTorch-initialized weights under Shoal's names (--init-from reads them).
    gpt_torch.py check INIT.safetensors AFTER.safetensors --text FILE --samples N --lr LR ...
        One SGD step in PyTorch from INIT on the first N training windows of FILE;
        compares every parameter with AFTER (Shoal's checkpoint after that step).
        Prints the largest relative difference of the update and exits 1 above --tol.
"""
import argparse
import math
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_roundtrip import load, save  # noqa: E402


def names(layers, tied):
    out = ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    for i in range(layers):
        h = f"h.{i}"
        out += [f"{h}.ln_1.weight", f"{h}.ln_1.bias", f"{h}.ln_2.weight", f"{h}.ln_2.bias"]
        for lin in ["attn.q", "attn.k", "attn.v", "attn.proj", "mlp.fc", "mlp.proj"]:
            out += [f"{h}.{lin}.weight", f"{h}.{lin}.bias"]
    if not tied:
        out.append("lm_head.weight")
    return out


def init(a):
    torch.manual_seed(a.seed)
    d, w = a.dim, {}
    w["wte.weight"] = torch.randn(a.vocab, d) * 0.02
    w["wpe.weight"] = torch.randn(a.context, d) * 0.02
    for i in range(a.layers):
        h = f"h.{i}"
        for ln in ["ln_1", "ln_2"]:  # not 1 and 0: the test should see gamma and beta used
            w[f"{h}.{ln}.weight"] = 1 + 0.1 * torch.randn(d)
            w[f"{h}.{ln}.bias"] = 0.1 * torch.randn(d)
        for lin, (o, i_) in {"attn.q": (d, d), "attn.k": (d, d), "attn.v": (d, d),
                             "attn.proj": (d, d), "mlp.fc": (4 * d, d),
                             "mlp.proj": (d, 4 * d)}.items():
            w[f"{h}.{lin}.weight"] = torch.randn(o, i_) / math.sqrt(i_)
            w[f"{h}.{lin}.bias"] = 0.1 * torch.randn(o)
    w["ln_f.weight"] = 1 + 0.1 * torch.randn(d)
    w["ln_f.bias"] = 0.1 * torch.randn(d)
    if not a.tied:
        w["lm_head.weight"] = torch.randn(a.vocab, d) * 0.02
    save(a.out, w, {})


def forward(w, x, a):
    h = w["wte.weight"][x] + w["wpe.weight"][:x.shape[1]]
    h = blocks(w, h, a, range(a.layers))
    h = F.layer_norm(h, (a.dim,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    head = w["wte.weight"] if a.tied else w["lm_head.weight"]
    return h @ head.t()


def blocks(w, h, a, layers):
    """The residual stream h through the given decoder blocks."""
    b, t, _ = h.shape
    d, nh = a.dim, a.heads
    hd = d // nh
    mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
    for i in layers:
        p = f"h.{i}"
        z = F.layer_norm(h, (d,), w[f"{p}.ln_1.weight"], w[f"{p}.ln_1.bias"], 1e-5)

        def heads(name):
            y = F.linear(z, w[f"{p}.attn.{name}.weight"], w[f"{p}.attn.{name}.bias"])
            return y.view(b, t, nh, hd).transpose(1, 2)

        q, k, v = heads("q"), heads("k"), heads("v")
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(mask, float("-inf"))
        o = (F.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        h = h + F.linear(o, w[f"{p}.attn.proj.weight"], w[f"{p}.attn.proj.bias"])
        z = F.layer_norm(h, (d,), w[f"{p}.ln_2.weight"], w[f"{p}.ln_2.bias"], 1e-5)
        m = F.gelu(F.linear(z, w[f"{p}.mlp.fc.weight"], w[f"{p}.mlp.fc.bias"]))
        h = h + F.linear(m, w[f"{p}.mlp.proj.weight"], w[f"{p}.mlp.proj.bias"])
    return h


def windows(path, context, n):
    text = open(path, "rb").read()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    train = text[: len(text) - int(len(text) * 0.1)]
    tok = torch.tensor([index[c] for c in train[: n * context + 1]], dtype=torch.int64)
    x = tok[: n * context].view(n, context)
    y = tok[1 : n * context + 1].view(n, context)
    return x, y, len(vocab)


def all_windows(path, context):
    """Every whole window of the training split (the first 90%): x, y, vocabulary size."""
    text = open(path, "rb").read()
    n = (len(text) - int(len(text) * 0.1) - 1) // context
    return windows(path, context, n)


def initial(layers, heads, dim, context, vocab, tied, seed=0):
    """The model's settings and the initial weights init() writes for them."""
    import tempfile

    class A:
        pass
    a = A()
    a.layers, a.heads, a.dim, a.context, a.vocab, a.tied, a.seed = (
        layers, heads, dim, context, vocab, tied, seed)
    with tempfile.TemporaryDirectory() as d:
        a.out = d + "/w.safetensors"
        init(a)
        w0, _ = load(a.out)
    return a, w0


def check(a):
    w0, _ = load(a.init)
    after, meta = load(a.after)
    x, y, vocab = windows(a.text, a.context, a.samples)
    w = {k: v.double().requires_grad_(True) for k, v in w0.items()}
    logits = forward(w, x, a)
    loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    worst, where = 0.0, ""
    # Relative to each parameter's largest update, floored at 1e-3 of the
    # largest update of all (the key biases' true gradient is 0: softmax
    # ignores a constant added to a row of scores).
    steps = {n: (a.lr * w[n].grad).abs().max().item() for n in names(a.layers, a.tied)}
    floor = 1e-3 * max(steps.values())
    for name in names(a.layers, a.tied):
        mine = (w0[name].double() - a.lr * w[name].grad).float()
        theirs = after["param/" + name]
        diff = (mine - theirs).abs().max().item() / max(steps[name], floor)
        if diff > worst:
            worst, where = diff, name
    print(f"torch: loss {loss.item():.6f}; largest update difference {worst:.3e} of the update "
          f"({where})", flush=True)
    sys.exit(0 if worst <= a.tol else 1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["init", "check"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--context", type=int, default=8)
    p.add_argument("--untied", dest="tied", action="store_false")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--text")
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--tol", type=float, default=1e-3)
    a = p.parse_args()
    torch.set_num_threads(2)
    if a.cmd == "init":
        a.out = a.paths[0]
        init(a)
    else:
        a.init, a.after = a.paths
        check(a)


if __name__ == "__main__":
    main()
