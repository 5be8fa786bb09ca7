#!/usr/bin/env bash
# A cluster of hosts inside this machine, for tests and benchmarks of what
# crosses a network. Each host is a network namespace with its own hostname
# (UTS), System V IPC, PIDs and /proc, /dev/shm, /tmp and /etc/hosts (its
# own name at 127.0.1.1, as Debian writes it), joined by a veth pair
# to its rack's bridge; racks are joined by a spine bridge. tc shapes every
# host link and rack uplink. Addresses come from 198.18.0.0/15 (RFC 2544's
# range for benchmark networks); no namespace has a route out.
#
#   tools/netns-cluster.sh start --hosts N [--racks R] [--link RATE[:DELAY]]
#                                [--spine RATE[:DELAY]] [--share DIR] [--burst MS]
#   tools/netns-cluster.sh exec HOST CMD...   # HOST: h1..hN (or 1..N)
#   tools/netns-cluster.sh rsh HOST WORDS...  # as ssh does: one shell line
#   tools/netns-cluster.sh addr HOST          # the host's address
#   tools/netns-cluster.sh fault HOST down|up|loss PCT|delay MS [JITTER]
#   tools/netns-cluster.sh measure HOST HOST  # iperf3: rate and mean RTT
#   tools/netns-cluster.sh status
#   tools/netns-cluster.sh stop
#
# --name NAME before the command (or SHOAL_NETNS_NAME; default "shoal"):
# clusters of different names coexist. State lives in /run/shoal-netns/NAME.
# RATE as tc writes it (100mbit, 1gbit); a DELAY in ms at start needs the
# kernel's netem qdisc, and the tool says so where the kernel lacks it;
# `fault HOST delay MS [JITTER]` uses netem where there is one and else a
# relay of the host's frames in user space (tools/netns_delay.py). --share DIR
# (default $TMPDIR when it is under /tmp) stays visible at the same path on
# every host, the way a shared file system is; the rest of /tmp is private.
# --burst MS (default 10): the token bucket's depth in ms of the link's
# traffic, at least 16 KiB. A link idle that long passes
# that much at memory speed, which a real NIC never does: 0.5 makes the
# links behave more like one (docs/cluster.md).
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), iproute2, util-linux; loss
# needs nftables, measure needs iperf3 (tools/install-deps.sh).
set -euo pipefail

die() { echo "netns-cluster: $*" >&2; exit 1; }

