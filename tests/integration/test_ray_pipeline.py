"""Pipeline parallelism through Ray Train (issue 50): the Ray driver checks the stages on the
meta device and prints them, then 2 CPU workers train a Hugging Face Llama as 2 pipeline stages
(1F1B), following the one-process run; the stages' checkpoint is the one-process checkpoint,
and ``drun test`` of it on the 2 workers' stages gives the metrics one process gives."""
from __future__ import annotations

import json

import pytest
import torch

from tests.hf_llama import close, logged
from tests.integration.test_ray_train import fit
from tests.unit.test_pipeline import VALIDATION, near, pp_cfg, validated, weights

pytestmark = [pytest.mark.integration,
              pytest.mark.slow("a pipeline-parallel Ray run and its one-process reference"),
              pytest.mark.timeout(300)]

pytest.importorskip("transformers")


def test_pp_2_on_two_ray_workers_follows_one_process(ray_cluster, tmp_path, capsys):
    from distributed_runner import Runner
    from distributed_runner.cli import main

    Runner.from_cfg(pp_cfg(tmp_path / "one", None)).train()
    run = pp_cfg(tmp_path / "pp", "1F1B", launcher=dict(type="ray", num_workers=2),
                 test_dataloader=VALIDATION["val_dataloader"],
                 test_evaluator=dict(type="Perplexity"), test_cfg=dict())
    (tmp_path / "pp.py").write_text("".join(f"{k} = {v!r}\n" for k, v in run.items()))
    assert main(["check", str(tmp_path / "pp.py")]) == 0
    out = capsys.readouterr().out
    assert "pipeline: pp=2 stages over 2 ranks (1F1B, 4 micro-batches)" in out
    assert "pipeline stages: model.embed_tokens .. model.layers.1 | model.layers.2 .. lm_head" \
        in out
    status, _, _ = fit(run)
    assert status == 0
    assert close(logged(tmp_path / "pp"), logged(tmp_path / "one"), rtol=1e-5)
    final = weights(tmp_path / "pp" / "epoch_2.pth")
    near(final, weights(tmp_path / "one" / "epoch_2.pth"), rtol=1e-4)
    assert torch.load(tmp_path / "pp" / "epoch_2.pth", weights_only=False)["meta"]["mesh"] == \
        [1, 1, 1]  # the stages count once: one data-parallel rank

    # drun test on the config's launcher: the 2 workers' stages evaluate the final weights on
    # the validation data, as the one-process run's last validation did
    capsys.readouterr()
    assert main(["test", str(tmp_path / "pp.py"), "--checkpoint",
                 str(tmp_path / "pp" / "epoch_2.pth")]) == 0
    out = capsys.readouterr().out
    assert "distributed-runner on Ray: 2 workers" in out, out
    tested = next(json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{"))
    assert sorted(tested) == ["loss", "perplexity"]
    assert close([tested["perplexity"]], validated(tmp_path / "one")[-1:], rtol=1e-5)
