"""Pipeline parallelism (issue 50, distributed_runner/parallel/pipeline.py): a Hugging Face Llama
built from its config, cut into stages along transformers' own pipeline plan, trained by torch's
schedules on 2 gloo processes; the logged losses follow one process's, every rank logs the same
values, gradient clipping takes the norm over both stages, and the stages' checkpoint is the
one-process checkpoint under every parameter's full name. Each request that cannot hold is one
line before training, on the Ray driver too."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from distributed_runner import Runner  # noqa: E402
from distributed_runner.core.errors import ConfigError  # noqa: E402
from distributed_runner.launch.launcher_config import validate_config  # noqa: E402
from distributed_runner.model.sharding import parse_strategy  # noqa: E402
from distributed_runner.parallel.pipeline import plan_stages  # noqa: E402
from tests.hf_llama import LLAMA, close, llama_cfg, logged  # noqa: E402
from tests.hf_toy import GPT2  # noqa: E402
from tests.toy import train_on_gloo  # noqa: E402

LLAMA4 = {**LLAMA, "config": {**LLAMA["config"], "num_hidden_layers": 4}}
SCHEDULES = ("1F1B", "GPipe", "Interleaved1F1B")
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")
EMA = [dict(type="EMAHook", momentum=0.2)]
# GPT-2 has no pipeline plan: cut by tracing where pp_split says (no dropout, untied head)
GPT2_4 = {**GPT2, "config": {**GPT2["config"], "n_layer": 4, "resid_pdrop": 0.0,
                             "embd_pdrop": 0.0, "tie_word_embeddings": False}}
CUTS = {"1F1B": ["transformer.h.2"],  # a V: 4 stages, stage 0's mask read by all of them
        "DualPipeV": ["transformer.h.1", "transformer.h.2", "transformer.ln_f"]}
VALIDATION = dict(  # every epoch, on 12 other sequences (the last batch smaller)
    val_dataloader=dict(dataset=dict(type="HFToyTokens", n=12, seed=1), batch_size=8,
                        sampler=dict(type="DefaultSampler", shuffle=False)),
    val_evaluator=dict(type="Perplexity"), val_cfg=dict())


def validated(work_dir: Path) -> list[float]:
    """Each validation's perplexity, from the run's JSONL log."""
    return [json.loads(line)["perplexity"] for path in sorted(Path(work_dir).glob(
        "**/scalars.jsonl")) for line in path.read_text().splitlines()
        if "perplexity" in json.loads(line)]


def pp_cfg(work_dir: Path, schedule: str | None, **overrides) -> dict:
    """:func:`llama_cfg`'s 8 iterations (global batch 8, clipping at 1.0) of a 4-layer Llama,
    without EMA/SyncBuffers; ``schedule``: pp=2 with it (each rank reads the whole batch),
    None: one process."""
    cfg = llama_cfg(work_dir, 8, None, **{"model": LLAMA4, "custom_hooks": [], **overrides})
    cfg.update(VALIDATION)
    if schedule is not None:
        cfg["strategy"] = dict(type="fsdp", pp=2, pp_schedule=schedule, pp_microbatches=4)
    return cfg


def gpt2_cfg(work_dir: Path, schedule: str | None, **overrides) -> dict:
    """:func:`pp_cfg` of a 4-layer GPT-2 with EMA; ``schedule``: cut where :data:`CUTS` says."""
    cfg = pp_cfg(work_dir, schedule, **{"model": GPT2_4, "custom_hooks": EMA, **overrides})
    if schedule is not None:
        cfg["strategy"]["pp_split"] = CUTS[schedule]
    return cfg


def evaluation_cfg(work_dir: Path, schedule: str | None, checkpoint: str,
                   make=pp_cfg) -> dict:
    """``make``'s config (:func:`pp_cfg`) evaluating ``checkpoint`` on the validation data as
    test data (``drun test``'s config: ``load_from`` the checkpoint, no resume)."""
    cfg = make(work_dir, schedule, load_from=checkpoint, resume=False)
    cfg.update(test_dataloader=VALIDATION["val_dataloader"], test_evaluator=dict(
        type="Perplexity"), test_cfg=dict())
    return cfg


def pretrained_dir(folder: Path, model: dict = LLAMA4) -> str:
    """The 4-layer Llama (or ``model``) with other weights (seed 7), as ``save_pretrained``
    writes it."""
    from distributed_runner.model.build import build_model

    torch.manual_seed(7)
    build_model(model, torch.device("cpu")).save_pretrained(str(folder))
    return str(folder)


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=False)["state_dict"]


