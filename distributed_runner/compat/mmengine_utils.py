"""Small helpers downstream OpenMMLab hooks import from ``mmengine`` / ``mmengine.utils``
(``is_seq_of``, ``is_list_of``, ``is_tuple_of``, ``mkdir_or_exist``, ``print_log``), here with
MMEngine's meaning, so such a hook runs after changing that import line."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from distributed_runner.core.log import print_log

__all__ = ["is_list_of", "is_seq_of", "is_tuple_of", "mkdir_or_exist", "print_log"]


def is_seq_of(
    seq: Any, expected_type: type | tuple, seq_type: type[Iterable[Any]] | None = None
) -> bool:
    """Whether ``seq`` is a sequence (of ``seq_type``, if given) whose items are all of
    ``expected_type``."""
    if not isinstance(seq, seq_type if seq_type is not None else Sequence):
        return False
    return all(isinstance(item, expected_type) for item in seq)


def is_list_of(seq: Any, expected_type: type | tuple) -> bool:
    return is_seq_of(seq, expected_type, seq_type=list)


def is_tuple_of(seq: Any, expected_type: type | tuple) -> bool:
    return is_seq_of(seq, expected_type, seq_type=tuple)


def mkdir_or_exist(dir_name: str | Path, mode: int = 0o777) -> None:
    """Create ``dir_name`` and its parents unless it exists (an empty name does nothing)."""
    if dir_name == "":
        return
    Path(dir_name).expanduser().mkdir(mode=mode, parents=True, exist_ok=True)
