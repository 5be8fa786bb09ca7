#!/usr/bin/env bash
# A real Slurm cluster on this one host, for tests of `shoal run --engine srun`:
# a private munged, slurmctld, and four slurmd (n1..n4) that all run here.
# Debian packages: slurm-wlm munge (tools/install-deps.sh installs them).
#
#   tools/slurm-cluster.sh start   # prints `export SLURM_CONF=...` for clients
#   tools/slurm-cluster.sh status
#   tools/slurm-cluster.sh stop
#
# State lives in $SHOAL_SLURM_DIR (default /tmp/shoal-slurm). Runs as root
# without cgroups (proctrack/pgid, task/none), as measured in
# ../shared/notes/slurm-and-launchers.md. Every wait is bounded.
set -euo pipefail

DIR=${SHOAL_SLURM_DIR:-/tmp/shoal-slurm}
HOST=$(hostname -s)
NODES=${SHOAL_SLURM_NODES:-4}
CONF=$DIR/slurm.conf

die() { echo "slurm-cluster: $*" >&2; exit 1; }

free_port() {  # a port nobody listens on, from a range away from ephemeral ones
  local p
  for _ in $(seq 1 200); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then echo "$p"; return; fi
  done
  die "no free port found"
}

start() {
  command -v slurmctld >/dev/null && command -v munged >/dev/null ||
    die "slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)"
  [ "$(id -u)" = 0 ] || die "must run as root (SlurmUser=root)"
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
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

  local ctl_port first
  ctl_port=$(free_port)
  first=$(free_port)
  cat > "$CONF" <<EOF
ClusterName=shoal
SlurmctldHost=$HOST
SlurmctldPort=$ctl_port
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
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
KillWait=5
InactiveLimit=0
NodeName=n[1-$NODES] NodeHostname=$HOST Port=$first-$((first + NODES - 1)) CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  export SLURM_CONF=$CONF
  slurmctld -f "$CONF"
  for i in $(seq 1 "$NODES"); do slurmd -f "$CONF" -N "n$i"; done
  # Bounded wait for every node to be idle.
  for _ in $(seq 1 100); do
    if [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = "$NODES" ]; then
      echo "export SLURM_CONF=$CONF"
      return
    fi
    sleep 0.2
  done
  sinfo -N >&2 || true
  tail -n 20 "$DIR/slurmctld.log" >&2 || true
  die "the $NODES nodes did not become idle within 20 s"
}

stop() {
  [ -f "$CONF" ] || return 0
  export SLURM_CONF=$CONF
  # Jobs first (slurmstepd can hang if the daemons go while steps run).
  scancel --full --quiet -u root 2>/dev/null || true
  for _ in $(seq 1 50); do
    [ -z "$(squeue -h 2>/dev/null)" ] && break
    sleep 0.2
  done
  for f in "$DIR"/slurmd-n*.pid "$DIR/slurmctld.pid" "$DIR/munged.pid"; do
    [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  for _ in $(seq 1 50); do
    pgrep -f "slurmd -f $CONF|slurmctld -f $CONF" >/dev/null || break
    sleep 0.1
  done
  pkill -9 -f "slurmd -f $CONF|slurmctld -f $CONF" 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF=$CONF sinfo -N ;;
  *) die "usage: $0 start|stop|status" ;;
esac
