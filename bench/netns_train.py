#!/usr/bin/python3
"""bench/netns_train: data-parallel training across hosts, Shoal against
PyTorch 1.13 DDP (gloo), on the netns testbed (tools/netns-cluster.sh; needs
root), in one run.

For each model and link rate: one host x 1 rank, then --hosts hosts x 1 rank
(one process per host, batch 64 per rank, SGD momentum, 1 thread), Shoal's
ranks started by hand on each host as a launcher would, DDP's one process
group per host (tools/peer_ddp_torch.py --nnodes), GLOO_SOCKET_IFNAME=eth0.
Prints images/s, time per step, the scaling against one host and the ratio
Shoal / DDP. --models gpt: bench/gpt_train.py's base GPT (4 layers, 4 heads,
dim 128, context 64) on its text, batch 32 sequences per rank, Adam, in
tokens/s; DDP wraps tests/python/gpt_torch.py's same decoder. This machine has 2 cores: 4 hosts x 1 rank is 4 processes on 2
cores, so the compute ceiling of 4 hosts is ~1.8x one (bench/dp.py).

With --ps, also a synchronous parameter-server job with a server and a
worker on every host (SGD on the servers, --ps-compress each value given);
with --trace, Shoal once more under `shoal run --engine mpirun --trace`,
printing rank 0's communication and exposed communication per step.

usage: bench/netns_train.py [--hosts 4] [--links 1gbit,100mbit]
                            [--models mlp,cnn,gpt] [--wire f32,bf16]
                            [--zero 1,2] [--ps none,bf16,2bit:0.01] [--ps-bound N]
                            [--trace]
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
TEXT = "/usr/share/games/fortunes/cookie"  # --model gpt's text, as bench/gpt_train.py
STEPS = {"mlp": 300, "cnn": 120, "resnet": 30, "gpt": 60}
GPT = ["--layers", "4", "--heads", "4", "--dim", "128"]  # bench/gpt_train.py's "base"
BATCH = {"gpt": 32}  # sequences of 64 characters; 64 images for the others


def per_step(model):
    """Samples of one rank's step in the rate's unit (images, or tokens)."""
    return BATCH.get(model, 64) * (64 if model == "gpt" else 1)


def train_args(model, hosts, out, optimizer="momentum", lr="0.02"):
    """`shoal train`'s words for one epoch of STEPS[model] steps of batch 64
    per rank on `hosts` ranks, into `out` (the GPT: batch 32, Adam, as
    bench/gpt_train.py)."""
    if model == "gpt":
        return ["train", "--model", "gpt", "--data", "text:" + TEXT, *GPT, "--context", "64",
                "--epochs", "1", "--batch", "32", "--threads", "1", "--optimizer", "adam",
                "--lr", "0.003", "--max-steps", str(STEPS[model]), "--limit-test", "4", "--out",
                out, "--quiet", "--no-plot", "--no-checkpoints"]
    return ["train", "--model", model, "--data", DATA, "--epochs", "1", "--batch", "64",
            "--threads", "1", "--optimizer", optimizer, "--lr", lr, "--limit-train",
            str(STEPS[model] * 64 * hosts), "--limit-test", "500", "--out", out, "--quiet",
            "--no-plot", "--no-checkpoints"]


def epoch_ips(out):
    """The last epoch's images/s (tokens/s for the GPT) in the run directory `out`."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if '"kind":"epoch"' in l]
    return rows[-1].get("images_per_s", rows[-1].get("tokens_per_s"))


def shoal_ips(c, a, model, hosts, wire, share, zero=0):
    out = tempfile.mkdtemp(prefix="train.", dir=share)
    env = ["env", f"SHOAL_WORLD_SIZE={hosts}", "SHOAL_LOCAL_RANK=0",
           "SHOAL_STORE=198.18.1.1:29400", "SHOAL_STORE_SERVE=1", "SHOAL_JOB_TOKEN=bench"]

    def argv(h, l, r):
        return env + [f"SHOAL_RANK={r}", a.shoal, *train_args(model, hosts, out), "--wire", wire,
                      "--zero", str(zero)]
    c.run_each(1, argv, hosts=hosts)
    return epoch_ips(out)


