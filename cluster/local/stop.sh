#!/usr/bin/env bash
# Stop exactly one Ray cluster on this machine, completely: the one whose temp dir is
# RAY_TEMP_DIR (as given to start_head.sh; default Ray's /tmp/ray). Other clusters keep running
# (`ray stop` would stop every one of them).
#
# The cluster's processes are those that name its session folder (gcs_server, raylet, dashboard,
# monitors), every descendant of them (ray::DashboardAgent, ray::RuntimeEnvAgent, workers — their
# command lines no longer name the folder) and its Ray client proxy. They get SIGTERM, then SIGKILL
# after STOP_GRACE_S (default 10) seconds; it returns once they are gone.
set -euo pipefail
TEMP="${RAY_TEMP_DIR:-/tmp/ray}"
SESSION="$(readlink -f "$TEMP/session_latest" 2>/dev/null || true)"
if [ -z "$SESSION" ] || [ ! -d "$SESSION" ]; then
    echo "no Ray cluster has run in $TEMP: nothing to stop"
    exit 0
fi

members() {
    ps -eww -o pid=,ppid=,args= | awk -v s="$SESSION" -v me="$$" '
        $1 == me || $3 == "awk" || $3 == "ps" { next }
        { n++; pid[n] = $1; parent[n] = $2
          if (index($0 " ", s "/") > 0 || index($0 " ", s " ") > 0) keep[$1] = 1 }
        END {
            changed = 1
            while (changed) {
                changed = 0
                for (i = 1; i <= n; i++)
                    if (!(pid[i] in keep) && (parent[i] in keep)) { keep[pid[i]] = 1; changed = 1 }
            }
            for (p in keep) print p
        }'
}

gcs_port() {
    ps -eww -o args= | grep -- "gcs_server" | grep -F -- "$SESSION" | grep -o -- "--gcs_server_port=[0-9]*" \
        | head -1 | cut -d= -f2
}

# alive: exists and is not a zombie (a container's PID 1 may never reap the orphans it inherits)
alive() { local st; st="$(ps -o stat= -p "$1" 2>/dev/null)" && [ -n "$st" ] && [ "${st:0:1}" != Z ]; }

PORT="$(gcs_port || true)"
PIDS="$(members)"
if [ -n "$PORT" ]; then
    PIDS="$PIDS $(pgrep -f -- "ray.util.client.server --address=[^ ]*:$PORT( |$)" || true)"
fi
PIDS="$(echo $PIDS)"
if [ -z "$PIDS" ]; then
    echo "Ray cluster of $SESSION is not running"
    rm -f "$TEMP/ray_current_cluster"
    exit 0
fi
COUNT=$(echo "$PIDS" | wc -w)

# wait_gone SECS PAUSE PID...: wait until none of the PIDs is alive, or SECS have passed; prints
# those still alive
wait_gone() {
    local end=$((SECONDS + $1)) pause=$2 left
    shift 2
    while :; do
        left=""
        for p in "$@"; do alive "$p" && left="$left $p"; done
        if [ -z "$left" ] || [ $SECONDS -ge $end ]; then break; fi
        sleep "$pause"
    done
    echo "$left"
}

kill -TERM $PIDS 2>/dev/null || true
LEFT="$(wait_gone "${STOP_GRACE_S:-10}" 0.5 $PIDS)"
if [ -n "$LEFT" ]; then
    kill -KILL $LEFT 2>/dev/null || true
    echo "SIGKILLed what did not stop within ${STOP_GRACE_S:-10} s:$LEFT"
    # a SIGKILL is delivered when the process next runs: wait until they are gone, so that the
    # cluster is stopped when this script returns (a busy machine left a gcs_server listed)
    STILL="$(wait_gone 10 0.2 $LEFT)"
    if [ -n "$STILL" ]; then echo "still running after SIGKILL:$STILL" >&2; exit 1; fi
fi
rm -f "$TEMP/ray_current_cluster"
echo "stopped the Ray cluster of $SESSION ($COUNT processes)"
