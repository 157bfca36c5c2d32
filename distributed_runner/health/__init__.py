"""Whether a run is alive: each rank's heartbeat, the in-process watchdog and the hang watch on
the Ray controller (``watchdog=dict(...)``).

May import: core.
"""
