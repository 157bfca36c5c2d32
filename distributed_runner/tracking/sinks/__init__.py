"""Where LoggerHook's records go. A sink is built from ``LoggerHook(sinks=[...])`` by name.

Built in: ``terminal`` (:class:`TerminalSink`), ``jsonl`` (:class:`JsonlSink`), ``tensorboard``
(:class:`TensorBoardSink`), ``parquet`` (:class:`ParquetSink`), ``mlflow`` (:class:`MLflowSink`),
``wandb`` (:class:`WandbSink`, with the optional ``wandb`` package).
The Runner builds the sinks the config names (LoggerHook's ``sinks=``) once, as a
:class:`SinkSet` that every hook reaches as ``runner.sinks``. A new sink subclasses
:class:`LogSink`, registers with ``@LOG_SINKS.register_module()`` and is named in the config.
May import: core.
"""

from distributed_runner.tracking.sinks.base import (
    LogRecord,
    LogSink,
    build_sink,
    validate_sink_spec,
)
from distributed_runner.tracking.sinks.jsonl import JsonlSink
from distributed_runner.tracking.sinks.mlflow import MLflowSink
from distributed_runner.tracking.sinks.parquet import ParquetSink, read_scalars
from distributed_runner.tracking.sinks.service import SinkSet
from distributed_runner.tracking.sinks.tensorboard import TensorBoardSink
from distributed_runner.tracking.sinks.terminal import TerminalSink
from distributed_runner.tracking.sinks.wandb import WandbSink

__all__ = [
    "JsonlSink",
    "LogRecord",
    "LogSink",
    "MLflowSink",
    "ParquetSink",
    "SinkSet",
    "TensorBoardSink",
    "TerminalSink",
    "WandbSink",
    "build_sink",
    "read_scalars",
    "validate_sink_spec",
]
