#!/usr/bin/env bash
# Stop the Ray processes this machine runs (head or worker node).
set -euo pipefail
ray stop --force
