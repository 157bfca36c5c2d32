"""Parquet shards as a list of blocks: where the files are, what each row group holds, and how
one is read again after a storage hiccup.

A *block* is one Parquet row group: the smallest unit a reader can fetch without reading rows
around it. Only the files' footers are read here (row counts, schema), so opening a 10 TB data
set costs one small request per file, whatever its size; rows are read later, by the loader,
block by block.

Sources (``paths``): a local folder (its ``*.parquet`` files, recursively), a glob, a file, a
list of these, or a URI that ``pyarrow.fs`` opens (``s3://``, ``gs://``, ``hdfs://``); S3 takes
its options from the standard AWS variables (``AWS_ENDPOINT_URL`` for an S3-compatible store,
``AWS_ACCESS_KEY_ID`` ...) or from ``filesystem=dict(...)`` (``pyarrow.fs.S3FileSystem``'s
arguments). Files are sorted by path: the block list, and so the sample order, does not depend on
the order a listing returns them in.
"""

from __future__ import annotations

import fnmatch
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from distributed_runner.core.errors import ArgumentError, DataReadError
from distributed_runner.core.redact import redact_url
from distributed_runner.core.registry import DATASETS
from distributed_runner.core.storage import is_remote, open_filesystem
from distributed_runner.data.streaming.index import Block, ShardIndex

READ_TRIES = 3  # a block read that fails is tried this many times before the run stops
RETRY_PAUSE_S = 1.0  # the pause before the second try; doubled before each next one


class ShardReadError(DataReadError):
    """A block that stayed unreadable after :data:`READ_TRIES` tries (one line: the file, the
    row group, the storage's reason)."""

    @classmethod
    def from_worker(cls, error: BaseException) -> ShardReadError:
        """The one line back from torch's re-raise in the main process, which prefixes it
        with the worker's traceback."""
        found = re.findall(rf"{cls.__name__}: (.+)", str(error))
        return cls(found[-1] if found else str(error).strip().splitlines()[-1])


def _open_filesystem(path: str, options: dict | None) -> tuple[Any, str]:
    """(pyarrow filesystem, path inside it) for a local path or a URI."""
    import pyarrow.fs as pafs

    if not is_remote(path):
        return pafs.LocalFileSystem(), str(Path(path).expanduser().resolve())
    return open_filesystem(path, options, key="paths", options_key="filesystem")


def _split_glob(item: str) -> tuple[str, str]:
    """``item`` as (the part before the first folder with a glob character, the rest): a URI's
    parser would refuse ``[`` or ``?``."""
    parts = item.split("/")
    for i, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:i]), "/".join(parts[i:])
    return item, ""


def _list_parquet(fs: Any, path: str, shown: str) -> list[str]:
    """The Parquet files ``path`` names: itself, a folder's ``*.parquet`` (recursively) or a
    glob's matches (``*`` and ``?`` in the last parts)."""
    import pyarrow.fs as pafs

    if any(ch in path for ch in "*?["):
        root = path
        while any(ch in root for ch in "*?["):
            root = root.rsplit("/", 1)[0]
        found = _list_parquet(fs, root, shown) if root else []
        return [f for f in found if fnmatch.fnmatchcase(f, path)]
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [path]
        if info.type != pafs.FileType.Directory:
            return []
        selector = pafs.FileSelector(path, recursive=True)
        return [
            i.path
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File and i.path.endswith(".parquet")
        ]
    except OSError as e:
        raise ArgumentError(
            "paths", f"cannot list {redact_url(shown)}: {str(e).splitlines()[0][:200]}"
        ) from None


def _shown(path: str, scheme: str | None) -> str:
    """A file as the user knows it: its URI for remote files, its path for local ones."""
    return f"{scheme}://{path}" if scheme else path


def stream_sources_absolute(loader: dict, key: str = "train_dataloader") -> bool:
    """On the Ray driver, before any worker starts: the StreamingLoader config ``loader`` (the
    config's ``key``: train, val or test) with its local ``paths`` made absolute (Ray Train runs
    the workers in another folder), in place. True when some source is a URI (the workers then
    get the driver's ``AWS_*`` variables)."""
    if not isinstance(loader, dict) or loader.get("type") != "StreamingLoader":
        return False
    dataset = loader.get("dataset")
    if not isinstance(dataset, dict) or "paths" not in dataset:
        return False
    given = dataset["paths"]
    items = [given] if isinstance(given, (str, Path)) else list(given)
    resolved = [str(p) if is_remote(p) else str(Path(p).expanduser().resolve()) for p in items]
    dataset["paths"] = resolved[0] if isinstance(given, (str, Path)) else resolved
    index = dataset.get("index")
    if isinstance(index, (str, Path)) and not is_remote(index):
        dataset["index"] = str(Path(index).expanduser().resolve())
    return any(is_remote(p) for p in resolved)


