"""TensorBoardSink: scalars under stable tags, the config as text, hparams at the end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.config import to_plain
from distributed_runner.core.redact import flatten, redact
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.tracking.sinks.base import LogRecord, LogSink

if TYPE_CHECKING:
    import numpy as np

    from distributed_runner.core.runner_api import RunnerAPI


@LOG_SINKS.register_module()
class TensorBoardSink(LogSink):
    """Event files in ``work_dir/<log_dir>`` (``tensorboard --logdir work_dir/logs/tensorboard``).

    Tags are ``<mode>/<name>`` — ``train/loss``, ``train/lr``, ``val/accuracy`` — with the number
    of completed training iterations as the step, so a resumed run continues its curves. The
    (redacted) config is written once as text; at the end the config's scalar values are written as
    hparams with the last validation metrics, for TensorBoard's HPARAMS tab.
    """

    def __init__(self, log_dir: str = "logs/tensorboard", hparams: bool = True) -> None:
        self.log_dir = log_dir
        self.hparams = hparams
        self._writer: Any = None
        self._last_val: dict[str, float] = {}

    def open(self, runner: RunnerAPI) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(runner.work_dir) / self.log_dir
        self._writer = SummaryWriter(str(self.path))
        self._config = redact(to_plain(runner.cfg))
        text = "\n".join(f"    {k} = {v!r}" for k, v in flatten(self._config).items())
        self._writer.add_text("config", text or "    (empty)", 0)

    def write(self, record: LogRecord) -> None:
        if self._writer is None:
            return
        for name, value in record.scalars.items():
            self._writer.add_scalar(
                f"{record.mode}/{name}", value, record.chart_step, walltime=record.created
            )
        if record.mode == "val":
            self._last_val = {
                f"hparam/val/{k}": v
                for k, v in record.scalars.items()
                if k not in ("time", "data_time")
            }

    def add_image(self, tag: str, image: np.ndarray, step: int) -> bool:
        """An ``H x W x 3`` uint8 image under ``tag`` (VisualizationHook's predictions), in
        TensorBoard's IMAGES tab; False while the sink is not open (no event file to hold it)."""
        if self._writer is None:
            return False
        self._writer.add_image(tag, image, step, dataformats="HWC")
        return True

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is None:
            return
        if self.hparams and self._last_val:
            params = {
                k: v
                for k, v in flatten(self._config).items()
                if isinstance(v, (int, float, str, bool))
            }
            self._writer.add_hparams(params, self._last_val, run_name="hparams")
        self._writer.close()
        self._writer = None
