#!/usr/bin/env bash
# Throwaway ONE-NODE Slurm cluster on localhost for the tests that need a real
# srun/sbatch (Debian 12: slurm-wlm 22.05 + munge). Everything (munge key and
# socket, slurm.conf, state, spool, logs, pids) lives under DIR and the ports
# are picked free, so clusters can run side by side; /etc/slurm and /etc/munge
# are neither used nor touched.
#   cluster.sh install    apt-get the packages (skipped when already installed)
#   cluster.sh start DIR  DIR: empty folder made by the caller. Success: last
#                         stdout line is `export SLURM_CONF=DIR/slurm.conf`.
#                         Failure: one stderr line `slurm cluster unavailable:
#                         <reason>`, all started daemons stopped, exit 3 (skip).
#   cluster.sh start DIR PID  the same, and the cluster is stopped once process PID is gone
#   cluster.sh stop DIR   cancel jobs, stop slurmd/slurmctld/munged; never fails.
# SLURM_TEST_CPUS=N declares N CPUs on the node (default: nproc, unset from
# OMP_NUM_THREADS, which GNU nproc obeys; the node is trusted as is).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

have() { local b; for b; do command -v "$b" >/dev/null || return 1; done; }

install() {  # slurm-wlm = slurmctld + slurmd + slurm-client (+ plugins, munge)
  have slurmctld slurmd srun sbatch munged && return 0
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge
}

