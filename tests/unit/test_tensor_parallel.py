"""Tensor parallelism on a 2-D mesh (issue 38): a Hugging Face Llama built from its config, split
by transformers' own plan. With 4 local gloo processes, ``dp_shard=2 x tp=2`` and
``dp_replicate=2 x tp=2`` follow ``dp_shard=4`` iteration by iteration (the same global batch;
gradient clipping, EMA, SyncBuffers and activation checkpointing on), and the tp run's
sharded checkpoint ends in one process as it ends on the mesh. Each request that cannot hold is
one line before training."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers")

from distributed_runner.core.errors import ConfigError  # noqa: E402
from distributed_runner.model.sharding import check_shard_modules, parse_strategy  # noqa: E402
from distributed_runner.parallel.mesh import MeshShape  # noqa: E402
from tests.hf_llama import LLAMA, close, llama_cfg, logged  # noqa: E402
from tests.toy import free_port, gloo_rank  # noqa: E402

FSDP = dict(type="fsdp", shard_modules=["LlamaDecoderLayer"],
            activation_checkpointing=["LlamaDecoderLayer"])
MESHES = {  # name: (strategy, batch per rank): the global batch is 8 in each
    "dp_shard4": (FSDP, 2),
    "dp_shard2_tp2": ({**FSDP, "tp": 2}, 4),
    "dp_replicate2_tp2": ({**FSDP, "tp": 2, "dp_replicate": 2}, 4),
}


def _full(runner) -> dict:
    """The model's whole weights (every rank takes part in the gather)."""
    return {k: v.full_tensor() for k, v in runner.model.state_dict().items()}


def _mesh_runs(rank: int, port: int, out: str) -> None:
    from torch.distributed.tensor import Shard
    with gloo_rank(rank, port, world_size=4, hang_s=400):
        from distributed_runner import Runner
        from distributed_runner.core import dist
        for name, (strategy, batch) in MESHES.items():
            runner = Runner.from_cfg(llama_cfg(Path(out) / name, batch, strategy))
            runner.train()
            q = runner.model.model.layers[0].self_attn.q_proj.weight
            # the plan split q_proj's rows over tp, FSDP sharded it over the data-parallel ranks
            expect = {"dp_shard4": None, "dp_shard2_tp2": ("dp_shard", "tp"),
                      "dp_replicate2_tp2": ("dp_replicate", "dp_shard", "tp")}[name]
            if expect is None:
                assert q.device_mesh.ndim == 1
            else:
                assert q.device_mesh.mesh_dim_names == expect and q.placements[-1] == Shard(0)
            assert dist.get_data_parallel_world_size() == (4 if expect is None else 2)
            state = _full(runner)
            if rank == 0:
                torch.save(state, Path(out) / f"{name}.pt")
        # dp_shard=4's epoch-1 checkpoint resumed on the other mesh (DCP reshards it)
        strategy, batch = MESHES["dp_shard2_tp2"]
        runner = Runner.from_cfg(llama_cfg(Path(out) / "resharded", batch, strategy,
                                           resume=str(Path(out) / "dp_shard4" / "epoch_1.pth")))
        runner.train()
        state = _full(runner)
        if rank == 0:
            torch.save(state, Path(out) / "resharded.pt")


def _ema(path: Path) -> dict:
    return torch.load(path, weights_only=False)["ema_state_dict"]


