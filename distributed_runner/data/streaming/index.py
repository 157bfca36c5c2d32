"""The shards' index: every file's row groups (and, packed, their token counts), read from the
footers once per run and stored with the run, so that a rank opens only the files its own
streams read.

Without it every rank reads every footer as it starts: 100,000 files on 1,024 ranks is 10^8
requests to object storage before the first step. With it (a Ray run: the driver reads the
footers while it checks the config, and writes the index into the run's Ray storage,
``<storage_path>/<name>/data_index/<section>.arrow``), a rank reads one file, the index, and then
only the row groups of its own streams, as it trains: its requests at startup do not depend on
the number of files.

The index is an Arrow IPC file: one row a block (``file``, ``row_group``, ``rows`` and, for each
counted list column, ``tokens:<column>``); its metadata holds the file paths, the data's schema
and a version. A run started in one process reads the footers itself (it is its own driver).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.redact import redact_url
from distributed_runner.core.storage import is_remote, open_filesystem

VERSION = 1
TOKENS = "tokens:"  # prefix of the per-block token count columns


@dataclass(frozen=True)
class Block:
    """One row group of one file."""

    file: int
    row_group: int
    rows: int


@dataclass
class ShardIndex:
    """What the footers say: the files, their non-empty row groups, the schema, token counts."""

    files: list[str]  # as the filesystem names them
    shown: list[str]  # as the user knows them (URIs for remote files)
    blocks: list[Block]
    schema: Any  # pyarrow.Schema of the data
    tokens: dict[str, list[int]] = field(default_factory=dict)  # column -> per block

    def to_table(self) -> Any:
        """The index as an Arrow table (its metadata: files, schema, version)."""
        import pyarrow as pa

        columns: dict[str, Any] = {
            "file": pa.array([b.file for b in self.blocks], pa.int32()),
            "row_group": pa.array([b.row_group for b in self.blocks], pa.int32()),
            "rows": pa.array([b.rows for b in self.blocks], pa.int64()),
        }
        for column, counts in self.tokens.items():
            columns[TOKENS + column] = pa.array(counts, pa.int64())
        meta = {
            "version": str(VERSION),
            "files": json.dumps(self.files),
            "shown": json.dumps(self.shown),
            "schema": self.schema.serialize().to_pybytes().hex(),
        }
        return pa.table(columns).replace_schema_metadata(meta)

    @classmethod
    def from_table(cls, table: Any, where: str) -> ShardIndex:
        """The index a :meth:`to_table` table holds; one line naming ``where`` otherwise."""
        import pyarrow as pa

        meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
        if meta.get("version") != str(VERSION):
            raise ArgumentError(
                "index",
                f"{redact_url(where)} is not a shard index of version {VERSION} "
                f"(found {meta.get('version')!r}): remove the key to read the footers",
            )
        rows = zip(
            *(table.column(c).to_pylist() for c in ("file", "row_group", "rows")), strict=True
        )
        tokens = {
            name[len(TOKENS) :]: table.column(name).to_pylist()
            for name in table.column_names
            if name.startswith(TOKENS)
        }
        schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(meta["schema"])))
        return cls(
            json.loads(meta["files"]),
            json.loads(meta["shown"]),
            [Block(f, g, r) for f, g, r in rows],
            schema,
            tokens,
        )

    def write(self, uri: str) -> None:
        """Write the index to ``uri`` (a local path or a URI; its folders made)."""
        import pyarrow as pa

        fs, path = _filesystem(uri)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        table = self.to_table()
        with fs.open_output_stream(path) as out, pa.ipc.new_file(out, table.schema) as writer:
            writer.write_table(table)

    @classmethod
    def read(cls, uri: str) -> ShardIndex:
        """The index at ``uri``: one request (one line naming it when it cannot be read)."""
        import pyarrow as pa

        fs, path = _filesystem(uri)
        try:
            with fs.open_input_file(path) as f:
                table = pa.ipc.open_file(f).read_all()
        except (OSError, pa.ArrowInvalid) as e:
            raise ArgumentError(
                "index",
                f"cannot read the shard index {redact_url(uri)} "
                f"({str(e).splitlines()[0][:160]}): remove the key to read the footers",
            ) from None
        return cls.from_table(table, uri)


def _filesystem(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    if is_remote(uri):
        return open_filesystem(uri, key="index")
    return pafs.LocalFileSystem(), uri