# alive PID DIR: PID runs, is no zombie (pid 1 of a container may not reap)
# and its command line names DIR/ (so a recycled pid is never killed).
alive() {
  [ -n "$1" ] && [[ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null)" =~ ^[^ZX] ]] &&
    tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF "$2/"
}
pidof_() { cat "$d/$1.pid" 2>/dev/null || true; }

stop() {
  local f p end; d=$(cd "$1" 2>/dev/null && pwd) || return 0
  if alive "$(pidof_ slurmctld)" "$d"; then  # cancel jobs so slurmstepd reaps tasks
    export SLURM_CONF=$d/slurm.conf
    timeout 5 scancel --user="$(id -un)" >/dev/null 2>&1 || true
    end=$((SECONDS + 5))
    while [ -n "$(timeout 2 squeue -h -o %i 2>/dev/null)" ] && [ $SECONDS -lt $end ]; do
      sleep 0.1
    done
  fi
  for f in slurmd slurmctld munged; do  # pid read once: slurmctld removes its file
    p=$(pidof_ $f)
    if alive "$p" "$d"; then
      kill -TERM "$p" 2>/dev/null || true
      end=$((SECONDS + 10))
      while alive "$p" "$d" && [ $SECONDS -lt $end ]; do sleep 0.1; done
      if alive "$p" "$d"; then kill -KILL "$p" 2>/dev/null || true; fi
    fi
    rm -f "$d/$f.pid" 2>/dev/null || true
  done
}

start() {
  d=$(cd "$1" && pwd)  # global: the EXIT trap needs it
  fail() {
    trap - EXIT
    local msg="$*"; echo "slurm cluster unavailable: ${msg//$'\n'/ }" >&2
    stop "$d"; exit 3
  }
  logtail() {  # last lines of a daemon's output, harmless pmix noise dropped
    local f; for f in "$d/$1.out" "$d/$1.log"; do
      [ -s "$f" ] || continue
      echo "; ${f##*/}: $(grep -vE 'pmix|MPI:|^\s*$' "$f" | tail -n 3 | paste -sd '|')"; return 0
    done
  }
  trap 'fail "start: unexpected error (exit $?), see $d"' EXIT  # e.g. set -e
  have slurmctld slurmd sinfo scontrol munged munge ||
    fail "slurm/munge not installed (run: tests/slurm/cluster.sh install)"
  [ "${#d}" -lt 80 ] || fail "DIR path too long for a unix socket: $d"
  local host user ports py=/usr/bin/python3
  [ -x $py ] || py=python3
  host=$(hostname -s 2>/dev/null || hostname); user=$(id -un)
  ports=$($py -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("", 0))
print(*[x.getsockname()[1] for x in s])' 2>&1) || fail "cannot pick free ports: $ports"
  mkdir -p "$d/state" "$d/spool"

  # munge: own key, socket, pid, log and seed. --force: munged refuses root
  # (and a group-writable DIR) without it.
  rm -f "$d/munge.key"
  dd if=/dev/urandom of="$d/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$d/munge.key"
  munged --force --socket="$d/munge.socket" --key-file="$d/munge.key" \
    --pid-file="$d/munged.pid" --log-file="$d/munged.log" --seed-file="$d/munged.seed" \
    </dev/null >"$d/munged.out" 2>&1 || fail "munged failed$(logtail munged)"
  munge -n -S "$d/munge.socket" | unmunge -S "$d/munge.socket" >/dev/null 2>&1 ||
    fail "munge round trip failed$(logtail munged)"

  # NodeAddr/SlurmctldHost addr = 127.0.0.1: no dependence on DNS for $host.
  # batch_sched_delay=0: batch jobs start at the next 1 s scheduler tick (not 3 s).
  # MinJobAge=5 keeps `sbatch --wait` polling every 2 s (it backs off when larger).
  cat >"$d/slurm.conf" <<EOF
ClusterName=test$$
# jobs numbered from this cluster's port: two clusters at once give their jobs different ids (and ports)
FirstJobId=${ports% *}
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${ports% *}
SlurmdPort=${ports#* }
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
AuthInfo=socket=$d/munge.socket
CredType=cred/munge
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd.log
PlugStackConfig=$d/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SlurmdParameters=config_overrides
MailProg=/bin/true
ReturnToService=2
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=5
TCPTimeout=2
KillWait=2
MinJobAge=5
NodeName=$host NodeAddr=127.0.0.1 CPUs=${SLURM_TEST_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  : >"$d/plugstack.conf"  # empty: keep /etc/slurm/plugstack.conf out
  export SLURM_CONF=$d/slurm.conf

  # -D: foreground, so $! is the daemon; *.out also catches errors printed
  # before the log file is open. slurmd starts once slurmctld answers.
  slurmctld -D -i -f "$d/slurm.conf" </dev/null >"$d/slurmctld.out" 2>&1 &
  echo $! >"$d/slurmctld.pid"
  local deadline=$((SECONDS + 30)) state=""
  until timeout 3 scontrol ping >/dev/null 2>&1; do
    alive "$(pidof_ slurmctld)" "$d" || fail "slurmctld exited$(logtail slurmctld)"
    [ $SECONDS -lt $deadline ] || fail "slurmctld not answering after 30 s$(logtail slurmctld)"
    sleep 0.1
  done
  slurmd -D -f "$d/slurm.conf" </dev/null >"$d/slurmd.out" 2>&1 &
  echo $! >"$d/slurmd.pid"
  until [ "$state" = idle ]; do
    alive "$(pidof_ slurmctld)" "$d" || fail "slurmctld exited$(logtail slurmctld)"
    alive "$(pidof_ slurmd)" "$d" || fail "slurmd exited$(logtail slurmd)"
    [ $SECONDS -lt $deadline ] ||
      fail "node not idle after 30 s (state '${state:-?}')$(logtail slurmctld)$(logtail slurmd)"
    sleep 0.2
    state=$(timeout 3 sinfo -h -N -o %t 2>/dev/null | head -n 1) || true
  done
  trap - EXIT
  if [ -n "${2:-}" ]; then  # OWNER_PID: a test killed by its timeout leaves no cluster behind
    setsid bash "$0" watch "$d" "$2" </dev/null >/dev/null 2>&1 &
  fi
  echo "export SLURM_CONF=$d/slurm.conf"
}

case "${1:-}" in
  install) install ;;
  start) [ -d "${2:-}" ] || { echo "usage: $0 start DIR [OWNER_PID] (existing folder)" >&2; exit 2; }; start "$2" "${3:-}" ;;
  watch) while kill -0 "$3" 2>/dev/null && [ -e "$2/slurm.conf" ]; do sleep 1; done; stop "$2" ;;
  stop) [ -n "${2:-}" ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
  *) echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2 ;;
esac
