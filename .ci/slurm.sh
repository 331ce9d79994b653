#!/usr/bin/env bash
# A real Slurm 22.05 cluster on this one Debian 12 host, for bertctl's integration tests.
#
#   bash .ci/slurm.sh start [--nodes N] [--gpus-per-node G] [--cpus-per-node C]
#        install (apt) if needed, then start munged, MariaDB + slurmdbd, slurmctld and one slurmd
#        per node; waits until every node is idle and sacct answers. Defaults: 2 nodes x 8 fake
#        GPUs x 4 CPUs (or SLURM_NODES, SLURM_GPUS, SLURM_CPUS). A cluster running in another
#        shape is restarted in the new one, its controller state and job ids starting afresh.
#   bash .ci/slurm.sh stop     cancel our jobs, then stop only the daemons this script started
#   bash .ci/slurm.sh status   one line per daemon
#
# Nodes node1..nodeN all run on 127.0.0.1 (Debian's build supports several slurmd per host: one
# port and spool each); the fake GPUs are character devices with /dev/null's numbers; one
# partition "debug" holds every node; accounting goes through slurmdbd so `sacct` works. Jobs get
# a pyxis stand-in (a SPANK plugin built here) and an enroot stand-in: .ci/pyxis-standin/README.md.
# Must run as root; no systemd needed.
set -euo pipefail

NODES=${SLURM_NODES:-2}
CPUS=${SLURM_CPUS:-4}
GPUS=${SLURM_GPUS:-8}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ETC=/etc/slurm
RUN=/run/slurm
SPOOL=/var/spool/bertctl-slurm
LOGS=/var/log/slurm
FAKEGPU=/var/lib/bertctl-fakegpu
STANDIN_LIB=/usr/local/lib/bertctl-slurm        # the compiled pyxis stand-in and its source
STANDIN_CONF=$ETC/plugstack.conf.d/bertctl-pyxis-standin.conf
PIDS=${BERTCTL_SLURM_PIDS:-/run/bertctl-slurm.pids}   # "name pid" of every daemon we started
DB=slurm_acct_db

