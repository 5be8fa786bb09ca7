#!/usr/bin/env python3
"""Train your own network with Shoal, from Python.

1. Export your PyTorch model to ONNX in training mode (once):

       torch.onnx.export(net, torch.randn(1, 1, 28, 28), "model.onnx", opset_version=13,
                         training=torch.onnx.TrainingMode.TRAINING,
                         do_constant_folding=False, dynamic_axes={"input": {0: "batch"}},
                         input_names=["input"])

   or run this script with --export model.onnx to write a small CNN that way.

2. Train it (one process, then many, with no change to the script):

       python3 examples/train_onnx.py model.onnx --epochs 2
       shoal run -n 2 -- python3 examples/train_onnx.py model.onnx --epochs 2
       python3 tools/torchrun.py --nproc_per_node 2 examples/train_onnx.py model.onnx

   --data takes what `shoal train --data` takes: fashion-mnist, an .npz of x_train,
   y_train, x_test, y_test, a folder of .npy files or of class image folders.

The weights are saved as safetensors with the ONNX (PyTorch) names, so
`net.load_state_dict({k: torch.from_numpy(v) for k, v in shoal.load_weights(PATH).items()})`
takes them back (Debian's python3 has no safetensors module; where it is
installed, `safetensors.torch.load_file(PATH)` does the same).
Use Debian's /usr/bin/python3 with PYTHONPATH=build/python.
"""
import argparse
import sys

import shoal


def export_cnn(path):
    """Writes a small PyTorch CNN to `path` as a trainable ONNX graph."""
    import warnings

    import torch
    import torch.nn as nn

    warnings.filterwarnings("ignore")  # the exporter's notes on batch-norm counters

    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, 10))
    net.train()
    torch.onnx.export(net, torch.randn(1, 1, 28, 28), path, opset_version=13,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      input_names=["input"], dynamic_axes={"input": {0: "batch"}})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", help="an .onnx file (or mlp, cnn, resnet)")
    p.add_argument("--export", metavar="PATH", help="write a small CNN as ONNX to PATH and exit")
    p.add_argument("--data", default="fashion-mnist")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--limit-train", type=int, default=0)
    p.add_argument("--save", metavar="FILE", help="write the trained weights (safetensors)")
    a = p.parse_args()
    if a.export:
        export_cnn(a.export)
        return 0
    if not a.model:
        p.error("give an .onnx file (or --export PATH first)")

    model = shoal.onnx.load(a.model) if a.model.endswith(".onnx") else a.model
    trainer = shoal.Trainer(model, a.data, epochs=a.epochs, batch=a.batch, optimizer="momentum",
                            lr=a.lr, schedule="cosine", limit_train=a.limit_train)
    for m in trainer.fit():
        if trainer.rank == 0:
            print(f"epoch {m['epoch']}: loss {m['train_loss']:.4f} test accuracy "
                  f"{100 * m['test_acc']:.2f}% ({m['images_per_s']:.0f} img/s)")
    if a.save and trainer.rank == 0:
        shoal.save_weights(a.save, trainer.state_dict())
        print(f"weights written to {a.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
