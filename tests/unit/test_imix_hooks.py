"""iMIX's hooks (seed 004) as iMIX published them: written without a runner argument, reading
``self.trainer``, configured with iMIX's ``level``. Loaded from the imix 0.1.0 wheel
(tests/published.py: only their ``HookBase`` and ``HOOKS`` imports rewritten)."""
import pytest
import torch

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import HOOKS, MODELS
from hooks import Hook
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
    from distributed_runner.engine.priority import imix_level
    assert [imix_level(n) for n in ("HIGHEST", "HIGHER", "HIGH", "NORMAL", "LOW", "LOWER",
                                    "LOWEST")] == [0, 10, 30, 50, 70, 90, 100]
    assert imix_level(35) == 60 and imix_level("normal") == 50
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\].level: unknown iMIX level 'HIGHR' "
                                          r"\(did you mean 'HIGHER'"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAIterHook", level="HIGHR")])
    with pytest.raises(ConfigError, match="give priority .* or level .*, not both"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAIterHook", level=30,
                                                 priority="LOW")])


def test_imix_hook_type_names_configure_what_does_the_same_here(tmp_path, runlog):
    """iMIX lists optimizing, checkpointing and logging as hooks (seed 004's table); here they
    are config keys or default hooks: each entry becomes its equivalent, and one line says so."""
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1), log_level="INFO",
        default_hooks=dict(checkpoint=None),  # iMIX's CheckPointHook below turns it back on
        custom_hooks=[dict(type="OptimizerHook", grad_clip=dict(max_norm=0.5)),
                      dict(type="CheckPointHook", iter_period=4, max_num_checkpoints=2,
                           prefix="model", level="LOW"),
                      dict(type="TensorboardLoggerHook", log_dir="tb", window_size=20),
                      dict(type="JSONLoggerHook"),
                      dict(type="IterationTimerHook", warmup_iter=2),
                      dict(type="AutogradAnomalyDetectHook", mode=False)])
    notes = [r.getMessage() for r in runlog.records if "iMIX's" in r.getMessage()]
    assert notes == [
        "custom_hooks[0]: iMIX's OptimizerHook -> optim_wrapper: clip_grad={'max_norm': 0.5}",
        "custom_hooks[1]: iMIX's CheckPointHook -> default_hooks.checkpoint: interval=4, "
        "by_epoch=False, max_keep_ckpts=2, filename_tmpl='model_{}.pth'",
        "custom_hooks[2]: iMIX's TensorboardLoggerHook -> default_hooks.logger.sinks: ['terminal', "
        "'jsonl', {'type': 'TensorBoardSink', 'log_dir': 'tb'}] (window_size: no equivalent, not used)",
        "custom_hooks[3]: iMIX's JSONLoggerHook -> default_hooks.logger.sinks already has 'jsonl'",
        "custom_hooks[4]: iMIX's IterationTimerHook -> IterTimerHook (the default timer)"]
    assert "autograd_anomaly_detect" in [e.name for e in runner._hooks.entries]  # ours, kept
    runner.train()
    assert runner.optim_wrapper.clip_grad == {"max_norm": 0.5}
    assert runner.optim_wrapper.last_grad_norm is None  # clipping ran and was logged
    assert runner.message_hub.get_scalar("train/grad_norm").current() > 0
    kept = sorted(p.name for p in tmp_path.glob("model_*.pth"))
    assert kept == ["model_4.pth", "model_8.pth"] and (tmp_path / "last.pth").is_file()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert not torch.is_anomaly_enabled()  # mode=False: the hook did nothing


def test_imix_arguments_without_an_equivalent_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\].grad_scaler_config: iMIX's "
                                          r"argument has no equivalent here; set "
                                          r"optim_wrapper.loss_scale"):
        make_runner(tmp_path, custom_hooks=[dict(type="Fp16OptimizerHook",
                                                 grad_scaler_config=dict(init_scale=512))])


def test_translation_leaves_the_callers_config_and_users_own_hooks_alone():
    from distributed_runner.compat.imix import translate_imix_hooks
    original = dict(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
                    custom_hooks=[dict(type="AutogradProfilerHook", output_dir="prof"),
                                  dict(type="OptimizerHook", grad_clip=dict(max_norm=1.0)),
                                  dict(type="EMAHook")])
    cfg = dict(original)
    notes = translate_imix_hooks(cfg)
    assert notes == ["custom_hooks[0]: iMIX's AutogradProfilerHook -> custom_hooks += "
                     "[{'type': 'ProfilerHook'}] (output_dir: no equivalent, not used)",
                     "custom_hooks[1]: iMIX's OptimizerHook -> optim_wrapper: "
                     "clip_grad={'max_norm': 1.0}"]
    assert cfg["custom_hooks"] == [dict(type="EMAHook"), dict(type="ProfilerHook")]
    assert "clip_grad" not in original["optim_wrapper"]  # the caller's dicts are not changed

    @HOOKS.register_module(name="OptimizerHook", force=True)
    class UsersOwnOptimizerHook(Hook):
        pass
    try:
        mine = dict(custom_hooks=[dict(type="OptimizerHook")])
        assert translate_imix_hooks(mine) == [] and mine["custom_hooks"] == [
            dict(type="OptimizerHook")]
    finally:
        HOOKS._table.pop("OptimizerHook")


def test_every_hook_imix_registers_is_translated_or_answered_with_what_to_do(tmp_path):
    """iMIX 0.1.0's own hook registry, read from its wheel: each name either configures its
    equivalent or is refused with what to do and the README table — never a look-alike of ours
    ('TextLoggerHook' used to get "did you mean 'LoggerHook'")."""
    import re
    import zipfile

    from distributed_runner.compat.imix import NO_EQUIVALENT, RULES
    from tests.published import wheel
    registered = set()
    with zipfile.ZipFile(wheel("imix", "0.1.0")) as archive:
        for name in archive.namelist():
            if name.startswith("imix/engine/hooks/") and name.endswith(".py"):
                registered |= set(re.findall(r"@HOOKS\.register_module\(\)\s*\nclass (\w+)",
                                             archive.read(name).decode("utf-8")))
    assert len(registered) >= 13 and "TextLoggerHook" in registered
    missing = registered - set(RULES) - set(NO_EQUIVALENT)
    assert not missing, missing
    for kind in ("TextLoggerHook", "MomentumSchedulerHook", "HookBase"):
        with pytest.raises(ConfigError) as error:
            make_runner(tmp_path, custom_hooks=[dict(type=kind)])
        message = str(error.value)
        assert message.startswith(f"custom_hooks[0].type: {kind!r} is not registered: it is ")
        assert message.endswith("see the README's iMIX table ('MMEngine and iMIX users')")
        assert "did you mean" not in message
    with pytest.raises(ConfigError, match=r"param_name='momentum'"):
        make_runner(tmp_path, custom_hooks=[dict(type="MomentumSchedulerHook")])
