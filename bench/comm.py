#!/usr/bin/python3
"""bench/comm: Shoal's allreduce beside OpenMPI's MPI_Allreduce and Gloo's
(torch.distributed) on this host, in one run, at the same sizes and timing
rule (warm-up, ~0.3 s per size, max time over ranks). Prints time and busbw
per size for each and the ratios Shoal/peer of busbw (above 1: Shoal faster).

usage: bench/comm.py [-n 2] [--max-bytes 268435456] [--shoal build/shoal] [--transport auto|tcp] [--shared]
Needs mpicc/mpirun (libopenmpi-dev, openmpi-bin) and python3-torch.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def print_table(n, shoal, mpi, gloo):
    """Shoal's {bytes: (us, algo)} beside the peers' {bytes: us}, n ranks."""
    hdr = (f"{'bytes':>10} {'shoal us':>10} {'busbw':>7} {'algo':>18} | {'mpi us':>10} {'busbw':>7} |"
           f" {'gloo us':>10} {'busbw':>7} | {'vs mpi':>7} {'vs gloo':>7}")
    print(hdr)
    print("-" * len(hdr))
    bus = lambda b, us: b / (us * 1e3) * 2 * (n - 1) / n
    for b in sorted(shoal):
        st, algo = shoal[b]
        mt, gt = mpi.get(b), gloo.get(b)
        line = f"{b:>10} {st:>10.1f} {bus(b, st):>7.3f} {algo:>18} | "
        line += f"{mt:>10.1f} {bus(b, mt):>7.3f} | " if mt else f"{'-':>10} {'-':>7} | "
        line += f"{gt:>10.1f} {bus(b, gt):>7.3f} | " if gt else f"{'-':>10} {'-':>7} | "
        line += f"{mt / st:>6.2f}x " if mt else f"{'-':>7} "
        line += f"{gt / st:>6.2f}x" if gt else f"{'-':>7}"
        print(line)
    print("\nratios = peer time / Shoal time (above 1: Shoal faster); busbw in GB/s = "
          "bytes/time * 2(n-1)/n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--shared", action="store_true",
                    help="Shoal's buffers in shared memory (as a data-parallel arena)")
    a = ap.parse_args()
    n = a.n
    env = dict(os.environ, SHOAL_TRANSPORT=a.transport)
    s = subprocess.run([a.shoal, "bench", "comm", "-n", str(n), "--max-bytes", str(a.max_bytes)]
                       + (["--shared"] if a.shared else []),
                       check=True, capture_output=True, text=True, env=env).stdout
    shoal = {}
    for line in s.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            shoal[int(f[0])] = (float(f[2]), " ".join(f[5:]))  # "direct (mapped)" has a space
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "mpi_allreduce")
        subprocess.run(["mpicc", "-O2", "-o", exe, os.path.join(HERE, "peers", "mpi_allreduce.c")],
                       check=True)
        mpi_cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            mpi_cmd.append("--allow-run-as-root")
        m = subprocess.run(mpi_cmd + [exe, str(a.max_bytes)], check=True, capture_output=True,
                           text=True).stdout
    mpi = {int(l.split()[0]): float(l.split()[1]) for l in m.splitlines() if l and l[0].isdigit()}
    g = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "peers", "gloo_allreduce.py"),
                        str(n), str(a.max_bytes)], check=True, capture_output=True, text=True).stdout
    gloo = {int(l.split()[0]): float(l.split()[1]) for l in g.splitlines() if l and l[0].isdigit()}

    ompi = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print(f"allreduce f32 sum, {n} ranks on one host ({os.cpu_count()} cores"
          f"{', oversubscribed' if n > (os.cpu_count() or 1) else ''}); Shoal transport {a.transport}; "
          f"peers: {ompi.strip()}, Gloo via PyTorch")
    print_table(n, shoal, mpi, gloo)

if __name__ == "__main__":
    sys.exit(main())