say() { printf '[slurm.sh %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { say "error: $*"; exit 1; }
alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
pid_in() { [ -s "$1" ] && tr -dc 0-9 <"$1" || true; }
# running PIDFILE NAME: the pid file names a live process that is that daemon (pids get recycled)
running() { local pid; pid=$(pid_in "$1"); alive "$pid" && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$2"* ]]; }
remember() { echo "$1 $2" >>"$PIDS"; }
forget() { [ -s "$PIDS" ] && sed -i "/^$1 /d" "$PIDS" || true; }   # forget NAME: a daemon now gone
wait_until() { # wait_until SECONDS WHAT CMD...
  local end=$(($(date +%s) + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "timed out waiting for $what"
    sleep 0.2
  done
}

install_packages() {
  local missing=() p
  # libslurm-dev (spank.h) and gcc build the pyxis stand-in; numactl is what a container image
  # would bring for node.binding.mem=node (stand-in tasks run the host's programs)
  for p in munge slurmctld slurmd slurm-client slurmdbd mariadb-server libslurm-dev gcc libc6-dev numactl; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  say "installing ${missing[*]}"
  # keep the packages' init scripts from starting daemons: we start them ourselves
  local policy=/usr/sbin/policy-rc.d ours=0
  [ -e $policy ] || { printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; ours=1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/bertctl-slurm-apt.log 2>&1 ||
    { apt-get update -q >>/tmp/bertctl-slurm-apt.log 2>&1 &&
      apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/bertctl-slurm-apt.log 2>&1; } ||
    { [ $ours = 1 ] && rm -f $policy; tail -n 20 /tmp/bertctl-slurm-apt.log >&2; die "apt-get install failed"; }
  [ $ours = 1 ] && rm -f $policy
  return 0
}

write_configs() {
  mkdir -p "$ETC" "$RUN" "$SPOOL/ctld" "$LOGS" "$FAKEGPU"
  local gres="" types=""
  if [ "$GPUS" -gt 0 ]; then
    gres=" Gres=gpu:$GPUS"; types="GresTypes=gpu"
    for ((i = 0; i < GPUS; i++)); do
      [ -e "$FAKEGPU/nvidia$i" ] || mknod -m 666 "$FAKEGPU/nvidia$i" c 1 3
    done
  fi
  cat >"$ETC/slurm.conf" <<CONF
# written by bertctl .ci/slurm.sh: a test cluster on one host
ClusterName=bertctlci
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CryptoType=crypto/munge
# requeued jobs may start again after 10 s instead of 120 s
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SwitchType=switch/none
ReturnToService=2
MailProg=/bin/true
KillWait=5
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdSpoolDir=$SPOOL/d/%n
StateSaveLocation=$SPOOL/ctld
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# nodes declare more CPUs and GPUs than the host has
SlurmdParameters=config_overrides
$types
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
NodeName=node[1-$NODES] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001-$((17000 + NODES)) CPUs=$CPUS RealMemory=16000$gres State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  printf 'AutoDetect=off\n' >"$ETC/gres.conf"
  [ "$GPUS" -gt 0 ] && echo "NodeName=node[1-$NODES] Name=gpu File=$FAKEGPU/nvidia[0-$((GPUS - 1))]" >>"$ETC/gres.conf"
  # slurmd always loads a cgroup plugin; without systemd on cgroup v2 only v1 stays inert
  if [ "$(stat -fc %T /sys/fs/cgroup 2>/dev/null)" = cgroup2fs ] && [ ! -d /run/systemd/system ]; then
    echo 'CgroupPlugin=cgroup/v1' >"$ETC/cgroup.conf"
  fi
  cat >"$ETC/slurmdbd.conf" <<CONF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageUser=slurm
StoragePass=bertctl-ci
StorageLoc=$DB
CONF
  chmod 600 "$ETC/slurmdbd.conf"   # slurmdbd refuses a readable config
  # node names must resolve: the trainer's MASTER_ADDR is the first node's name
  local n missing=""
  for ((n = 1; n <= NODES; n++)); do getent hosts "node$n" >/dev/null || missing+=" node$n"; done
  [ -z "$missing" ] || echo "127.0.0.1$missing # bertctl-slurm" >>/etc/hosts
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- /usr/sbin/munged
  wait_until 10 munged bash -c 'munge -n </dev/null | unmunge'
  remember munged "$(pid_in /run/munge/munged.pid)"
}

start_accounting() {
  if ! mysqladmin ping >/dev/null 2>&1; then
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    setsid /usr/sbin/mariadbd --user=mysql --skip-networking --pid-file=/run/mysqld/mysqld.pid \
      </dev/null >>"$LOGS/mariadb.log" 2>&1 &
    wait_until 60 mariadb mysqladmin ping
    remember mariadbd "$(pid_in /run/mysqld/mysqld.pid)"
  fi
  # Fresh controller state restarts job ids at 1: old accounting rows would then answer for new
  # jobs with the same ids, so the database starts fresh with the controller. (A running
  # controller may not have saved its job_state yet: its ids and the database go on.)
  if [ ! -e "$SPOOL/ctld/job_state" ] && ! running $RUN/slurmctld.pid slurmctld; then
    running $RUN/slurmdbd.pid slurmdbd && { kill "$(pid_in $RUN/slurmdbd.pid)"; sleep 1; forget slurmdbd; }
    mysql -u root -e "DROP DATABASE IF EXISTS $DB"
  fi
  mysql -u root -e "CREATE DATABASE IF NOT EXISTS $DB;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'bertctl-ci';
    GRANT ALL ON $DB.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  if ! running $RUN/slurmdbd.pid slurmdbd; then
    slurmdbd
    wait_until 60 "slurmdbd on port 6819" bash -c 'exec 3<>/dev/tcp/127.0.0.1/6819'
    remember slurmdbd "$(pid_in $RUN/slurmdbd.pid)"
  fi
}

# ---- the pyxis and enroot stand-ins (.ci/pyxis-standin/README.md)

# Compiled again whenever its source differs from the one the installed plugin was built from.
build_standin() {
  local src=$HERE/pyxis-standin/pyxis_standin.c
  if ! cmp -s "$src" "$STANDIN_LIB/pyxis_standin.c" || [ ! -s "$STANDIN_LIB/pyxis_standin.so" ]; then
    mkdir -p "$STANDIN_LIB"
    gcc -shared -fPIC -O2 -Wall -Wextra -Werror -o "$STANDIN_LIB/pyxis_standin.so.new" "$src" ||
      die "could not compile the pyxis stand-in $src"
    # a rename, so running sruns and slurmstepds keep the file they loaded
    mv "$STANDIN_LIB/pyxis_standin.so.new" "$STANDIN_LIB/pyxis_standin.so"
    cp "$src" "$STANDIN_LIB/pyxis_standin.c"
    say "built the pyxis stand-in $STANDIN_LIB/pyxis_standin.so"
  fi
  mkdir -p "$SPOOL/pyxis"
}

# Sets PLUGSTACK_CHANGED=1 when the plugin stack changed: slurmd only learns of SPANK hooks at start.
PLUGSTACK_CHANGED=0
register_standin() {
  local line="required $STANDIN_LIB/pyxis_standin.so spool=$SPOOL/pyxis"
  if grep -lsE '^[^#]*(spank_pyxis|pyxis)\.so' "$ETC"/plugstack.conf "$ETC"/plugstack.conf.d/*.conf |
      grep -qvx "$STANDIN_CONF"; then
    say "a real pyxis is registered in $ETC/plugstack.conf*: the stand-in stays out"
    rm -f "$STANDIN_CONF"
    return
  fi
  grep -qsx 'include /etc/slurm/plugstack.conf.d/\*.conf' "$ETC/plugstack.conf" ||
    die "$ETC/plugstack.conf does not include plugstack.conf.d/*.conf (Debian's default): cannot register the pyxis stand-in"
  mkdir -p "$(dirname "$STANDIN_CONF")"
  if [ "$(cat "$STANDIN_CONF" 2>/dev/null)" != "$line" ]; then
    echo "$line" >"$STANDIN_CONF"
    PLUGSTACK_CHANGED=1
  fi
}

# Only where no real enroot exists: ours carries a marker line.
install_enroot_standin() {
  local have; have=$(command -v enroot || true)
  if [ -z "$have" ] || grep -qs bertctl-enroot-standin "$have"; then
    cmp -s "$HERE/pyxis-standin/enroot" /usr/local/bin/enroot ||
      install -m 0755 "$HERE/pyxis-standin/enroot" /usr/local/bin/enroot
  fi
}

# ---- the cluster's shape: N nodes x G GPUs x C CPUs

shape() { echo "nodes=$NODES gpus=$GPUS cpus=$CPUS"; }

# A different shape means a new slurm.conf for slurmctld and every slurmd, and the old controller
# and node state (nodes that no longer exist, job ids, named containers) must not carry over.
reshape_if_needed() {
  local was; was=$(cat "$SPOOL/shape" 2>/dev/null || true)
  [ "$was" = "$(shape)" ] && return
  if running $RUN/slurmctld.pid slurmctld; then
    grep -qs "^slurmctld $(pid_in $RUN/slurmctld.pid)\$" "$PIDS" ||
      die "a cluster (${was:-of unknown shape}) runs that this pid file ($PIDS) did not start: stop it first"
    say "reshaping: ${was:-unknown} -> $(shape)"
    cancel_all_jobs
    stop_daemons slurmd slurmctld
  fi
  rm -rf "$SPOOL/ctld" "$SPOOL/d" "$SPOOL/pyxis"
  mkdir -p "$SPOOL"
  shape >"$SPOOL/shape"
}

nodes_idle() {
  local states
  states=$(sinfo -h -N -o '%N %T' | sort -u) || return 1
  [ "$(wc -l <<<"$states")" -eq "$NODES" ] && ! grep -qvE ' (idle|mixed|allocated|completing)$' <<<"$states"
}

all_pid_files() { # all_pid_files N...: every listed node's slurmd wrote its pid file
  local n
  for n; do [ -s "$RUN/slurmd-node$n.pid" ] || return 1; done
}

start_slurm() {
  if ! running $RUN/slurmctld.pid slurmctld; then
    slurmctld
    wait_until 30 slurmctld scontrol ping
    remember slurmctld "$(pid_in $RUN/slurmctld.pid)"
  fi
  # every missing slurmd at once (each daemonizes), then wait for all of them
  local n started=()
  for ((n = 1; n <= NODES; n++)); do
    running "$RUN/slurmd-node$n.pid" slurmd && continue
    rm -f "$RUN/slurmd-node$n.pid"
    mkdir -p "$SPOOL/d/node$n"
    slurmd -N "node$n"
    started+=("$n")
  done
  if [ ${#started[@]} -gt 0 ]; then
    wait_until $((10 + NODES / 4)) "slurmd on ${#started[@]} node(s)" all_pid_files "${started[@]}"
    for n in "${started[@]}"; do remember "slurmd-node$n" "$(pid_in "$RUN/slurmd-node$n.pid")"; done
  fi
  # a node drained by an earlier bad configuration stays drained until resumed
  sinfo -h -N -o '%T' | grep -qE 'drain|down' && scontrol update nodename="node[1-$NODES]" state=resume || true
  wait_until $((60 + NODES)) "nodes to become idle" nodes_idle
  wait_until 60 "the cluster to register in slurmdbd" bash -c 'sacctmgr -n -P list cluster format=cluster | grep -qx bertctlci'
  wait_until 30 sacct sacct -n -X
}

# ---- stopping

cancel_all_jobs() {
  scontrol ping >/dev/null 2>&1 || return 0
  # job processes outlive slurmd: cancel everything before the daemons go
  local ids; ids=$(squeue -h -o %A | tr '\n' ' ')
  if [ -n "${ids// /}" ]; then
    scancel $ids || true
    for _ in $(seq 100); do [ -z "$(squeue -h -o %A)" ] && break; sleep 0.1; done
  fi
}

# stop_daemons KIND...: the daemons of each kind that the pid file names, all of a kind at once
stop_daemons() {
  local kind name pid victims
  [ -s "$PIDS" ] || return 0
  for kind; do
    victims=()
    while read -r name pid; do
      [[ $name == "$kind" || $name == "$kind"-* ]] || continue   # slurmd-node3 is a slurmd
      # never signal a recycled pid: the process must still be the daemon we started
      [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$kind" ] && kill "$pid" && victims+=("$name:$pid")
    done <"$PIDS"
    for victim in "${victims[@]}"; do
      name=${victim%%:*} pid=${victim##*:}
      for _ in $(seq 150); do alive "$pid" || break; sleep 0.1; done
      alive "$pid" && kill -9 "$pid"
      say "stopped $name ($pid)"
    done
    sed -i -E "/^$kind(-[^ ]*)? /d" "$PIDS"
  done
}

stop_all() {
  cancel_all_jobs
  [ -s "$PIDS" ] || { say "nothing to stop"; return; }
  stop_daemons slurmd slurmctld slurmdbd mariadbd munged
  rm -f "$PIDS"
}

usage() {
  echo "usage: bash .ci/slurm.sh start [--nodes N] [--gpus-per-node G] [--cpus-per-node C] | stop | status" >&2
  exit 2
}

bad_arg() { say "error: $*"; exit 2; }

parse_start_args() {
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) NODES=${2:-}; shift 2 || usage ;;
      --gpus-per-node) GPUS=${2:-}; shift 2 || usage ;;
      --cpus-per-node) CPUS=${2:-}; shift 2 || usage ;;
      --nodes=*) NODES=${1#*=}; shift ;;
      --gpus-per-node=*) GPUS=${1#*=}; shift ;;
      --cpus-per-node=*) CPUS=${1#*=}; shift ;;
      *) usage ;;
    esac
  done
  [[ $NODES =~ ^[1-9][0-9]*$ ]] && [ "$NODES" -le 1000 ] || bad_arg "--nodes: a number from 1 to 1000, got '$NODES'"
  [[ $GPUS =~ ^[0-9]+$ ]] && [ "$GPUS" -le 64 ] || bad_arg "--gpus-per-node: a number from 0 to 64, got '$GPUS'"
  [[ $CPUS =~ ^[1-9][0-9]*$ ]] || bad_arg "--cpus-per-node: a number from 1, got '$CPUS'"
}

case "${1:-}" in
  start)
    shift
    parse_start_args "$@"
    [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"
    t0=$(date +%s%N)
    install_packages
    reshape_if_needed
    build_standin
    install_enroot_standin
    register_standin
    if [ $PLUGSTACK_CHANGED = 1 ] && running $RUN/slurmctld.pid slurmctld; then
      say "the plugin stack changed: restarting slurmctld and slurmd"
      cancel_all_jobs
      stop_daemons slurmd slurmctld
    fi
    write_configs
    start_munge
    start_accounting
    start_slurm
    say "cluster ready: $NODES node(s) x $GPUS GPU(s) x $CPUS CPU(s) in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    ;;
  stop) stop_all ;;
  status)
    if [ -s "$PIDS" ]; then
      while read -r name pid; do
        if alive "$pid"; then echo "$name $pid running"; else echo "$name $pid gone"; fi
      done <"$PIDS"
    else echo "no daemons started by .ci/slurm.sh"; fi
    ;;
  *) usage ;;
esac