def near(a: dict, b: dict, rtol: float = 1e-5) -> None:
    assert list(a) == list(b)  # every parameter, under its full name, in the model's order
    for key in a:
        assert torch.allclose(a[key], b[key], rtol=rtol, atol=rtol * b[key].abs().max()), key


@pytest.mark.slow("2 gloo processes: every pipeline schedule, resume, load_from, EMA")
def test_pp2_follows_one_process_and_its_checkpoint_resumes_in_one_process_and_on_stages(
        tmp_path):
    epoch_1 = str(tmp_path / "1F1B" / "epoch_1.pth")
    seen = str(tmp_path / "outputs")
    pretrained = pretrained_dir(tmp_path / "pretrained")  # load_from: each stage its layers
    runs = [pp_cfg(tmp_path / name, name) for name in SCHEDULES]
    # 1F1B with activation checkpointing per stage and SyncBuffersHook: the same losses
    runs[0]["strategy"]["activation_checkpointing"] = ["LlamaDecoderLayer"]
    runs[0]["custom_hooks"].append(dict(type="SyncBuffersHook"))
    runs.append(pp_cfg(tmp_path / "pp_loaded", "1F1B", load_from=pretrained))
    runs += [pp_cfg(tmp_path / "pp_ema", "1F1B", custom_hooks=EMA),  # each stage's average
             pp_cfg(tmp_path / "pp_ema_resumed", "1F1B", custom_hooks=EMA,
                    resume=str(tmp_path / "pp_ema" / "epoch_1.pth"))]
    runs += [pp_cfg(tmp_path / name, name) for name in V_SCHEDULES]
    runs[0]["custom_hooks"].append(dict(type="OutputsPerRank", path=seen))
    runs[0]["custom_imports"] = dict(imports=["tests.hf_toy", "tests.hf_llama"])
    final_1f1b = str(tmp_path / "1F1B" / "epoch_2.pth")
    tested = [("test", evaluation_cfg(tmp_path / f"{name}_test", name, final_1f1b))
              for name in ("1F1B", "DualPipeV")]  # the test loop on stages, a V's too
    train_on_gloo(*runs, pp_cfg(tmp_path / "pp_resumed", "1F1B", resume=epoch_1), *tested)
    Runner.from_cfg(pp_cfg(tmp_path / "one", None)).train()
    reference = logged(tmp_path / "one")
    assert len(reference) == 8
    for name in SCHEDULES + V_SCHEDULES:  # a V: 2 stages a rank, the last on rank 0
        losses = logged(tmp_path / name)
        assert close(losses, reference, rtol=1e-5), (name, losses, reference)
        # validation: the stages' forward-only schedule, the logits shared with every rank
        assert close(validated(tmp_path / name), validated(tmp_path / "one"), rtol=1e-5)
    assert len(validated(tmp_path / "one")) == 2
    Runner.from_cfg(pp_cfg(tmp_path / "one_loaded", None, load_from=pretrained)).train()
    loaded = logged(tmp_path / "one_loaded")
    assert close(logged(tmp_path / "pp_loaded"), loaded, rtol=1e-5) and loaded != reference
    Runner.from_cfg(pp_cfg(tmp_path / "one_ema", None, custom_hooks=EMA)).train()
    ema = torch.load(tmp_path / "one_ema" / "epoch_2.pth", weights_only=False)
    for name in ("pp_ema", "pp_ema_resumed"):  # the stages' averages, gathered, and resumed
        mine = torch.load(tmp_path / name / "epoch_2.pth", weights_only=False)
        near(mine["state_dict"], ema["state_dict"], rtol=1e-4)  # the average, deployed
        near(mine["ema_state_dict"], ema["ema_state_dict"], rtol=1e-4)
    first, last = (Path(f"{seen}.rank{r}").read_text() for r in (0, 1))
    assert first == last and len(first.splitlines()) == 8  # every rank's hooks: the same values
    norms = logged(tmp_path / "1F1B", "grad_norm")
    assert max(norms) > 1.0  # clipping at 1.0 acted, with the norm over both stages
    assert close(norms, logged(tmp_path / "one", "grad_norm"), rtol=1e-4)
    final = weights(tmp_path / "1F1B" / "epoch_2.pth")  # both stages' weights, full names
    near(final, weights(tmp_path / "one" / "epoch_2.pth"), rtol=1e-4)
    # the stages' epoch-1 checkpoint, resumed in one process and on 2 stages again
    Runner.from_cfg(pp_cfg(tmp_path / "one_resumed", None, resume=epoch_1)).train()
    for resumed in ("one_resumed", "pp_resumed"):
        assert close(logged(tmp_path / resumed), reference[4:], rtol=1e-5)  # epoch 2 only
        near(weights(tmp_path / resumed / "epoch_2.pth"), final)
    # the test loop on stages evaluates the checkpoint as drun test does in one process
    Runner.from_cfg(evaluation_cfg(tmp_path / "one_test", None, final_1f1b)).test()
    reference_test = validated(tmp_path / "one_test")
    assert len(reference_test) == 1
    for name in ("1F1B", "DualPipeV"):
        assert close(validated(tmp_path / f"{name}_test"), reference_test, rtol=1e-5), name
    # drun export of the stages' checkpoint: one directory from_pretrained loads
    from transformers import LlamaForCausalLM

    from distributed_runner.cli import main
    assert main(["export", str(tmp_path / "1F1B" / "epoch_2.pth"), str(tmp_path / "hf")]) == 0
    exported = LlamaForCausalLM.from_pretrained(str(tmp_path / "hf")).state_dict()
    assert exported.keys() == final.keys()
    assert all(torch.equal(exported[k], final[k]) for k in final)


