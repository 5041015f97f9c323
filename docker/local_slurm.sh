#!/usr/bin/env bash
# A one-node Slurm on this machine (munged + slurmctld + slurmd, the node is localhost), to try an experiment plan
# or docker/launch_slurm.sh before submitting to a cluster; the tests marked `slurm` run against it.
#   sudo apt-get install -y --no-install-recommends slurm-wlm munge   # Debian / Ubuntu (or: make local-slurm)
#   sudo docker/local_slurm.sh start    # writes /etc/slurm/slurm.conf, starts the daemons, waits for the node
#   docker/local_slurm.sh status        # sinfo and squeue
#   sudo docker/local_slurm.sh stop     # cancels every job, stops the daemons it started, removes its slurm.conf
# Needs root (the daemons run as root; no systemd or cgroups needed: proctrack/linuxproc, task/none, so it runs in
# a container). The node has this machine's CPUs and memory (`slurmd -C`) in one partition, `local`; jobs are
# scheduled within a second or two, may be requeued (JobRequeue=1), and leave squeue 10 s after they end
# (MinJobAge). Finished jobs are listed in $KPCA_LOCAL_SLURM_DIR/jobcomp.txt (no accounting database, so no
# sacct). Jobs whose dependency can never be satisfied are cancelled (SchedulerParameters=kill_invalid_depend),
# so a report waiting with `afterany` on the test of a failed fit still runs.
# State, logs and pid files: $KPCA_LOCAL_SLURM_DIR (default /tmp/kpca-local-slurm), emptied at each start.
set -euo pipefail

STATE="${KPCA_LOCAL_SLURM_DIR:-/tmp/kpca-local-slurm}"
CONF=/etc/slurm/slurm.conf
MARK="# Written by kpca docker/local_slurm.sh"
PARTITION=local
WAIT_S="${KPCA_LOCAL_SLURM_WAIT_S:-60}"
usage="usage: $0 start|stop|status (state in \$KPCA_LOCAL_SLURM_DIR, now $STATE)"

die() {
    echo "local_slurm: $*" >&2
    exit 1
}

say() {
    echo "local_slurm: $*"
}

need_root() {
    [[ "$(id -u)" == 0 ]] || die "$1 needs root (the Slurm daemons run as root): sudo $0 $1"
}

