"""iMIX's hooks (seed 004) as iMIX published them: written without a runner argument, reading
``self.trainer``, configured with iMIX's ``level``. Loaded from the imix 0.1.0 wheel
(tests/published.py: only their ``HookBase`` and ``HOOKS`` imports rewritten)."""
import pytest
import torch

from distributed_runner.errors import ConfigError
from distributed_runner.registry import HOOKS, MODELS
from tests.published import imix_hook
from tests.toy import ToyModel, make_runner


@MODELS.register_module(force=True)
class ImixEmaModel(ToyModel):
    """A model with the EMA methods iMIX's EMA hooks call (as iMIX's DeVLBert model has)."""

    def init_ema(self, decay: float = 0.9) -> None:
        self.decay, self.updates = decay, 0
        self.ema = {k: v.detach().clone() for k, v in self.state_dict().items()}

    def update_ema(self) -> None:
        self.updates += 1
        for k, v in self.state_dict().items():
            if v.is_floating_point():
                self.ema[k].mul_(self.decay).add_(v.detach(), alpha=1 - self.decay)

    def load_bkp_state_dict(self) -> None:
        self.backup = {k: v.detach().clone() for k, v in self.state_dict().items()}

    def save_checkpoint_ema(self, path, epoch: int) -> None:
        torch.save(self.ema, f"{path}/ema_epoch_{epoch}.pth")


@pytest.fixture(scope="module")
def imix_ema():
    module = imix_hook("ema.py")
    for cls in (module.EMAIterHook, module.EMAEpochHook):
        HOOKS.register_module(name=cls.__name__, module=cls, force=True)
    return module


def test_imix_ema_hooks_run_with_self_trainer_and_levels(tmp_path, imix_ema):
    runner = make_runner(tmp_path, model=dict(type="ImixEmaModel"),
                         train_cfg=dict(by_epoch=True, max_epochs=2),
                         custom_hooks=[dict(type="EMAIterHook", level=30),  # iMIX's NORMAL
                                       dict(type="EMAEpochHook", level="HIGHER")])
    order = [(e.name, e.priority) for e in runner._hooks.entries]
    assert ("ema_iter", 50) in order and ("ema_epoch", 10) in order
    # as iMIX says: at a default hook's level, a custom hook comes right after it
    assert order.index(("ema_epoch", 10)) == order.index(("runtime_info", 10)) + 1
    runner.train()
    model = runner.model
    assert model.updates == 2 * 10  # after every training iteration
    saved = [torch.load(tmp_path / f"ema_epoch_{e}.pth") for e in (0, 1)]
    assert all(torch.equal(saved[1][k], model.ema[k]) for k in model.ema)
    assert not all(torch.equal(saved[0][k], saved[1][k]) for k in model.ema)
    assert runner.get_hook("ema_iter").trainer.work_dir == runner.work_dir


def test_imix_levels_map_onto_mmengines_scale(tmp_path, imix_ema):
    from hooks.priority import imix_level
    assert [imix_level(n) for n in ("HIGHEST", "HIGHER", "HIGH", "NORMAL", "LOW", "LOWER",
                                    "LOWEST")] == [0, 10, 30, 50, 70, 90, 100]
    assert imix_level(35) == 60 and imix_level("normal") == 50
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\].level: unknown iMIX level 'HIGHR' "
                                          r"\(did you mean 'HIGHER'"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAIterHook", level="HIGHR")])
    with pytest.raises(ConfigError, match="give priority .* or level .*, not both"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAIterHook", level=30,
                                                 priority="LOW")])
