"""FSDP2 through Ray Train (2 CPU workers, gloo) on a transformer toy, sharded checkpoints saved
and uploaded in the background: each worker reports its own shard files and Ray merges them into
one checkpoint folder; a worker killed mid-run comes back from it; MLflow receives the last
checkpoint whole. The run must end with the weights, average and optimizer state of the same
config trained without interruption by 2 local gloo processes."""
import uuid
from pathlib import Path

import pytest
import torch

from tests.integration.test_ray_train import fit, ray_cfg
from tests.toy import train_on_gloo

pytestmark = [pytest.mark.integration, pytest.mark.slow("FSDP Ray runs with a dead worker and their restart"),
              pytest.mark.timeout(240)]

# a transformer toy (tests/toy.py ToyGPT: GPT-2's blocks, tied embeddings), each Block sharded
FSDP = dict(model=dict(type="ToyGPT"), strategy=dict(type="fsdp", shard_modules=["Block"]),
            train_dataloader=dict(dataset=dict(type="ToyTokens", n=40), batch_size=4,
                                  sampler=dict(type="DefaultSampler", shuffle=True)),
            optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=2),
            val_dataloader=None, val_evaluator=None, val_cfg=None)
EMA = dict(type="EMAHook", momentum=0.3)


def reference_cfg(work_dir: Path, parts: dict) -> dict:
    """The config with EMA, without a launcher: trained without interruption by 2 local gloo
    processes."""
    reference = ray_cfg(work_dir, custom_hooks=[EMA], **parts)
    del reference["launcher"]
    return reference


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> Path:
    """The reference, trained by 2 gloo processes: ``<folder>/fsdp`` (DDP's async single-file
    checkpoint through a worker's death: test_ray_train.py's worker-death test)."""
    folder = tmp_path_factory.mktemp("references")
    train_on_gloo(reference_cfg(folder / "fsdp", FSDP))
    return folder


def everything(path: Path, tmp: Path) -> dict:
    """Model and optimizer tensors of a sharded checkpoint, read by this one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    manifest = torch.load(path, weights_only=False)
    out = tmp / f"{path.parent.name}.pt"
    dcp_to_torch_save(str(path.parent / manifest["sharded"]["dir"]), str(out))
    return {"manifest": manifest, **torch.load(out, weights_only=False)}


def test_fsdp_async_shards_through_ray_survive_a_dead_worker_exactly(ray_cluster, mlflow_server,
                                                                     references, tmp_path):
    from mlflow.tracking import MlflowClient

    cfg = ray_cfg(tmp_path / "died", experiment_name=f"fsdp-{uuid.uuid4().hex[:8]}",
                  log_level="INFO",
                  custom_hooks=[EMA, dict(type="DieOnceHook", at_iter=10, persisted=7),
                                dict(type="MLflowCheckpointHook", kinds=["last"])], **FSDP)
    cfg["launcher"]["max_failures"] = 1
    cfg["default_hooks"]["checkpoint"]["async_save"] = True
    cfg["default_hooks"]["logger"]["sinks"] = [dict(type="MLflowSink",
                                                    tracking_uri=mlflow_server.uri)]
    assert fit(cfg)[0] == 0 and 10 <= int((tmp_path / "died" / "died_once").read_text()) < 14

    # Ray's copy of iter_7 (committed before the death): the manifest and both ranks' shards
    reported = next((tmp_path / "died" / "ray_storage" / "died").glob("iter_7-*"))
    manifest = torch.load(reported / "iter_7.pth", weights_only=False)
    assert manifest["meta"]["async_save"] is True
    assert sorted(p.name for p in (reported / manifest["sharded"]["dir"]).iterdir()) == \
        [".metadata", "__0_0.distcp", "__1_0.distcp"]
    log = (tmp_path / "died" / "logs" / "run.log").read_text()
    assert "resumed from" in log and "iter_7.pth (epoch 1, iter 7)" in log

    a, b = (everything(path / "last.pth", tmp_path) for path in (references / "fsdp",
                                                                 tmp_path / "died"))
    assert a["manifest"]["meta"]["iter"] == b["manifest"]["meta"]["iter"] == 15
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), f"model {k}"
    for k, v in a["manifest"]["ema_state_dict"].items():
        assert torch.equal(v, b["manifest"]["ema_state_dict"][k]), f"ema {k}"
    # every parameter has its optimizer state (the tied output layer shares the embedding's)
    assert set(a["optimizer"]["state"]) == set(a["model"]) - {"head.weight"}
    for name, state in a["optimizer"]["state"].items():
        for k, v in state.items():
            assert torch.equal(v, b["optimizer"]["state"][name][k]), f"optimizer {name} {k}"

    # MLflow holds the last checkpoint whole: the manifest and its shard folder
    client = MlflowClient(mlflow_server.uri)
    experiment = client.get_experiment_by_name(cfg["experiment_name"])
    run_id = client.search_runs([experiment.experiment_id])[0].info.run_id
    uploaded = {Path(x.path).name: x for x in client.list_artifacts(run_id, "checkpoints")}
    shard_dir = b["manifest"]["sharded"]["dir"]
    assert {"last.pth", shard_dir} <= set(uploaded) and uploaded[shard_dir].is_dir
    assert sorted(Path(x.path).name for x in client.list_artifacts(
        run_id, f"checkpoints/{shard_dir}")) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
