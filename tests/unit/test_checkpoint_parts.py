"""The checkpoint's parts are declared once (checkpoint_parts.PARTS): the documented layout, the
keys CheckpointHook publishes and the keys a real checkpoint holds all come from that table."""
import torch

import distributed_runner.checkpoint.files as checkpoint
from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.checkpoint.parts import PARTS, PUBLISHABLE_KEYS, layout_text
from hooks.checkpoint_hook import CHECKPOINT_KEYS
from tests.toy import make_runner


def test_the_documented_layout_is_the_table():
    assert layout_text() in checkpoint.__doc__
    keys = [p.key for p in PARTS]
    assert len(keys) == len(set(keys))


def test_the_published_keys_are_the_tables():
    assert CHECKPOINT_KEYS == PUBLISHABLE_KEYS
    assert set(CHECKPOINT_KEYS) == {p.key for p in PARTS} - {"sharded", "rank_slices"}


def test_every_key_a_checkpoint_holds_is_declared(tmp_path):
    """Saved inside an accumulation window, with EMAHook: the optional parts are there too."""
    runner = make_runner(
        tmp_path, train_dataloader=dict(dataset=dict(type="ToyDataset", n=24), batch_size=4),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=3),
        param_scheduler=[dict(type="LinearLR", start_factor=0.5, by_epoch=False, end=4)],
        custom_hooks=[dict(type="EMAHook", momentum=0.5)],
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=4, by_epoch=False)))
    runner.train()
    ckpt = torch.load(tmp_path / "iter_4.pth", weights_only=True)
    declared = {p.key for p in PARTS}
    assert set(ckpt) <= declared, set(ckpt) - declared
    assert {"meta", "state_dict", "optimizer", "param_schedulers", "hooks", "sinks", "rng",
            "sampler", "accumulated_grads", "ema_state_dict"} <= set(ckpt)
    assert read_pointer(tmp_path) is not None
