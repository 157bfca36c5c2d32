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


def index_array(indices: np.ndarray) -> Any:
    """Row indices as an Arrow int64 array for ``take``, built on the NumPy buffer: ``pa.array``
    of a NumPy array imports pandas to ask whether it is a Series, 0.3 s of a first batch."""
    import pyarrow as pa

    values = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


def column_array(column: Any) -> np.ndarray:
    """One Arrow column as a NumPy array (2-D for a fixed-size list of numbers)."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = array.type
    if pa.types.is_fixed_size_list(kind) and array.null_count == 0:
        values = array.flatten()
        if pa.types.is_integer(values.type) or pa.types.is_floating(values.type):
            return _numbers(values).reshape(len(array), kind.list_size)
    if (pa.types.is_integer(kind) or pa.types.is_floating(kind)) and array.null_count == 0:
        return _numbers(array)
    return array.to_numpy(zero_copy_only=False)


def _numbers(array: Any) -> np.ndarray:
    """A null-free numeric Arrow array as a NumPy view of its buffer (read-only, as Arrow's own
    zero-copy ``to_numpy``, which imports pandas on its first call: 0.3 s of a first batch)."""
    dtype = np.dtype(_NUMPY_NAMES[str(array.type)])
    data = array.buffers()[1]
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


_NUMPY_NAMES = {
    **{f"int{b}": f"int{b}" for b in (8, 16, 32, 64)},
    **{f"uint{b}": f"uint{b}" for b in (8, 16, 32, 64)},
    "halffloat": "float16",
    "float": "float32",
    "double": "float64",
}


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
