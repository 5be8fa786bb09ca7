#!/usr/bin/python3
"""Delay and jitter for a netns-cluster host where the kernel has no netem.

tools/netns-cluster.sh `fault HOST delay MS [JITTER]` runs this in the
fabric namespace between the host's link (--host, its veth end, taken off
its rack's bridge) and a new veth pair whose other end joins the bridge in
its place (--fabric). Frames the host sends wait MS +- JITTER ms (uniform,
in order: a frame never leaves before the one ahead of it, as netem with a
rate keeps them), then go on to the bridge; frames for the host pass at
once. Both sockets carry the kernel's virtio-net header (PACKET_VNET_HDR),
so segmentation-offloaded frames and checksums the sender left to the
hardware cross as they are. The queue holds at most --limit frames (more
are dropped, as netem's limit does); the relay stops after --max-seconds.

usage: netns_delay.py --host DEV --fabric DEV --delay MS [--jitter MS]
                      [--limit 10000] [--max-seconds 86400] [--seed N]
"""
import argparse
import heapq
import random
import select
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4


def open_dev(dev):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    s.bind((dev, 0))
    s.setblocking(False)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", required=True, help="the host's link (its frames are delayed)")
    ap.add_argument("--fabric", required=True, help="the veth end facing the rack's bridge")
    ap.add_argument("--delay", type=float, required=True, help="ms")
    ap.add_argument("--jitter", type=float, default=0.0, help="ms, uniform +-")
    ap.add_argument("--limit", type=int, default=10000)
    ap.add_argument("--max-seconds", type=float, default=86400)
    ap.add_argument("--seed", type=int, default=None)
    a = ap.parse_args()
    if a.delay < 0 or a.jitter < 0 or a.jitter > a.delay:
        sys.exit("netns_delay: need 0 <= --jitter <= --delay")
    rng = random.Random(a.seed)
    host, fabric = open_dev(a.host), open_dev(a.fabric)
    queue, seq, last_due = [], 0, 0.0
    end = time.monotonic() + a.max_seconds
    while time.monotonic() < end:
        now = time.monotonic()
        wait = min(1.0, max(0.0, queue[0][0] - now)) if queue else 1.0
        ready, _, _ = select.select([host, fabric], [], [], wait)
        for s in ready:
            for _ in range(256):  # bounded drain per wake-up
                try:
                    data, addr = s.recvfrom(1 << 17)
                except BlockingIOError:
                    break
                if addr[2] == PACKET_OUTGOING:  # what this relay sent on it
                    continue
                if s is fabric:
                    try:
                        host.send(data)
                    except BlockingIOError:  # the host's link is full: dropped
                        pass
                elif len(queue) < a.limit:
                    d = (a.delay + rng.uniform(-a.jitter, a.jitter)) / 1e3
                    last_due = max(last_due, time.monotonic() + d)
                    heapq.heappush(queue, (last_due, seq, data))
                    seq += 1
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            try:
                fabric.send(queue[0][2])
            except BlockingIOError:  # the bridge's side is full: try again
                break
            heapq.heappop(queue)
    return 0


if __name__ == "__main__":
    sys.exit(main())
