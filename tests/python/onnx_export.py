"""Exports a PyTorch model to ONNX with what Shoal's importer is checked
against: an input batch, the eval-mode logits, and one training step's
loss and gradients (PyTorch autograd), as ONNX TensorProto files.

usage: onnx_export.py MODEL OUTDIR   (MODEL: mlp cnn resnet20 resnet18 mobilenet_v2)
Random init, no downloads. Run with Debian's /usr/bin/python3.
"""
import os
import sys

import torch
import torch.nn as nn
import onnx
from onnx import numpy_helper


def resnet20():
    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.short = None
            if stride != 1 or cin != cout:
                self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                           nn.BatchNorm2d(cout))

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.short is None else self.short(x)))

    layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    cin = 16
    for cout, stride in ((16, 1), (32, 2), (64, 2)):
        for i in range(3):
            layers.append(Block(cin, cout, stride if i == 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def build(name):
    """The model and its input shape (batch 8)."""
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256),
                             nn.ReLU(), nn.Linear(256, 10)), (8, 1, 28, 28)
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(32, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64),
            nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(),
            nn.Linear(128, 10)), (8, 1, 28, 28)
    if name == "resnet20":
        return resnet20(), (8, 1, 28, 28)
    import torchvision
    if name == "resnet18":
        return torchvision.models.resnet18(num_classes=10), (4, 3, 32, 32)
    if name == "mobilenet_v2":
        return torchvision.models.mobilenet_v2(num_classes=10), (4, 3, 32, 32)
    raise SystemExit(f"unknown model {name}")


def save(path, t):
    with open(path, "wb") as f:
        f.write(numpy_helper.from_array(t.detach().contiguous().numpy()).SerializeToString())


def main():
    name, out = sys.argv[1], sys.argv[2]
    os.makedirs(os.path.join(out, "grads"), exist_ok=True)
    torch.manual_seed(0)
    net, shape = build(name)
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


if __name__ == "__main__":
    main()