def ps_ips(c, a, model, hosts, compress, share):
    """A synchronous parameter-server job across the hosts, as docs/ps.md
    starts one by hand: the scheduler on h1, a server and a worker on every
    host (BytePS's layout: the servers' links add up). Workers' images/s."""
    out = tempfile.mkdtemp(prefix="ps.", dir=share)
    env = ["env", "SHOAL_JOB_TOKEN=bench", "DMLC_PS_ROOT_URI=198.18.1.1", "DMLC_PS_ROOT_PORT=9000",
           f"DMLC_NUM_SERVER={hosts}", f"DMLC_NUM_WORKER={hosts}",
           f"MXNET_KVSTORE_BIGARRAY_BOUND={a.ps_bound}"]
    train = train_args(model, hosts, out, "sgd", "0.05") + ["--dist", "ps", "--ps-compress",
                                                             compress]
    procs = [subprocess.Popen(c.cmd(1, *env, "DMLC_ROLE=scheduler", a.shoal, "ps", "scheduler"),
                              env=c.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)]
    for h in range(1, hosts + 1):
        procs.append(subprocess.Popen(c.cmd(h, *env, "DMLC_ROLE=server", a.shoal, "ps", "server"),
                                      env=c.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    for h in range(1, hosts + 1):
        procs.append(subprocess.Popen(c.cmd(h, *env, "DMLC_ROLE=worker", a.shoal, *train),
                                      env=c.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"{p.args}: exit {p.returncode}\n{err.decode()[-2000:]}")
    return epoch_ips(out)


def shoal_exposed(c, a, model, hosts, wire, share):
    """`shoal run --engine mpirun --trace` across the hosts (OpenMPI's daemons
    started through the tool's rsh): rank 0's communication and exposed
    communication per step, as `shoal run` prints them."""
    out = tempfile.mkdtemp(prefix="trace.", dir=share)
    agent = f"OMPI_MCA_plm_rsh_agent={c.tool} --name {c.name} rsh"
    hosts_arg = ",".join(f"h{h}:1" for h in range(1, hosts + 1))
    p = subprocess.run(c.cmd(1, "env", agent, a.shoal, "run", "--engine", "mpirun", "-n",
                             str(hosts), "--timeout", "600", "--store-host", "198.18.1.1",
                             "--engine-arg=--host", f"--engine-arg={hosts_arg}", "--trace",
                             os.path.join(out, "trace.json"), "--", a.shoal,
                             *train_args(model, hosts, os.path.join(out, "run")), "--wire", wire),
                       capture_output=True, text=True, env=c.env, timeout=900)
    lines = [l.strip() for l in p.stdout.splitlines() if "rank 0:" in l and "exposed" in l]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"shoal run --trace: exit {p.returncode}\n{p.stdout[-1500:]}"
                           f"{p.stderr[-1500:]}")
    return lines[0].split("rank 0: ", 1)[1]


def ddp_ips(c, model, hosts):
    def argv(h, l, r):
        return ["env", "GLOO_SOCKET_IFNAME=eth0", "OPENBLAS_NUM_THREADS=1", "/usr/bin/python3",
                os.path.join(ROOT, "tools", "peer_ddp_torch.py"), "--model", model,
                "--ranks", "1", "--threads", "1", "--data", TEXT if model == "gpt" else DATA,
                "--batch", str(BATCH.get(model, 64)), "--steps", str(STEPS[model]), "--nnodes",
                str(hosts), "--node-rank", str(h - 1), "--master", "198.18.1.1:29600"] + (
                    GPT if model == "gpt" else [])
    out = c.run_each(1, argv, hosts=hosts)
    row = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
    return row.get("images_per_s", row.get("tokens_per_s"))


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--links", default="1gbit,100mbit")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--wire", default="f32", help="Shoal's --wire values to time (f32,bf16)")
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--zero", default="", help="also time Shoal under these ZeRO stages (1,2), "
                    "each at every --wire")
    ap.add_argument("--ps", default="", help="also time a sync parameter server, a server "
                    "and a worker per host, with these --ps-compress values (none,2bit:0.01)")
    ap.add_argument("--ps-bound", type=int, default=1000000,
                    help="MXNET_KVSTORE_BIGARRAY_BOUND: keys of at least this many elements are "
                         "sliced over every server (so every host's link carries a share)")
    ap.add_argument("--trace", action="store_true",
                    help="also run Shoal under `shoal run --engine mpirun --trace` and print "
                         "its communication and exposed communication per step")
    a = ap.parse_args()
    print(f"{'link':>8} {'model':>6} {'who':>12} {'1 host /s':>13} "
          f"{a.hosts:>2} hosts /s {'ms/step':>8} {'scaling':>8} {'vs DDP':>7}  (images/s; "
          "the GPT's tokens/s)")
    for link in a.links.split(","):
        share = tempfile.mkdtemp(prefix="shoal-netns-train.", dir="/tmp")
        c = Cluster(f"t{os.getpid() % 100000}", a.hosts, link, share)
        try:
            print(f"# {link}: {c.measure()}", flush=True)
            for model in a.models.split(","):
                ddp1, ddpn = ddp_ips(c, model, 1), ddp_ips(c, model, a.hosts)
                rows = [("DDP gloo", ddp1, ddpn)]
                for wire in [w for w in a.wire.split(",") if w]:
                    rows.append((f"Shoal {wire}", shoal_ips(c, a, model, 1, wire, share),
                                 shoal_ips(c, a, model, a.hosts, wire, share)))
                    for z in [int(x) for x in a.zero.split(",") if x]:
                        rows.append((f"ZeRO-{z} {wire}", shoal_ips(c, a, model, 1, wire, share, z),
                                     shoal_ips(c, a, model, a.hosts, wire, share, z)))
                for comp in [x for x in a.ps.split(",") if x]:
                    rows.append((f"PS {comp}", ps_ips(c, a, model, 1, comp, share),
                                 ps_ips(c, a, model, a.hosts, comp, share)))
                for who, one, many in rows:
                    ms = per_step(model) * a.hosts / many * 1e3
                    print(f"{link:>8} {model:>6} {who:>12} {one:>13.0f} {many:>16.0f} "
                          f"{ms:>8.1f} {many / one:>7.2f}x {many / ddpn:>6.2f}x", flush=True)
                for wire in [w for w in a.wire.split(",") if w] if a.trace else []:
                    print(f"# {link} {model} --wire {wire} traced: "
                          f"{shoal_exposed(c, a, model, a.hosts, wire, share)}", flush=True)
        finally:
            c.stop()
            subprocess.run(["rm", "-rf", share])


if __name__ == "__main__":
    sys.exit(main())
