"""Per-step fault tolerance: a lost replica costs the step it was in, not a restart.

``fault_tolerance=dict(mode='replicas', replicas=2, min_replicas=1, heartbeat_timeout=1.0)``
runs the model as ``replicas`` replica groups (one process each, DDP's data parallelism) that
agree on every step through torchft's lighthouse instead of one process group:

* **The global batch is fixed**: ``train_dataloader.batch_size x replicas``. Replica slot ``s``
  reads DefaultSampler's share ``s`` of it, as rank ``s`` of a DDP run would.
* **Every step is a quorum** (:class:`~.replica.ReplicaGroup`): the replicas alive agree on who
  takes part; each trains its own share and, while slots are missing, their shares too, as extra
  micro-batches (:func:`~.shares.shares_for`), each loss weighted by its part of the global
  batch. The gradients are summed over the quorum, so the update is the mean over the whole
  global batch whoever is missing: every sample is trained once an epoch, and the weights equal
  a run without failures (bit for bit with 2 replicas; to float tolerance otherwise).
* **A failure mid-step** makes the step uncommitted on every survivor: its update is dropped and
  the same global batch is trained again with the quorum that is left, in the same process (no
  checkpoint is loaded). A replacement (the launcher starts one, :mod:`distributed_runner.launch.
  replicas`) asks to join; the quorum sends it a peer's whole training state (the checkpoint's
  parts: weights, optimizer, schedulers, counters, the data position, hooks' state such as EMA)
  and it trains its share again from the next step.
* The loop and hooks hear of it: ``after_replica_change(event)`` (a :class:`~.events.ReplicaEvent`:
  lost or joined, the slots, the iteration, the seconds it cost), a log line and
  ``train/replicas`` in the logged scalars.

What stays per replica: BatchNorm's running statistics (a replica that trains a missing share
updates them once more; said once at start) and the random streams of data augmentation.

May import: checkpoint, core (and torchft, an extra: imported where a replica starts).
"""
