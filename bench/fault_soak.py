#!/usr/bin/python3
"""bench/fault_soak: kill -9 a random rank at a random moment, many times.

Each run starts `shoal run -n N [--max-restarts 1] -- shoal train ...` (a
deterministic data-parallel job), waits a random 20-80% of an uninterrupted
run's length,
SIGKILLs one random rank (found by its SHOAL_RANK), and checks:
  * the launcher ends within its --timeout,
  * its report names that rank and signal 9,
  * no process of the job is left (pgrep on the job's unique run directory),
  * with --max-restarts 1: the job completes (exit 0) and its final test
    accuracy equals an uninterrupted run's (deterministic mode, so equal to
    the last digit, not just within noise).
Prints one line per run and a summary; exits non-zero if any run failed.

usage: bench/fault_soak.py [--runs 20] [--ranks 3] [--restart] [--shoal build/shoal]
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def train_cmd(shoal, out):
    return [shoal, "train", "--model", "mlp", "--epochs", "3", "--limit-train", "12000",
            "--limit-test", "2000", "--batch", "32", "--threads", "1", "--optimizer",
            "momentum", "--lr", "0.05", "--deterministic", "--checkpoint-every", "25",
            "--no-plot", "--out", out]


def final_acc(out):
    with open(os.path.join(out, "metrics.jsonl")) as f:
        rows = [json.loads(l) for l in f if '"kind":"epoch"' in l]
    return rows[-1]["test_acc"] if rows else None


def ranks_of(launcher_pid):
    """{rank: pid} of the launcher's children (each rank leads its group)."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            out[int(env[b"SHOAL_RANK"])] = int(pid)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--restart", action="store_true", help="--max-restarts 1; check accuracy")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="shoal_soak_")
    bad = 0
    try:
        # An uninterrupted run: its accuracy (for --restart) and its length,
        # so that every kill lands while the job trains (20-80% of the way).
        out = os.path.join(tmp, "reference")
        t0 = time.time()
        subprocess.run([a.shoal, "run", "-n", str(a.ranks), "--"] + train_cmd(a.shoal, out),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        length = time.time() - t0
        ref = final_acc(out)
        print(f"reference (uninterrupted): test accuracy {ref:.4f} in {length:.1f} s")
        ends = []
        for i in range(a.runs):
            out = os.path.join(tmp, f"run{i}")
            cmd = [a.shoal, "run", "-n", str(a.ranks), "--timeout", str(a.timeout)]
            if a.restart:
                cmd += ["--max-restarts", "1"]
            p = subprocess.Popen(cmd + ["--"] + train_cmd(a.shoal, out), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            delay = rng.uniform(0.2 * length, 0.8 * length)
            time.sleep(delay)
            victim, pid = None, None
            for _ in range(50):  # bounded: the ranks may still be starting
                rk = ranks_of(p.pid)
                if len(rk) == a.ranks:
                    victim = rng.randrange(a.ranks)
                    pid = rk[victim]
                    break
                time.sleep(0.05)
            t_kill = time.time()
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
            try:
                text, _ = p.communicate(timeout=a.timeout + 30)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
                print(f"run {i}: FAIL launcher did not end within {a.timeout + 30:.0f} s")
                bad += 1
                continue
            end_s = time.time() - t_kill
            left = subprocess.run(["pgrep", "-f", out], capture_output=True, text=True).stdout.split()
            problems = []
            if victim is None:
                problems.append("job ended before a rank could be killed")
            elif f"rank {victim} was killed by signal 9" not in text:
                problems.append(f"report does not name rank {victim} / signal 9")
            if left:
                problems.append(f"{len(left)} processes left: {left}")
            acc = None
            if a.restart:
                if p.returncode != 0:
                    problems.append(f"exit {p.returncode} with --max-restarts 1")
                else:
                    acc = final_acc(out)
                    if acc != ref:
                        problems.append(f"accuracy {acc} != uninterrupted {ref}")
            elif p.returncode == 0:
                problems.append("exit 0 after a rank was killed")
            if not a.restart:
                ends.append(end_s)
            status = "ok" if not problems else "FAIL " + "; ".join(problems)
            bad += bool(problems)
            extra = f", final accuracy {acc:.4f}" if acc is not None else \
                f", launcher ended {end_s:.2f} s after the kill"
            print(f"run {i:2d}: killed rank {victim} after {delay:.2f} s, exit {p.returncode}"
                  f"{extra}: {status}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
        mode = "with --max-restarts 1" if a.restart else "no restarts"
        print(f"summary ({mode}, {a.ranks} ranks): {a.runs - bad}/{a.runs} runs ok" +
              (f"; launcher ended {min(ends):.2f}-{max(ends):.2f} s after the kill"
               if ends else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