def driver_index(loader: dict, key: str = "train_dataloader") -> ShardIndex | None:
    """On the Ray driver: the StreamingLoader config's shards opened once (every footer read: a
    bad source is one line here, not on every worker) and their index, with the token counts a
    ``pack`` needs, for the workers (:mod:`.index`); None when the config names its own index
    or its dataset is not ParquetShards."""
    dataset = loader.get("dataset") if isinstance(loader, dict) else None
    if not isinstance(dataset, dict) or dataset.get("type") != "ParquetShards":
        return None
    # its pipeline is the loader's (loaders.streaming_arguments)
    shards = DATASETS.build({k: v for k, v in dataset.items() if k != "pipeline"}, f"{key}.dataset")
    if dataset.get("index") is not None:
        return None
    pack = loader.get("pack")
    column = pack.get("column") if isinstance(pack, dict) else None
    try:
        return shards.index((column,) if isinstance(column, str) else ())
    except ArgumentError:  # a pack column that is not a token list: the workers' line says it
        return shards.index()


@DATASETS.register_module()
class ParquetShards:
    """Parquet files read block by block (a row group a block), by :class:`StreamingLoader`.

    ``columns`` picks the columns (all by default); each must exist in every file. Opening reads
    the footers only, or with ``index`` (a :mod:`.index` file: a Ray run's driver writes one and
    names it here for its workers) not even those: one request, whatever the number of files.
    ``len()`` is the number of rows.
    """

    def __init__(
        self,
        paths: str | list[str],
        columns: list[str] | None = None,
        filesystem: dict | None = None,
        index: str | None = None,
    ) -> None:
        items = [paths] if isinstance(paths, (str, Path)) else list(paths or [])
        if not items:
            raise ArgumentError("paths", "empty: name a folder, a glob, files or a URI")
        self.filesystem_options = filesystem
        self.files: list[str] = []  # as given to the filesystem
        self.shown: list[str] = []  # as the user knows them (URIs for remote files)
        self._fs: Any = None
        self.columns = list(columns) if columns is not None else None
        self.blocks: list[Block] = []
        self.schema: Any = None
        self._tokens: dict[str, list[int]] = {}  # token_counts, per list column (an index's)
        if index is not None:
            self._from_index(str(index), str(items[0]))
            return
        for item in items:
            self._add_source(str(item))
        self._read_footers()

    def _from_index(self, uri: str, first_source: str) -> None:
        """Files, row groups and schema from the index at ``uri`` (no footer read); the
        filesystem is the first source's (all sources are on one)."""
        found = ShardIndex.read(uri)
        self._fs = _open_filesystem(_split_glob(first_source)[0], self.filesystem_options)[0]
        self.files, self.shown, self.blocks = found.files, found.shown, found.blocks
        self.schema, self._tokens = found.schema, found.tokens
        missing = [c for c in self.columns or [] if self.schema.get_field_index(c) < 0]
        if missing:
            raise ArgumentError(
                "columns",
                f"{missing[0]!r} is not a column of the data "
                f"(it has {', '.join(self.schema.names)})",
            )
        if self.columns is None:
            self.columns = list(self.schema.names)

    def index(self, token_columns: tuple[str, ...] = ()) -> ShardIndex:
        """What the footers said, as an index (with the token counts of ``token_columns``)."""
        tokens = {column: self.token_counts(column) for column in token_columns}
        return ShardIndex(self.files, self.shown, self.blocks, self.schema, tokens)

    def _add_source(self, item: str) -> None:
        root, pattern = _split_glob(item)
        fs, inner = _open_filesystem(root, self.filesystem_options)
        if pattern:
            inner = f"{inner.rstrip('/')}/{pattern}"
        if self._fs is not None and type(fs) is not type(self._fs):
            raise ArgumentError("paths", "all sources must be on one filesystem")
        self._fs = fs
        scheme = item.partition("://")[0] if is_remote(item) else None
        found = sorted(set(_list_parquet(fs, inner.rstrip("/"), item)))
        if not found:
            raise ArgumentError(
                "paths", f"no Parquet file in {redact_url(item)} (looked for *.parquet)"
            )
        known = set(self.files)  # a list of 100,000 files: no quadratic membership test
        for path in found:
            if path not in known:
                known.add(path)
                self.files.append(path)
                self.shown.append(_shown(path, scheme))

    def _read_footers(self) -> None:
        """Row groups and schema of every file (footers only, 16 at a time); one line naming a
        file that is truncated, not Parquet, or lacks a column."""
        with ThreadPoolExecutor(max_workers=16) as pool:
            footers = list(pool.map(self._footer, range(len(self.files))))
        self.schema = footers[0][1]
        for index, (row_groups, schema) in enumerate(footers):
            missing = [c for c in self.columns or [] if schema.get_field_index(c) < 0]
            if missing:
                raise ArgumentError(
                    "columns",
                    f"{missing[0]!r} is not a column of {redact_url(self.shown[index])} "
                    f"(it has {', '.join(schema.names)})",
                )
            for group, rows in enumerate(row_groups):
                if rows:
                    self.blocks.append(Block(index, group, rows))
        if self.columns is None:
            self.columns = list(self.schema.names)

    def _footer(self, index: int) -> tuple[list[int], Any]:
        import pyarrow.parquet as pq

        try:
            with self._fs.open_input_file(self.files[index]) as f:
                meta = pq.ParquetFile(f).metadata
                rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
                return rows, meta.schema.to_arrow_schema()
        except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a bad file
            raise ArgumentError(
                "paths",
                f"{redact_url(self.shown[index])} is not a readable Parquet file "
                f"({type(e).__name__}: {str(e).splitlines()[0][:160]}): replace or remove it",
            ) from None

    def __len__(self) -> int:
        return sum(b.rows for b in self.blocks)

    def token_counts(self, column: str) -> list[int]:
        """Per block, the number of values in the list column ``column`` (a document's tokens),
        from the footers' statistics (or the index's); a row group written without them is read
        (that column only). One line when ``column`` is not a list of integers."""
        import pyarrow as pa

        if column in self._tokens:
            return self._tokens[column]

        field = self.schema.field(column) if self.schema.get_field_index(column) >= 0 else None
        kind = field.type if field is not None else None
        if kind is None or not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
            raise ArgumentError(
                "pack.column",
                f"{column!r} must be a list column of token ids; the shards have "
                f"{', '.join(f'{f.name}: {f.type}' for f in self.schema)}",
            )
        with ThreadPoolExecutor(max_workers=16) as pool:
            per_file = list(
                pool.map(self._leaf_counts, range(len(self.files)), [column] * len(self.files))
            )
        counts = [self._count_block(b, per_file[b.file][b.row_group], column) for b in self.blocks]
        self._tokens[column] = counts
        return counts

    def _leaf_counts(self, index: int, column: str) -> list[int | None]:
        import pyarrow.parquet as pq

        with self._fs.open_input_file(self.files[index]) as f:
            meta = pq.ParquetFile(f).metadata
        leaf = next(
            i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == column
        )
        counts: list[int | None] = []
        for group in range(meta.num_row_groups):
            stats = meta.row_group(group).column(leaf).statistics
            counts.append(int(stats.num_values) if stats is not None else None)
        return counts

    def _count_block(self, block: Block, counted: int | None, column: str) -> int:
        if counted is not None:
            return counted
        import pyarrow.compute as pc

        table = self.read_block(block, columns=[column])
        return int(pc.sum(pc.list_value_length(table.column(column))).as_py() or 0)

    def fingerprint(self) -> dict:
        """What fixes the sample order besides (seed, epoch): the files and their row groups."""
        return {"files": len(self.files), "blocks": len(self.blocks), "rows": len(self)}

    def read_block(self, block: Block, columns: list[str] | None = None) -> Any:
        """The block's rows (the chosen columns) as a ``pyarrow.Table``; a failing read is
        retried (:data:`READ_TRIES` tries, pauses doubling from :data:`RETRY_PAUSE_S`), then
        one line naming the file."""
        import pyarrow.parquet as pq

        pause = RETRY_PAUSE_S
        for attempt in range(1, READ_TRIES + 1):
            try:
                with self._fs.open_input_file(self.files[block.file]) as f:
                    return pq.ParquetFile(f).read_row_group(
                        block.row_group, columns=columns or self.columns
                    )
            except Exception as e:  # noqa: BLE001 - storage and decoding errors alike
                if attempt == READ_TRIES:
                    raise ShardReadError(
                        f"{redact_url(self.shown[block.file])} row group {block.row_group} "
                        f"unreadable after {READ_TRIES} tries ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160]}): the run stops here; its last "
                        f"checkpoint is intact"
                    ) from None
                time.sleep(pause)
                pause *= 2
        raise AssertionError("unreachable")
