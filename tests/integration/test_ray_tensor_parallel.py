"""Tensor parallelism through Ray Train (issue 38): a Hugging Face Llama built from its config,
split by transformers' own plan over 2 CPU workers (``tp=2``: one model, both workers on every
layer), follows the one-process run for two epochs; its epoch-1 sharded checkpoint, resumed by
one process, ends where the one-process run ends."""
from __future__ import annotations

import pytest
import torch

from tests.hf_llama import close, llama_cfg, logged
from tests.integration.test_ray_train import fit

pytestmark = [pytest.mark.integration, pytest.mark.slow("tensor-parallel Ray runs and a resume in one process"),
              pytest.mark.timeout(300)]

pytest.importorskip("transformers")

TP = dict(type="fsdp", tp=2, shard_modules=["LlamaDecoderLayer"])


def test_tp_2_on_two_ray_workers_follows_one_process_and_resumes_in_one(ray_cluster, tmp_path):
    from distributed_runner import Runner

    one = Runner.from_cfg(llama_cfg(tmp_path / "one", 8))
    one.train()
    reference = logged(tmp_path / "one")
    assert len(reference) == 8

    status, _, _ = fit(llama_cfg(tmp_path / "tp", 8, TP, launcher=dict(type="ray",
                                                                         num_workers=2)))
    assert status == 0
    tp_losses = logged(tmp_path / "tp")
    print("one process", reference, "\ntp=2 on 2 Ray workers", tp_losses)
    assert close(tp_losses, reference), (tp_losses, reference)
    meta = torch.load(tmp_path / "tp" / "epoch_1.pth", weights_only=False)["meta"]
    assert (meta["world_size"], meta["mesh"]) == (2, [1, 1, 2])

    resumed = Runner.from_cfg(llama_cfg(tmp_path / "resumed", 8, TP,
                                        resume=str(tmp_path / "tp" / "epoch_1.pth")))
    resumed.train()
    print("resumed in one process", logged(tmp_path / "resumed"))
    assert close(logged(tmp_path / "resumed"), reference[4:])
    final, mine = one.model.state_dict(), resumed.model.state_dict()
    assert all(torch.allclose(mine[k], final[k], rtol=1e-4, atol=1e-5) for k in final)
