"""FSDP2 through Ray Train (2 CPU workers, gloo), sharded checkpoints: each worker reports its
own shard files and Ray merges them into one checkpoint folder (saved and uploaded in the
background in one run); a worker killed mid-run comes back from it and the run ends with the
weights, average and optimizer state of the run that was never interrupted."""
from pathlib import Path

import pytest
import torch

from distributed_runner.sharded_checkpoint import full_weights
from tests.integration.test_ray_train import fit, ray_cfg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FSDP = dict(model=dict(type="TinyBlocks"), strategy=dict(type="fsdp", shard_modules=["Block"]),
            train_dataloader=dict(dataset=dict(type="ToyDataset", n=40), batch_size=4,
                                  sampler=dict(type="DefaultSampler", shuffle=True)),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=2))


def everything(path: Path, tmp: Path) -> dict:
    """Model and optimizer tensors of a sharded checkpoint, read by this one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    manifest = torch.load(path, weights_only=False)
    out = tmp / f"{path.parent.name}.pt"
    dcp_to_torch_save(str(path.parent / manifest["sharded"]["dir"]), str(out))
    return {"manifest": manifest, **torch.load(out, weights_only=False)}


def test_fsdp_worker_death_resumes_exactly_from_merged_shards(ray_cluster, tmp_path):
    ema = dict(type="EMAHook", momentum=0.3)
    straight = ray_cfg(tmp_path / "straight", custom_hooks=[ema], **FSDP)
    straight["default_hooks"]["checkpoint"]["async_save"] = True  # saved and uploaded in the
    assert fit(straight)[0] == 0                                   # background: the same result
    storage = tmp_path / "straight" / "ray_storage" / "straight"
    reported = sorted(p.name.rsplit("-", 1)[0] for p in storage.iterdir() if p.is_dir())
    assert reported == ["iter_14", "iter_7", "last"]
    for folder in (p for p in storage.iterdir() if p.is_dir()):
        manifest = torch.load(next(folder.glob("*.pth")), weights_only=False)
        assert manifest["meta"]["async_save"] is True
        assert sorted(p.name for p in (folder / manifest["sharded"]["dir"]).iterdir()) == \
            [".metadata", "__0_0.distcp", "__1_0.distcp"]
    died = ray_cfg(tmp_path / "died", custom_hooks=[ema, dict(type="DieOnceHook", at_iter=9)],
                   **FSDP)
    died["launcher"]["max_failures"] = 1
    assert fit(died)[0] == 0 and (tmp_path / "died" / "died_once").read_text() == "9"
    # Ray's copy of iter_7: the manifest and both ranks' shards in one folder
    reported = next((tmp_path / "died" / "ray_storage" / "died").glob("iter_7-*"))
    manifest = torch.load(reported / "iter_7.pth", weights_only=False)
    shards = sorted(p.name for p in (reported / manifest["sharded"]["dir"]).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert full_weights(reported / "iter_7.pth", manifest).keys() == \
        full_weights(tmp_path / "died" / "iter_7.pth",
                     torch.load(tmp_path / "died" / "iter_7.pth", weights_only=False)).keys()
    a, b = (everything(tmp_path / run / "last.pth", tmp_path) for run in ("straight", "died"))
    assert a["manifest"]["meta"]["iter"] == b["manifest"]["meta"]["iter"] == 15
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), f"model {k}"
    for k, v in a["manifest"]["ema_state_dict"].items():
        assert torch.equal(v, b["manifest"]["ema_state_dict"][k]), f"ema {k}"
    assert set(a["optimizer"]["state"]) == set(a["model"])
    for name, state in a["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(v, b["optimizer"]["state"][name][k]), f"optimizer {name} {k}"
