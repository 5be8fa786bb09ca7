#!/usr/bin/python3
"""bench/netns_train: data-parallel training across hosts, Shoal against
PyTorch 1.13 DDP (gloo), on the netns testbed (tools/netns-cluster.sh; needs
root), in one run.

For each model and link rate: one host x 1 rank, then --hosts hosts x 1 rank
(one process per host, batch 64 per rank, SGD momentum, 1 thread), Shoal's
ranks started by hand on each host as a launcher would, DDP's one process
group per host (tools/peer_ddp_torch.py --nnodes), GLOO_SOCKET_IFNAME=eth0.
Prints images/s, time per step, the scaling against one host and the ratio
Shoal / DDP. This machine has 2 cores: 4 hosts x 1 rank is 4 processes on 2
cores, so the compute ceiling of 4 hosts is ~1.8x one (bench/dp.py).

usage: bench/netns_train.py [--hosts 4] [--links 1gbit,100mbit]
                            [--models mlp,cnn] [--wire f32,bf16]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

from netns_comm import Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = "/usr/share/datasets/fashion-mnist"
STEPS = {"mlp": 300, "cnn": 120, "resnet": 30}


def shoal_ips(c, a, model, hosts, wire, share):
    out = tempfile.mkdtemp(prefix="train.", dir=share)
    env = ["env", f"SHOAL_WORLD_SIZE={hosts}", "SHOAL_LOCAL_RANK=0",
           "SHOAL_STORE=198.18.1.1:29400", "SHOAL_STORE_SERVE=1", "SHOAL_JOB_TOKEN=bench"]

    def argv(h, l, r):
        return env + [f"SHOAL_RANK={r}", a.shoal, "train", "--model", model, "--data", DATA,
                      "--epochs", "1", "--batch", "64", "--threads", "1", "--optimizer",
                      "momentum", "--lr", "0.02", "--limit-train", str(STEPS[model] * 64 * hosts),
                      "--limit-test", "500", "--out", out, "--quiet", "--no-plot",
                      "--no-checkpoints", "--wire", wire]
    c.run_each(1, argv, hosts=hosts)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if '"kind":"epoch"' in l]
    return rows[-1]["images_per_s"]


def ddp_ips(c, model, hosts):
    def argv(h, l, r):
        return ["env", "GLOO_SOCKET_IFNAME=eth0", "OPENBLAS_NUM_THREADS=1", "/usr/bin/python3",
                os.path.join(ROOT, "tools", "peer_ddp_torch.py"), "--model", model,
                "--ranks", "1", "--threads", "1", "--data", DATA,
                "--steps", str(STEPS[model]), "--nnodes", str(hosts), "--node-rank", str(h - 1),
                "--master", "198.18.1.1:29600"]
    out = c.run_each(1, argv, hosts=hosts)
    return json.loads([l for l in out.splitlines() if l.startswith("{")][-1])["images_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--links", default="1gbit,100mbit")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--wire", default="f32", help="Shoal's --wire values to time (f32,bf16)")
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    a = ap.parse_args()
    print(f"{'link':>8} {'model':>6} {'who':>12} {'1 host img/s':>13} "
          f"{a.hosts:>2} hosts img/s {'ms/step':>8} {'scaling':>8} {'vs DDP':>7}")
    for link in a.links.split(","):
        share = tempfile.mkdtemp(prefix="shoal-netns-train.", dir="/tmp")
        c = Cluster(f"t{os.getpid() % 100000}", a.hosts, link, share)
        try:
            print(f"# {link}: {c.measure()}", flush=True)
            for model in a.models.split(","):
                ddp1, ddpn = ddp_ips(c, model, 1), ddp_ips(c, model, a.hosts)
                rows = [("DDP gloo", ddp1, ddpn)]
                for wire in a.wire.split(","):
                    rows.append((f"Shoal {wire}", shoal_ips(c, a, model, 1, wire, share),
                                 shoal_ips(c, a, model, a.hosts, wire, share)))
                for who, one, many in rows:
                    ms = 64 * a.hosts / many * 1e3
                    print(f"{link:>8} {model:>6} {who:>12} {one:>13.0f} {many:>16.0f} "
                          f"{ms:>8.1f} {many / one:>7.2f}x {many / ddpn:>6.2f}x", flush=True)
        finally:
            c.stop()
            subprocess.run(["rm", "-rf", share])


if __name__ == "__main__":
    sys.exit(main())
