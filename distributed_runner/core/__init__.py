"""The bottom layer: what every other part of the package stands on.

Owns errors users act on, registries and ``type=`` resolution, config files, the run's logger,
rank and collective helpers (``dist``), redaction of secrets, seeding, the interval rule of
periodic hooks, preemption signals, the Runner's typed surface for hooks (``runner_api``), the one
adapter to Ray's private modules (``ray_private``) and the map of moved module names (``moved``).
May import: nothing of the project but ``distributed_runner.version``. The registries name the
modules that register built-ins by string (loaded on first look-up, as MMEngine's ``locations``).
"""
