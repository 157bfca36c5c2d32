"""Where LoggerHook's records go. A sink is built from ``LoggerHook(sinks=[...])`` by name.

Built in: ``terminal`` (:class:`TerminalSink`), ``jsonl`` (:class:`JsonlSink`), ``tensorboard``
(:class:`TensorBoardSink`), ``parquet`` (:class:`ParquetSink`), ``mlflow`` (:class:`MLflowSink`).
A new sink subclasses
:class:`LogSink`, registers with ``@LOG_SINKS.register_module()`` and is named in the config.
"""
from .base import LogRecord, LogSink, build_sink
from .jsonl import JsonlSink
from .mlflow import MLflowSink
from .parquet import ParquetSink, read_scalars
from .tensorboard import TensorBoardSink
from .terminal import TerminalSink

__all__ = ["LogRecord", "LogSink", "build_sink", "JsonlSink", "MLflowSink", "ParquetSink", "TensorBoardSink",
           "TerminalSink", "read_scalars"]
