"""Exports a PyTorch model to ONNX with what Shoal's importer is checked
against: an input batch, the eval-mode logits, and one training step's
loss and gradients (PyTorch autograd), as ONNX TensorProto files.

usage: onnx_export.py MODEL OUTDIR [--init-from FILE.safetensors]
       (MODEL: mlp cnn resnet20 transformer resnet18 mobilenet_v2, or one of zoo.py's;
       --init-from sets the cnn's weights from a Shoal `--model cnn` parameter file
       instead of PyTorch's init)
Random init, no downloads. Run with Debian's /usr/bin/python3.
"""
import os
import sys

import torch
import torch.nn as nn
import onnx
from onnx import numpy_helper

# The PyTorch twins of Shoal's built-in models, as the benchmark peers define them.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from peer_ddp_torch import resnet20  # noqa: E402
from peer_train_torch import model as mlp_or_cnn  # noqa: E402


class Encoder(nn.Module):
    """A small pre-norm transformer encoder over the image's 28 rows (GELU
    MLPs, 4 heads, learned positions), mean-pooled into a linear head."""

    def __init__(self, dim=32, layers=2):
        super().__init__()
        self.proj = nn.Linear(28, dim)
        self.pos = nn.Parameter(torch.randn(1, 28, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, 4, 2 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        h = self.proj(x.reshape(x.shape[0], 28, 28)) + self.pos
        return self.head(self.enc(h).mean(1))


def encoder():
    return Encoder()


def build(name):
    """The model and its input shape (batch 8)."""
    if name in ("mlp", "cnn"):
        return mlp_or_cnn(name), (8, 1, 28, 28)
    if name == "resnet20":
        return resnet20(), (8, 1, 28, 28)
    if name == "transformer":
        return encoder(), (8, 1, 28, 28)
    import torchvision
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10), (4, 3, 32, 32)
    if name == "mobilenet_v2":
        return torchvision.models.mobilenet_v2(num_classes=10), (4, 3, 32, 32)
    import zoo
    built = zoo.build(name)
    if built is None:
        raise SystemExit(f"unknown model {name}")
    return built


# Shoal's `--model cnn` parameter names for the PyTorch CNN's (nn.Sequential indices).
SHOAL_CNN_NAMES = {"0.weight": "block1.conv.weight", "1.weight": "block1.bn.weight",
                   "1.bias": "block1.bn.bias", "4.weight": "block2.conv.weight",
                   "5.weight": "block2.bn.weight", "5.bias": "block2.bn.bias",
                   "9.weight": "fc1.weight", "9.bias": "fc1.bias", "11.weight": "fc2.weight",
                   "11.bias": "fc2.bias"}


def load_shoal_cnn(net, path):
    """Copies f32 tensors of a safetensors file (read by hand: 8-byte header
    length, JSON header, data) into the CNN under Shoal's names."""
    import json
    import struct
    import numpy as np
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    with torch.no_grad():
        for name, p in net.named_parameters():
            h = head[SHOAL_CNN_NAMES[name]]
            lo, hi = h["data_offsets"]
            a = np.frombuffer(b[8 + n + lo:8 + n + hi], dtype=np.float32).reshape(h["shape"])
            assert tuple(a.shape) == tuple(p.shape), (name, a.shape, p.shape)
            p.copy_(torch.from_numpy(a.copy()))


def save(path, t):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(t.detach().contiguous().numpy()).SerializeToString())


def main():
    name, out = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "grads"), exist_ok=True)
    torch.manual_seed(0)
    net, shape = build(name)
    if len(sys.argv) > 4 and sys.argv[3] == "--init-from":
        load_shoal_cnn(net, sys.argv[4])
    g = torch.Generator().manual_seed(1)
    # Non-trivial running statistics, so eval mode is not batch statistics.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1, generator=g)
            m.running_var.uniform_(0.5, 1.5, generator=g)
    # Dropout off: its masks come from another RNG than Shoal's, so the
    # gradients could not be compared (the ratio is exported as 0).
    for m in net.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    x = torch.randn(*shape, generator=g)
    labels = torch.randint(0, 10, (shape[0],), generator=g, dtype=torch.int32)
    net.train()
    torch.onnx.export(net, x, os.path.join(out, "model.onnx"), opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    net.eval()
    with torch.no_grad():
        save(os.path.join(out, "logits_eval.pb"), net(x))
    net.train()
    net.zero_grad()
    logits = net(x)
    loss = nn.functional.cross_entropy(logits, labels.long())
    loss.backward()
    save(os.path.join(out, "x.pb"), x)
    save(os.path.join(out, "labels.pb"), labels)
    save(os.path.join(out, "logits_train.pb"), logits)
    save(os.path.join(out, "loss.pb"), loss)
    names = []
    for i, (n, p) in enumerate(net.named_parameters()):
        save(os.path.join(out, "grads", f"{i}.pb"), p.grad)
        names.append(n)
    with open(os.path.join(out, "grads.txt"), "w") as f:
        f.write("\n".join(names) + "\n")
    # The same step in f64: what f32 results (PyTorch's and Shoal's) are
    # judged against where their summation orders differ.
    os.makedirs(os.path.join(out, "grads64"), exist_ok=True)
    net64 = net.double()
    net64.zero_grad()
    nn.functional.cross_entropy(net64(x.double()), labels.long()).backward()
    for i, (n, p) in enumerate(net64.named_parameters()):
        save(os.path.join(out, "grads64", f"{i}.pb"), p.grad)


if __name__ == "__main__":
    main()
