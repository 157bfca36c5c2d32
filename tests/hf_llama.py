"""A tiny Hugging Face Llama built from its config (transformers' own tensor-parallel plan), and a
run of it over two epochs whose every iteration's loss is logged: the tensor-parallel tests
(issue 38) compare such runs across meshes."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.hf_toy import CONTEXT, VOCAB

LLAMA = dict(type="transformers.LlamaForCausalLM",
             config=dict(type="transformers.LlamaConfig", vocab_size=VOCAB, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         tie_word_embeddings=False))


def llama_cfg(work_dir: Path | str, batch_size: int, strategy: Any = None,
              **overrides: Any) -> dict:
    """2 epochs of 32 sequences (global batch 8: 4 iterations an epoch), AdamW with gradient
    clipping, EMA and SyncBuffers, a checkpoint every epoch, the loss logged every iteration
    (averaged over the ranks)."""
    cfg: dict[str, Any] = dict(
        work_dir=str(work_dir), run_name=".", model=LLAMA, log_level="WARNING",
        custom_imports=dict(imports=["tests.hf_toy"]),
        train_dataloader=dict(dataset=dict(type="HFToyTokens", n=32), batch_size=batch_size,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=True, max_epochs=2),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=3e-3),
                           clip_grad=dict(max_norm=1.0)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=1, sinks=["jsonl"]),
                           checkpoint=dict(type="CheckpointHook", interval=1)),
        custom_hooks=[dict(type="EMAHook", momentum=0.2), dict(type="SyncBuffersHook")],
        randomness=dict(seed=0))
    if strategy is not None:
        cfg["strategy"] = strategy
    cfg.update(overrides)
    return cfg


def logged(work_dir: Path | str, key: str = "loss") -> list[float]:
    """Every training record's ``key`` from the run's JSONL log, in order."""
    values = []
    for path in sorted(Path(work_dir).glob("**/scalars.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("mode", "train") == "train" and key in record:
                values.append(float(record[key]))
    return values


def close(a: list[float], b: list[float], rtol: float = 1e-4) -> bool:
    """Same length, every value within ``rtol`` (relative) of the other's."""
    return len(a) == len(b) > 0 and all(abs(x - y) <= rtol * abs(y) for x, y in zip(a, b))


from hooks import HOOKS, Hook  # noqa: E402


@HOOKS.register_module(force=True)
class OutputsPerRank(Hook):
    """Appends each iteration's ``outputs`` (loss, grad_norm) to ``{path}.rank{R}``: what every
    rank's hooks see (under pipeline parallelism only the last stage computes the loss)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def after_train_iter(self, runner, batch_idx=None, data_batch=None, outputs=None) -> None:
        values = {k: float(v) for k, v in (outputs or {}).items()}
        with open(f"{self.path}.rank{runner.rank}", "a") as f:
            f.write(json.dumps(values) + "\n")


@HOOKS.register_module(force=True)
class ProjectionLayout(Hook):
    """Writes, per rank, the mesh dimensions and placements of each held decoder layer's
    ``q_proj.weight`` to ``{path}.rank{R}`` (how the strategy split the model on that rank)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def before_train(self, runner) -> None:
        layout = {name: [list(getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None)
                              or []), [str(x) for x in getattr(p, "placements", [])]]
                  for name, p in runner.model.named_parameters() if name.endswith("q_proj.weight")}
        with open(f"{self.path}.rank{runner.rank}", "w") as f:
            f.write(json.dumps(layout))


@HOOKS.register_module(force=True)
class StageModules(Hook):
    """Writes, per rank, the names of its pipeline stages' modules that FSDP shards one by one
    (``fully_shard`` units, the stage itself as ``''``) and whose forward is recomputed, whether
    each stage is compiled, and the mesh dimensions of the model's parameters, to
    ``{path}.rank{R}``: what ``shard_modules``, ``activation_checkpointing`` and ``compile``
    did to the stages, and what the optimizer and the checkpoint see through the model."""

    def __init__(self, path: str) -> None:
        self.path = path

    def before_train(self, runner) -> None:
        from torch.distributed.fsdp import FSDPModule

        from distributed_runner.model.activation_checkpointing import is_recomputed

        modules = [(name, module) for stage in runner.pipeline.stages
                   for name, module in stage.named_modules()]
        meshes = sorted({str(getattr(getattr(p, "device_mesh", None), "mesh_dim_names", None))
                         for p in runner.model.parameters()})
        found = {"units": [n for n, m in modules if isinstance(m, FSDPModule)],
                 "recomputed": [n for n, m in modules if is_recomputed(m)], "meshes": meshes,
                 "compiled": [s._compiled_call_impl is not None for s in runner.pipeline.stages]}
        with open(f"{self.path}.rank{runner.rank}", "w") as f:
            f.write(json.dumps(found))


def stepping_llama(config: Any) -> Any:
    """A Llama whose class has its own ``train_step`` (a model that steps its optimizer itself,
    as MMEngine models may): refused under ``strategy.pp``."""
    from transformers import LlamaForCausalLM

    class SteppingLlama(LlamaForCausalLM):
        def train_step(self, data: Any, optim_wrapper: Any) -> dict:
            loss = self(**data).loss
            optim_wrapper.update_params(loss)
            return {"loss": loss}

    return SteppingLlama(config)
