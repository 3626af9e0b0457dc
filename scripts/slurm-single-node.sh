#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the tests of `./run.sh all --slurm` (CI runs it from .ci/run).
# Debian's slurmctld, slurmd and MUNGE, started by hand as root (no systemd here): a munge key, a slurm.conf whose
# node line comes from `slurmd -C`, proctrack/linuxproc and task/none (no cgroup management in these sandboxes).
#
#   scripts/slurm-single-node.sh start   install (apt) where missing, configure, start the daemons this script
#                                        does not find running, wait until `sinfo` shows the node idle; idempotent
#   scripts/slurm-single-node.sh stop    stop the daemons this script started (by the process ids it recorded)
#
# State: $SLURM_CI_STATE (default /run/artifact-slurm): the pids of the daemons it started, and its logs.
set -euo pipefail
STATE=${SLURM_CI_STATE:-/run/artifact-slurm}
CONF=/etc/slurm/slurm.conf

need_root() { [ "$(id -u)" = 0 ] || { echo "error: $0 needs root (it installs and starts daemons)" >&2; exit 2; }; }

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
    && command -v munged >/dev/null && return 0
  command -v apt-get >/dev/null || { echo "error: Slurm is not installed and there is no apt-get" >&2; exit 2; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null; }
}

configure() {
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
  fi
  chown munge: /etc/munge /etc/munge/munge.key && chmod 700 /etc/munge && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  chown munge: /run/munge /var/log/munge /var/lib/munge
  chown slurm: /var/spool/slurmctld /var/log/slurm
  local host node
  host=$(hostname -s)
  node=$(slurmd -C | head -1)  # NodeName=<host> CPUs=... RealMemory=...
  mkdir -p /etc/slurm
  cat >"$CONF" <<EOF
# written by scripts/slurm-single-node.sh (the artifact's CI): one node, no cgroups, no accounting daemon
ClusterName=artifact-ci
SlurmctldHost=$host
SlurmUser=slurm
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MaxArraySize=1000
KillWait=30
JobAcctGatherType=jobacct_gather/none
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

alive() { [ -f "$STATE/$1.pid" ] && kill -0 "$(cat "$STATE/$1.pid")" 2>/dev/null; }

start_daemon() {  # start_daemon NAME CMD...: in the background, its pid recorded (it stays in the foreground: -D)
  local name=$1
  shift
  alive "$name" && return 0
  nohup "$@" >"$STATE/$name.log" 2>&1 &
  echo $! >"$STATE/$name.pid"
}

start() {
  need_root
  local t0=$SECONDS
  install
  mkdir -p "$STATE"
  # Daemons already answering (started by someone else) are used, not restarted
  if ! sinfo -h >/dev/null 2>&1; then
    configure
    munge -n </dev/null >/dev/null 2>&1 || start_daemon munged runuser -u munge -- munged -F
    for _ in $(seq 30); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.5; done
    start_daemon slurmctld slurmctld -D -i
    for _ in $(seq 60); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.5; done
    start_daemon slurmd slurmd -D
  fi
  local state=""
  for _ in $(seq 90); do
    state=$(sinfo -h -o %T 2>/dev/null | head -1)
    [ "$state" = idle ] && break
    sleep 1
  done
  if [ "$state" != idle ]; then
    echo "error: the Slurm node did not become idle (state '${state:-none}'); see $STATE/*.log and /var/log/slurm/" >&2
    tail -5 "$STATE"/*.log /var/log/slurm/*.log >&2 2>/dev/null || true
    exit 1
  fi
  echo "slurm: single node $(hostname -s) idle ($(sinfo -h -o '%c CPUs, %m MB') ; $(sbatch --version)) in $((SECONDS - t0)) s"
}

stop() {
  local name pid
  for name in slurmd slurmctld munged; do
    [ -f "$STATE/$name.pid" ] || continue
    pid=$(cat "$STATE/$name.pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    rm -f "$STATE/$name.pid"
  done
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
