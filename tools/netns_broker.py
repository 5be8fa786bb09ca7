#!/usr/bin/python3
"""Runs commands on the hosts of a tools/netns-cluster.sh cluster for callers
that are themselves on one of its hosts (a launcher's remote agent, as
OpenMPI's plm_rsh_agent): a process in one host's PID namespace cannot enter
another's, so the request goes over a Unix socket in the cluster's state
directory to this broker, which runs in the machine's own namespaces.

    netns_broker.py serve SOCKET TOOL NAME   # started by `netns-cluster.sh start`
    netns_broker.py call SOCKET HOST CMD...  # what `exec` does inside a host

The caller passes its stdin, stdout and stderr (SCM_RIGHTS), so the command
reads and writes them directly; the broker answers with its exit status.
"""
import array
import json
import os
import socket
import subprocess
import sys


def serve(path, tool, name):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    while True:
        conn, _ = srv.accept()
        if os.fork() == 0:
            srv.close()
            os._exit(handle(conn, tool, name))
        conn.close()
        try:  # reap finished handlers without blocking
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass


def handle(conn, tool, name):
    fds = array.array("i")
    msg, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
    if len(fds) != 3:
        return 2
    req = json.loads(msg)
    p = subprocess.run([tool, "--name", name, "exec", req["host"], *req["argv"]], stdin=fds[0],
                       stdout=fds[1], stderr=fds[2], cwd=req.get("cwd") or "/")
    conn.sendall(bytes([p.returncode & 0xFF]))
    return 0


def call(path, host, argv):
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(path)
    req = json.dumps({"host": host, "argv": argv, "cwd": os.getcwd()}).encode()
    c.sendmsg([req], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    code = c.recv(1)
    return code[0] if code else 255


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) >= 5 and sys.argv[1] == "call":
        sys.exit(call(sys.argv[2], sys.argv[3], sys.argv[4:]))
    else:
        sys.exit(__doc__)
