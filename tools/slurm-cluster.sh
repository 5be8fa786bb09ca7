#!/usr/bin/env bash
# A real Slurm cluster on this one host, for tests of `shoal run --engine srun`:
# a private munged, slurmctld, and four slurmd (n1..n4) that all run here.
# Debian packages: slurm-wlm munge (tools/install-deps.sh installs them).
#
#   tools/slurm-cluster.sh start   # prints `export SLURM_CONF=...` for clients
#   tools/slurm-cluster.sh status
#   tools/slurm-cluster.sh stop
#
# SHOAL_SLURM_TOPOLOGY=FILE adds switches (topology.conf for topology/tree);
# SHOAL_SLURM_GPUS=K gives each node K GPUs as counted GRES (no devices).
#
# State lives in $SHOAL_SLURM_DIR (default /tmp/shoal-slurm). Runs as root
# without cgroups (proctrack/pgid, task/none), as measured in
# ../shared/notes/slurm-and-launchers.md. Every wait is bounded, and every
# Slurm client call too (a client whose slurmctld is gone retries for long).
set -euo pipefail

DIR=${SHOAL_SLURM_DIR:-/tmp/shoal-slurm}
HOST=$(hostname -s)
NODES=${SHOAL_SLURM_NODES:-4}
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
NodeName=n[1-$NODES] NodeHostname=$HOST Port=$2-$(($2 + NODES - 1)) CPUs=2 RealMemory=4000 State=UNKNOWN$GRES_NODE
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
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
  for f in "$DIR"/slurmd-n*.pid "$DIR/slurmctld.pid"; do
    if [ -f "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
  done
  for _ in $(seq 1 50); do
    pgrep -f "slurm(ctl)?d -f $CONF" >/dev/null || break
    sleep 0.1
  done
  pkill -9 -f "slurm(ctl)?d -f $CONF" 2>/dev/null || true
  rm -f "$DIR"/slurmd-n*.pid "$DIR/slurmctld.pid"
}

start() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    die "slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)"
  [ "$(id -u)" = 0 ] || die "must run as root (SlurmUser=root)"
  if alive "$DIR/slurmctld.pid"; then
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
    slurmctld -f "$CONF" || true
    for i in $(seq 1 "$NODES"); do slurmd -f "$CONF" -N "n$i" || true; done
    sleep 1
    ok=1
    alive "$DIR/slurmctld.pid" || ok=0
    for i in $(seq 1 "$NODES"); do alive "$DIR/slurmd-n$i.pid" || ok=0; done
    [ "$ok" = 1 ] && break
    echo "slurm-cluster: a daemon did not stay up (port taken?); retrying with new ports" >&2
    tail -n 2 "$DIR/slurmctld.log" >&2 2>/dev/null || true
    stop_daemons
    [ "$attempt" = 3 ] && die "slurmctld/slurmd did not start; logs in $DIR"
  done
  # Bounded wait for every node to be idle.
  for _ in $(seq 1 40); do
    if [ "$(timeout 3 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ]; then
      echo "export SLURM_CONF=$CONF"
      return
    fi
    sleep 0.25
  done
  timeout 3 sinfo -N >&2 || true
  tail -n 20 "$DIR/slurmctld.log" >&2 || true
  die "the $NODES nodes did not become idle"
}

stop() {
  [ -f "$CONF" ] || return 0
  export SLURM_CONF=$CONF
  # Jobs first (slurmstepd can hang if the daemons go while steps run).
  if alive "$DIR/slurmctld.pid"; then
    timeout 5 scancel --full --quiet -u root 2>/dev/null || true
    for _ in $(seq 1 25); do
      [ -z "$(timeout 3 squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_daemons
  if [ -f "$DIR/munged.pid" ]; then kill "$(cat "$DIR/munged.pid")" 2>/dev/null || true; fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF=$CONF timeout 5 sinfo -N ;;
  *) die "usage: $0 start|stop|status" ;;
esac