@pytest.mark.slow("4 gloo processes train each mesh and reshard")
def test_dp_shard_x_tp_and_hsdp_x_tp_follow_dp_shard_4_and_reshard_both_ways(tmp_path):
    mp.spawn(_mesh_runs, args=(free_port(), str(tmp_path)), nprocs=4, join=True)
    reference = logged(tmp_path / "dp_shard4")
    print("dp_shard=4 losses", reference)
    assert len(reference) == 8  # 2 epochs of 4 iterations
    final = torch.load(tmp_path / "dp_shard4.pt")
    ema = _ema(tmp_path / "dp_shard4" / "epoch_2.pth")

    def same(state: dict, rtol: float = 1e-4) -> bool:
        return state.keys() == final.keys() and all(
            torch.allclose(state[k], final[k], rtol=rtol, atol=1e-5) for k in final)

    for name in ("dp_shard2_tp2", "dp_replicate2_tp2"):
        print(name, "losses", logged(tmp_path / name))
        assert close(logged(tmp_path / name), reference), (name, logged(tmp_path / name))
        assert close(logged(tmp_path / name, "grad_norm"), logged(tmp_path / "dp_shard4",
                                                                  "grad_norm"), 1e-3)
        assert same(torch.load(tmp_path / f"{name}.pt"))
        theirs = _ema(tmp_path / name / "epoch_2.pth")
        assert theirs.keys() == ema.keys() and all(
            torch.allclose(theirs[k], ema[k], rtol=1e-4, atol=1e-5) for k in ema)
    print("resharded dp_shard=4 -> dp_shard=2 x tp=2", logged(tmp_path / "resharded"))
    assert close(logged(tmp_path / "resharded"), reference[4:])
    assert same(torch.load(tmp_path / "resharded.pt"))

    # the tp run's epoch-1 sharded checkpoint, resumed by one process with the same config
    from distributed_runner import Runner
    one = tmp_path / "one_process"
    runner = Runner.from_cfg(llama_cfg(one, 8, MESHES["dp_shard2_tp2"][0],
                                       resume=str(tmp_path / "dp_shard2_tp2" / "epoch_1.pth")))
    runner.train()
    print("resumed in one process", logged(one))
    assert close(logged(one), reference[4:]), (logged(one), reference)
    assert same(runner.model.state_dict())

    # drun export reads the tp run's shards whole: from_pretrained gets the trained weights
    from transformers import AutoModelForCausalLM

    from distributed_runner.cli import main
    assert main(["export", str(tmp_path / "dp_shard2_tp2" / "epoch_2.pth"),
                 str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    assert same({k: exported[k] for k in final})


@pytest.mark.parametrize("strategy, fragment", [
    (dict(type="ddp", tp=2), "strategy.tp: tp needs FSDP"),
    (dict(type="fsdp", tp=0), "strategy.tp: got 0; takes an integer >= 1"),
    (dict(type="fsdp", tp_plan={"lm_head": "colwise"}), "strategy.tp_plan: is set but tp=1"),
    (dict(type="fsdp", tp=4), "num_key_value_heads=2"),
    (dict(type="fsdp", tp=2, tp_plan={"model.layers.*.self_attn.qproj": "colwise"}),
     "matches no module of LlamaForCausalLM (did you mean"),
    (dict(type="fsdp", tp=2, tp_plan={"lm_head": "colwize"}),
     "has style 'colwize', which is not supported (did you mean 'colwise'"),
    (dict(type="fsdp", tp=2, tp_plan={"model.layers.*.mlp": "rowwise"}),
     "names model.layers.0.mlp, a LlamaMLP; style 'rowwise' splits Linear modules only"),
    (dict(type="fsdp", tp=2, tp_plan={"model.layers.*.mlp.up_proj": "colwise",
                                      "model.layers.1.mlp.up_proj": "rowwise"}),
     "names model.layers.1.mlp.up_proj, which another entry splits as colwise"),
    (dict(type="fsdp", tp=2, tp_plan={"model.norm": "sequence_parallel"}),
     "sequence parallelism"),
])
def test_each_request_that_cannot_hold_is_one_line(strategy, fragment):
    from distributed_runner.core.registry import MODELS
    model = MODELS.build(LLAMA, "model")
    with pytest.raises(ConfigError) as caught:
        check_shard_modules(model, parse_strategy(strategy))
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_a_model_without_a_plan_and_a_tp_not_dividing_the_world_are_one_line():
    from tests.toy import ToyModel
    with pytest.raises(ConfigError, match="ToyModel has no tensor-parallel plan of its own"):
        check_shard_modules(ToyModel(), parse_strategy(dict(type="fsdp", tp=2)))
    with pytest.raises(ConfigError, match=r"strategy.tp: 2 does not divide the world size 3"):
        MeshShape.for_world(3, tp=2)
    with pytest.raises(ConfigError, match="strategy.dp_replicate: 2 does not divide the 3"):
        MeshShape.for_world(6, tp=2, dp_replicate=2)
    assert MeshShape.for_world(16, tp=4, dp_replicate=2) == MeshShape(2, 2, 4)


def test_the_ray_driver_checks_the_mesh_against_the_workers_before_any_starts(tmp_path):
    from distributed_runner.launch.launcher_config import validate_config
    tp = dict(type="fsdp", tp=2)
    cfg = llama_cfg(tmp_path, 8, tp, launcher=dict(type="ray", num_workers=3))
    with pytest.raises(ConfigError, match="strategy.tp: 2 does not divide the world size 3"):
        validate_config(cfg)
    cfg["launcher"]["num_workers"] = (2, 4)
    with pytest.raises(ConfigError, match=r"launcher.num_workers: an elastic group"):
        validate_config(cfg)
    cfg["launcher"]["num_workers"] = 4
    validate_config(cfg)  # 2 replicas of a 2-way split
    for launcher in ("ray", "none", None):  # as drun tune's trials and the CLI give it
        validate_config({**cfg, "launcher": launcher})
    cfg["train_dataloader"] = dict(type="RayDataLoader", batch_size=8)
    with pytest.raises(ConfigError, match="train_dataloader.type: RayDataLoader gives each"):
        validate_config(cfg)


def test_a_windows_gradients_saved_on_another_mesh_are_not_forced_onto_this_one():
    """A checkpoint inside an accumulation window holds each rank's gradient parts; parts
    shaped for another mesh (or strategy) are refused as a whole, by name, never assigned."""
    from distributed_runner.checkpoint.parts import saved_mesh
    from distributed_runner.optim.wrapper import OptimWrapper
    model = torch.nn.Linear(4, 2)
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    misfit = {"weight": torch.ones(1, 4), "bias": torch.ones(2)}
    assert wrapper.restore_pending_grads(model, misfit) == ["weight"]
    assert model.weight.grad is None and model.bias.grad is None
    assert wrapper.restore_pending_grads(model, {"weight": torch.ones(2, 4)}) == []
    assert torch.equal(model.weight.grad, torch.ones(2, 4))
    assert saved_mesh({"world_size": 4}) == [1, 4, 1]  # written before meshes were recorded
    assert saved_mesh({"world_size": 4, "mesh": [2, 1, 2]}) == [2, 1, 2]


def test_the_docs_strategy_fits_a_llama_and_the_memory_table_is_what_its_code_prints(capsys):
    from distributed_runner.core.registry import MODELS
    from tests.docs_blocks import ROOT, docs_block
    namespace: dict = {}
    exec(docs_block("tp-strategy"), namespace)
    strategy = parse_strategy(namespace["strategy"])
    check_shard_modules(MODELS.build(LLAMA, "model"), strategy)
    assert MeshShape.for_world(8, strategy["tp"]) == MeshShape(1, 4, 2)

    exec(docs_block("mesh-memory"), {})
    printed = capsys.readouterr().out.strip().splitlines()
    page = (ROOT / "docs" / "how-to" / "tensor-parallel.md").read_text()
    table = page.split("<!-- mesh-memory-table -->\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert printed == table and len(table) == 8


def _pretrained_rank(rank: int, folder: str, out: str) -> None:
    from distributed_runner import Runner
    from tests.unit.test_hf_pretrained import cfg, tensors
    runner = Runner.from_cfg(cfg(Path(out), folder, lr=0.0, strategy=dict(
        type="fsdp", tp=2, shard_modules=["LlamaDecoderLayer"], checkpoint="full")))
    q = runner.model.model.layers[0].self_attn.q_proj.weight
    assert q.device_mesh.mesh_dim_names == ("dp_shard", "tp")
    assert q.to_local().shape[0] == q.shape[0] // 2  # this rank's half of the heads
    runner.train()
    state = {k: v.full_tensor() for k, v in runner.model.state_dict().items()}
    source = tensors(Path(folder))
    assert state.keys() == source.keys()
    assert all(torch.equal(state[k], source[k]) for k in source)
    # checkpoint='full' gathers the 2-D shards into one plain file
    saved = torch.load(Path(out) / "iter_4.pth", weights_only=True)["state_dict"]
    assert all(torch.equal(saved[k], source[k]) for k in source)


def _both_ranks(rank: int, port: int, folder: str, out: str) -> None:
    """The two 2-rank bodies below in one process group: one spawn of 2 processes (each imports
    torch and transformers) for both tests (issue 47)."""
    with gloo_rank(rank, port):
        _pretrained_rank(rank, folder, str(Path(out) / "pretrained"))
        _qwen3_rank(rank, str(Path(out) / "qwen3"))


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """Where both bodies ran: ``pretrained/`` (a saved Llama loaded into split layers) and
    ``qwen3/tp`` (Qwen3 under its own plan); a body's failed assert fails both tests."""
    from tools.make_tiny_llama import make
    out = tmp_path_factory.mktemp("tp_two_ranks")
    folder = make(out / "llama", hidden=64, layers=2, heads=4, shard="60KB", seed=0)
    mp.spawn(_both_ranks, args=(free_port(), str(folder), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.slow("2 gloo processes load a saved model into split layers")
def test_load_from_a_model_directory_fills_the_split_layers_exactly(two_ranks):
    """A sharded save_pretrained Llama as load_from under tp=2 (built empty, split, then each
    rank reads its slices): trained with lr=0 it is tensor for tensor the files, and so is its
    full (gathered, one-file) checkpoint (asserted on each rank, in _pretrained_rank)."""
    assert (two_ranks / "pretrained" / "iter_4.pth").is_file()


QWEN3 = dict(type="transformers.Qwen3ForCausalLM",
             config=dict(type="transformers.Qwen3Config", vocab_size=64, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8, max_position_embeddings=16,
                         tie_word_embeddings=False))


def _qwen3_rank(rank: int, out: str) -> None:
    from distributed_runner import Runner
    runner = Runner.from_cfg(llama_cfg(Path(out) / "tp", 8, dict(type="fsdp", tp=2),
                                       model=QWEN3, custom_hooks=[]))
    runner.train()
    # a sampler splitting over the world, not the groups, would feed a group two batches
    from distributed_runner.data.loaders import build_dataloader
    with pytest.raises(ConfigError, match="train_dataloader.sampler: DistributedSampler "
                                          "splits the data over 2 ranks"):
        build_dataloader(dict(dataset=dict(type="HFToyTokens", n=8), batch_size=2,
                              sampler=dict(type="DistributedSampler")),
                         "train_dataloader", 0)
    q_norm = runner.model.model.layers[0].self_attn.q_norm.weight.full_tensor()
    theirs = [torch.empty_like(q_norm), torch.empty_like(q_norm)]
    torch.distributed.all_gather(theirs, q_norm)
    assert torch.equal(theirs[0], theirs[1])  # the partial gradients were summed
    state = {k: v.full_tensor() for k, v in runner.model.state_dict().items()}
    if rank == 0:
        torch.save(state, Path(out) / "tp.pt")


@pytest.mark.slow("a Qwen3 on 2 gloo processes beside one process")
def test_qwen3s_own_plan_sums_the_per_head_norms_gradients_and_follows_one_process(two_ranks,
                                                                                   tmp_path):
    """Qwen3's plan has q_norm/k_norm 'replicated_with_grad_allreduce': whole on every rank,
    but each sees only its rank's heads, so their gradients are summed over the group."""
    from distributed_runner import Runner
    one = Runner.from_cfg(llama_cfg(tmp_path / "one", 8, model=QWEN3, custom_hooks=[]))
    one.train()
    ranks = two_ranks / "qwen3"  # where the 2 ranks ran: tp/ and tp.pt
    print("one process", logged(tmp_path / "one"), "\ntp=2", logged(ranks / "tp"))
    assert close(logged(ranks / "tp"), logged(tmp_path / "one"))
    split, whole = torch.load(ranks / "tp.pt"), one.model.state_dict()
    assert all(torch.allclose(split[k], whole[k], rtol=1e-4, atol=1e-5) for k in whole)


def test_a_style_of_the_models_own_plan_that_is_not_supported_is_one_line():
    """A model that brings a plan (as transformers' models do) with a style not supported
    here (transformers' packed_colwise, for fused gate/up projections): the error names
    strategy.tp and says how to choose the entries."""
    class Fused(torch.nn.Module):
        tp_plan = {"gate_up": "packed_colwise", "down": "rowwise"}

        def __init__(self):
            super().__init__()
            self.gate_up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(16, 8)

    with pytest.raises(ConfigError) as caught:
        check_shard_modules(Fused(), parse_strategy(dict(type="fsdp", tp=2)))
    text = str(caught.value)
    assert text.startswith("strategy.tp: the model's own plan entry 'gate_up' has style "
                           "'packed_colwise', which is not supported")
    assert "give strategy.tp_plan=dict(...)" in text and "\n" not in text
