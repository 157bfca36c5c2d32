"""The training engine: the Runner, its loops, the step, the train state, the hooks' requests,
the MessageHub, and the Hook API with its dispatch.

The loop's pseudocode with its mount points is in :mod:`.loops`; the Hook base class, its
priorities and the declared extension points live here (``hooks`` re-exports them for users).
May import: every subsystem below it (validation, checkpoint, optim, evaluation, data, health,
model, tracking, compat) and core. Loads the built-in hooks of ``hooks`` by name only.
"""
