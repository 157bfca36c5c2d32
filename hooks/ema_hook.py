"""EMAHook: evaluate and test with a weight average of the model being trained."""

from __future__ import annotations

from typing import Any

import torch

import distributed_runner.model.averaged  # noqa: F401  (registers the averages in MODELS)
from distributed_runner.core.errors import ArgumentError, argument_errors
from distributed_runner.core.registry import HOOKS, MODELS
from distributed_runner.core.signatures import check_arguments
from distributed_runner.engine.hook import DataBatch, Hook

EMA_IN_STATE_DICT = "ema_in_state_dict"  # meta flag: state_dict holds the average (MMEngine)


@HOOKS.register_module()
class EMAHook(Hook):
    """Keep an averaged copy of the model (``ema_type``: ``'ExponentialMovingAverage'``,
    ``'MomentumAnnealingEMA'``, ``'StochasticWeightAverage'`` or any registered
    :class:`~distributed_runner.model.averaged.BaseAveragedModel`; other keyword arguments —
    ``momentum``, ``interval``, ``update_buffers``, ``gamma`` — go to it).

    * Updated after every training iteration from the ``begin_iter``-th iteration (or the
      ``begin_epoch``-th epoch) on, counting from 1 as MMEngine does; before that it tracks the
      model exactly.
    * Validation and testing run with the averaged weights (swapped in at ``before_val_epoch`` /
      ``before_test_epoch``, back at ``after_*_epoch`` — before CheckpointHook's save-best — and
      at ``after_val``/``after_test`` if an evaluation failed), so training never sees them.
    * Checkpoints as MMEngine writes them: ``state_dict`` holds the averaged weights (what you
      deploy or publish) and ``ema_state_dict`` the training weights (under ``module.``, with
      the average's ``steps``); ``meta['ema_in_state_dict']`` marks the exchange. Resuming
      exchanges them back before the runner loads anything, so training and the average
      continue exactly. A sharded (FSDP) checkpoint keeps the training weights in its shards and
      the average in ``ema_state_dict``; its published file takes the average. ``load_from``
      loads the checkpoint's ``state_dict`` into the model and starts the average from it, as
      MMEngine does (``strict_load=True`` makes resuming without an ``ema_state_dict`` an
      error).
    * MMEngine's names for what subclasses use (mmpretrain's EMAHook): ``ema_model``,
      ``src_model``, ``enabled_by_epoch``, ``_swap_ema_parameters()``,
      ``_swap_ema_state_dict(checkpoint)``, ``_ema_started(runner)``.

    Ranks: every rank keeps the same average (weights are identical after each step).
    """

    priority = "NORMAL"

    def __init__(
        self,
        ema_type: str = "ExponentialMovingAverage",
        strict_load: bool = False,
        begin_iter: int = 0,
        begin_epoch: int = 0,
        **kwargs: Any,
    ) -> None:
        if begin_iter < 0 or begin_epoch < 0:
            raise ArgumentError("", "begin_iter and begin_epoch must be >= 0")
        if begin_iter and begin_epoch:
            raise ArgumentError("", "set begin_iter or begin_epoch, not both")
        self.ema_cfg = dict(type=ema_type, **kwargs)
        # a typo in the type or its arguments fails at registration, not after an epoch
        with argument_errors():
            check_arguments(MODELS.resolve(ema_type, "ema_type"), kwargs, "", supplied=["model"])
        self.strict_load = strict_load
        self.begin_iter, self.begin_epoch = int(begin_iter), int(begin_epoch)
        self.enabled_by_epoch = self.begin_epoch > 0
        self.ema_model: Any = None
        self.src_model: Any = None
        self._swapped = False
        self._copy_pending = False  # start the average from weights the runner loads later

    def before_run(self, runner) -> None:
        if self.ema_model is not None:  # train() then test() on one runner: keep the average
            return
        self.src_model = runner.model
        with argument_errors():
            self.ema_model = MODELS.build({**self.ema_cfg, "model": runner.model}, "ema_type")
        self._pairs = self.ema_model.swap_pairs(runner.model)

    def before_train(self, runner) -> None:
        begin, most, name = (
            (self.begin_epoch, runner.max_epochs, "begin_epoch")
            if self.enabled_by_epoch
            else (self.begin_iter, runner.max_iters, "begin_iter")
        )
        if begin > most:
            raise ArgumentError(name, f"{begin} is after the end of training ({most})")
        self._copy_if_pending(runner)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Runs before the runner takes anything from ``checkpoint`` (MMEngine's order)."""
        state = checkpoint.get("ema_state_dict")
        if runner.loading_for == "resume" and state is not None:
            if checkpoint.get("meta", {}).get(EMA_IN_STATE_DICT) and "state_dict" in checkpoint:
                self._swap_ema_state_dict(checkpoint)  # the training weights back for the model
            try:
                mismatched = self.ema_model.load_state_dict(state, strict=self.strict_load)
            except RuntimeError as e:
                raise ArgumentError(
                    "strict_load",
                    f"ema_state_dict does not fit the model: {str(e).splitlines()[0]}",
                ) from None
            if mismatched:
                runner.logger.warning(
                    "ema_state_dict: %d keys did not match (strict_load=False)", len(mismatched)
                )
            return
        if runner.loading_for == "resume":
            if self.strict_load:
                raise ArgumentError(
                    "strict_load",
                    "the checkpoint has no ema_state_dict; set "
                    "strict_load=False to start the average from "
                    "its weights",
                )
            runner.logger.warning(
                "checkpoint has no ema_state_dict: the average starts from the loaded weights"
            )
        self._copy_pending = True  # from the weights the runner is about to load

    def _copy_if_pending(self, runner) -> None:
        if self._copy_pending:
            self._copy_pending = False
            self.ema_model.copy_from(runner.model)
            self.ema_model.steps = 0

    def _ema_started(self, runner) -> bool:
        """MMEngine's rule: averaging starts at the ``begin_iter``-th iteration (or in the
        ``begin_epoch``-th epoch), counting from 1; 0 means from the first."""
        if self.enabled_by_epoch:
            return runner.epoch + 1 >= self.begin_epoch
        return runner.iter + 1 >= self.begin_iter

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: DataBatch = None, outputs: dict | None = None
    ) -> None:
        if self._ema_started(runner):
            self.ema_model.update_parameters(runner.model)
        else:
            self.ema_model.copy_from(runner.model)

    # -- evaluation with the averaged weights --------------------------------------------------
    @torch.no_grad()
    def _swap_ema_parameters(self) -> None:
        """Exchange the model's averaged tensors with the average's (MMEngine's name)."""
        for source, averaged in self._pairs:
            kept = source.detach().clone()
            source.copy_(averaged)
            averaged.copy_(kept)
        self._swapped = not self._swapped

    def _swap_in(self, runner) -> None:
        self._copy_if_pending(runner)
        self._swap_ema_parameters()

    def _swap_back(self, runner, metrics: dict | None = None) -> None:
        if self._swapped:  # at after_val/after_test: only when the evaluation raised
            self._swap_ema_parameters()

    before_val_epoch = before_test_epoch = _swap_in
    after_val_epoch = after_test_epoch = after_val = after_test = _swap_back

    # -- checkpoints ---------------------------------------------------------------------------
    @staticmethod
    def _swap_ema_state_dict(checkpoint: dict) -> None:
        """Exchange the values of ``state_dict[k]`` and ``ema_state_dict['module.' + k]``."""
        model_state, ema_state = checkpoint["state_dict"], checkpoint["ema_state_dict"]
        for key in ema_state:
            if key.startswith("module.") and key[7:] in model_state:
                ema_state[key], model_state[key[7:]] = model_state[key[7:]], ema_state[key]

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        self._copy_if_pending(runner)
        checkpoint["ema_state_dict"] = {
            k: v.detach().cpu().clone() if torch.is_tensor(v) else v
            for k, v in self.ema_model.state_dict().items()
        }
        if "state_dict" in checkpoint:  # a full checkpoint: the average is what it deploys
            self._swap_ema_state_dict(checkpoint)
            checkpoint.setdefault("meta", {})[EMA_IN_STATE_DICT] = True
