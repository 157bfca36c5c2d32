"""distributed_runner.core.dist with and without a process group (2 local gloo processes, no Ray),
and the rank-aware pieces that use it: cross-rank loss averaging and gathered metrics."""
import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.ranks import leave_rank_process
from distributed_runner.core import dist


def test_identity_without_a_process_group():
    assert dist.get_rank() == 0 and dist.get_world_size() == 1 and dist.is_main_process()
    assert not dist.is_distributed()
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(dist.all_reduce(t, "mean"), torch.tensor([1.0, 2.0]))
    assert dist.broadcast_object({"a": 1}) == {"a": 1}
    assert dist.all_gather_object(3) == [3]
    assert dist.all_gather_floats([1, 2.5]) == [[1.0, 2.5]]
    assert dist.master_only(lambda: 5)() == 5
    assert dist.get_dist_info() == (0, 1)
    data = {"x": torch.tensor([1.0])}
    assert dist.all_reduce_dict(data, "mean") is data and data["x"].item() == 1.0
    dist.barrier()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        import tests.toy  # noqa: F401
        from distributed_runner import Runner
        from tests.toy import ListSink, base_cfg

        result = {
            "rank": dist.get_rank(), "world": dist.get_world_size(),
            "sum": dist.all_reduce(torch.tensor([rank + 1.0]), "sum").item(),
            "mean": dist.all_reduce(torch.tensor([rank + 1.0]), "mean").item(),
            "max": dist.all_reduce(torch.tensor([rank + 1.0]), "max").item(),
            "broadcast": dist.broadcast_object(f"from {rank}"),
            "gathered": dist.all_gather_object(rank * 10),
            "gathered_floats": dist.all_gather_floats([rank + 0.25, 1e-9 * (rank + 1), -rank]),
            "master_only": dist.master_only(lambda: "ran")(),
            "dist_info": dist.get_dist_info(),
            "reduced_dict": {k: v.tolist() for k, v in dist.all_reduce_dict(
                {"b": torch.tensor([rank, 1.0]), "a": torch.tensor(rank + 2)}, "mean").items()},
        }
        sink = ListSink()
        runner = Runner.from_cfg(base_cfg(
            os.path.join(out_dir, "wd"), train_cfg=dict(by_epoch=True, max_epochs=1),
            default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=[sink]),
                               checkpoint=None)))
        runner.train()
        hub = runner.message_hub
        result["local_losses"] = hub.get_scalar("train/loss").values()
        result["logged_losses"] = [r.scalars["loss"] for r in sink.records if r.mode == "train"]
        result["val_accuracy"] = hub.get_scalar("val/accuracy").values()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        torch.distributed.barrier()  # neither rank tears gloo down while the other still uses it
        torch.distributed.destroy_process_group()
    leave_rank_process()  # only when the body did not raise


@pytest.mark.timeout(120)
def test_collectives_loss_averaging_and_gathered_metrics(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    assert r0["sum"] == r1["sum"] == 3.0 and r0["mean"] == 1.5 and r1["max"] == 2.0
    assert r0["broadcast"] == r1["broadcast"] == "from 0"
    assert r0["gathered"] == r1["gathered"] == [0, 10]
    assert r0["gathered_floats"] == r1["gathered_floats"] == [[0.25, 1e-9, 0.0], [1.25, 2e-9, -1.0]]
    assert r0["master_only"] == "ran" and r1["master_only"] is None
    assert r0["dist_info"] == [0, 2] and r1["dist_info"] == [1, 2]
    assert r0["reduced_dict"] == r1["reduced_dict"] == {"a": 2, "b": [0.5, 1.0]}  # int kept
    # 20 samples a rank, batch 4: 5 iterations; one record at iteration 5, on rank 0 only
    assert r1["logged_losses"] == [] and len(r0["logged_losses"]) == 1
    mean_both = (sum(r0["local_losses"]) + sum(r1["local_losses"])) / 10
    assert r0["logged_losses"][0] == pytest.approx(mean_both, rel=1e-6)
    assert r0["local_losses"] != r1["local_losses"]
    # validation results gathered from both ranks: the same metrics everywhere
    assert r0["val_accuracy"] == r1["val_accuracy"]
