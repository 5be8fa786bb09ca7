#!/usr/bin/env python3
"""Training through faults: `shoal run --elastic` against restarts (issue 35).

One data-parallel job (4 ranks of `shoal train`, the MLP on Fashion-MNIST,
a global batch of 48) trains --epochs (or --minutes each) in each of these
modes, one after another on this host:

  clean    no faults: the reference time.
  calm     `--elastic` without faults: what the elastic job's lease,
           regroup check and held updates cost.
  elastic  `shoal run -n 4 --elastic 2 --max-restarts 100`: a lost rank
           leaves, the others go on in-process from their live state (only
           the step in flight is trained again), a replacement joins.
  elastic1 the same with SHOAL_ELASTIC_COMMIT_EVERY=1: a copy of the state
           after every step, as sharded state keeps it (before the updates
           were held, the only way to lose just the step in flight).
  restart  `shoal run -n 4 --max-restarts 100 --restart-delay 0` and `--checkpoint-every 50`:
           today's way, every rank restarted from the newest checkpoint.
  ddp-clean, ddp-restart
           PyTorch DDP under torchrun (tools/peer_elastic_torch.py), without
           faults and with `--max_restarts` (every worker restarted from its
           newest checkpoint, written every 50 steps).

In the faulty modes the bench kills a random live rank (SIGKILL) every
--kill-every seconds and freezes one (SIGSTOP) every --freeze-every seconds,
on the same schedule, with SHOAL_HEARTBEAT=5. Reported per mode: wall time,
images/s and its ratio to the clean run, faults sent, and for elastic the
time from each fault to training again (the survivors' "resumed from the
state ... kept in memory" line, which precedes their next step) and the
steps trained again per fault.

usage: bench/elastic.py [--shoal build/shoal] [--epochs 12] [--kill-every 30]
       [--freeze-every 120] [--seed 1] [--modes clean,calm,elastic,restart,ddp-clean,ddp-restart]
       [--minutes M] [--ddp-timeout 60] [--chart docs/elastic_faults.png]
Prints a table; exit 0.
"""
import argparse
import datetime
import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gnuplot_chart  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN = ("train --model mlp --batch 12 --limit-test 1000 --threads 1 --no-plot "
         "--optimizer momentum --lr 0.05")
GLOBAL_BATCH = 48


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "T", "X")
    except (OSError, IndexError):
        return False


def run_mode(args, mode, work):
    out = os.path.join(work, mode)
    pids = os.path.join(work, mode + ".pids")
    os.makedirs(pids)
    if mode.startswith("ddp"):
        return run_ddp(args, mode, work, out, pids)
    run = [args.shoal, "run", "-n", "4", "--timeout", str(args.timeout)]
    extra = ""
    env = dict(os.environ, SHOAL_HEARTBEAT="5")
    if mode in ("elastic", "calm", "elastic1"):
        run += ["--elastic", "2", "--max-restarts", "100"]
    if mode == "elastic1":  # a copy of the state after every step: only the step in flight is lost
        env["SHOAL_ELASTIC_COMMIT_EVERY"] = "1"
    elif mode == "restart":
        run += ["--max-restarts", "100", "--restart-delay", "0"]  # as measured before the delay existed
        extra = " --checkpoint-every 50"
    cmd = (f"echo $$ > {pids}/${{SHOAL_ELASTIC_ID:-$SHOAL_RANK}}; exec {args.shoal} {TRAIN} "
           f"--epochs {args.epochs} --out {out}{extra}")
    return supervise(args, mode, work, out, pids, run + ["--", "sh", "-c", cmd], env)


def run_ddp(args, mode, work, out, pids):
    """PyTorch DDP under torchrun: ddp-clean without faults, ddp-restart
    with them (torchrun restarts every worker; each resumes from the newest
    checkpoint, written every 50 steps as in `restart`)."""
    restarts = "0" if mode == "ddp-clean" else "100"
    run = ["/usr/bin/python3", os.path.join(ROOT, "tools", "torchrun.py"), "--standalone",
           "--nnodes", "1",
           "--nproc_per_node", "4", "--max_restarts", restarts,
           os.path.join(ROOT, "tools", "peer_elastic_torch.py"), "--epochs", str(args.epochs),
           "--global-batch", str(GLOBAL_BATCH), "--checkpoint-every", "50",
           "--collective-timeout", str(args.ddp_timeout), "--out", out, "--pids", pids]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    return supervise(args, mode, work, out, pids, run, env)


