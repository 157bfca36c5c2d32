#!/usr/bin/env bash
# Start a Ray head node on this machine, dashboard (job submission) on 127.0.0.1 only.
#   cluster/local/start_head.sh [NUM_CPUS] [NUM_GPUS]
# Optional: RAY_PORT (6379), RAY_DASHBOARD_PORT (8265), RAY_TEMP_DIR (Ray's default /tmp/ray), and
# for a second cluster on one machine the agents' ports: RAY_AGENT_LISTEN_PORT,
# RAY_AGENT_GRPC_PORT, RAY_RUNTIME_ENV_AGENT_PORT, RAY_METRICS_EXPORT_PORT.
# Auth: Ray >= 2.59 turns on token auth for local clusters. RAY_AUTH_MODE must be the same for
# `ray start`, `ray job submit` and the drivers: this script uses RAY_AUTH_MODE from the
# environment, default "disabled" (a loopback-only test cluster); for a cluster other machines
# reach, export RAY_AUTH_MODE=token (and RAY_AUTH_TOKEN on every client).
set -euo pipefail
NUM_CPUS="${1:-$(nproc)}"
NUM_GPUS="${2:-0}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
# Ray Train's controller empties each worker's one-slot report queue when it polls (every 2 s by
# default), so every checkpoint report waited for it; drun's own local cluster polls every 0.2 s
export RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="${RAY_TRAIN_HEALTH_CHECK_INTERVAL_S:-0.2}"
ray start --head --node-ip-address 127.0.0.1 --port "${RAY_PORT:-6379}" \
    --num-cpus "$NUM_CPUS" --num-gpus "$NUM_GPUS" \
    --dashboard-host 127.0.0.1 --dashboard-port "${RAY_DASHBOARD_PORT:-8265}" \
    ${RAY_TEMP_DIR:+--temp-dir "$RAY_TEMP_DIR"} \
    ${RAY_AGENT_LISTEN_PORT:+--dashboard-agent-listen-port "$RAY_AGENT_LISTEN_PORT"} \
    ${RAY_AGENT_GRPC_PORT:+--dashboard-agent-grpc-port "$RAY_AGENT_GRPC_PORT"} \
    ${RAY_RUNTIME_ENV_AGENT_PORT:+--runtime-env-agent-port "$RAY_RUNTIME_ENV_AGENT_PORT"} \
    ${RAY_METRICS_EXPORT_PORT:+--metrics-export-port "$RAY_METRICS_EXPORT_PORT"} \
    --disable-usage-stats
echo "head: 127.0.0.1:${RAY_PORT:-6379}, jobs: http://127.0.0.1:${RAY_DASHBOARD_PORT:-8265}, RAY_AUTH_MODE=$RAY_AUTH_MODE"