def test_a_model_without_a_plan_is_cut_where_pp_split_says_by_tracing_its_forward(tmp_path):
    """GPT-2 has no pipeline plan: torch.export's trace of its own forward is cut before each
    module of pp_split. Under 1F1B (also with activation checkpointing and compile) and under
    DualPipeV (4 stages) the losses and validations follow one process's, EMA's too; the checkpoint has one process's names in its order and resumes on the stages;
    load_from a save_pretrained directory, the test loop on the stages and drun export work
    as with a plan."""
    epoch_1, final = (str(tmp_path / "1F1B" / f"epoch_{i}.pth") for i in (1, 2))
    pretrained = pretrained_dir(tmp_path / "pretrained", GPT2_4)
    recomputed = gpt2_cfg(tmp_path / "recomputed", "1F1B", custom_imports=dict(
        imports=["tests.hf_toy", "tests.hf_llama"]), custom_hooks=[*EMA, dict(
            type="StageModules", path=str(tmp_path / "modules"))])
    recomputed["strategy"]["activation_checkpointing"] = ["GPT2Block"]
    recomputed["compile"] = dict(backend="eager")  # each stage compiled (dynamo, no codegen)
    train_on_gloo(*(gpt2_cfg(tmp_path / name, name) for name in CUTS), recomputed,
                  gpt2_cfg(tmp_path / "resumed", "1F1B", resume=epoch_1),
                  gpt2_cfg(tmp_path / "loaded", "1F1B", load_from=pretrained),
                  ("test", evaluation_cfg(tmp_path / "tested", "DualPipeV", final, gpt2_cfg)))
    Runner.from_cfg(gpt2_cfg(tmp_path / "one", None)).train()
    reference = logged(tmp_path / "one")
    assert len(reference) == 8 and len(validated(tmp_path / "one")) == 2
    for name in (*CUTS, "recomputed"):
        assert close(logged(tmp_path / name), reference, rtol=1e-5), name
        assert close(validated(tmp_path / name), validated(tmp_path / "one"), rtol=1e-5), name
    # activation checkpointing matched the stages' blocks by the model's class name; each
    # rank's stage is what compile compiled
    modules = [json.loads(Path(f"{tmp_path}/modules.rank{r}").read_text()) for r in (0, 1)]
    assert [m["recomputed"] for m in modules] == [["transformer.h.0", "transformer.h.1"],
                                                  ["transformer.h.2", "transformer.h.3"]]
    assert [m["compiled"] for m in modules] == [[True], [True]]
    assert close(logged(tmp_path / "resumed"), reference[4:], rtol=1e-5)
    mine, one = (torch.load(tmp_path / name / "epoch_2.pth", weights_only=False)
                 for name in ("1F1B", "one"))
    # rtol 1e-3: the attention's key bias has near-zero gradients, where AdamW's normalisation
    # turns float rounding into differences of ~1e-6 (the losses agree to 1e-5)
    near(mine["state_dict"], one["state_dict"], rtol=1e-3)
    near(mine["ema_state_dict"], one["ema_state_dict"], rtol=1e-3)
    near(weights(tmp_path / "resumed" / "epoch_2.pth"), mine["state_dict"])
    Runner.from_cfg(gpt2_cfg(tmp_path / "one_loaded", None, load_from=pretrained)).train()
    loaded = logged(tmp_path / "one_loaded")
    assert close(logged(tmp_path / "loaded"), loaded, rtol=1e-5) and loaded != reference
    # the final checkpoint (its average, deployed) tested on the stages: the last validation
    assert close(validated(tmp_path / "tested"), validated(tmp_path / "one")[-1:], rtol=1e-5)
    from transformers import GPT2LMHeadModel

    from distributed_runner.cli import main
    assert main(["export", final, str(tmp_path / "hf")]) == 0
    exported = GPT2LMHeadModel.from_pretrained(str(tmp_path / "hf")).state_dict()
    assert list(exported) == list(mine["state_dict"])
    assert all(torch.equal(exported[k], v) for k, v in mine["state_dict"].items())


