#!/usr/bin/python3
"""bench/mp: the GPT under each way of distributing it, in one run.

One process, then at N ranks (1 thread each, context 64, Adam, per-rank
batch 16): plain data parallelism, ZeRO-1, tensor parallelism over the N
ranks, and (at 4) 2 data-parallel groups of 2 tensor-parallel ranks. Prints
the job's training tokens/s (global tokens over the training loop's time)
and rank 0's memory as its log reports it: parameters, optimizer state, the
step's planned arena.

usage: bench/mp.py [--shoal build/shoal] [--ranks 2,4] [--steps 100]
"""
import argparse
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TEXT = "/usr/share/games/fortunes/cookie"
MODEL = ["--model", "gpt", "--data", "text:" + TEXT, "--layers", "4", "--heads", "4", "--dim",
         "128", "--context", "64"]


def run(binary, ranks, steps, extra):
    with tempfile.TemporaryDirectory() as d:
        cmd = [binary, "train"] + MODEL + [
            "--batch", "16", "--optimizer", "adam", "--lr", "0.003", "--max-steps", str(steps),
            "--threads", "1", "--limit-test", "4", "--no-plot", "--no-checkpoints", "--quiet",
            "--out", d] + extra
        if ranks > 1:
            cmd = [binary, "run", "-n", str(ranks), "--"] + cmd
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             check=True).stdout
    final = [l for l in out.splitlines() if "final:" in l][-1]
    mem = [l for l in out.splitlines() if "memory on rank 0" in l][-1]
    tps = float(final.split(" tok/s")[0].rsplit(" ", 1)[1])
    field = lambda key: int(mem.split(key + " ")[1].split(" ")[0])  # noqa: E731
    return tps, field("parameters"), field("optimizer state"), field("step arena")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", type=int, default=100)
    a = p.parse_args()
    print(f"GPT 4 layers x 128, 4 heads, context 64, batch 16 per rank, Adam, {a.steps} steps, "
          "1 thread per rank")
    print("| layout | ranks | tokens/s | rank 0: parameters | optimizer state | step arena |")
    print("|---|---|---|---|---|---|")
    rows = [("one process", 1, [])]
    for n in [int(v) for v in a.ranks.split(",")]:
        rows += [("data parallel", n, []), ("ZeRO-1", n, ["--zero", "1"]),
                 (f"tensor parallel {n}", n, ["--tp", str(n)])]
        if n == 4:
            rows.append(("2 DP groups x TP 2", 4, ["--tp", "2", "--dp", "2"]))
    for name, n, extra in rows:
        tps, params, state, arena = run(a.shoal, n, a.steps, extra)
        print(f"| {name} | {n} | {tps:,.0f} | {params:,} B | {state:,} B | {arena:,} B |",
              flush=True)


if __name__ == "__main__":
    main()