def supervise(args, mode, work, out, pids, cmd, env):
    """Runs cmd, sending the faults of faulty modes to its ranks' pids."""
    log = open(os.path.join(work, mode + ".log"), "w")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    rng = random.Random(args.seed)
    faults = []  # (wall time, kind, id)
    progress = []  # (seconds since start, newest step in metrics.jsonl)
    next_look = 0.0
    # Freezes fall between kills, so each fault's recovery is timed alone.
    next_kill, next_freeze = args.kill_every, args.freeze_every + args.kill_every / 2
    capped = None  # when --minutes ran out and the job was told to stop
    while p.poll() is None:
        time.sleep(0.1)
        if args.minutes and capped is None and time.time() - t0 >= args.minutes * 60:
            capped = time.time()
            p.send_signal(signal.SIGTERM)  # ends at a step boundary (shoal) or now (torchrun)
        if capped is not None:
            if time.time() - capped > 60:
                p.kill()
            continue
        if time.time() - t0 >= next_look:  # for the chart: steps over time
            next_look += 1.0
            step = newest_step(os.path.join(out, "metrics.jsonl"))
            if step is not None:
                progress.append((time.time() - t0, step))
        if mode in ("clean", "calm", "ddp-clean"):
            continue
        t = time.time() - t0
        kind = None
        if t >= next_freeze:
            kind, next_freeze = "STOP", next_freeze + args.freeze_every
        elif t >= next_kill:
            kind, next_kill = "KILL", next_kill + args.kill_every
        if kind is None:
            continue
        live = []
        for f in glob.glob(pids + "/*"):
            try:
                pid = int(open(f).read())
            except (OSError, ValueError):
                continue
            if alive(pid):
                live.append((os.path.basename(f), pid))
        if len(live) < 3:  # leave the job its floor
            continue
        rid, pid = rng.choice(sorted(live))
        os.kill(pid, getattr(signal, "SIG" + kind))
        faults.append((time.time(), kind, rid))
    wall = time.time() - t0
    for f in glob.glob(pids + "/*"):  # a frozen rank nobody killed: not left behind
        try:
            os.kill(int(open(f).read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    log.close()
    text = open(os.path.join(work, mode + ".log")).read()
    return {"mode": mode, "code": p.returncode, "wall": wall, "faults": faults, "log": text,
            "out": out, "t0": t0, "progress": progress, "capped": capped is not None}


def newest_step(path):
    """The step of the last record in a run's metrics.jsonl, or None."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def chart(results, png):
    """Images/s over time (5 s windows) for each mode, faults marked."""
    def commands(d, out):
        plots, arrows = [], []
        for i, (mode, r) in enumerate(results.items()):
            pts = r["progress"]
            data = os.path.join(d, f"{i}.tsv")
            with open(data, "w") as f:
                j = 0
                for k in range(len(pts)):
                    while pts[k][0] - pts[j][0] > 5:
                        j += 1
                    dt = pts[k][0] - pts[j][0]
                    if dt > 0:
                        rate = max(0, pts[k][1] - pts[j][1]) * GLOBAL_BATCH / dt
                        f.write(f"{pts[k][0]:.1f}\t{rate:.0f}\n")
            plots.append(f"'{data}' using 1:2 with lines lw 2 title '{mode}'")
            for t, kind, _ in r["faults"]:
                colour = "red" if kind == "KILL" else "blue"
                arrows.append(f"set arrow from {t - r['t0']:.1f}, graph 0 to {t - r['t0']:.1f}, "
                              f"graph 1 nohead dt 2 lc rgb '{colour}'")
        return f"""
set terminal pngcairo size 1100,420 noenhanced
set output '{out}'
set title 'Training through faults: images/s over 5 s windows (4 ranks, MLP, global batch {GLOBAL_BATCH}); dashed: kill (red), freeze (blue)'
set xlabel 'seconds since start'
set ylabel 'images/s'
set yrange [0:*]
set grid
set key bottom right
{chr(10).join(arrows)}
plot {", ".join(plots)}
"""
    gnuplot_chart.render(png, commands)


def stamps(text, pattern, day):
    """Wall times (epoch seconds) of the log lines matching pattern."""
    times = []
    for m in re.finditer(r"\[(\d\d):(\d\d):(\d\d\.\d+) r\d+/\d+ [a-z]+\] . " + pattern, text):
        h, mi, s = int(m.group(1)), int(m.group(2)), float(m.group(3))
        times.append(day + h * 3600 + mi * 60 + s)
    return times


def elastic_figures(res):
    """Seconds from each fault to the next 'resumed from the state' line
    (the first rank's), and steps trained again per membership change."""
    midnight = datetime.datetime.now().replace(hour=0, minute=0, second=0, microsecond=0)
    day = midnight.timestamp()
    resumed = sorted(stamps(res["log"], r"resumed from the state rank 0 kept in memory", day))
    gaps = []
    for t, kind, _ in res["faults"]:
        after = [r - t for r in resumed if r > t]
        if after:
            gaps.append((kind, after[0]))
    redo = {}  # generation -> most steps any survivor trains again
    for m in re.finditer(r"generation (\d+) lost a peer after step \d+; going on from the state "
                         r"after step \d+ \((\d+) steps? trained again\)", res["log"]):
        g, n = int(m.group(1)), int(m.group(2))
        redo[g] = max(redo.get(g, 0), n)
    return gaps, [redo[g] for g in sorted(redo)]


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from blas_core import pin_openblas_core
    pin_openblas_core()
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", default=os.path.join(ROOT, "build", "shoal"))
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--kill-every", type=float, default=30)
    ap.add_argument("--freeze-every", type=float, default=120)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="clean,calm,elastic,restart,ddp-clean,ddp-restart")
    ap.add_argument("--chart", default="", help="a PNG of images/s over time, faults marked")
    ap.add_argument("--minutes", type=float, default=0,
                    help="stop each mode after M minutes (SIGTERM); img/s counts the epochs "
                         "it finished (0: none, each mode trains --epochs)")
    ap.add_argument("--ddp-timeout", type=float, default=60,
                    help="the DDP workers' collective deadline (s): how a freeze is found there")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="shoal-elastic-")
    results = {}
    for mode in args.modes.split(","):
        res = run_mode(args, mode, work)
        results[mode] = res
        steps = 0
        res["accs"] = {}  # epoch -> test accuracy
        for l in open(os.path.join(res["out"], "metrics.jsonl")):
            r = json.loads(l)
            if r.get("kind") == "epoch":
                steps = max(steps, r["step"])
                if "test_acc" in r:
                    res["accs"][r["epoch"]] = r["test_acc"]
        res["ips"] = steps * GLOBAL_BATCH / res["wall"]
        print(f"{mode}: exit {res['code']}, {res['wall']:.1f} s, {len(res['faults'])} faults",
              flush=True)
    clean = results.get("clean")
    print(f"\n{args.epochs} epochs, 4 ranks, global batch {GLOBAL_BATCH}; kill every "
          f"{args.kill_every:g} s, freeze every {args.freeze_every:g} s; work dir {work}\n")
    # Each mode against the clean run of its own system (DDP against ddp-clean);
    # the test accuracy as the mean of the last 10 epochs a mode finished (one
    # epoch's moves by ~2 points here), beside its clean run's over the same
    # epochs (a run may also diverge late at this constant lr).
    print("| mode | exit | wall s | img/s | vs its clean | faults (kill/stop) | "
          "test acc, last 10 epochs (its clean's then) |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        kills = sum(1 for f in r["faults"] if f[1] == "KILL")
        stops = len(r["faults"]) - kills
        ref = results.get("ddp-clean" if mode.startswith("ddp") else "clean")
        ratio = f"{r['ips'] / ref['ips']:.2f}" if ref else "-"
        capped = f" (stopped at {args.minutes:g} min)" if r["capped"] else ""
        acc = "-"
        if r["accs"]:
            last = sorted(r["accs"])[-10:]
            mine = sum(r["accs"][e] for e in last) / len(last)
            theirs = [ref["accs"][e] for e in last if ref and e in ref["accs"]]
            acc = f"{100 * mine:.2f}% (epochs {last[0]}-{last[-1]})" + (
                f" ({100 * sum(theirs) / len(theirs):.2f}%)" if len(theirs) == len(last) else "")
        print(f"| {mode} | {r['code']}{capped} | {r['wall']:.1f} | {r['ips']:.0f} | {ratio} | "
              f"{kills}/{stops} | {acc} |")
    if args.chart:
        chart(results, args.chart)
    for mode in ("elastic", "elastic1"):
        if mode not in results:
            continue
        gaps, redo = elastic_figures(results[mode])
        for kind, g in gaps:
            # A frozen rank is detected at the heartbeat deadline (5 s here).
            det = g - 5 if kind == "STOP" else g
            print(f"{mode}: {kind} -> training again in {g:.2f} s ({det:.2f} s after detection)")
        print(f"{mode}: steps trained again per fault: {redo}")
    if "restart" in results:
        n = len(re.findall(r"restarting all 4 ranks", results["restart"]["log"]))
        print(f"restart: {n} restarts of all ranks")
    if "ddp-restart" in results:
        text = results["ddp-restart"]["log"]
        n = len(re.findall(r"rank 0 resumed from", text))
        print(f"ddp-restart: {n} restarts of all workers (torchrun)")
        midnight = datetime.datetime.now().replace(hour=0, minute=0, second=0, microsecond=0)
        back = [midnight.timestamp() + int(h) * 3600 + int(m) * 60 + float(sec) for h, m, sec in
                re.findall(r"\[(\d\d):(\d\d):(\d\d\.\d+)\] rank 0 resumed from", text)]
        for t, kind, _ in results["ddp-restart"]["faults"]:
            after = [b - t for b in back if b > t]
            if after:
                print(f"ddp-restart: {kind} -> training again in {after[0]:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
