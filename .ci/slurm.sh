#!/usr/bin/env bash
# `make test-slurm`: a one-node SLURM cluster from Debian's packages (munge, slurmctld,
# slurmd), the tests of tests/slurm/ on it, and everything it started stopped again.
#
# Needs root and apt-get (or slurmctld, slurmd and munged already installed); anywhere
# else it prints one line and exits 0. Its configuration, state and logs live in a
# temporary directory (SLURM_CONF points there): /etc/slurm is not touched.
#
#   .ci/slurm.sh [PYTHON] [pytest arguments...]     default: .venv/bin/python, tests/slurm
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
shift || true

skip() { echo "test-slurm: skipped: $*"; exit 0; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v munged >/dev/null || ! command -v sinfo >/dev/null; then
    [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null \
        || skip "SLURM is not installed and installing it needs root and apt-get"
    echo "test-slurm: installing slurmctld, slurmd, slurm-client and munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge \
            >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q \
                --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null 2>&1; } \
        || skip "apt-get could not install slurmctld, slurmd and munge"
fi
[ "$(id -u)" = 0 ] || skip "starting slurmd needs root"
"$PY" -c "import dask_jobqueue" 2>/dev/null \
    || "$PY" -m pip install -q "dask-jobqueue>=0.8.5" >/dev/null 2>&1 \
    || skip "dask-jobqueue is not installed (pip install -e '.[jobqueue]')"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/dask-scd-slurm.XXXXXX")
chmod 755 "$WORK"
STARTED=()   # pid files of the daemons this script started

stop() {
    local status=$?
    # Jobs first (their workers), then the daemons, newest first, by their pid files.
    if [ -n "${SLURM_CONF:-}" ] && [ -e "$SLURM_CONF" ]; then
        scancel --full --quiet --partition=debug 2>/dev/null || true
    fi
    for (( i=${#STARTED[@]}-1; i>=0; i-- )); do
        pidfile=${STARTED[$i]}
        [ -s "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    done
    if [ "$status" != 0 ]; then
        for log in "$WORK"/slurmctld.log "$WORK"/slurmd.log; do
            [ -e "$log" ] && { echo "--- tail of $log"; tail -n 20 "$log"; }
        done
    fi
    rm -rf "$WORK"
    exit "$status"
}
trap stop EXIT INT TERM

# munge: the key Debian's package generated (or a fresh one), its own socket and pid file.
MUNGE_KEY=/etc/munge/munge.key
if [ ! -s "$MUNGE_KEY" ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    chown munge:munge "$MUNGE_KEY" 2>/dev/null || true
    chmod 400 "$MUNGE_KEY"
fi
mkdir -p "$WORK/munge"
chown munge:munge "$WORK/munge" 2>/dev/null || true
chmod 700 "$WORK/munge"
MUNGE_SOCKET="$WORK/munge/munge.socket"
runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file="$WORK/munge/munged.pid" \
    --log-file="$WORK/munge/munged.log" --seed-file="$WORK/munge/munged.seed" \
    --key-file="$MUNGE_KEY" 2>/dev/null \
    || { chown root:root "$WORK/munge" && munged --force --socket="$MUNGE_SOCKET" \
        --pid-file="$WORK/munge/munged.pid" --log-file="$WORK/munge/munged.log" \
        --seed-file="$WORK/munge/munged.seed" --key-file="$MUNGE_KEY" 2>/dev/null; }
STARTED+=("$WORK/munge/munged.pid")

# slurm.conf: this node (slurmd -C) declared with at most 4 GiB (DASK_SCD_SLURM_NODE_MB,
# in MB as slurm counts them): the example and the tests, two 1-core 2 GiB jobs, must
# fit the small nodes users meet; one partition "debug".
HOST=$(hostname -s)
NODE_MB=${DASK_SCD_SLURM_NODE_MB:-4096}
NODE=$(slurmd -C | head -n 1 | awk -v cap="$NODE_MB" '{
    for (i = 1; i <= NF; i++) if ($i ~ /^RealMemory=/) {
        split($i, kv, "="); if (kv[2] + 0 > cap + 0) $i = "RealMemory=" cap
    }
    print }')
mkdir -p "$WORK/state" "$WORK/spool"
export SLURM_CONF="$WORK/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=dasktest
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
SlurmctldPort=${SLURM_TEST_PORT:-6817}
SlurmdPort=$(( ${SLURM_TEST_PORT:-6817} + 1 ))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=512
ReturnToService=2
MpiDefault=none
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
$NODE State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=01:00:00 State=UP
EOF

slurmctld -i
STARTED+=("$WORK/slurmctld.pid")
slurmd
STARTED+=("$WORK/slurmd.pid")

echo -n "test-slurm: waiting for the node to be idle"
for _ in $(seq 60); do
    state=$(sinfo -h -p debug -o %t 2>/dev/null || true)
    [ "$state" = idle ] && break
    echo -n "."
    sleep 1
done
echo " ($state)"
[ "$state" = idle ] || { echo "test-slurm: the node did not come up"; sinfo || true; exit 1; }
sinfo

# The jobs' working directory and logs: this worktree's tmp, on the same machine as the node.
export DASK_SCD_SLURM_DIR="$WORK/shared"
mkdir -p "$DASK_SCD_SLURM_DIR"
# The jobs inherit this environment (sbatch --export=ALL): their workers import this
# checkout's dask_scd, whichever checkout the venv was installed from.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -m pytest -q -ra -p no:cacheprovider tests/slurm "$@"
