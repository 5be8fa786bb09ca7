#!/usr/bin/env bash
# A real Slurm cluster on this one host, for tests of `shoal run --engine srun`:
# a private munged, slurmctld, and four slurmd (n1..n4) that all run here.
# Debian packages: slurm-wlm munge (tools/install-deps.sh installs them).
#
#   tools/slurm-cluster.sh start   # prints `export SLURM_CONF=...` for clients
#   tools/slurm-cluster.sh status
#   tools/slurm-cluster.sh stop
#
# SHOAL_SLURM_NETNS=NAME puts one slurmd on each host of the running
# tools/netns-cluster.sh cluster NAME (nodes h1..hN, slurmctld on h1, state in
# /run/shoal-netns/NAME/slurm); clients then run on a host:
#   tools/netns-cluster.sh --name NAME exec h1 env SLURM_CONF=... srun -N 2 ...
#
# SHOAL_SLURM_TOPOLOGY=FILE adds switches (topology.conf for topology/tree);
# SHOAL_SLURM_GPUS=K gives each node K GPUs as counted GRES (no devices).
#
# State lives in $SHOAL_SLURM_DIR (default /tmp/shoal-slurm). Runs as root
# without cgroups (proctrack/pgid, task/none), as measured in
# ../shared/notes/slurm-and-launchers.md. Every wait is bounded, and every
# Slurm client call too (a client whose slurmctld is gone retries for long).
set -euo pipefail

NETNS=${SHOAL_SLURM_NETNS:-}
NETNS_TOOL="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/netns-cluster.sh"
if [ -n "$NETNS" ]; then
  DIR=${SHOAL_SLURM_DIR:-/run/shoal-netns/$NETNS/slurm}
  NODES=$(cat "/run/shoal-netns/$NETNS/hosts.count" 2>/dev/null) ||
    { echo "slurm-cluster: no netns cluster named $NETNS is running" >&2; exit 1; }
else
  DIR=${SHOAL_SLURM_DIR:-/tmp/shoal-slurm}
  NODES=${SHOAL_SLURM_NODES:-4}
fi
HOST=$(hostname -s)
NODE=n  # node names: n1..nN here, h1..hN on netns hosts
[ -n "$NETNS" ] && NODE=h
CONF=$DIR/slurm.conf
TOPOLOGY=${SHOAL_SLURM_TOPOLOGY:-}  # a topology.conf: switches over n1..n4
GPUS=${SHOAL_SLURM_GPUS:-0}  # GPUs (GRES, counted only) per node
GRES_NODE=""
if [ "$GPUS" != 0 ]; then GRES_NODE=" Gres=gpu:$GPUS"; fi

die() { echo "slurm-cluster: $*" >&2; exit 1; }

