#!/usr/bin/env python3
"""Makespan of a job set on a real Slurm: `shoal submit` against plain sbatch (issue 36).

Runs on the cluster SLURM_CONF points at (tools/slurm-cluster.sh with
SHOAL_SLURM_TOPOLOGY for switches and SHOAL_SLURM_GPUS for counted GPUs).
The same jobs go in twice, all submitted at once, one variant after the
other on an empty cluster:

  shoal   `shoal submit SPEC --chip-links ring -- sleep S` for each job:
          Slurm places it from the shape Shoal writes (ring jobs: their
          node count and --switches=1@5).
  sbatch  `sbatch --ntasks --cpus-per-task --gpus-per-task [--nodes]
          --wrap 'shoal run --engine srun -n R -- sleep S'`: what a user
          writes by hand, the ranks started the same way (so only the
          placement differs: a bare `srun sleep` step took 3 s longer here).

Makespan: first submission to the last job's end (scontrol's StartTime and
EndTime, one-second resolution). Also: each job's wait, and for the shoal
variant whether every ring job ran under one switch. The sets: `six` (the
6-job set of issue 36, shortened) and `trace` (N random jobs, a seed).

usage: bench/slurm_makespan.py [--shoal build/shoal] [--set six|trace]
       [--jobs 50] [--seed 1] [--scale 1.0] [--variants shoal,sbatch]
Exit 0; prints a table and `ratio shoal/sbatch R`.
"""
import argparse
import datetime
import os
import random
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, ranks, gpus per rank, ring?, seconds): two 2-node rings, two
# 1-node rings, small jobs between them.
SIX = [("ringa", 2, 4, True, 8), ("one", 1, 1, False, 10), ("ringb", 1, 4, True, 6),
       ("two", 2, 2, False, 5), ("ringc", 2, 4, True, 6), ("ringd", 1, 4, True, 4)]


def trace(n, seed):
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.3:
            jobs.append((f"r{i}", 2, 4, True, rng.randint(2, 6)))
        elif kind < 0.6:
            jobs.append((f"q{i}", 1, 4, True, rng.randint(1, 5)))
        else:
            ranks = rng.choice([1, 2])
            jobs.append((f"s{i}", ranks, rng.choice([1, 2]), False, rng.randint(1, 5)))
    return jobs


def sh(args, timeout=30, check=True):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {r.stdout}{r.stderr}")
    return r.stdout + r.stderr


def switches():
    """node -> leaf switch, from the topology.conf beside SLURM_CONF."""
    conf = os.path.join(os.path.dirname(os.environ["SLURM_CONF"]), "topology.conf")
    leaf = {}
    for line in open(conf):
        m = re.match(r"SwitchName=(\S+)\s+Nodes=(\S+)", line)
        if m:
            for n in sh(["scontrol", "show", "hostnames", m.group(2)]).split():
                leaf[n] = m.group(1)
    return leaf


def submit_shoal(shoal, job, d):
    name, ranks, gpus, ring, secs = job
    spec = os.path.join(d, name + ".yaml")
    with open(spec, "w") as f:
        f.write(f"name: {name}\nranks: {ranks}\naccels_per_rank: {gpus}\n"
                + ("links: ring\n" if ring else ""))
    out = sh([shoal, "submit", spec, "--chip-links", "ring", "--dir", d, "--", "sleep",
              str(secs)])
    return re.search(r"Slurm job (\d+)", out).group(1)


def submit_sbatch(shoal, job, d, per_node):
    name, ranks, gpus, ring, secs = job
    args = ["sbatch", "--parsable", "-J", name, f"--ntasks={ranks}", "--cpus-per-task=1",
            f"--gpus-per-task={gpus}", f"--output={d}/{name}-%j.out"]
    if ring and ranks * gpus > per_node:
        args.append(f"--nodes={(ranks * gpus + per_node - 1) // per_node}")
    # The ranks start as the shoal variant's do: only the placement differs.
    args += ["--wrap", f"exec {shoal} run --engine srun -n {ranks} -- sleep {secs}"]
    return sh(args).strip().split(";")[0]


def when(s):
    return datetime.datetime.fromisoformat(s).timestamp()


def run(variant, jobs, shoal, per_node, leaf):
    d = tempfile.mkdtemp(prefix=f"makespan-{variant}-")
    t0 = time.time()
    ids = {}
    for job in jobs:
        ids[job[0]] = (submit_shoal(shoal, job, d) if variant == "shoal"
                       else submit_sbatch(shoal, job, d, per_node))
    deadline = time.time() + 60 + 4 * sum(j[4] for j in jobs)
    info = {}
    while time.time() < deadline and len(info) < len(ids):
        for name, i in ids.items():
            if name in info:
                continue
            kv = dict(re.findall(r"(\w+)=(\S+)", sh(["scontrol", "show", "job", i])))
            if kv.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                info[name] = kv
        time.sleep(0.5)
    if len(info) < len(ids):
        sh(["scancel"] + list(ids.values()), check=False)
        raise RuntimeError(f"{variant}: jobs still running at the deadline: "
                           f"{sorted(set(ids) - set(info))}")
    end = max(when(kv["EndTime"]) for kv in info.values())
    first = min(when(kv["SubmitTime"]) for kv in info.values())
    split = []
    for job in jobs:
        kv = info[job[0]]
        if job[3]:
            nodes = sh(["scontrol", "show", "hostnames", kv["NodeList"]]).split()
            if len({leaf.get(n, "?") for n in nodes}) > 1:
                split.append(f"{job[0]}@{kv['NodeList']}")
    waits = [when(info[j[0]]["StartTime"]) - when(info[j[0]]["SubmitTime"]) for j in jobs]
    bad = [n for n, kv in info.items() if kv["JobState"] != "COMPLETED"]
    if bad:
        raise RuntimeError(f"{variant}: jobs that did not complete: {bad}")
    timeline = [f"{j[0]}: {when(info[j[0]]['StartTime']) - first:.0f}-"
                f"{when(info[j[0]]['EndTime']) - first:.0f} s on {info[j[0]]['NodeList']}"
                for j in jobs]
    return {"makespan": end - first, "wait": sum(waits) / len(waits), "split": split,
            "submit_s": time.time() - t0, "timeline": timeline}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--set", choices=["six", "trace"], default="six")
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every job's seconds")
    ap.add_argument("--variants", default="shoal,sbatch")
    ap.add_argument("--timeline", action="store_true", help="print each job's start, end, nodes")
    a = ap.parse_args()
    if "SLURM_CONF" not in os.environ:
        sys.exit("SLURM_CONF is not set: start tools/slurm-cluster.sh first")
    jobs = SIX if a.set == "six" else trace(a.jobs, a.seed)
    jobs = [(n, r, g, ring, max(1, round(s * a.scale))) for n, r, g, ring, s in jobs]
    per_node = max(int(m) for m in re.findall(r"Gres=gpu:(\d+)", sh(["scontrol", "show",
                                                                     "nodes"])))
    leaf = switches()
    got = {}
    for v in a.variants.split(","):
        got[v] = run(v, jobs, a.shoal, per_node, leaf)
        r = got[v]
        print(f"{v:7s} makespan {r['makespan']:.0f} s, mean wait {r['wait']:.1f} s, "
              f"ring jobs across switches: {len(r['split'])} {' '.join(r['split'])}")
        if a.timeline:
            print("  " + "\n  ".join(r["timeline"]))
        sys.stdout.flush()
    if "shoal" in got and "sbatch" in got:
        print(f"ratio shoal/sbatch {got['shoal']['makespan'] / got['sbatch']['makespan']:.3f}")


if __name__ == "__main__":
    main()