def test_a_traced_cut_rewires_the_stages_for_any_batch_and_sequence_size():
    """The traced stages run one after another (each reading only the one before it) give the
    model's own logits, bit for bit, at sizes other than the trace's; a forward torch.export
    cannot capture is one line naming pp_split."""
    from distributed_runner.model.build import build_model
    from distributed_runner.parallel.traced_stages import trace_stages

    torch.manual_seed(0)
    model = build_model(GPT2_4, torch.device("cpu"))
    stages = trace_stages(model, CUTS["DualPipeV"], torch.device("cpu"))
    assert [len(stage.state_dict()) for stage in stages] == [2 + 12, 12, 24, 3]
    for shape in ((2, 16), (3, 5), (1, 9)):
        ids = torch.randint(0, 64, shape)
        values = (ids,)
        for stage in stages:
            out = stage(*values)
            values = out if isinstance(out, tuple) else (out,)
        assert torch.equal(values[0], model(input_ids=ids).logits), shape
    assert "forward" not in vars(model.transformer.h[2])  # the cut's mark is gone

    class Skipping(torch.nn.Module):  # the head reads the embedding, which stage 1 does not
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)
            self.blocks = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))

        def forward(self, input_ids):
            embedded = self.embed(input_ids)
            return self.head(self.blocks(embedded)) + embedded.sum(-1, keepdim=True)

    skipping = Skipping()
    first, middle, last = trace_stages(skipping, ["blocks.1", "head"], torch.device("cpu"))
    ids = torch.randint(0, 64, (3, 7))
    assert torch.equal(last(*middle(*first(ids))), skipping(ids))  # handed on by stage 1

    class Branching(torch.nn.Module):  # a branch on a value: torch.export cannot capture it
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head = torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)

        def forward(self, input_ids):
            hidden = self.embed(input_ids)
            return self.head(hidden if hidden.sum() > 0 else -hidden)

    class Dropping(Branching):  # functional dropout, as OPT's layers call it: no module shows it
        def forward(self, input_ids):
            hidden = torch.nn.functional.dropout(self.embed(input_ids), 0.1, self.training)
            return self.head(hidden)

    for model, words in ((Branching(), "could not be traced"), (Dropping(), "drops with p=0.1")):
        with pytest.raises(ConfigError) as caught:
            trace_stages(model, ["head"], torch.device("cpu"))
        assert caught.value.key == "strategy.pp_split" and words in str(caught.value)
        assert "\n" not in str(caught.value)


