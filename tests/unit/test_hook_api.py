"""The hook contract: 22 mount points, MMEngine signatures and helpers, registration rules."""
import inspect
from types import SimpleNamespace

import pytest

import distributed_runner.core.registry
from distributed_runner.core.errors import ConfigError
from hooks import ADDED_MOUNT_POINTS, HOOKS, MMENGINE_MOUNT_POINTS, MOUNT_POINTS, Hook
from tests.toy import make_runner


def test_22_mount_points_with_mmengine_signatures():
    assert len(MMENGINE_MOUNT_POINTS) == len(set(MMENGINE_MOUNT_POINTS)) == 22
    assert ADDED_MOUNT_POINTS == ("after_save_checkpoint", "after_replica_change")
    assert MOUNT_POINTS == MMENGINE_MOUNT_POINTS + ADDED_MOUNT_POINTS
    assert {"before_val_epoch", "after_val_epoch", "before_test_epoch", "after_test_epoch"} \
        <= set(MOUNT_POINTS)
    sig = lambda n: list(inspect.signature(getattr(Hook, n)).parameters)  # noqa: E731
    assert sig("after_train_iter") == ["self", "runner", "batch_idx", "data_batch", "outputs"]
    assert sig("before_train_iter") == ["self", "runner", "batch_idx", "data_batch"]
    assert sig("after_val_epoch") == ["self", "runner", "metrics"]
    assert sig("before_save_checkpoint") == ["self", "runner", "checkpoint"]
    assert sig("after_load_checkpoint") == ["self", "runner", "checkpoint"]
    assert sig("after_save_checkpoint") == ["self", "runner", "path", "checkpoint"]
    assert sig("after_replica_change") == ["self", "runner", "event"]
    assert sig("after_test_iter") == ["self", "runner", "batch_idx", "data_batch", "outputs"]


def test_hooks_registry_is_the_engine_registry():
    assert HOOKS is distributed_runner.core.registry.HOOKS


def test_helpers_count_from_one_like_mmengine():
    h = Hook()
    r = SimpleNamespace(epoch=4, iter=9, max_epochs=5, max_iters=10)
    assert h.every_n_epochs(r, 5) and not h.every_n_epochs(r, 3)
    assert h.every_n_epochs(r, 1, start=5) and not h.every_n_epochs(r, 1, start=6)
    assert h.every_n_train_iters(r, 10) and h.every_n_train_iters(r, 5)
    assert not h.every_n_train_iters(r, 3)
    assert h.every_n_inner_iters(4, 5) and not h.every_n_inner_iters(3, 5)
    assert not h.every_n_epochs(r, 0) and not h.every_n_train_iters(r, -1)
    assert h.is_last_train_epoch(r) and h.is_last_train_iter(r)
    assert h.end_of_epoch([0, 1, 2], 2) and not h.end_of_epoch([0, 1, 2], 1)


def test_register_module_with_name_and_force():
    @HOOKS.register_module(name="NamedHookForTest")
    class A(Hook):
        pass

    assert HOOKS.get("NamedHookForTest") is A

    class B(Hook):
        pass

    with pytest.raises(KeyError, match="already registered"):
        HOOKS.register_module(name="NamedHookForTest", module=B)
    HOOKS.register_module(name="NamedHookForTest", force=True, module=B)
    assert HOOKS.get("NamedHookForTest") is B


def test_misnamed_mount_point_is_rejected_with_the_closest_name(tmp_path):
    @HOOKS.register_module(force=True)
    class TypoHook(Hook):
        def after_train_iteration(self, runner, batch_idx, data_batch=None, outputs=None):
            pass

    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, custom_hooks=[dict(type="TypoHook")])
    msg = str(err.value)
    assert msg.startswith("custom_hooks[0]:") and "after_train_iteration" in msg
    assert "did you mean 'after_train_iter'" in msg


def test_private_helpers_and_attributes_are_not_mount_points(tmp_path):
    @HOOKS.register_module(force=True)
    class HelperHook(Hook):
        def __init__(self, after_epoch=True):
            self.after_epoch = after_epoch  # an attribute, like EmptyCacheHook's

        def _after_iter(self, runner):
            pass

    runner = make_runner(tmp_path, custom_hooks=[dict(type="HelperHook")])
    assert "helper" in [e.name for e in runner._hooks.entries]
