"""Remote storage: which paths are URIs, and the pyarrow filesystem that opens one.

A path is remote when it is a URI (``s3://bucket/path``, ``gs://``, ``hdfs://``, ``file://``):
any scheme pyarrow's filesystems open. Every part of the package that reads or writes such a
path — CheckpointHook's and LoggerHook's ``out_dir``, ``load_from`` and ``HFModel``'s ``path``,
``ParquetShards``' sources, the Ray launcher's ``storage_path`` — opens it here, so the options
(``backend_args``, ``filesystem=``: ``pyarrow.fs.S3FileSystem``'s arguments, for ``s3://``
only; without them pyarrow reads the usual environment, ``AWS_*``) and the one-line errors are
the same everywhere.
"""

from __future__ import annotations

from typing import Any

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.redact import redact_url


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URI (``scheme://...``) rather than a local path."""
    return "://" in str(path)


def open_filesystem(
    uri: str, backend_args: dict | None = None, *, key: str, options_key: str = "backend_args"
) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it, without a trailing ``/``) for the URI ``uri``.

    ``backend_args``: ``pyarrow.fs.S3FileSystem``'s arguments (``s3://`` only). The errors are
    one line, as :class:`ArgumentError` s keyed relative to the object being built (the registry
    or the hook dispatcher puts the config path in front): ``options_key`` when the options are
    refused, ``key`` when the URI cannot be opened."""
    import pyarrow.fs as pafs

    scheme, _, rest = uri.partition("://")
    if backend_args and scheme != "s3":
        raise ArgumentError(
            options_key,
            f"options are supported for s3:// only; {scheme}:// "
            f"takes its configuration from the environment",
        )
    try:
        if backend_args:
            return pafs.S3FileSystem(**backend_args), rest.rstrip("/")
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, path.rstrip("/")
    except TypeError as e:
        raise ArgumentError(
            options_key, f"pyarrow.fs.S3FileSystem rejected them: {str(e).splitlines()[0]}"
        ) from None
    except (ValueError, OSError) as e:
        raise ArgumentError(
            key, f"cannot open {redact_url(uri)}: {str(e).splitlines()[0][:200]}"
        ) from None
