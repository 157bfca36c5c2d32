"""Remote checkpoint copies: CheckpointHook's ``out_dir='s3://bucket/path'`` (or ``gs://``,
``hdfs://``: any URI pyarrow's filesystems open).

As MMEngine, checkpoints go to ``out_dir/<basename(work_dir)>``. A remote ``out_dir`` receives a
copy of each checkpoint once it has committed locally in ``work_dir`` (where resume reads it): the
file, its checksum and, for a sharded checkpoint, its shard folder. One background thread uploads
them in order, so training does not wait on the network; a checkpoint that replaces others
(``max_keep_ckpts``, a new best) deletes their remote copies too, after its own upload. At the end
of training the uploads are waited for; one that failed is logged as an error naming the file and
the reason (its local copy stays). ``backend_args`` are the filesystem's options — for ``s3://``
those of ``pyarrow.fs.S3FileSystem`` (``endpoint_override``, ``region``, ``access_key``,
``secret_key``, ``scheme`` ...); without them pyarrow reads the usual environment (``AWS_*``).
"""

from __future__ import annotations

import functools
import logging
import shutil
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.redact import redact_url
from distributed_runner.core.run_folders import FLAT, runs_root
from distributed_runner.core.storage import is_remote, open_filesystem

CHUNK = 8 << 20


def run_folder(out_dir: str, work_dir: Path, run_name: str = FLAT) -> str:
    """MMEngine's rule for an ``out_dir``: the run's files go to ``out_dir/<basename(work_dir)>``
    (a URI or a local path, as given) — with ``work_dir`` the config's, and the run's folder
    under it kept (``out_dir/digits_cnn/20261128_194653``) as MMEngine keeps its timestamped log
    folder, so that runs of one config never overwrite each other there either."""
    base = f"{str(out_dir).rstrip('/')}/{runs_root(work_dir, run_name).name}"
    return base if run_name == FLAT else f"{base}/{run_name}"


def check_storage_options(
    owner: str, out_dir: str | None, backend_args: dict | None, file_client_args: dict | None
) -> None:
    """A hook's ``backend_args`` and MMEngine's deprecated ``file_client_args``, checked when
    the hook is built (no I/O): one of them at most; ``file_client_args`` only with a local
    backend (a warning says it is deprecated); ``backend_args`` only with a remote ``out_dir``,
    whose filesystem must accept them."""
    if file_client_args is not None:
        if backend_args is not None:
            raise ArgumentError(
                "file_client_args", "set backend_args or file_client_args (deprecated), not both"
            )
        backend = (file_client_args or {}).get("backend", "disk")
        if backend not in ("disk", "local"):
            raise ArgumentError(
                "file_client_args",
                f"backend {backend!r} is not supported: use out_dir='s3://...' with backend_args",
            )
        warnings.warn(
            f"{owner}: file_client_args is deprecated (as in MMEngine): use backend_args",
            DeprecationWarning,
            stacklevel=3,
        )
    if out_dir and is_remote(out_dir):
        open_filesystem(out_dir, backend_args, key="out_dir")
    elif backend_args is not None:
        raise ArgumentError(
            "backend_args", "only a remote out_dir (s3://...) takes filesystem options"
        )


class RemoteCopies:
    """Uploads and deletions under one remote folder, in order, on one background thread."""

    def __init__(self, uri: str, backend_args: dict | None, logger: logging.Logger) -> None:
        self.uri = uri.rstrip("/")
        self.fs, self.root = open_filesystem(uri, backend_args, key="out_dir")
        self.logger = logger
        self.failed: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drun-out-dir")
        self._pending: list[Future] = []
        self._run(lambda: self.fs.create_dir(self.root, recursive=True), "create")

    def _run(self, task: Callable[[], None], what: str) -> None:
        def guarded() -> None:
            try:
                task()
            except Exception as e:  # noqa: BLE001 - reported once training is done
                message = f"{what} ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
                self.failed.append(message)
                self.logger.error("out_dir %s: %s failed", redact_url(self.uri), message)

        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(guarded))

    def upload(self, paths: list[Path]) -> None:
        """Copy files and folders (recursively) to the remote folder, under their names."""
        for path in paths:
            self._run(functools.partial(self._copy, path), f"upload of {path.name}")

    def _copy(self, source: Path) -> None:
        files = (
            sorted(f for f in source.rglob("*") if f.is_file())
            if source.is_dir()
            else [source]
            if source.is_file()
            else []
        )
        for file in files:
            self._put(file, file.relative_to(source.parent).as_posix())

    def put(self, file: Path, name: str) -> None:
        """Upload ``file`` as ``<remote folder>/<name>`` (in the background, in order)."""
        self._run(lambda: self._put(file, name), f"upload of {name}")

    def _put(self, file: Path, name: str) -> None:
        """Write ``file`` to ``<remote folder>/<name>``."""
        target = f"{self.root}/{name}"
        self.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
        with open(file, "rb") as src, self.fs.open_output_stream(target) as out:
            shutil.copyfileobj(src, out, CHUNK)

    def remove(self, names: list[str]) -> None:
        """Delete remote files or folders by name (missing ones are fine)."""
        import pyarrow.fs as pafs

        def delete(name: str) -> None:
            target = f"{self.root}/{name}"
            kind = self.fs.get_file_info(target).type
            if kind == pafs.FileType.Directory:
                self.fs.delete_dir(target)
            elif kind == pafs.FileType.File:
                self.fs.delete_file(target)

        for name in names:
            self._run(functools.partial(delete, name), f"removal of {name}")

    def wait(self) -> list[str]:
        """Block until everything submitted is done; the failures so far."""
        for future in self._pending:
            future.result()
        self._pending = []
        return list(self.failed)


def copy_run_files(
    work_dir: Path,
    run_name: str,
    out_dir: str,
    suffixes: tuple[str, ...],
    keep_local: bool,
    backend_args: dict | None,
    logger: logging.Logger,
) -> list[str]:
    """LoggerHook's ``out_dir``: the files under ``work_dir/logs`` and ``work_dir`` itself whose
    names end with one of ``suffixes``, copied to ``out_dir/<basename(work_dir)>/`` (local or
    remote), keeping their paths; with ``keep_local=False`` the local ones are deleted once
    every copy succeeded. Returns the relative paths copied."""
    work_dir = Path(work_dir)
    files = [
        f
        for f in sorted((work_dir / "logs").rglob("*")) + sorted(work_dir.glob("*"))
        if f.is_file() and f.name.endswith(suffixes)
    ]
    names = [f.relative_to(work_dir).as_posix() for f in files]
    target = run_folder(out_dir, work_dir, run_name)
    if is_remote(out_dir):
        remote = RemoteCopies(target, backend_args, logger)
        for file, name in zip(files, names, strict=True):
            remote.put(file, name)
        failed = remote.wait()
    else:
        failed = []
        for file, name in zip(files, names, strict=True):
            destination = Path(target).expanduser() / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, destination)
    if not keep_local and not failed:
        for file in files:
            file.unlink(missing_ok=True)
    return names
