"""PyTorch's side of the Shoal <-> PyTorch weights round trip (tests/cli/interop_cli_test.cc).

Run by Debian's own python3 with its python3-torch; no other package. The
safetensors files are read and written by hand (8-byte little-endian header
length, JSON header, packed tensor bytes) so that the test depends on the
format, not on a library that implements it.

    torch_roundtrip.py train OUT.safetensors --limit-train N   # train, evaluate, save
    torch_roundtrip.py eval FILE.safetensors                   # load (Shoal or own), evaluate
    torch_roundtrip.py eval DIR/model.safetensors.index.json   # a sharded checkpoint

Both print "torch: test accuracy XX.XX% on N images".
"""
import argparse
import gzip
import json
import os
import struct
import sys

import numpy as np
import torch
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"
DTYPES = {"F32": (torch.float32, np.float32), "F64": (torch.float64, np.float64),
          "I64": (torch.int64, np.int64)}


def idx(name):
    with gzip.open(f"{DATA}/{name}", "rb") as f:
        b = f.read()
    ndim = b[3]
    dims = struct.unpack(">" + "I" * ndim, b[4:4 + 4 * ndim])
    return np.frombuffer(b, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mlp():
    # Shoal's --model mlp: the same layer names as its parameters.
    m = nn.Module()
    m.fc1, m.fc2, m.fc3 = nn.Linear(784, 512), nn.Linear(512, 256), nn.Linear(256, 10)
    return m


def forward(m, x):
    x = torch.relu(m.fc1(x.reshape(x.shape[0], -1)))
    return m.fc3(torch.relu(m.fc2(x)))


def inputs(images, mean, std):
    return (torch.from_numpy(images.astype(np.float32)) / 255.0 - mean) / std


def evaluate(m, mean, std):
    x = inputs(idx("t10k-images-idx3-ubyte.gz"), mean, std)
    y = torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz").astype(np.int64))
    with torch.no_grad():
        acc = (forward(m, x).argmax(1) == y).float().mean().item()
    print(f"torch: test accuracy {100 * acc:.2f}% on {len(y)} images", flush=True)


def save(path, tensors, meta):
    header, blobs, off = {"__metadata__": meta}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().to(torch.float32).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def load(path):
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, h in header.items():
        tdtype, ndtype = DTYPES[h["dtype"]]
        lo, hi = h["data_offsets"]
        a = np.frombuffer(b, dtype=ndtype, count=(hi - lo) // np.dtype(ndtype).itemsize,
                          offset=8 + n + lo)
        out[name] = torch.from_numpy(a.copy()).reshape(h["shape"]).to(tdtype)
    return out, meta


def load_index(path):
    """A sharded checkpoint: Hugging Face's index maps each tensor to its file."""
    with open(path) as f:
        index = json.load(f)
    out, where = {}, os.path.dirname(path)
    for file in sorted(set(index["weight_map"].values())):
        tensors, _ = load(os.path.join(where, file))
        for name, t in tensors.items():
            assert index["weight_map"][name] == file, f"{name} in {file}, index says otherwise"
            out[name] = t
    assert set(out) == set(index["weight_map"]), "the shards miss tensors the index lists"
    print(f"torch: {len(out)} tensors from {len(set(index['weight_map'].values()))} shards")
    return out, index["metadata"]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["train", "eval"])
    p.add_argument("path")
    p.add_argument("--limit-train", type=int, default=8192)
    a = p.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(7)
    m = mlp()
    if a.cmd == "train":
        images = idx("train-images-idx3-ubyte.gz")[:a.limit_train]
        labels = torch.from_numpy(idx("train-labels-idx1-ubyte.gz")[:a.limit_train].astype(np.int64))
        px = images.astype(np.float64) / 255.0
        mean, std = float(px.mean()), float(px.std())
        x = inputs(images, mean, std)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        for i in range(0, len(labels) - 63, 64):
            opt.zero_grad()
            nn.functional.cross_entropy(forward(m, x[i:i + 64]), labels[i:i + 64]).backward()
            opt.step()
        evaluate(m, mean, std)
        save(a.path, dict(m.state_dict()), {"input_mean": repr(mean), "input_std": repr(std)})
    else:
        tensors, meta = load_index(a.path) if a.path.endswith(".index.json") else load(a.path)
        state = {}
        for name, t in tensors.items():
            if name.startswith("param/") or name.startswith("buf/"):
                state[name.split("/", 1)[1]] = t
            elif "/" not in name:
                state[name] = t  # a plain state_dict; Shoal's optimizer state ("opt/...") is not
        m.load_state_dict(state, strict=True)
        evaluate(m, float(meta["input_mean"]), float(meta["input_std"]))


if __name__ == "__main__":
    sys.exit(main())
