"""The Ray driver's view of where it runs: which cluster to join, where relative paths may live,
and which of the driver's environment the workers need.

Three things a driver cannot leave to Ray's defaults without surprising a user:

* **Which cluster.** ``address='auto'`` makes Ray pick the cluster named in
  ``/tmp/ray/ray_current_cluster``; a head started with ``--temp-dir`` writes its address only
  there, so with two clusters on one machine Ray joins one of them silently. We list the running
  clusters (their GCS servers) and refuse when 'auto' could mean more than one.
* **Where a relative path goes.** ``ray job submit --working-dir`` runs the entrypoint inside
  ``.../runtime_resources/working_dir_files/_ray_pkg_<hash>``, a folder Ray deletes; a relative
  ``work_dir`` or ``storage_path`` there would lose every checkpoint. Inside such a folder they
  resolve under ``$DRUN_WORK_ROOT`` (default ``~/drun``) and the driver says so.
* **What answers.** An explicit address nobody listens at is a one-line error within seconds
  (``ray.init`` would wait minutes), and so is a ``storage_path`` that cannot be written.
* **What the workers must see.** On a running cluster the workers were started by ``ray start``,
  not by this driver: an ``MLFLOW_TRACKING_URI`` exported in the driver's shell never reaches them.
  The driver hands its ``MLFLOW_*`` and ``WANDB_*`` variables (the tracking sinks' settings and
  credentials), and its ``AWS_*`` ones when a StreamingLoader reads from a URI, to every training
  worker through Ray's object store
  (an object reference in the trainer's config), not through the job's ``runtime_env``: Ray shows
  a job's runtime_env to anyone who can open its dashboard, and these may hold a token or a
  password.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.redact import redact_text
from distributed_runner.core.storage import is_remote, open_filesystem

WORK_ROOT_ENV = "DRUN_WORK_ROOT"
FORWARDED_PREFIXES = ("MLFLOW_", "WANDB_")
STORAGE_PREFIXES = ("AWS_",)  # forwarded too when the training data is read from a URI


def running_clusters() -> list[str]:
    """GCS addresses of the Ray clusters with a node on this machine (empty if unknown)."""
    from distributed_runner.core.ray_private import gcs_addresses_on_this_machine

    return gcs_addresses_on_this_machine()


def resolve_address(
    address: str | None, environ: Mapping[str, str] = os.environ, clusters: list[str] | None = None
) -> str | None:
    """The address to join, or None to start a local Ray in this process.

    ``address`` (the launcher's) wins over ``RAY_ADDRESS``. 'auto' means: ``RAY_ADDRESS`` if it
    names a cluster (``ray job submit`` sets it for the entrypoint), else the one cluster running
    on this machine; none or several is a one-line error naming them.
    """
    env_address = environ.get("RAY_ADDRESS") or None
    address = address or env_address
    if address != "auto":
        return address
    if env_address and env_address != "auto":
        return env_address
    found = running_clusters() if clusters is None else clusters
    if not found:
        raise ConfigError(
            "launcher.address",
            "'auto' found no running Ray cluster on this "
            "machine: start one (cluster/local/start_head.sh) "
            "or pass --address HOST:PORT",
        )
    if len(found) > 1:
        raise ConfigError(
            "launcher.address",
            f"'auto' is ambiguous: {len(found)} Ray clusters "
            f"run on this machine ({', '.join(found)}); pass "
            f"one of them with --address",
        )
    return found[0]


# Ray Train's controller polls a local cluster's workers this often (start_local_ray)
LOCAL_POLL_INTERVAL_S = 0.2
# how long a GCS address may take to answer as Ray's (a real one: well under a second)
GCS_TIMEOUT_S = 15.0


def start_local_ray() -> None:
    """``ray.init`` of a new local Ray whose own processes know its address.

    Ray's processes find "their" cluster through ``RAY_ADDRESS``, else by looking for GCS servers
    on the machine; Ray Train's placement-group cleaner and autoscaling client do so. With another
    cluster running they find two and die with tracebacks (``Found multiple active Ray
    instances``, then ``GetTimeoutError``) in the middle of the run's output. So the GCS port is
    chosen here and ``RAY_ADDRESS`` naming it is in the environment the cluster's processes are
    started with; this process's environment is restored afterwards.

    The same environment turns off Ray Train's preemption watcher in this cluster: it watches
    nodes an autoscaler drains, which a local cluster has none of, and its actor's creation logs
    an error-level line (``core_worker.cc ... PreemptionWatcher ... max_restarts > 0``) at every
    run's start. And it makes Ray Train's controller poll the workers every
    :data:`LOCAL_POLL_INTERVAL_S` instead of every 2 s, unless ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``
    is set: a worker's ``ray.train.report`` puts its result in a queue of one that only the
    controller's poll empties, so every report after the first waited up to a whole interval —
    measured on the README's Ray command, the reports came exactly 2.0 s apart and took 12.7 s of
    its 25.6 s of training (:mod:`hooks.ray_report_hook` reports every checkpoint).
    """
    import ray

    extra = {
        "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": os.environ.get(
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(LOCAL_POLL_INTERVAL_S)
        ),
    }
    with own_address_environment(**extra):
        # the dashboard serves the State API that Ray Train's placement-group cleaner polls;
        # without it the cleaner warns every second for the whole run
        ray.init(address="local", include_dashboard=True, dashboard_host="127.0.0.1")


@contextlib.contextmanager
def own_address_environment(**extra: str) -> Iterator[None]:
    """While a new local Ray starts (``ray.init(address="local")`` inside): a free GCS port and
    ``RAY_ADDRESS`` naming it, plus ``extra``, in the environment its processes inherit (see
    :func:`start_local_ray`); this process's environment is restored afterwards."""
    import socket

    import ray

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    forced = {
        "RAY_GCS_SERVER_PORT": str(port),
        "RAY_ADDRESS": f"{ray.util.get_node_ip_address()}:{port}",
        **extra,
    }
    saved = {k: os.environ.get(k) for k in forced}
    os.environ.update(forced)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def probe_address(address: str, timeout: float = 3.0, gcs_timeout: float = GCS_TIMEOUT_S) -> None:
    """One-line error within ``timeout`` seconds when nothing listens at ``address`` (a GCS
    ``host:port`` or a ``ray://host:port`` client address): ``ray.init`` would wait minutes."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(
            "launcher.address",
            redact_text(f"{address!r} is not HOST:PORT, ray://HOST:PORT or 'auto'"),
        )
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ConfigError(
            "launcher.address",
            redact_text(
                f"nothing answers at {address} ({reason}): is the head running (ray status "
                f"--address {hostport})? check host and port"
            ),
        ) from None
    if "://" not in address:  # a GCS address: is this shell's token the cluster's?
        check_authentication(hostport, gcs_timeout)


def check_authentication(hostport: str, timeout: float = GCS_TIMEOUT_S) -> None:
    """One-line error when the cluster at ``hostport`` refuses this process's authentication
    (Ray >= 2.59 turns token auth on for local clusters): ``ray.init`` would retry for ~20 s,
    printing a warning a second, then end in a traceback that does not say what to set. And
    one when nothing there answers as Ray's GCS within ``timeout`` seconds (another service on
    that port): Ray's client would wait 40 s, then ``ray.init`` longer."""
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:  # pragma: no cover - a Ray without it: let ray.init decide
        return
    from distributed_runner.core.ray_private import connect_gcs

    outcome: dict = {}  # the client's exception, if it raised one

    def connect() -> None:
        try:
            connect_gcs(hostport)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            outcome["error"] = e

    worker = threading.Thread(target=connect, name="drun-gcs-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():  # the client keeps trying in its daemon thread; we stop waiting
        raise ConfigError(
            "launcher.address",
            f"{hostport} accepts connections but does not answer as a Ray cluster's GCS "
            f"within {timeout:g} s: check the port (the head's, 6379 unless ray start "
            f"--port said otherwise)",
        )
    try:
        if "error" in outcome:
            raise outcome["error"]
    except AuthenticationError:
        mode = os.environ.get("RAY_AUTH_MODE", "unset")
        raise ConfigError(
            "launcher.address",
            f"the Ray cluster at {hostport} refused this shell's authentication "
            f"(RAY_AUTH_MODE={mode}): set RAY_AUTH_MODE and the token (RAY_AUTH_TOKEN, "
            f"RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) as on its head, or start the head "
            f"with RAY_AUTH_MODE=disabled",
        ) from None
    except Exception:  # noqa: BLE001 - anything else: ray.init reports it as it would
        return


def check_storage(path: str) -> None:
    """One-line error, before any worker starts, when ``storage_path`` cannot be written (Ray
    would fail after its workers started, with a traceback)."""
    probe_name = ".drun_write_probe"
    hint = "pass a writable --storage-path (shared storage or s3://BUCKET/PATH on several nodes)"
    try:
        if is_remote(path):
            fs, root = open_filesystem(path, key="launcher.storage_path")
            fs.create_dir(root, recursive=True)
            with fs.open_output_stream(f"{root}/{probe_name}") as f:
                f.write(b"ok")
            fs.delete_file(f"{root}/{probe_name}")
        else:
            folder = Path(path)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / probe_name).write_bytes(b"ok")
            (folder / probe_name).unlink()
    except ConfigError as e:  # pyarrow could not open the URI at all
        raise ConfigError("launcher.storage_path", f"{e.message}; {hint}") from None
    except (OSError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
        raise ConfigError(
            "launcher.storage_path", f"cannot write to {path} ({reason}): {hint}"
        ) from None


def in_job_package(cwd: Path | None = None) -> bool:
    """Whether this process runs inside a ``ray job submit --working-dir`` package folder."""
    parts = (cwd or Path.cwd()).resolve().parts
    return "working_dir_files" in parts and any(p.startswith("_ray_pkg_") for p in parts)


def persistent_path(
    path: str, key: str, environ: Mapping[str, str] = os.environ, cwd: Path | None = None
) -> tuple[str, str | None]:
    """``path`` made absolute, and a note for the user when it was moved out of a job's package
    folder (see the module docstring). URIs (``s3://``) are returned as they are."""
    if is_remote(path):
        return path, None
    p = Path(path).expanduser()
    if p.is_absolute() or not in_job_package(cwd):
        return str(((cwd or Path.cwd()) / p).resolve()), None
    root = Path(environ.get(WORK_ROOT_ENV) or Path.home() / "drun").expanduser()
    moved = str((root / p).resolve())
    return moved, (
        f"{key} {path!r} is relative and this Ray job runs in Ray's temporary "
        f"package folder (deleted after the job): using {moved} (set "
        f"{WORK_ROOT_ENV} or pass an absolute path)"
    )


def announced_path(path: str, key: str) -> str:
    """:func:`persistent_path`, telling the user on stderr when the path was moved."""
    resolved, note = persistent_path(path, key)
    if note:
        print(f"drun: {note}", file=sys.stderr, flush=True)
    return resolved


def forwarded_env(
    environ: Mapping[str, str] = os.environ, reads_object_storage: bool = False
) -> dict[str, str]:
    """The driver's ``MLFLOW_*`` and ``WANDB_*`` variables, which every training worker gets
    (see the module docstring), and its ``AWS_*`` ones when the workers read their training data
    from a URI (``AWS_ENDPOINT_URL`` and the keys of an S3-compatible store the user exported)."""
    prefixes = FORWARDED_PREFIXES + (STORAGE_PREFIXES if reads_object_storage else ())
    return {k: v for k, v in environ.items() if k.startswith(prefixes)}
