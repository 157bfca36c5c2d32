"""The seeds' CheckInvalidLossHook, written exactly as in MMEngine's docs with our imports."""

import pytest
import torch

import tests.hook_probes  # noqa: F401 - NanModel
from tests.toy import make_runner

SEED_HOOK = '''
import torch
from hooks import HOOKS
from hooks import Hook

@HOOKS.register_module(force=True)
class CheckInvalidLossHook(Hook):
    """Check invalid loss hook.
    This hook will regularly check whether the loss is valid
    during training.
    Args:
        interval (int): Checking interval (every k iterations).
            Defaults to 50.
    """
    def __init__(self, interval=50):
        self.interval = interval

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        """All subclasses should override this method if they need any
        operations after each training iteration.
        Args:
            runner (Runner): The runner of the training process.
            batch_idx (int): The index of the current batch in the train loop.
            data_batch (dict or tuple or list, optional): Data from dataloader.
            outputs (dict, optional): Outputs from model.
        """
        if self.every_n_train_iters(runner, self.interval):
            assert torch.isfinite(outputs['loss']),\\
                runner.logger.info('loss become infinite or NaN!')
'''

CLASS_PRIORITY_VARIANT = SEED_HOOK.replace(
    "class CheckInvalidLossHook(Hook):\n", "class CheckInvalidLossHook(Hook):\n    priority = 'ABOVE_NORMAL'\n")


def define(source):
    namespace = {}
    exec(compile(source, "seed_hook.py", "exec"), namespace)
    return namespace["CheckInvalidLossHook"]


def entry(runner, name="check_invalid_loss"):
    return next(e for e in runner._hooks.entries if e.name == name)


def test_seed_hook_runs_from_custom_hooks(tmp_path):
    define(SEED_HOOK)
    runner = make_runner(tmp_path, custom_hooks=[dict(type="CheckInvalidLossHook", interval=50)])
    assert entry(runner).priority == 50
    runner.train()


def test_seed_hook_priority_in_the_dict(tmp_path):
    define(SEED_HOOK)
    runner = make_runner(tmp_path, custom_hooks=[
        dict(type="CheckInvalidLossHook", interval=50, priority="ABOVE_NORMAL")])
    assert entry(runner).priority == 40
    plan = runner._hooks.plan()["after_train_iter"]
    # ABOVE_NORMAL (40) runs before the NORMAL timer and after VERY_HIGH runtime_info
    assert [n for n, _ in plan].index("check_invalid_loss") == 1


def test_seed_hook_priority_as_class_attribute(tmp_path):
    define(CLASS_PRIORITY_VARIANT)
    runner = make_runner(tmp_path, custom_hooks=[dict(type="CheckInvalidLossHook", interval=50)])
    assert entry(runner).priority == 40


def test_seed_hook_catches_a_nan_loss(tmp_path):
    define(SEED_HOOK)
    runner = make_runner(tmp_path, custom_hooks=[dict(type="CheckInvalidLossHook", interval=1)],
                         model=dict(type="NanModel", nan_at=[3]))
    with pytest.raises(AssertionError):
        runner.train()
    assert not torch.isfinite(next(runner.model.parameters())).all()
