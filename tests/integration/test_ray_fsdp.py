"""FSDP2 through Ray Train (2 CPU workers, gloo): a worker killed mid-run comes back from the
last checkpoint and the run ends with the weights, average and optimizer state of a run that
was never interrupted; the checkpoints hold full tensors."""
import pytest
import torch

from tests.integration.test_ray_train import fit, ray_cfg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FSDP = dict(model=dict(type="TinyBlocks"), strategy=dict(type="fsdp", shard_modules=["Block"]),
            train_dataloader=dict(dataset=dict(type="ToyDataset", n=40), batch_size=4,
                                  sampler=dict(type="DefaultSampler", shuffle=True)),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=2))


def test_fsdp_worker_death_resumes_exactly(ray_cluster, tmp_path):
    ema = dict(type="EMAHook", momentum=0.3)
    assert fit(ray_cfg(tmp_path / "straight", custom_hooks=[ema], **FSDP))[0] == 0
    died = ray_cfg(tmp_path / "died", custom_hooks=[ema, dict(type="DieOnceHook", at_iter=9)],
                   **FSDP)
    died["launcher"]["max_failures"] = 1
    assert fit(died)[0] == 0 and (tmp_path / "died" / "died_once").read_text() == "9"
    a, b = (torch.load(tmp_path / run / "last.pth", weights_only=False)
            for run in ("straight", "died"))
    assert a["meta"]["iter"] == b["meta"]["iter"] == 15
    # keyed by parameter name: the sharded path gathered it (DDP's is keyed by index)
    assert set(a["optimizer"]["state"]) == set(a["state_dict"])
    for part in ("state_dict", "ema_state_dict"):
        for k, v in a[part].items():
            assert type(v) is torch.Tensor and torch.equal(v, b[part][k]), f"{part} {k}"
    for name, state in a["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(v, b["optimizer"]["state"][name][k]), f"optimizer {name} {k}"