need_binaries() {
    local missing=()
    for binary in munged slurmctld slurmd sinfo squeue sbatch scontrol scancel srun; do
        command -v "$binary" >/dev/null 2>&1 || [[ -x "/usr/sbin/$binary" ]] || missing+=("$binary")
    done
    if ((${#missing[@]})); then
        die "not installed: ${missing[*]}; install Debian's packages: apt-get install -y --no-install-recommends slurm-wlm munge (or: make local-slurm)"
    fi
}

daemon() {  # the path of an sbin daemon (root's PATH has /usr/sbin, a user's may not)
    command -v "$1" 2>/dev/null || echo "/usr/sbin/$1"
}

alive() {  # alive <pid file>: the process it names runs
    [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

ours() {  # /etc/slurm/slurm.conf is this script's
    [[ -f "$CONF" ]] && [[ "$(head -n 1 "$CONF")" == "$MARK"* ]]
}

log_tail() {  # log_tail <file>: its last lines, for an error message
    if [[ -s "$1" ]]; then
        echo "--- last lines of $1:"
        tail -n 20 "$1"
    else
        echo "--- $1 is empty or missing"
    fi
}

node_state() {
    sinfo --noheader --partition="$PARTITION" --format=%T 2>/dev/null | head -n 1 || true
}

write_conf() {
    local host node_line
    host="$(hostname -s)"
    # slurmd -C: this machine as slurmd sees it (CPUs, sockets, cores, threads, memory); a node configured with more
    # than that would be drained. The first line is the node's; its NodeName is the host name.
    node_line="$("$(daemon slurmd)" -C | head -n 1)"
    [[ "$node_line" == NodeName=* ]] || die "slurmd -C did not describe this machine: $node_line"
    node_line="${node_line#NodeName=* }"
    mkdir -p /etc/slurm
    cat >"$CONF" <<EOF
$MARK on $(date -u +%Y-%m-%dT%H:%M:%SZ): a one-node Slurm on localhost; \`$0 stop\` removes it.
ClusterName=kpca-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=kill_invalid_depend,sched_min_interval=100000,bf_interval=1,defer_batch
JobRequeue=1
ReturnToService=2
MinJobAge=10
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$host NodeAddr=127.0.0.1 $node_line State=UNKNOWN
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

start_munge() {
    if [[ -S /run/munge/munge.socket.2 ]] && munge -n </dev/null >/dev/null 2>&1; then
        say "munged already runs"
        return
    fi
    local user=root
    id munge >/dev/null 2>&1 && user=munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        say "creating /etc/munge/munge.key"
        mkdir -p /etc/munge
        "$(daemon mungekey)" --create --keyfile=/etc/munge/munge.key
    fi
    mkdir -p /run/munge /var/lib/munge /var/log/munge
    chown "$user:" /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge
    chmod 0600 /etc/munge/munge.key
    chmod 0755 /run/munge
    if [[ "$user" == munge ]]; then
        runuser -u munge -- "$(daemon munged)" --pid-file="/run/munge/munged.pid"
    else
        "$(daemon munged)" --force --pid-file="/run/munge/munged.pid"
    fi
    cp /run/munge/munged.pid "$STATE/munged.pid"
    munge -n </dev/null | unmunge >/dev/null || die "munged started but a credential does not decode"
}

start() {
    need_root start
    need_binaries
    if ours && alive "$STATE/slurmctld.pid" && alive "$STATE/slurmd.pid"; then
        say "already running (state in $STATE)"
        sinfo
        return
    fi
    if [[ -f "$CONF" ]] && ! ours; then
        die "$CONF exists and was not written by this script: this machine has a Slurm of its own; use it, or move that file away"
    fi
    stop_daemons quiet
    rm -rf "$STATE"
    mkdir -p "$STATE/slurmctld" "$STATE/slurmd"
    start_munge
    write_conf
    "$(daemon slurmctld)" -c || die "slurmctld did not start; $(log_tail "$STATE/slurmctld.log")"
    "$(daemon slurmd)" || die "slurmd did not start; $(log_tail "$STATE/slurmd.log")"
    local waited=0 state=""
    while ((waited < WAIT_S * 2)); do
        state="$(node_state)"
        [[ "$state" == idle ]] && break
        if ! alive "$STATE/slurmctld.pid"; then
            die "slurmctld exited; $(log_tail "$STATE/slurmctld.log")"
        fi
        if ! alive "$STATE/slurmd.pid"; then
            die "slurmd exited; $(log_tail "$STATE/slurmd.log")"
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    if [[ "$state" != idle ]]; then
        die "the node is not idle after ${WAIT_S} s (state: ${state:-none}); $(log_tail "$STATE/slurmctld.log") $(log_tail "$STATE/slurmd.log")"
    fi
    say "running: partition $PARTITION, node $(hostname -s) ($(sinfo --noheader --format='%c CPUs, %m MB')); state and logs in $STATE"
}

stop_pid() {  # stop_pid <pid file> <name>: SIGTERM, then SIGKILL after 10 s
    local file="$1" name="$2" pid
    alive "$file" || return 0
    pid="$(cat "$file")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    echo "local_slurm: $name ($pid) did not stop after SIGTERM: SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
}

stop_daemons() {
    local quiet="${1:-}"
    if alive "$STATE/slurmctld.pid"; then
        local jobs
        jobs="$(squeue --noheader --format=%A 2>/dev/null | sort -u | tr '\n' ' ' || true)"
        if [[ -n "${jobs// /}" ]]; then
            [[ -n "$quiet" ]] || say "cancelling jobs $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            for _ in $(seq 50); do
                [[ -z "$(squeue --noheader --states=RUNNING,COMPLETING --format=%A 2>/dev/null || true)" ]] && break
                sleep 0.2
            done
        fi
    fi
    stop_pid "$STATE/slurmd.pid" slurmd
    stop_pid "$STATE/slurmctld.pid" slurmctld
    stop_pid "$STATE/munged.pid" munged
}

stop() {
    need_root stop
    if [[ -f "$CONF" ]] && ! ours; then
        die "$CONF was not written by this script: not touching this machine's Slurm"
    fi
    stop_daemons
    if ours; then
        rm -f "$CONF"
    fi
    say "stopped (logs kept in $STATE)"
}

status() {
    if ! ours; then
        say "not running (no $CONF of this script)"
        return 3
    fi
    if ! alive "$STATE/slurmctld.pid" || ! alive "$STATE/slurmd.pid"; then
        say "configured but not running (slurmctld or slurmd is down; logs in $STATE): sudo $0 start"
        return 3
    fi
    sinfo
    squeue
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "$usage" ;;
esac
