"""``strategy=dict(..., activation_checkpointing=[...])``: the named blocks' activations are
recomputed in backward. Training is bit-for-bit what it is without (the recomputation replays
the same operations on the same inputs, dropout's random state restored), the checkpoint keys do
not change (a checkpoint loads across), fewer bytes are kept for backward, and it works with
DDP, FSDP (one process and 2 gloo processes), compile, EMA's copy and a Hugging Face GPT-2."""
import copy
import json

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.activation_checkpointing import SavedBytes
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.activation_checkpointing import (
    apply_activation_checkpointing,
    is_recomputed,
)
from distributed_runner.model.sharding import parse_strategy
from tests.toy import TinyBlocks, ToyGPT, free_port, gloo_rank

ITERS = 4
MODELS = {"TinyBlocks": dict(dataset=dict(type="ToyDataset", n=32)),
          "ToyGPT": dict(dataset=dict(type="ToyTokens", n=32))}


def cfg(work_dir, strategy, model="TinyBlocks", **extra):
    """``ITERS`` iterations of ``model`` (a TinyBlocks/ToyGPT name or a config), a checkpoint
    every 2."""
    data = MODELS.get(model if isinstance(model, str) else "", extra.pop("data", None))
    return dict(
        work_dir=str(work_dir), run_name=".", model=dict(type=model) if isinstance(model, str) else model,
        strategy=strategy,
        train_dataloader=dict(**data, batch_size=4,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=False, max_iters=ITERS),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False),
                           logger=dict(type="LoggerHook", interval=2, sinks=["jsonl"])),
        randomness=dict(seed=0), log_level="WARNING", **extra)


def trained(work_dir, strategy, model="TinyBlocks", **extra):
    """On the CPU also where a GPU is present: these runs are compared bit for bit (and the
    2-process ones run gloo)."""
    from distributed_runner import Runner
    runner = Runner.from_cfg(cfg(work_dir, strategy, model, **{"device": "cpu", **extra}))
    runner.train()
    return runner


def weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def assert_equal_states(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_the_option_is_parsed_for_ddp_and_fsdp():
    assert parse_strategy(dict(type="ddp", activation_checkpointing="Block")) == dict(
        type="ddp", activation_checkpointing=["Block"])
    assert parse_strategy(None) == dict(type="ddp", activation_checkpointing=[])
    fsdp = parse_strategy(dict(type="fsdp", shard_modules=["Block"],
                               activation_checkpointing=["Block"]))
    assert fsdp["activation_checkpointing"] == ["Block"] and fsdp["shard_modules"] == ["Block"]


@pytest.mark.parametrize("spec, key, says", [
    (dict(type="ddp", activation_checkpoint=["Block"]), "strategy.activation_checkpoint",
     "did you mean 'activation_checkpointing'"),
    (dict(type="ddp", activation_checkpointing=3), "strategy.activation_checkpointing",
     "takes a list of module class names"),
    (dict(type="fsdp", activation_checkpointing=[1]), "strategy.activation_checkpointing",
     "takes a list of module class names"),
    (dict(type="ddp", shard_modules=["Block"]), "strategy.shard_modules", "model_wrapper_cfg"),
])
def test_a_wrong_option_is_one_line_naming_the_key(spec, key, says):
    with pytest.raises(ConfigError) as err:
        parse_strategy(spec)
    assert err.value.key == key and says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kind", ["ddp", "fsdp"])
def test_a_misspelled_class_is_one_line_before_training(tmp_path, kind):
    from distributed_runner import Runner
    with pytest.raises(ConfigError) as err:
        Runner.from_cfg(cfg(tmp_path, dict(type=kind, activation_checkpointing=["Blok"])))
    assert err.value.key == "strategy.activation_checkpointing"
    assert "no module of class 'Blok' (did you mean 'Block'" in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model", ["TinyBlocks", "ToyGPT"])
@pytest.mark.parametrize("kind", ["ddp", "fsdp"])  # one process: FSDP trains the model whole
def test_training_is_bit_for_bit_the_same_and_the_keys_stay(tmp_path, model, kind):
    plain = trained(tmp_path / "plain", dict(type=kind), model)
    recomputed = trained(tmp_path / "ac", dict(type=kind, activation_checkpointing=["Block"]),
                         model)
    blocks = [n for n, m in recomputed.model.named_modules() if is_recomputed(m)]
    assert blocks == [n for n, m in plain.model.named_modules() if type(m).__name__ == "Block"]
    assert blocks and not any(is_recomputed(m) for m in plain.model.modules())
    assert [n for n, _ in plain.model.named_modules()] == \
        [n for n, _ in recomputed.model.named_modules()]
    assert_equal_states(plain.model.state_dict(), recomputed.model.state_dict())
    assert_equal_states(weights(tmp_path / "plain" / f"iter_{ITERS}.pth"),
                        weights(tmp_path / "ac" / f"iter_{ITERS}.pth"))


def test_a_checkpoint_resumes_across_with_and_without(tmp_path):
    """Saved with it, resumed without it (and the reverse): the run ends where the run that
    never switched ends."""
    on = dict(type="ddp", activation_checkpointing=["Block"])
    trained(tmp_path / "on", on, "ToyGPT")
    trained(tmp_path / "off", "ddp", "ToyGPT")
    trained(tmp_path / "on_then_off", "ddp", "ToyGPT", resume=str(tmp_path / "on/iter_2.pth"))
    trained(tmp_path / "off_then_on", on, "ToyGPT", resume=str(tmp_path / "off/iter_2.pth"))
    final = weights(tmp_path / "on" / f"iter_{ITERS}.pth")
    middle = weights(tmp_path / "on" / "iter_2.pth")
    assert not any(torch.equal(final[k], middle[k]) for k in final if "weight" in k)  # trained
    for run in ("off", "on_then_off", "off_then_on"):
        assert_equal_states(final, weights(tmp_path / run / f"iter_{ITERS}.pth"))


def test_the_blocks_run_twice_in_training_and_once_in_evaluation(monkeypatch):
    calls = []
    forward = TinyBlocks.Block.forward
    monkeypatch.setattr(TinyBlocks.Block, "forward",
                        lambda self, x: calls.append(1) or forward(self, x))
    model = TinyBlocks()
    apply_activation_checkpointing(model, ["Block"])
    model(torch.randn(3, 4)).sum().backward()
    assert len(calls) == 4  # 2 blocks: forward, then recomputed in backward
    calls.clear()
    with torch.no_grad():
        model(torch.randn(3, 4))
    model.eval()
    model(torch.randn(3, 4)).sum().backward()
    assert len(calls) == 4  # no recomputation: under no_grad, and in eval mode


def saved_bytes(model, tokens) -> int:
    with SavedBytes(model) as saved:
        loss = model(tokens, mode="loss")["loss"]
    loss.backward()
    return saved.total


def test_fewer_bytes_are_saved_for_backward():
    torch.manual_seed(0)
    plain = ToyGPT(context=64, width=64, layers=4)
    recomputed = copy.deepcopy(plain)
    apply_activation_checkpointing(recomputed, ["Block"])
    tokens = torch.randint(0, 64, (8, 65))
    without, with_ = saved_bytes(plain, tokens), saved_bytes(recomputed, tokens)
    # measured: 8.4 MiB without, 0.9 MiB with (each of the 4 blocks keeps its input, 128 KiB,
    # instead of the ~2.1 MiB it computes inside; the embeddings, head and loss save as before)
    assert with_ < 0.2 * without
    assert all(p.grad is not None for p in recomputed.parameters())


def test_emas_copy_recomputes_its_own_blocks():
    model = TinyBlocks()
    apply_activation_checkpointing(model, ["Block"])
    twin = copy.deepcopy(model)
    for block, copied in zip(model.blocks, twin.blocks):
        assert is_recomputed(copied) and copied.forward.__self__ is copied
    with torch.no_grad():
        for p in twin.parameters():
            p.add_(1.0)
    x = torch.randn(3, 4)
    assert not torch.equal(model(x), twin(x))  # the copy runs with its own weights


@pytest.mark.timeout(600)
@pytest.mark.slow("torch.compile (inductor) of the model, with and without it")
def test_compiled_training_with_it_matches_compiled_training_without(tmp_path):
    plain = trained(tmp_path / "plain", "ddp", "ToyGPT", compile=True)
    recomputed = trained(tmp_path / "ac", dict(type="ddp", activation_checkpointing=["Block"]),
                         "ToyGPT", compile=True)
    assert type(recomputed.wrapped_model).__name__ == "OptimizedModule"
    a, b = plain.model.state_dict(), recomputed.model.state_dict()
    assert a.keys() == b.keys()
    # measured equal (torch 2.13, CPU inductor); a tolerance, as inductor may fuse the
    # recomputed graph differently on another version or device
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_hugging_face_gpt2_recomputes_without_filling_its_cache_twice():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    plain = transformers.GPT2LMHeadModel(config).train()
    recomputed = copy.deepcopy(plain)
    assert apply_activation_checkpointing(recomputed, ["GPT2Block"]) == ["transformer.h.0",
                                                                        "transformer.h.1"]
    ids = torch.randint(0, 64, (2, 16))
    outputs = []
    for model in (plain, recomputed):
        torch.manual_seed(1)  # dropout (0.1 by default): recomputed with the same masks
        outputs.append(model(input_ids=ids, labels=ids))
        outputs[-1].loss.backward()
    for p, q in zip(plain.parameters(), recomputed.parameters()):
        assert torch.equal(p.grad, q.grad)
    assert plain.state_dict().keys() == recomputed.state_dict().keys()
    # the recomputed blocks train without a key/value cache (a replay would append to it)
    assert kv_cache(outputs[1]) is None or kv_cache(outputs[1]).get_seq_length() == 0
    recomputed.eval()
    with torch.no_grad():  # evaluation keeps its cache
        assert kv_cache(recomputed(input_ids=ids, use_cache=True)).get_seq_length() == 16


def kv_cache(output):
    """The key/value cache of a Hugging Face output (``cache`` since transformers 5.24,
    ``past_key_values`` before)."""
    return getattr(output, "cache", None) or getattr(output, "past_key_values", None)


def test_a_hugging_face_gpt2_config_trains_with_it(tmp_path):
    pytest.importorskip("transformers")
    from tests.hf_toy import GPT2
    data = dict(dataset=dict(type="HFToyTokens", n=32))
    plain = trained(tmp_path / "plain", "ddp", GPT2, data=data)
    recomputed = trained(tmp_path / "ac", dict(type="ddp", activation_checkpointing=["GPT2Block"]),
                         GPT2, data=data)
    assert sum(is_recomputed(m) for m in recomputed.model.modules()) == 2
    assert_equal_states(plain.model.state_dict(), recomputed.model.state_dict())


FSDP_AC = dict(type="fsdp", shard_modules=["Block"], activation_checkpointing=["Block"],
               checkpoint="full")


def _worker(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port):
        import tests.toy  # noqa: F401  (registers ToyTokens and ToyGPT)
        from distributed_runner.model.sharding import is_sharded
        facts = {}
        for name, strategy in (("ddp", "ddp"), ("fsdp", dict(FSDP_AC, activation_checkpointing=[])),
                               ("fsdp_ac", FSDP_AC),
                               ("ddp_ac", dict(type="ddp", activation_checkpointing=["Block"]))):
            runner = trained(f"{out}/{name}", strategy, "ToyGPT")
            facts[name] = dict(
                sharded=[n for n, m in runner.model.named_modules() if is_sharded(m)],
                recomputed=[n for n, m in runner.model.named_modules() if is_recomputed(m)])
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(facts, f)


@pytest.mark.timeout(300)
@pytest.mark.slow("FSDP on 2 gloo processes, with and without")
def test_fsdp_with_it_on_2_processes_trains_as_without(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    facts = json.loads((tmp_path / "rank0.json").read_text())
    assert facts["fsdp_ac"]["sharded"] == ["", "blocks.0", "blocks.1"]
    assert facts["fsdp_ac"]["recomputed"] == ["blocks.0", "blocks.1"] == \
        facts["ddp_ac"]["recomputed"]
    final = {run: weights(tmp_path / run / f"iter_{ITERS}.pth") for run in facts}
    assert_equal_states(final["fsdp"], final["fsdp_ac"])  # the same operations, recomputed
    assert_equal_states(final["ddp"], final["ddp_ac"])
    for k, v in final["ddp"].items():  # FSDP sums in another order than DDP: within 1e-5
        torch.testing.assert_close(final["fsdp_ac"][k], v, rtol=1e-5, atol=1e-6, msg=k)
