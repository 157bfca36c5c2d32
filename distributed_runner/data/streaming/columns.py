"""Rows as columns: Arrow tables to NumPy columns in the workers, columns to tensors in the
loader.

A numeric column becomes a 1-D array, a fixed-size list column a 2-D one (so a batch of token
rows is a ``(batch, length)`` tensor); strings, binaries and variable-length lists stay Python
objects (an object array, a list in the batch) for the pipeline or the model to handle.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def column_array(column: Any) -> np.ndarray:
    """One Arrow column as a NumPy array (2-D for a fixed-size list of numbers)."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if pa.types.is_fixed_size_list(kind) and array.null_count == 0:
        values = array.flatten()
        if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
            return values.to_numpy(zero_copy_only=False).reshape(len(array), kind.list_size)
    return array.to_numpy(zero_copy_only=False)


def table_columns(table: Any) -> dict[str, np.ndarray]:
    return {name: column_array(table.column(name)) for name in table.column_names}


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out


def stack(values: list) -> np.ndarray:
    """Values of one key over samples: stacked when they are numbers or arrays of one shape,
    else an object array."""
    first = values[0]
    try:
        if isinstance(first, torch.Tensor):
            return torch.stack(values).numpy()
        if isinstance(first, (np.ndarray, np.generic, int, float, bool)):
            stacked = np.stack([np.asarray(v) for v in values])
            if stacked.dtype != object:
                return stacked
    except (RuntimeError, ValueError, TypeError):
        pass
    return _objects(values)


def columnize(samples: list[dict]) -> dict[str, np.ndarray]:
    """Samples (dicts, as a pipeline returns them) as columns."""
    return {key: stack([s[key] for s in samples]) for key in samples[0]}


def to_batch(columns: dict[str, np.ndarray]) -> dict[str, Any]:
    """Columns as the batch the model gets: tensors, or lists for object columns."""
    batch: dict[str, Any] = {}
    for name, values in columns.items():
        if values.dtype == object or values.dtype.kind in "USV":
            batch[name] = values.tolist()
        else:
            batch[name] = torch.from_numpy(np.ascontiguousarray(values))
    return batch
