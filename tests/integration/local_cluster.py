"""The environment for a head started by ``cluster/local/start_head.sh`` beside the session's
in-process Ray: its own temp dir and free ports for every service, no inherited RAY_ADDRESS."""
from __future__ import annotations

import os
from pathlib import Path

from tests.toy import free_ports

PORT_VARIABLES = ("RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_AGENT_LISTEN_PORT", "RAY_AGENT_GRPC_PORT",
                  "RAY_RUNTIME_ENV_AGENT_PORT", "RAY_METRICS_EXPORT_PORT")


def head_env(temp: Path, **settings: str) -> dict[str, str]:
    """``os.environ`` with ``RAY_TEMP_DIR=temp`` (short: Ray's socket paths have a limit), a free
    port for each of :data:`PORT_VARIABLES`, a 5 s stop grace, no usage stats, and ``settings``."""
    # distinct (Ray refuses a port given twice), and from a range no other process's port 0
    # lands in while this head starts
    ports = free_ports(len(PORT_VARIABLES), quiet=True)
    env = dict(os.environ, RAY_TEMP_DIR=str(temp), STOP_GRACE_S="5", RAY_USAGE_STATS_ENABLED="0",
               **{name: str(port) for name, port in zip(PORT_VARIABLES, ports, strict=True)})
    env.pop("RAY_ADDRESS", None)
    env.update(settings)
    return env