@pytest.mark.slow("4 gloo processes: 2 stages, each sharded by FSDP, HSDP or split by TP over 2")
def test_pp2_x_dp2_and_pp2_x_tp2_follow_one_process_and_their_checkpoints_reshard(tmp_path):
    """pp=2 x dp_shard=2: each stage's 2 ranks read half of the global batch of 8 and shard the
    stage with FSDP (its decoder layers one by one); pp=2 x dp_replicate=2 replicates it
    instead (HSDP); pp=2 x tp=2: a stage's 2 ranks split its layers by transformers' own
    plan; GPT-2's traced stages at pp=2 x dp_shard=2. The logged losses (averaged over the
    ranks) follow one process's; pp=2 x dp=2's epoch-1 checkpoint resumes in one process, into
    FSDP's shards and into TP's splits, each ending with the uninterrupted run's weights."""

    fsdp = dict(type="fsdp", pp=2, pp_schedule="1F1B", pp_microbatches=2,
                shard_modules=["LlamaDecoderLayer"])
    tp, hsdp = {**fsdp, "tp": 2}, {**fsdp, "dp_replicate": 2}
    epoch_1 = str(tmp_path / "pp_dp" / "epoch_1.pth")
    runs = (("pp_dp", fsdp, 4, {}), ("pp_dp_resumed", fsdp, 4, {"resume": epoch_1}),
            ("pp_tp", tp, 8, {}), ("pp_tp_resumed", tp, 8, {"resume": epoch_1}),
            ("pp_hsdp", hsdp, 4, {"custom_hooks": EMA}),
            ("gpt2_pp_dp", {**fsdp, "shard_modules": ["GPT2Block"], "pp_split": CUTS["1F1B"]},
             4, {"model": GPT2_4, "custom_hooks": [dict(type="StageModules",
                                                        path=str(tmp_path / "units"))]}))
    cfgs = [llama_cfg(tmp_path / name, batch, strategy, **{"model": LLAMA4, "custom_hooks": [],
                                                           **more})
            for name, strategy, batch, more in runs]
    cfgs[2]["custom_hooks"] = [dict(type="ProjectionLayout", path=str(tmp_path / "layout"))]
    for cfg in cfgs[2], cfgs[5]:
        cfg["custom_imports"] = dict(imports=["tests.hf_toy", "tests.hf_llama"])
    train_on_gloo(*cfgs, nprocs=4)
    # GPT-2 cut by tracing, each stage sharded over its 2 ranks block by block (shard_modules
    # matched on the traced stages by the model's class names); the model's parameters are the
    # stages' shards
    units = [json.loads(Path(f"{tmp_path}/units.rank{r}").read_text()) for r in range(4)]
    assert [u["units"] for u in units] == [["", "transformer.h.0", "transformer.h.1"]] * 2 + [
        ["", "transformer.h.2", "transformer.h.3"]] * 2
    assert all(u["meshes"] == ["('dp_shard',)"] for u in units)
    Runner.from_cfg(gpt2_cfg(tmp_path / "gpt2_one", None, custom_hooks=[])).train()
    assert close(logged(tmp_path / "gpt2_pp_dp"), logged(tmp_path / "gpt2_one"), rtol=1e-5)
    layouts = [json.loads(Path(f"{tmp_path}/layout.rank{r}").read_text()) for r in range(4)]
    assert [sorted(layout) for layout in layouts] == [  # ranks 0-1: stage 0, ranks 2-3: stage 1
        [f"model.layers.{i}.self_attn.q_proj.weight" for i in held]
        for held in ((0, 1), (0, 1), (2, 3), (2, 3))]
    assert all(v == [["tp"], ["S(0)"]] for layout in layouts for v in layout.values())
    Runner.from_cfg(pp_cfg(tmp_path / "one", None)).train()
    reference = logged(tmp_path / "one")
    for name in ("pp_dp", "pp_tp", "pp_hsdp"):
        assert close(logged(tmp_path / name), reference, rtol=1e-5), name
    final = weights(tmp_path / "pp_dp" / "epoch_2.pth")
    near(final, weights(tmp_path / "one" / "epoch_2.pth"), rtol=1e-4)
    near(weights(tmp_path / "pp_tp" / "epoch_2.pth"), final, rtol=1e-4)
    Runner.from_cfg(pp_cfg(tmp_path / "one_resumed", None, resume=epoch_1)).train()
    for resumed in ("one_resumed", "pp_dp_resumed", "pp_tp_resumed"):  # one process, shards, TP
        assert close(logged(tmp_path / resumed), reference[4:], rtol=1e-5), resumed
        near(weights(tmp_path / resumed / "epoch_2.pth"), final)
    # EMA over HSDP stages: the average of every stage, whole, under the model's names
    average = torch.load(tmp_path / "pp_hsdp" / "epoch_2.pth", weights_only=False)
    assert [k[len("module."):] for k in average["ema_state_dict"] if k != "steps"] == list(final)


