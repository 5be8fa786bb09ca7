#!/usr/bin/python3
"""bench/netns_model: does the α-β model predict the all-reduce across hosts?

On the netns testbed (tools/netns-cluster.sh; needs root):
1. Fits the link costs from `shoal bench comm` tables: across hosts from 2
   hosts x 1 rank with the ring forced (t = 2a + n*b at p = 2), inside a host
   from 2 ranks on h1 with the ring forced (shared memory): a from the small
   sizes, b from the least-squares slope from 64 KiB up.
2. Times Shoal's all-reduce with each algorithm forced (SHOAL_ALLREDUCE_ALGO)
   and with the tuner's own choice, at every host count x ranks per host.
3. Predicts each with `shoal simulate --project` from the fitted costs and
   prints predicted / measured per size and algorithm, the worst error per
   algorithm, and whether the tuner's choice was the fastest measured.

usage: bench/netns_model.py [--link 1gbit] [--layouts 2x1,4x1,2x2]
                            [--max-bytes 16777216] [--seconds 0.3]
"""
import argparse
import os
import subprocess
import sys
import tempfile

from netns_comm import Cluster, shoal_bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The name SHOAL_ALLREDUCE_ALGO takes -> the projection's column.
ALGOS = {"ring": "ring", "hd": "halving-doubling", "rd": "recursive-doubling",
         "hier": "hierarchical"}


def bench(c, a, hosts, per_host, algo):
    """{bytes: (us, algorithm)} and the header line of one `shoal bench comm`."""
    env = [] if algo == "auto" else [f"SHOAL_ALLREDUCE_ALGO={algo}"]
    return shoal_bench(c, a.shoal, hosts, per_host, a.max_bytes, env, a.seconds)


def fit(rows, p):
    """a, b (seconds, seconds/byte) of t = 2(p-1)(a + n/p b): a from the
    median time of the sizes up to 1 KiB (latency), b from the least-squares
    slope of the sizes from 64 KiB (bandwidth)."""
    steps = 2.0 * (p - 1)
    small = sorted(us * 1e-6 / steps for n, (us, _) in rows.items() if n <= 1024)
    alpha = small[len(small) // 2]
    low = min(65536, sorted(rows)[-2])  # at least the two largest sizes
    big = [(steps * n / p, us * 1e-6) for n, (us, _) in rows.items() if n >= low]
    mx = sum(x for x, _ in big) / len(big)
    my = sum(y for _, y in big) / len(big)
    beta = sum((x - mx) * (y - my) for x, y in big) / sum((x - mx) ** 2 for x, _ in big)
    return alpha, beta


def project(a, costs, hosts, per_host):
    """{(bytes, column): seconds} from `shoal simulate --project`."""
    sizes = ",".join(str(4 << (2 * i)) for i in range(40) if 4 << (2 * i) <= a.max_bytes)
    out = subprocess.run([a.shoal, "simulate", "--project", "--ranks-per-node", str(per_host),
                          "--project-ranks", str(hosts * per_host), "--bytes", sizes] + costs,
                         check=True, capture_output=True, text=True).stdout
    pred = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 7 and f[0].isdigit():
            for col, v in zip(("ring", "halving-doubling", "hierarchical", "recursive-doubling"),
                              f[2:6]):
                pred[(int(f[0]), col)] = float(v) * 1e-3
    return pred


def report(layout, measured, pred, per_host):
    algos = [k for k in ALGOS if k != "hier" or per_host > 1]
    print(f"\n## {layout}: measured us / predicted us (predicted/measured)")
    print(f"{'bytes':>10} " + " ".join(f"{k:>26}" for k in algos) +
          f" {'tuner chose':>20} {'fastest':>8}")
    worst = {k: 0.0 for k in algos}
    hits = total = 0
    for b in sorted(measured["auto"]):
        cells, times = [], {}
        for k in algos:
            us = measured[k][b][0]
            p = pred[(b, ALGOS[k])] * 1e6
            times[k] = us
            worst[k] = max(worst[k], abs(p / us - 1))
            cells.append(f"{us:>9.1f} /{p:>9.1f} ({p / us:4.2f})")
        chose = measured["auto"][b][1]
        fastest = min(times, key=times.get)
        # The tuner's pick counts as right when it is within 5% of the fastest.
        chose_key = next((k for k, v in ALGOS.items() if v == chose), None)
        ok = chose_key is not None and times[chose_key] <= 1.05 * times[fastest]
        hits, total = hits + ok, total + 1
        print(f"{b:>10} " + " ".join(cells) + f" {chose:>20} {fastest:>8}{'' if ok else '  <-'}")
    print("worst |predicted/measured - 1|: " +
          ", ".join(f"{k} {100 * v:.0f}%" for k, v in worst.items()) +
          f"; tuner within 5% of the fastest at {hits} of {total} sizes")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--layouts", default="2x1,4x1,2x2")
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    a = ap.parse_args()
    layouts = [tuple(int(x) for x in l.split("x")) for l in a.layouts.split(",")]
    share = tempfile.mkdtemp(prefix="shoal-netns-model.", dir="/tmp")
    c = Cluster(f"m{os.getpid() % 100000}", max(h for h, _ in layouts), a.link, share)
    try:
        print(f"link: {a.link}; {c.measure()}")
        net, _ = bench(c, a, 2, 1, "ring")
        na, nb = fit(net, 2)
        head = bench(c, a, 2, 1, "auto")[1].split(";")[-1].strip()
        print(f"across hosts (2 x 1, ring): alpha {na * 1e6:.2f} us, {8e-9 / nb:.3f} Gbit/s "
              f"(the communicator's own start-up fit: {head})")
        host, _ = bench(c, a, 1, 2, "ring")
        ha, hb = fit(host, 2)
        print(f"inside a host (1 x 2, ring): alpha {ha * 1e6:.2f} us, {8e-9 / hb:.2f} Gbit/s")
        costs = ["--host-alpha-us", f"{ha * 1e6:.4f}", "--host-gbit-s", f"{8e-9 / hb:.4f}",
                 "--net-alpha-us", f"{na * 1e6:.4f}", "--net-gbit-s", f"{8e-9 / nb:.4f}"]
        for hosts, per_host in layouts:
            measured = {k: bench(c, a, hosts, per_host, k)[0]
                        for k in ["auto"] + [k for k in ALGOS if k != "hier" or per_host > 1]}
            report(f"{hosts} hosts x {per_host} ranks", measured,
                   project(a, costs, hosts, per_host), per_host)
    finally:
        c.stop()
        subprocess.run(["rm", "-rf", share])


if __name__ == "__main__":
    sys.exit(main())