NAME=${SHOAL_NETNS_NAME:-shoal}
case "${1:-}" in  # before the command: what follows `exec HOST` is the host's
  --name) NAME=${2:?--name needs a value}; shift 2 ;;
  --name=*) NAME=${1#--name=}; shift ;;
esac
[[ "$NAME" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "--name $NAME: use 1-8 lower-case letters and digits"
DIR=/run/shoal-netns/$NAME
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FAB=$NAME-fab

ns() { echo "$NAME-h$1"; }
# h3 or 3 -> 3, checked against the cluster's size.
host_index() {
  local h=${1#h} n
  n=$(cat "$DIR/hosts.count" 2>/dev/null) || die "no cluster named $NAME is running (start it first)"
  [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] && [ "$h" -le "$n" ] ||
    die "host '$1' is not one of h1..h$n of cluster $NAME"
  echo "$h"
}
holder() { cat "$DIR/h$1.pid"; }
in_host() {  # index, command...: run inside every namespace of the host
  local i=$1; shift
  # From inside a host (a launcher's remote agent) no other host's PID
  # namespace can be entered: the broker, in the machine's, runs it.
  if [ "$(readlink /proc/self/ns/pid)" != "$(cat "$DIR/rootns")" ]; then
    exec python3 "$HERE/netns_broker.py" call "$DIR/broker.sock" "h$i" "$@"
  fi
  nsenter -t "$(holder "$i")" -n -u -i -m -p --wd="$PWD" -- "$@"
}

# RATE[:DELAY] -> "RATE DELAY" (DELAY 0 when absent), both checked.
split_link() {
  local rate=${1%%:*} delay=0
  [[ "$1" == *:* ]] && delay=${1#*:}
  [[ "$rate" =~ ^[0-9]+(\.[0-9]+)?(kbit|mbit|gbit)$ ]] || die "link rate '$rate': write it as tc does, e.g. 100mbit or 1gbit"
  delay=${delay%ms}
  [[ "$delay" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "link delay '$delay': milliseconds, e.g. 0.5 or 2ms"
  echo "$rate $delay"
}
bytes_per_s() {  # tc rate -> bytes per second
  local r=$1 num unit
  num=${r%%[kmg]bit}; unit=${r#"$num"}
  case "$unit" in kbit) awk "BEGIN{print int($num*125)}" ;; mbit) awk "BEGIN{print int($num*125000)}" ;;
    gbit) awk "BEGIN{print int($num*125000000)}" ;; esac
}
has_netem() {
  local probe=$NAME-probe ok=1
  ip netns add "$probe"
  ip -n "$probe" link add d0 type veth peer name d1 2>/dev/null || true
  ip netns exec "$probe" tc qdisc add dev d0 root netem delay 1ms 2>/dev/null || ok=0
  ip netns del "$probe"
  [ "$ok" = 1 ]
}
# Shapes egress of one device in one namespace: tbf for the rate, under
# netem for the delay where one is asked for.
shape() {  # netns dev rate delay
  local bps burst
  bps=$(bytes_per_s "$3")
  burst=$(awk -v b="$bps" -v ms="$(cat "$DIR/burst.ms")" 'BEGIN { x = int(b * ms / 1000); print (x > 16384 ? x : 16384) }')
  if [ "$4" != 0 ]; then
    ip netns exec "$1" tc qdisc replace dev "$2" root handle 1: netem delay "${4}ms" limit 100000
    ip netns exec "$1" tc qdisc add dev "$2" parent 1:1 handle 10: tbf rate "$3" burst "$burst" latency 100ms
  else
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$burst" latency 100ms
  fi
}

start_holder() {  # index share: the process whose namespaces are the host's
  local i=$1 share=$2 up child="" cgroups
  cgroups=$(awk '$2 ~ "^/sys/fs/cgroup" { print $3, $2, $4 }' /proc/self/mounts)
  # Its own PID namespace and /proc too: a process on one host cannot open
  # another host's /proc/<pid> (shared memory by memfd, CMA) by accident.
  ip netns exec "$(ns "$i")" unshare --uts --ipc --mount --pid --fork \
    --propagation private -- bash -c '
      set -e
      hostname "h$1"
      mount -t proc proc /proc
      # ip netns exec mounted a fresh /sys: the machine'"'"'s cgroup mounts
      # again (slurmd refuses to start without them).
      while read -r fs mp opts; do
        [ -n "$fs" ] || continue
        mkdir -p "$mp" 2>/dev/null || true
        mount -t "$fs" -o "$opts" "$fs" "$mp" 2>/dev/null || true
      done <<< "$4"
      mount -t tmpfs -o mode=1777,size=2g shm /dev/shm
      mount --bind "$2/hosts.h$1" /etc/hosts
      # The shared directory is set aside before /tmp is covered, then
      # moved back to its own path on the private /tmp.
      stage="$2/share-h$1"
      if [ -n "$3" ]; then mkdir -p "$stage"; mount --bind "$3" "$stage"; fi
      mount -t tmpfs -o mode=1777 tmp /tmp
      if [ -n "$3" ]; then mkdir -p "$3"; mount --move "$stage" "$3"; fi
      touch "$2/h$1.ready"
      # PID 1 of the host: reaps the orphans of whatever runs there.
      set +e
      while :; do sleep 3600 & wait $!; done' holder "$i" "$DIR" "$share" "$cgroups" \
    </dev/null >/dev/null 2>"$DIR/h$i.err" &
  up=$!
  for _ in $(seq 1 100); do
    if [ -f "$DIR/h$i.ready" ] && [ -z "$child" ]; then
      child=$(cat "/proc/$up/task/$up/children" 2>/dev/null | awk '{print $1}')
    fi
    if [ -n "$child" ]; then echo "$child" > "$DIR/h$i.pid"; return 0; fi
    kill -0 "$up" 2>/dev/null || break
    sleep 0.05
  done
  die "host h$i did not start: $(cat "$DIR/h$i.err")"
}

cmd_start() {
  local hosts="" racks=1 link="" spine="" share="" burst=10
  [ "${TMPDIR:-}" != "" ] && [[ "$TMPDIR" == /tmp/* ]] && share=$TMPDIR
  while [ $# -gt 0 ]; do
    case "$1" in
      --hosts) hosts=$2; shift 2 ;;
      --racks) racks=$2; shift 2 ;;
      --link) link=$2; shift 2 ;;
      --spine) spine=$2; shift 2 ;;
      --share) share=$2; shift 2 ;;
      --burst) burst=$2; shift 2 ;;
      *) die "start: unknown option '$1'" ;;
    esac
  done
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 250 ] || die "start: --hosts N, 1 <= N <= 250"
  [[ "$racks" =~ ^[0-9]+$ ]] && [ "$racks" -ge 1 ] && [ "$racks" -le "$hosts" ] || die "start: --racks R, 1 <= R <= hosts"
  [[ "$burst" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "start: --burst $burst: milliseconds of the link's traffic, e.g. 10 or 0.5"
  [ "$(id -u)" = 0 ] || die "start: needs root (network namespaces, mounts)"
  [ -e "$DIR" ] && die "start: cluster $NAME exists ($DIR); stop it first"
  local lrate="" ldelay=0 srate="" sdelay=0
  [ -n "$link" ] && read -r lrate ldelay < <(split_link "$link")
  [ -n "$spine" ] && read -r srate sdelay < <(split_link "$spine")
  if [ "$ldelay" != 0 ] || [ "$sdelay" != 0 ]; then
    has_netem || die "start: a link delay needs the kernel's netem qdisc (sch_netem), which this kernel ($(uname -r)) does not have; shape by rate only (--link RATE)"
  fi
  if [ -n "$share" ]; then [ -d "$share" ] || die "start: --share $share is not a directory"; fi
  mkdir -p "$DIR"
  trap 'echo "netns-cluster: start failed; cleaning up" >&2; cmd_stop >/dev/null 2>&1 || true' ERR
  echo "$hosts" > "$DIR/hosts.count"
  echo "$burst" > "$DIR/burst.ms"
  readlink /proc/self/ns/pid > "$DIR/rootns"
  { echo "127.0.0.1 localhost"; for i in $(seq 1 "$hosts"); do
      echo "198.18.$(( (i - 1) % racks + 1 )).$i h$i"; done; } > "$DIR/hosts"
  # Each host's own name first at 127.0.1.1, as Debian's installer writes
  # it: a process that publishes its host name to others must not rely on it.
  for i in $(seq 1 "$hosts"); do
    { echo "127.0.1.1 h$i"; cat "$DIR/hosts"; } > "$DIR/hosts.h$i"
  done
  ip netns add "$FAB"
  ip -n "$FAB" link set lo up
  for r in $(seq 1 "$racks"); do
    ip -n "$FAB" link add "r$r" type bridge
    ip -n "$FAB" link set "r$r" up
  done
  if [ "$racks" -gt 1 ]; then
    ip -n "$FAB" link add spine type bridge
    ip -n "$FAB" link set spine up
    for r in $(seq 1 "$racks"); do
      ip -n "$FAB" link add "up$r" type veth peer name "sp$r"
      ip -n "$FAB" link set "up$r" master "r$r" up
      ip -n "$FAB" link set "sp$r" master spine up
      if [ -n "$srate" ]; then shape "$FAB" "up$r" "$srate" "$sdelay"; shape "$FAB" "sp$r" "$srate" "$sdelay"; fi
    done
  fi
  for i in $(seq 1 "$hosts"); do
    local r=$(( (i - 1) % racks + 1 )) h
    h=$(ns "$i")
    ip netns add "$h"
    ip -n "$FAB" link add "h$i" type veth peer name eth0 netns "$h"
    ip -n "$FAB" link set "h$i" master "r$r" up
    ip -n "$h" link set lo up
    ip -n "$h" addr add "198.18.$r.$i/15" dev eth0
    ip -n "$h" link set eth0 up
    if [ -n "$lrate" ]; then shape "$h" eth0 "$lrate" "$ldelay"; shape "$FAB" "h$i" "$lrate" "$ldelay"; fi
    start_holder "$i" "$share"
  done
  python3 "$HERE/netns_broker.py" serve "$DIR/broker.sock" "$HERE/netns-cluster.sh" "$NAME" \
    </dev/null >/dev/null 2>"$DIR/broker.err" &
  echo $! > "$DIR/broker.pid"
  for _ in $(seq 1 100); do [ -S "$DIR/broker.sock" ] && break; sleep 0.05; done
  {
    echo "hosts=$hosts racks=$racks link=${link:-unshaped} spine=${spine:-unshaped} share=${share:-none}"
  } > "$DIR/config"
  trap - ERR
  echo "netns-cluster $NAME: $hosts hosts in $racks racks ($(cat "$DIR/config"))"
}

cmd_stop() {
  [ -d "$DIR" ] || { echo "netns-cluster $NAME: not running"; return 0; }
  local n i h
  n=$(cat "$DIR/hosts.count" 2>/dev/null || echo 0)
  for i in $(seq 1 "$n"); do
    h=$(ns "$i")
    if ip netns list | grep -qw "^$h"; then
      # Everything still running on the host goes with it.
      for p in $(ip netns pids "$h" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
      ip netns del "$h" 2>/dev/null || true
    fi
  done
  for f in "$DIR"/delay.*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true; done
  ip netns del "$FAB" 2>/dev/null || true
  [ -f "$DIR/broker.pid" ] && kill "$(cat "$DIR/broker.pid")" 2>/dev/null || true
  rm -rf "$DIR"
  echo "netns-cluster $NAME: stopped"
}

# Without netem: frames host i sends wait in a relay in the fabric
# namespace (tools/netns_delay.py) between the host's link, taken off its
# rack's bridge, and a veth pair that joins the bridge in its place.
# Delay 0 (and jitter 0) puts the link back on the bridge.
delay_relay() {  # index ms jitter
  local i=$1 ms=$2 jit=$3 r pidf=$DIR/delay.h$1.pid
  r=$(sed -n 's/.*racks=\([0-9]*\).*/\1/p' "$DIR/config")
  r=$(( (i - 1) % r + 1 ))
  if [ -f "$pidf" ]; then
    kill "$(cat "$pidf")" 2>/dev/null || true
    rm -f "$pidf"
    ip -n "$FAB" link del "d$i" 2>/dev/null || true
    ip -n "$FAB" link set "h$i" master "r$r"
  fi
  python3 -c "import sys; sys.exit(float(sys.argv[1]) == 0)" "$ms" || return 0
  ip -n "$FAB" link set "h$i" nomaster
  ip -n "$FAB" link add "d$i" type veth peer name "b$i"
  ip -n "$FAB" link set "b$i" master "r$r" up
  ip -n "$FAB" link set "d$i" up
  ip netns exec "$FAB" python3 "$HERE/netns_delay.py" --host "h$i" --fabric "d$i" \
    --delay "$ms" --jitter "$jit" </dev/null >/dev/null 2>"$DIR/delay.h$i.err" &
  echo $! > "$pidf"
  for _ in $(seq 1 50); do  # its sockets bound: it holds two packet sockets
    [ "$(ls -l /proc/$!/fd 2>/dev/null | grep -c socket)" -ge 2 ] && return 0
    kill -0 $! 2>/dev/null || die "fault delay: the relay failed: $(cat "$DIR/delay.h$i.err")"
    sleep 0.05
  done
}

cmd_fault() {
  local i h
  i=$(host_index "${1:-}"); h=$(ns "$i")
  case "${2:-}" in
    down) ip -n "$h" link set eth0 down ;;
    up) ip -n "$h" link set eth0 up ;;
    loss)
      local pct=${3:-}
      [[ "$pct" =~ ^[0-9]+$ ]] && [ "$pct" -le 100 ] || die "fault loss PCT: a whole percent 0-100"
      command -v nft >/dev/null || die "fault loss needs nftables (apt-get install nftables)"
      ip netns exec "$h" nft delete table inet shoalfault 2>/dev/null || true
      if [ "$pct" != 0 ]; then
        ip netns exec "$h" nft -f - <<EOF
table inet shoalfault {
  chain in { type filter hook input priority 0; iifname "eth0" numgen random mod 100 < $pct counter drop; }
  chain out { type filter hook output priority 0; oifname "eth0" numgen random mod 100 < $pct counter drop; }
}
EOF
      fi ;;
    delay)
      local ms=${3:-} jit=${4:-0}
      [[ "$ms" =~ ^[0-9]+(\.[0-9]+)?$ ]] && [[ "$jit" =~ ^[0-9]+(\.[0-9]+)?$ ]] ||
        die "fault delay MS [JITTER]: milliseconds"
      python3 -c "import sys; sys.exit(float(sys.argv[2]) > float(sys.argv[1]))" "$ms" "$jit" ||
        die "fault delay MS JITTER: the jitter ($jit ms) cannot exceed the delay ($ms ms)"
      if has_netem; then
        ip netns exec "$h" tc qdisc replace dev eth0 root netem delay "${ms}ms" "${jit}ms"
      else
        delay_relay "$i" "$ms" "$jit"
      fi ;;
    *) die "fault HOST down|up|loss PCT|delay MS [JITTER]" ;;
  esac
  echo "netns-cluster $NAME: h$i ${*:2}"
}

cmd_measure() {
  local a b addr out line=""
  a=$(host_index "${1:-}"); b=$(host_index "${2:-}")
  command -v iperf3 >/dev/null || die "measure needs iperf3 (apt-get install iperf3)"
  addr=$(cmd_addr "$b")
  for _ in 1 2 3 4 5; do  # a client that beat the server to its port tries again
    in_host "$b" timeout 20 iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    local srv=$!
    out=""
    for _ in $(seq 1 50); do
      out=$(in_host "$a" timeout 15 iperf3 -c "$addr" -p 5201 -t 2 -J 2>/dev/null) && break
      out=""; sleep 0.1
    done
    wait "$srv" 2>/dev/null || true
    [ -n "$out" ] || continue
    line=$(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
e = d.get("end", {})
if "sum_received" not in e:
    sys.exit(d.get("error", "no result"))
rate = e["sum_received"]["bits_per_second"] / 1e6
rtt = e["streams"][0]["sender"].get("mean_rtt", 0) / 1000.0
print(f"h{sys.argv[2]} -> h{sys.argv[3]}: {rate:.0f} Mbit/s, mean RTT {rtt:.3f} ms (iperf3, 2 s)")
' "$out" "$a" "$b" 2>&1) && break
    line=""
  done
  [ -n "$line" ] || die "measure: iperf3 from h$a to h$b ($addr) gave no result"
  echo "$line" | tee -a "$DIR/measured"
}

cmd_addr() {
  local i; i=$(host_index "${1:-}")
  awk -v h="h$i" '$2 == h { print $1 }' "$DIR/hosts"
}

cmd_status() {
  [ -d "$DIR" ] || { echo "netns-cluster $NAME: not running"; return 1; }
  echo "netns-cluster $NAME: $(cat "$DIR/config")"
  local n i
  n=$(cat "$DIR/hosts.count")
  for i in $(seq 1 "$n"); do
    local state="up"
    kill -0 "$(holder "$i")" 2>/dev/null || state="its holder process is gone"
    echo "  h$i $(cmd_addr "$i") ($state)"
  done
  [ -f "$DIR/measured" ] && sed 's/^/  measured: /' "$DIR/measured"
  return 0
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) cmd_stop ;;
  exec)
    shift; [ $# -ge 2 ] || die "exec HOST CMD..."
    i=$(host_index "$1"); shift
    in_host "$i" "$@" ;;
  rsh)
    # ssh's contract, for launchers' remote agents (OpenMPI's plm_rsh_agent):
    # the words joined into one line that the host's shell runs.
    shift; [ $# -ge 2 ] || die "rsh HOST WORDS..."
    i=$(host_index "$1"); shift
    in_host "$i" sh -c "$*" ;;
  addr) shift; cmd_addr "$@" ;;
  fault) shift; cmd_fault "$@" ;;
  measure) shift; cmd_measure "$@" ;;
  status) cmd_status ;;
  *) sed -n '2,25p' "$0" >&2; exit 2 ;;
esac