def test_the_plan_cuts_the_embedding_layers_and_head_evenly_or_where_asked():
    from distributed_runner.model.build import build_model

    model = build_model(LLAMA4, torch.device("cpu"))
    plan = plan_stages(model, parse_strategy(dict(type="fsdp", pp=2)))
    assert plan.units(0) == ("model.embed_tokens", "model.layers.0", "model.layers.1")
    assert plan.units(1) == ("model.layers.2", "model.layers.3", "lm_head")
    split = parse_strategy(dict(type="fsdp", pp=2, pp_split=["model.layers.1"]))
    assert plan_stages(model, split).units(0) == ("model.embed_tokens", "model.layers.0")
    looped = plan_stages(model, parse_strategy(dict(type="fsdp", pp=2,
                                                    pp_schedule="Interleaved1F1B")))
    assert looped.stages == 4 and looped.stages_of(0) == [0, 2] and looped.stages_of(1) == [1, 3]
    v = plan_stages(model, parse_strategy(dict(type="fsdp", pp=2, pp_schedule="DualPipeV")))
    assert v.stages == 4 and v.stages_of(0) == [0, 3] and v.stages_of(1) == [1, 2]
    assert v.rank_of(3) == 0  # the last stage beside the first


@pytest.mark.parametrize(("strategy", "key", "words"), [
    (dict(pp=2, pp_schedule="1f1b"), "strategy.pp_schedule", "did you mean '1F1B'"),
    (dict(pp=2, pp_microbatches=1), "strategy.pp_microbatches", ">= the 2 stages"),
    (dict(pp=0), "strategy.pp", "integer >= 1"),
    (dict(pp=2, pp_split="model.layers.2"), "strategy.pp_split", "list of module names"),
    (dict(pp=2, pp_split=["model.layer.2"]), "strategy.pp_split", "did you mean"),
    (dict(pp=2, pp_split=["model.layers.1", "model.layers.3"]), "strategy.pp_split",
     "3 stage(s)"),
])
def test_a_pipeline_option_that_cannot_hold_is_one_line(strategy, key, words):
    from distributed_runner.model.build import build_model

    with pytest.raises(ConfigError) as caught:
        plan_stages(build_model(LLAMA4, torch.device("cpu")),
                    parse_strategy(dict(type="fsdp", **strategy)))
    assert caught.value.key == key and words in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("change", "workers", "key", "words"), [
    (dict(strategy=dict(type="fsdp", pp=2, tp=2)), 2, "strategy.pp",
     "pp=2 x tp=2 does not divide the world size 2"),
    (dict(strategy=dict(type="fsdp", pp=2, dp_replicate=2)), 2, "strategy.pp",
     "pp=2 x dp_replicate=2 does not divide the world size 2"),
    (dict(strategy=dict(type="fsdp", pp=3)), 2, "strategy.pp", "does not divide"),
    (dict(strategy=dict(type="fsdp", pp=2), model=dict(type="TinyBlocks"),
          custom_imports=dict(imports=["tests.hf_toy", "tests.toy"])), 2, "strategy.pp",
     "no pipeline plan"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_split=["blocks.1"]), model=dict(type="TinyBlocks"),
          custom_imports=dict(imports=["tests.hf_toy", "tests.toy"])), 2, "strategy.pp_split",
     "TinyBlocks is not a causal LM"),
    (dict(strategy=dict(type="fsdp", pp=2), model=GPT2_4), 2, "strategy.pp",
     "GPT2LMHeadModel has no pipeline plan drun can run (a Hugging Face decoder's"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_split=["transformer.layers.2"]), model=GPT2_4), 2,
     "strategy.pp_split", "GPT2LMHeadModel has no module 'transformer.layers.2'"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_split=["transformer.h.1"]), model=GPT2), 2,
     "strategy.pp_split", "GPT2LMHeadModel.transformer.drop drops with p > 0"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_split=["transformer.h.2"]), model={
        **GPT2_4, "config": {**GPT2_4["config"], "tie_word_embeddings": True}}), 2,
     "strategy.pp_split", "shares a weight between modules"),
    (dict(strategy=dict(type="fsdp", pp=2, tp=2, pp_split=["transformer.h.2"], tp_plan={
        "lm_head": "colwise"}), model=GPT2_4), 4,
     "strategy.pp_split", "tp > 1 splits the model's modules, which a traced graph no longer calls"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_schedule="Interleaved1F1B",
                        pp_split=["transformer.h.2"]), model=GPT2_4), 2, "strategy.pp_split",
     "2 stage(s) from 1 cut(s), but pp=2 x 2 stage(s) a rank needs 4"),
    (dict(strategy=dict(type="fsdp", pp=2), model={**LLAMA4, "config": {
        **LLAMA4["config"], "tie_word_embeddings": True}}), 2, "strategy.pp",
     "tie_word_embeddings"),
    (dict(strategy=dict(type="fsdp", pp=2, pp_stages_per_rank=4,
                        pp_schedule="Interleaved1F1B")), 2, "strategy.pp", "8 stages from 6"),
    (dict(strategy=dict(type="ddp", pp=2)), 2, "strategy.pp", "needs FSDP"),
    (dict(strategy=dict(type="fsdp", pp=2), model={**LLAMA4, "type": "tests.hf_llama.stepping_llama"}),
     2, "strategy.pp", "SteppingLlama.train_step runs forward and backward itself"),
    (dict(strategy=dict(type="fsdp", pp=2), custom_hooks=[dict(type="NonFiniteLossHook")]), 2,
     "custom_hooks", "NonFiniteLossHook is a step guard"),
    (dict(strategy=dict(type="fsdp", pp=2)), (2, 4), "launcher.num_workers",
     "an elastic group (min, max) cannot keep strategy.tp/dp_replicate/pp"),
])
def test_the_ray_driver_refuses_a_pipeline_that_cannot_run_in_one_line(
        tmp_path, change, workers, key, words):
    cfg = {**pp_cfg(tmp_path / "w", None), **change,
           "launcher": dict(type="ray", num_workers=workers)}
    with pytest.raises(ConfigError) as caught:
        validate_config(cfg)
    assert caught.value.key == key and words in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_traced_cut_passes_the_ray_drivers_checks_and_one_process_ignores_pp(tmp_path):
    """docs/how-to/pipeline-parallel.md's traced cut (a 24-layer GPT-2 on 4 workers): the
    driver checks it as the workers will and says where its stages start. A config with ``pp``
    that runs in one process trains the model whole, so the driver does not refuse what only
    stages cannot run (a model's own train_step)."""
    from tests.docs_blocks import docs_block

    page: dict = {}
    exec(docs_block("pipeline-traced"), page)
    cfg = {**pp_cfg(tmp_path / "w", None), **{k: page[k] for k in ("model", "strategy",
                                                                    "launcher")}}
    plan = validate_config(cfg)
    assert "pipeline stages, cut by tracing the forward, start at: input_ids | transformer.h.12" \
        in plan.lines["model"]
    assert plan.lines["mesh"] == ["pipeline: pp=2 stages over 4 ranks (1F1B, 8 micro-batches)"]
    stepping = {**pp_cfg(tmp_path / "w", None), "strategy": dict(type="fsdp", pp=2),
                "model": {**LLAMA4, "type": "tests.hf_llama.stepping_llama"},
                "launcher": dict(type="ray", num_workers=1)}
    assert not any("pipeline" in line for line in validate_config(stepping).lines["model"])


def test_the_pages_config_passes_the_ray_drivers_checks_and_shows_its_stages(tmp_path):
    """docs/how-to/pipeline-parallel.md's block (a 32-layer Llama on 4 workers), with the
    data of :func:`pp_cfg`: the driver builds it on the meta device and cuts it."""
    from tests.docs_blocks import docs_block

    page: dict = {}
    exec(docs_block("pipeline-config"), page)
    cfg = {**pp_cfg(tmp_path / "w", None),
           **{k: page[k] for k in ("model", "strategy", "launcher")}}
    plan = validate_config(cfg)
    assert plan.lines["mesh"] == ["pipeline: pp=2 stages over 4 ranks (1F1B, 8 micro-batches)"]
    assert "pipeline stages: model.embed_tokens .. model.layers.15 | model.layers.16 .. lm_head" \
        in plan.lines["model"]
    assert plan.lines["checkpoints"][0].startswith("full: the stages' weights gathered")
