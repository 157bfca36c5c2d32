#!/usr/bin/env bash
# Stop Ray on this machine. With RAY_TEMP_DIR set (as given to start_head.sh), stop only the
# cluster that lives there; otherwise every Ray process of this machine (ray stop --force).
set -euo pipefail
if [ -n "${RAY_TEMP_DIR:-}" ]; then
    pkill -TERM -f -- "$RAY_TEMP_DIR" || true
    sleep 2
    pkill -KILL -f -- "$RAY_TEMP_DIR" || true
else
    ray stop --force
fi
