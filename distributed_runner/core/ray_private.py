"""The private parts of Ray this project uses, in one module, each with why (Ray is pinned to
2.60.0 in ``pyproject.toml``; an upgrade checks this file first).

- :class:`WorkerGroupCallback` (``ray.train.v2._internal``): the only way, in Train V2, to run
  code on the Train controller at each poll of the worker group; the hang watch reads every
  rank's heartbeat there and turns a hang into a group restart (:mod:`~..health.hang_watch`).
- :func:`gcs_addresses_on_this_machine` (``ray._private.services``): which Ray clusters have a
  node on this machine, so ``address='auto'`` can refuse to guess between two.
- :func:`connect_gcs` (``ray._raylet.GcsClient``): one connection attempt that fails at once on
  a token-auth cluster, instead of ``ray.init``'s twenty seconds of retries and a traceback.
- :func:`quiet_train_reports` (the loggers of ``ray.train.v2._internal.execution``'s
  ``context`` and ``storage``): Ray Train logs two INFO lines per report on every worker
  ("Reporting training result ...", "Checkpoint successfully created ..."), about 20 for a short
  run; drun shows its own line per checkpoint and hides these unless ``launcher.verbose``.
- :func:`keep_driver_sigint` (``DataParallelTrainer._register_sigint_handler``): Train V2's
  ``fit()`` replaces the driver's SIGINT handler with one that aborts the run (and never puts
  the old one back); ``drun`` makes Ctrl-C a pause instead (:mod:`~..launch.run_control`).
- :func:`no_dataset_actor_without_datasets` (``DataParallelTrainer._create_default_callbacks``,
  ``DatasetsCallback``): Train V2 starts a ``DatasetManager`` actor at every worker group start,
  Ray Datasets or not: a process that imports Ray Data (about 3.5 s of CPU here) and serves
  nothing in a run without them, again after every restart. drun leaves it out of those runs.
- :func:`kv_put`, :func:`kv_get`, :func:`kv_delete` (``ray.experimental.internal_kv``): the
  GCS's key-value store, which every process of a cluster reaches. The driver's Ctrl-C and where
  the workers paused travel through it between the driver and rank 0
  (:mod:`~..launch.run_control`); a named actor per run held them before: a process that imports
  Ray (about 1.5 s of CPU) for two strings.
- :func:`short_worker_errors` (``construct_user_exception_with_traceback`` as
  ``ray.train.v2._internal.execution.worker_group.thread_runner`` calls it): what the training
  function raises, Ray wraps with its traceback text, logged at ERROR on every worker ("Error in
  training function", forwarded to the driver's terminal) and repeated in the controller's
  failure report and the driver's ``WorkerGroupError`` ("[Rank 0,1 Error Snippet]"): a wall of
  tracebacks per failed run. drun's worker writes the stack to the run's log itself and hands Ray
  one line instead (:mod:`~..launch.ray_worker`).

Nothing else in the package imports a private Ray module (``tests/unit/test_layout.py``).
Importing this module imports Ray Train; only Ray-side code imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray.train.v2._internal.execution.callback import WorkerGroupCallback

__all__ = [
    "WorkerGroupCallback",
    "connect_gcs",
    "gcs_addresses_on_this_machine",
    "keep_driver_sigint",
    "kv_delete",
    "kv_get",
    "kv_put",
    "no_dataset_actor_without_datasets",
    "quiet_train_reports",
    "short_worker_errors",
]


def quiet_train_reports() -> None:
    """Ray Train's per-report INFO lines to WARNING on this worker (see the module docstring;
    ``context`` names its logger by file path, not by module)."""
    import logging

    from ray.train.v2._internal.execution import context, storage

    for name in (context.__file__, storage.__name__):
        logging.getLogger(name).setLevel(logging.WARNING)


def short_worker_errors(line_of: Callable[[BaseException], str | None]) -> bool:
    """In this Ray Train worker, an exception the training function raises reaches Ray as
    ``line_of(exception)``, when that is a string, instead of its traceback text, and is not
    logged (see the module docstring); other exceptions as Ray wraps them. False when this Ray
    has no such step (then Ray's tracebacks are shown, as before)."""
    try:
        from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
        from ray.train.v2._internal.execution.worker_group import thread_runner
    except ImportError:  # pragma: no cover - another Ray
        return False
    wrap = getattr(thread_runner, "construct_user_exception_with_traceback", None)
    if wrap is None:  # pragma: no cover
        return False
    original = getattr(wrap, "drun_original", wrap)

    def construct(e: BaseException, exclude_frames: int = 0) -> Any:
        line = line_of(e)
        if line is None:
            return original(e, exclude_frames=exclude_frames)
        return UserExceptionWithTraceback(e, traceback_str=line)

    construct.drun_original = original  # type: ignore[attr-defined]  # patched once, not nested
    thread_runner.construct_user_exception_with_traceback = construct
    return True


def keep_driver_sigint(trainer: object) -> bool:
    """Stop ``trainer.fit()`` from installing Ray's SIGINT handler (abort the run), so the one
    in place stays; False when this Ray has no such step (then Ctrl-C aborts, as Ray does)."""
    if not callable(getattr(trainer, "_register_sigint_handler", None)):
        return False
    trainer._register_sigint_handler = lambda controller: None  # type: ignore[attr-defined]
    return True


def no_dataset_actor_without_datasets(trainer: object) -> bool:
    """Without Ray Datasets, ``trainer.fit()`` starts no ``DatasetManager`` actor per worker
    group (see the module docstring); True when it was left out, False when the trainer has
    datasets or this Ray has no such step (then Ray starts it, as before)."""
    if getattr(trainer, "datasets", None):
        return False
    try:
        from ray.train.v2._internal.callbacks import DatasetsCallback
    except ImportError:  # pragma: no cover - another Ray
        return False
    create = getattr(trainer, "_create_default_callbacks", None)
    if not callable(create):  # pragma: no cover
        return False

    def without_datasets() -> list[Any]:
        return [cb for cb in create() if not isinstance(cb, DatasetsCallback)]

    trainer._create_default_callbacks = without_datasets  # type: ignore[attr-defined]
    return True


KV_NAMESPACE = "drun"  # the keys drun writes to the GCS's store, apart from Ray's own


def kv_put(key: str, value: str) -> None:
    """Write ``key`` in the cluster's key-value store (this process is connected to Ray)."""
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def kv_get(key: str) -> str | None:
    """``key``'s value in the cluster's key-value store, None when it was never written."""
    from ray.experimental.internal_kv import _internal_kv_get

    value = _internal_kv_get(key, namespace=KV_NAMESPACE)
    return None if value is None else value.decode()


def kv_delete(key: str) -> None:
    from ray.experimental.internal_kv import _internal_kv_del

    _internal_kv_del(key, namespace=KV_NAMESPACE)


def gcs_addresses_on_this_machine() -> list[str]:
    """GCS addresses of the Ray clusters with a node on this machine (empty if Ray cannot say)."""
    try:
        from ray._private.services import find_gcs_addresses
    except ImportError:  # pragma: no cover - a Ray without it: let ray.init decide
        return []
    # Ray 2.60 sets this attribute on the function (its cache of non-empty results)
    find_gcs_addresses.cache_clear()  # type: ignore[attr-defined]
    return sorted(find_gcs_addresses())


def connect_gcs(hostport: str) -> bool:
    """Open one GCS connection to ``hostport``: False when this Ray has no such client (then
    ``ray.init`` decides), True when it connected; Ray's ``AuthenticationError`` propagates."""
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # compiled, no stub
    except ImportError:  # pragma: no cover
        return False
    GcsClient(address=hostport)
    return True
