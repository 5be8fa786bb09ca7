#!/usr/bin/python3
"""bench/netns_comm: all-reduce across hosts. Starts a cluster of network
namespaces (tools/netns-cluster.sh; needs root), measures its link with
iperf3, then times Shoal's all-reduce, OpenMPI's MPI_Allreduce and Gloo's
(torch.distributed) across the hosts in one run, at the same sizes and
timing rule as bench/comm.py (warm-up, ~0.3 s per size, max over ranks).

usage: bench/netns_comm.py [--hosts 2] [--per-host 1] [--link 1gbit]
                           [--racks 1] [--spine RATE]
                           [--max-bytes 16777216] [--shoal build/shoal] [--png FILE]
Needs mpicc/mpirun (libopenmpi-dev, openmpi-bin), python3-torch, iperf3.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import gnuplot_chart
from comm import print_table  # bench/comm.py: the same table

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TOOL = os.path.join(ROOT, "tools", "netns-cluster.sh")


def table_rows(text):
    """'bytes time_us' lines (the peers' output) -> {bytes: us}."""
    return {int(l.split()[0]): float(l.split()[1]) for l in text.splitlines()
            if l and l[0].isdigit()}


class Cluster:
    def __init__(self, name, hosts, link, share, racks=1, spine=""):
        self.name, self.hosts, self.tool = name, hosts, TOOL
        self.env = dict(os.environ, TMPDIR=share)
        shape = ["--racks", str(racks)] + (["--spine", spine] if spine else [])
        subprocess.run([TOOL, "--name", name, "start", "--hosts", str(hosts), "--link", link] +
                       shape, check=True, env=self.env, stdout=subprocess.DEVNULL)

    def cmd(self, host, *argv):
        return [TOOL, "--name", self.name, "exec", f"h{host}", *argv]

    def measure(self):
        return subprocess.run([TOOL, "--name", self.name, "measure", "h1", "h2"], check=True,
                              capture_output=True, text=True, env=self.env).stdout.strip()

    def stop(self):
        subprocess.run([TOOL, "--name", self.name, "stop"], env=self.env,
                       stdout=subprocess.DEVNULL)

    def run_each(self, per_host, argv_of, timeout=900, hosts=None):
        """Starts argv_of(host, local, rank) for every rank on the first `hosts`
        hosts (all by default); returns rank 0's stdout."""
        procs = []
        for h in range(1, (hosts or self.hosts) + 1):
            for l in range(per_host):
                r = (h - 1) * per_host + l
                procs.append(subprocess.Popen(self.cmd(h, *argv_of(h, l, r)), env=self.env,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
        outs = [p.communicate(timeout=timeout) for p in procs]
        for p, (o, e) in zip(procs, outs):
            if p.returncode != 0:
                raise RuntimeError(f"{p.args}: exit {p.returncode}\n{e[-2000:]}")
        return outs[0][0]


def shoal_bench(c, shoal, hosts, per_host, max_bytes, env=(), seconds=None):
    """`shoal bench comm` on the first `hosts` hosts, `per_host` ranks each,
    ranks started by hand: {bytes: (us, algorithm)} and its header line."""
    n = hosts * per_host

    def argv(h, l, r):
        return (["env", f"SHOAL_RANK={r}", f"SHOAL_WORLD_SIZE={n}", f"SHOAL_LOCAL_RANK={l}",
                 "SHOAL_STORE=198.18.1.1:29400", "SHOAL_STORE_SERVE=1", "SHOAL_JOB_TOKEN=bench",
                 *env, shoal, "bench", "comm", "--max-bytes", str(max_bytes)] +
                (["--seconds", str(seconds)] if seconds else []))
    out = c.run_each(per_host, argv, hosts=hosts)
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            rows[int(f[0])] = (float(f[2]), " ".join(f[5:]))
    return rows, out.splitlines()[0]


def mpi_times(c, a, n, share):
    exe = os.path.join(share, "mpi_allreduce")
    subprocess.run(["mpicc", "-O2", "-o", exe, os.path.join(HERE, "peers", "mpi_allreduce.c")],
                   check=True)
    hosts = ",".join(f"h{h}:{a.per_host}" for h in range(1, c.hosts + 1))
    agent = f"OMPI_MCA_plm_rsh_agent={TOOL} --name {c.name} rsh"
    out = subprocess.run(c.cmd(1, "env", agent, "mpirun", "--allow-run-as-root", "-n", str(n),
                               "--host", hosts, "--bind-to", "none", exe, str(a.max_bytes)),
                         check=True, capture_output=True, text=True, env=c.env,
                         timeout=900).stdout
    return table_rows(out)


def gloo_times(c, a):
    def argv(h, l, r):
        return ["env", "GLOO_SOCKET_IFNAME=eth0", "/usr/bin/python3",
                os.path.join(HERE, "peers", "gloo_allreduce.py"), str(a.per_host),
                str(a.max_bytes), "0.3", str(c.hosts), str(h - 1), "198.18.1.1:29600"]
    return table_rows(c.run_each(1, argv))


def chart(png, title, n, bound, shoal, mpi, gloo):
    """busbw against message size for the three, with the link's bound."""
    bus = lambda b, us: b / (us * 1e3) * 2 * (n - 1) / n

    def script(d, out):
        for name, rows in (("shoal", {b: t for b, (t, _) in shoal.items()}), ("mpi", mpi),
                           ("gloo", gloo)):
            with open(os.path.join(d, name + ".tsv"), "w") as f:
                for b in sorted(rows):
                    f.write(f"{b}\t{bus(b, rows[b])}\n")
        return f"""
set terminal pngcairo size 900,520 noenhanced
set output '{out}'
set title '{title}'
set logscale x 2
set format x '%.0b%B'
set xlabel 'message bytes'
set ylabel 'all-reduce bus bandwidth (GB/s)'
set yrange [0:{bound * 1.25}]
set key top left box opaque
set grid
plot '{d}/shoal.tsv' using 1:2 with linespoints lw 2 title 'Shoal', \
     '{d}/mpi.tsv' using 1:2 with linespoints title 'OpenMPI 4.1 (MPI_Allreduce)', \
     '{d}/gloo.tsv' using 1:2 with linespoints title 'Gloo (PyTorch 1.13)', \
     {bound} with lines dt 2 lc rgb 'black' title 'bound of the link (iperf3 rate)'
"""
    gnuplot_chart.render(png, script)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--per-host", type=int, default=1)
    ap.add_argument("--link", default="1gbit")
    ap.add_argument("--racks", type=int, default=1, help="hosts in R racks (h1 in rack 1, h2 in "
                    "rack 2, ...: launchers' rank order crosses the spine at every host)")
    ap.add_argument("--spine", default="", help="the racks' uplinks' rate, as --link")
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--png", default="", help="also chart busbw against size here")
    a = ap.parse_args()
    n = a.hosts * a.per_host
    share = tempfile.mkdtemp(prefix="shoal-netns-bench.", dir="/tmp")
    c = Cluster(f"b{os.getpid() % 100000}", a.hosts, a.link, share, a.racks, a.spine)
    try:
        link = c.measure()
        shoal = shoal_bench(c, a.shoal, a.hosts, a.per_host, a.max_bytes)[0]
        mpi = mpi_times(c, a, n, share)
        gloo = gloo_times(c, a)
    finally:
        c.stop()
        subprocess.run(["rm", "-rf", share])
    ompi = subprocess.run(["ompi_info", "--version"], capture_output=True,
                          text=True).stdout.split("\n")[0]
    racks = f", {a.racks} racks, --spine {a.spine or 'unshaped'}" if a.racks > 1 else ""
    print(f"allreduce f32 sum, {a.hosts} hosts x {a.per_host} ranks (network namespaces, "
          f"--link {a.link}{racks}; {link}); peers: {ompi.strip()}, Gloo via PyTorch")
    print_table(n, shoal, mpi, gloo)
    if a.png:
        # Each host's link must carry 2(H-1)/H of the buffer each way, so
        # algbw <= rate * H / (2(H-1)); busbw = algbw * 2(n-1)/n.
        rate = float(link.split(": ")[1].split(" Mbit/s")[0]) / 8e3  # GB/s
        bound = rate * a.hosts / (2 * (a.hosts - 1)) * 2 * (n - 1) / n
        chart(a.png, f"all-reduce across {a.hosts} netns hosts x {a.per_host} rank(s), "
              f"--link {a.link}", n, bound, shoal, mpi, gloo)


if __name__ == "__main__":
    sys.exit(main())
