#!/usr/bin/env bash
# Join this machine to a running head as a worker node.
#   cluster/local/join_node.sh HEAD_ADDRESS:PORT [NUM_CPUS] [NUM_GPUS]
# Use the same RAY_AUTH_MODE (and RAY_AUTH_TOKEN for token mode) as the head.
set -euo pipefail
HEAD="${1:?usage: join_node.sh HEAD_ADDRESS:PORT [NUM_CPUS] [NUM_GPUS]}"
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}"
export RAY_USAGE_STATS_ENABLED=0
ray start --address "$HEAD" --num-cpus "${2:-$(nproc)}" --num-gpus "${3:-0}" \
    --disable-usage-stats