# A port nobody listens on, below the kernel's ephemeral range (32768 and up
# here) so that no outgoing connection holds it. A daemon that still fails to
# bind is caught after start, and the start retried with new ports.
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((12000 + RANDOM % 18000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# A daemon of this cluster is up ($1: slurmctld or n3/h3); by its command
# line in netns mode, where pid files hold the hosts' own PIDs.
up() {
  if [ -z "$NETNS" ]; then
    if [ "$1" = slurmctld ]; then alive "$DIR/slurmctld.pid"; else alive "$DIR/slurmd-$1.pid"; fi
  elif [ "$1" = slurmctld ]; then
    pgrep -f "^slurmctld -f $CONF\$" >/dev/null
  else
    pgrep -f "^slurmd -f $CONF -N $1\$" >/dev/null
  fi
}
on_host() {  # host command...: on that netns host, or here
  local h=$1; shift
  if [ -n "$NETNS" ]; then "$NETNS_TOOL" --name "$NETNS" exec "$h" "$@"; else "$@"; fi
}
client() { on_host h1 env SLURM_CONF="$CONF" "$@"; }

write_conf() {  # $1 slurmctld port, $2 first slurmd port
  cat > "$CONF" <<EOF
ClusterName=shoal
SlurmctldHost=$HOST
SlurmctldPort=$1
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge/munge.socket.2
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
MessageTimeout=5
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
KillWait=5
InactiveLimit=0
EOF
  if [ -n "$NETNS" ]; then
    # SlurmctldHost above names this machine: h1 holds it here.
    sed -i "s/^SlurmctldHost=.*/SlurmctldHost=h1($("$NETNS_TOOL" --name "$NETNS" addr h1))/" "$CONF"
    local i
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=h$i NodeAddr=$("$NETNS_TOOL" --name "$NETNS" addr "h$i") Port=$2 CPUs=2 RealMemory=4000 State=UNKNOWN$GRES_NODE" >> "$CONF"
    done
    echo "PartitionName=debug Nodes=h[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >> "$CONF"
  else
    cat >> "$CONF" <<EOF
NodeName=n[1-$NODES] NodeHostname=$HOST Port=$2-$(($2 + NODES - 1)) CPUs=2 RealMemory=4000 State=UNKNOWN$GRES_NODE
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  fi
  # Optional: switches (Slurm's topology/tree) and GPUs per node (counted
  # only: no devices, for placement tests).
  if [ -n "$TOPOLOGY" ]; then
    cp "$TOPOLOGY" "$DIR/topology.conf"
    echo "TopologyPlugin=topology/tree" >> "$CONF"
  fi
  if [ "$GPUS" != 0 ]; then
    echo "GresTypes=gpu" >> "$CONF"
    # Slurm counts GPUs by their device files: character devices with
    # /dev/null's numbers stand in.
    mkdir -p "$DIR/dev"
    for i in $(seq 0 $((GPUS - 1))); do
      mknod "$DIR/dev/gpu$i" c 1 3 2>/dev/null || touch "$DIR/dev/gpu$i"  # /dev/null's numbers
    done
    echo "NodeName=n[1-$NODES] Name=gpu File=$DIR/dev/gpu[0-$((GPUS - 1))]" > "$DIR/gres.conf"
  fi
}

stop_daemons() {
  local f
  if [ -n "$NETNS" ]; then  # the pid files hold the hosts' own PIDs
    pkill -TERM -f "^slurm(ctl)?d -f $CONF" 2>/dev/null || true
  else
    for f in "$DIR"/slurmd-n*.pid "$DIR/slurmctld.pid"; do
      if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
    done
  fi
  for _ in $(seq 1 50); do
    pgrep -f "slurm(ctl)?d -f $CONF" >/dev/null || break
    sleep 0.1
  done
  pkill -9 -f "slurm(ctl)?d -f $CONF" 2>/dev/null || true
  rm -f "$DIR"/slurmd-*.pid "$DIR/slurmctld.pid"
}

start() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    die "slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)"
  [ "$(id -u)" = 0 ] || die "must run as root (SlurmUser=root)"
  if up slurmctld; then
    echo "export SLURM_CONF=$CONF"
    return
  fi
  rm -rf "$DIR"
  mkdir -p "$DIR/state" "$DIR/munge" "$DIR/spool"
  chmod 755 "$DIR/munge"
  head -c 1024 /dev/urandom > "$DIR/munge.key"
  chmod 0400 "$DIR/munge.key"
  munged --force --key-file="$DIR/munge.key" --socket="$DIR/munge/munge.socket.2" \
    --pid-file="$DIR/munged.pid" --log-file="$DIR/munged.log" --seed-file="$DIR/munged.seed"
  export SLURM_CONF=$CONF
  local attempt ok i
  for attempt in 1 2 3; do
    write_conf "$(free_port)" "$(free_port)"
    on_host h1 slurmctld -f "$CONF" || true
    for i in $(seq 1 "$NODES"); do on_host "h$i" slurmd -f "$CONF" -N "$NODE$i" || true; done
    sleep 1
    ok=1
    up slurmctld || ok=0
    for i in $(seq 1 "$NODES"); do up "$NODE$i" || ok=0; done
    [ "$ok" = 1 ] && break
    echo "slurm-cluster: a daemon did not stay up (port taken?); retrying with new ports" >&2
    tail -n 2 "$DIR/slurmctld.log" >&2 2>/dev/null || true
    stop_daemons
    [ "$attempt" = 3 ] && die "slurmctld/slurmd did not start; logs in $DIR"
  done
  # Bounded wait for every node to be idle.
  for _ in $(seq 1 40); do
    if [ "$(client timeout 3 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ]; then
      echo "export SLURM_CONF=$CONF"
      return
    fi
    sleep 0.25
  done
  client timeout 3 sinfo -N >&2 || true
  tail -n 20 "$DIR/slurmctld.log" >&2 || true
  die "the $NODES nodes did not become idle"
}

stop() {
  [ -f "$CONF" ] || return 0
  export SLURM_CONF=$CONF
  # Jobs first (slurmstepd can hang if the daemons go while steps run).
  if up slurmctld; then
    client timeout 5 scancel --full --quiet -u root 2>/dev/null || true
    for _ in $(seq 1 25); do
      [ -z "$(client timeout 3 squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_daemons
  if [ -f "$DIR/munged.pid" ]; then kill "$(cat "$DIR/munged.pid")" 2>/dev/null || true; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) client timeout 5 sinfo -N ;;
  *) die "usage: $0 start|stop|status" ;;
esac
