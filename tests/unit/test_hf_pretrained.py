"""Pretrained weights in, a servable model out (issue 37): a Llama written by
``save_pretrained`` (tools/make_tiny_llama.py: sharded safetensors, a tokenizer) as ``load_from``,
plain, under FSDP on 2 gloo ranks and under PEFT's LoRA; ``drun export --format hf`` back to a
directory ``from_pretrained`` reads, checked tensor for tensor against the source and against
PEFT's own ``merge_and_unload``; the errors a wrong directory gives."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("transformers")

import tests.hf_toy  # noqa: F401,E402  (HFToyTokens)
from distributed_runner import Runner  # noqa: E402
from distributed_runner.cli import main  # noqa: E402
from distributed_runner.core.errors import ConfigError  # noqa: E402
from tests.toy import free_port, gloo_rank  # noqa: E402
from tools.make_tiny_llama import make  # noqa: E402


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    """A 2-layer Llama (untied head) in 4 safetensors shards with their index and a tokenizer."""
    out = tmp_path_factory.mktemp("pretrained") / "tiny_llama"
    make(out, hidden=64, layers=2, heads=4, shard="60KB", seed=0)
    assert len(list(out.glob("model-*.safetensors"))) > 1 and (out / "tokenizer.json").is_file()
    return out


def llama_model(folder) -> dict:
    return dict(type="transformers.AutoModelForCausalLM.from_config",
                config=dict(type="transformers.AutoConfig.from_pretrained",
                            pretrained_model_name_or_path=str(folder)))


def lora(model: dict) -> dict:
    return dict(type="peft.get_peft_model", model=model,
                peft_config=dict(type="peft.LoraConfig", r=4, lora_alpha=8,
                                 target_modules=["q_proj", "v_proj"]))


def cfg(work_dir, folder, lr=0.01, model=None, iters=4, **extra) -> dict:
    return {**dict(work_dir=str(work_dir), run_name=".", log_level="WARNING",
                model=model or llama_model(folder), load_from=str(folder),
                train_cfg=dict(by_epoch=False, max_iters=iters),
                optim_wrapper=dict(optimizer=dict(type="SGD", lr=lr)),
                train_dataloader=dict(dataset=dict(type="HFToyTokens", n=16), batch_size=4,
                                      sampler=dict(type="DefaultSampler", shuffle=True)),
                default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=iters,
                                                   by_epoch=False))), **extra}


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory's safetensors files, by name."""
    from safetensors.torch import load_file
    out: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def export(*args) -> Path:
    assert main(["export", *map(str, args)]) == 0
    return Path(args[1])


def test_loaded_with_lr_0_and_exported_is_tensor_for_tensor_the_source(llama, tmp_path):
    Runner.from_cfg(cfg(tmp_path / "run", llama, lr=0.0)).train()
    out = export(tmp_path / "run" / "iter_4.pth", tmp_path / "out", "--max-shard-size", "60KB")
    source, exported = tensors(llama), tensors(out)
    assert exported.keys() == source.keys()
    assert all(torch.equal(exported[k], source[k]) and exported[k].dtype == source[k].dtype
               for k in source)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(source) and len(set(index["weight_map"].values())) > 1
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (llama / name).read_bytes()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert AutoTokenizer.from_pretrained(out)("hi")["input_ids"] == list(b"hi")
    # and the export is a load_from in its turn, unchanged; bfloat16 too, as bf16 values
    again = Runner.from_cfg(cfg(tmp_path / "again", out)).model.state_dict()
    assert all(torch.equal(again[k], source[k]) for k in source)
    half = tensors(export(tmp_path / "run" / "iter_4.pth", tmp_path / "bf16", "--dtype",
                          "bfloat16"))
    assert all(half[k].dtype == torch.bfloat16 and torch.equal(half[k], source[k].bfloat16())
               for k in source)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def _fsdp_rank(rank: int, port: int, folder: str, out: str) -> None:
    with gloo_rank(rank, port):
        from distributed_runner.model.sharding import full_model_state, local_tensor
        strategy = dict(type="fsdp", shard_modules=["LlamaDecoderLayer"])
        runner = Runner.from_cfg(cfg(out, folder, lr=0.0, strategy=strategy))
        local = {k: local_tensor(p).numel() for k, p in runner.model.named_parameters()}
        full = full_model_state(runner.model)
        runner.train()  # lr=0: the sharded checkpoint holds what was loaded
        lora_cfg = cfg(f"{out}/lora", folder, model=lora(llama_model(folder)),
                       strategy=strategy)  # LoRA under FSDP, its shards without the base
        lora_cfg["default_hooks"]["checkpoint"]["save_frozen_weights"] = False
        adapted = Runner.from_cfg(lora_cfg)
        lora_before = full_model_state(adapted.model)
        adapted.train()
        lora_after = full_model_state(adapted.model)
        ddp = Runner.from_cfg(cfg(f"{out}/ddp", folder, strategy="ddp"))  # replicas, each whole
        ddp_state = {k: v.clone() for k, v in ddp.model.state_dict().items()}
        if rank == 0:
            changed = sorted(k for k in lora_before
                             if not torch.equal(lora_before[k], lora_after[k]))
            torch.save({"local": local, "full": full, "lora_changed": changed,
                        "lora_keys": sorted(lora_before), "ddp": ddp_state,
                        "ddp_wrapped": type(ddp.wrapped_model).__name__}, f"{out}/rank0.pt")


@pytest.mark.slow("FSDP and DDP gloo processes load and export")
def test_fsdp_and_ddp_ranks_load_and_a_sharded_checkpoint_exports_whole(llama, tmp_path):
    mp.spawn(_fsdp_rank, args=(free_port(), str(llama), str(tmp_path)), nprocs=2, join=True)
    seen = torch.load(tmp_path / "rank0.pt", weights_only=True)
    source = tensors(llama)
    assert seen["full"].keys() == source.keys()
    assert all(torch.equal(seen["full"][k], source[k]) for k in source)
    # each rank holds half of every weight (FSDP2 shards dim 0; all dims here are even)
    assert all(seen["local"][k] * 2 == source[k].numel() for k in source)
    assert seen["lora_changed"] == [k for k in seen["lora_keys"] if "lora_" in k]
    assert seen["ddp_wrapped"] == "DistributedDataParallel"
    assert all(torch.equal(seen["ddp"][k], source[k]) for k in source)
    manifest = tmp_path / "iter_4.pth"
    assert "sharded" in torch.load(manifest, weights_only=False)
    exported = tensors(export(manifest, tmp_path / "out"))
    assert exported.keys() == source.keys()
    assert all(torch.equal(exported[k], source[k]) for k in source)
    lora_manifest = torch.load(tmp_path / "lora" / "iter_4.pth", weights_only=False)
    assert lora_manifest["sharded"]["weights"] == "trainable"
    merged = tensors(export(tmp_path / "lora", tmp_path / "lora_out", "--merge-adapters"))
    assert merged.keys() == source.keys()
    assert {k for k in source if not torch.equal(merged[k], source[k])} == \
        {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qv"}


def test_lora_trains_only_adapters_and_its_merged_export_is_peft_merge_and_unload(llama,
                                                                                  tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    runner = Runner.from_cfg(cfg(tmp_path, llama, model=lora(llama_model(llama)),
                                 optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01))))
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    assert all(not v.any() for k, v in before.items() if "lora_B" in k)  # starts as the base
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
            for k, v in before.items() if "lora_" not in k}
    assert base.keys() == tensors(llama).keys()
    assert all(torch.equal(base[k], v) for k, v in tensors(llama).items())
    runner.train()
    after = runner.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {k for k in before if "lora_" in k}  # 2 layers x q, v x A, B
    merged = export(tmp_path / "iter_4.pth", tmp_path / "merged", "--merge-adapters")
    adapters = export(tmp_path / "iter_4.pth", tmp_path / "adapters")
    assert {p.name for p in adapters.glob("adapter_*")} == {"adapter_config.json",
                                                            "adapter_model.safetensors"}
    peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(llama), adapters)
    ids = torch.arange(32).view(2, 16)
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(merged)(input_ids=ids).logits
        theirs = peft.merge_and_unload()(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    assert not torch.allclose(ours, AutoModelForCausalLM.from_pretrained(llama)(
        input_ids=ids).logits, atol=1e-3)  # the adapters did change the model


def _rewrite(folder: Path, out: Path, change) -> Path:
    """A copy of ``folder`` whose tensors went through ``change`` (one file, no index)."""
    from safetensors.torch import save_file
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    save_file(change(tensors(folder)), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_a_missing_unexpected_or_misshaped_tensor_is_one_line_naming_it(llama, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"
    lacking = _rewrite(llama, tmp_path / "lacking", lambda t: {k: v for k, v in t.items()
                                                              if k != name})
    with pytest.raises(ConfigError, match=rf"^load_from: {lacking} has no tensor for {name}: "):
        Runner.from_cfg(cfg(tmp_path / "a", lacking))
    bent = _rewrite(llama, tmp_path / "bent", lambda t: {**t, name: t[name][:-1]})
    with pytest.raises(ConfigError, match=rf"^load_from: {bent}: {name} is \[159, 64\] in the "
                                          rf"files, \[160, 64\] in the model"):
        Runner.from_cfg(cfg(tmp_path / "b", bent))
    extra = _rewrite(llama, tmp_path / "extra", lambda t: {**t, "score.weight": t[name].clone()})
    with pytest.raises(ConfigError, match=r"holds score.weight, which the model has no place"):
        Runner.from_cfg(cfg(tmp_path / "c", extra))
    for case in (lacking, bent, extra):
        try:
            Runner.from_cfg(cfg(tmp_path / "d", case))
        except ConfigError as e:
            assert "\n" not in str(e)
    with pytest.raises(ConfigError, match=r"^load_from: got 3; takes a path or dict"):
        Runner.from_cfg(cfg(tmp_path / "e", llama, load_from=3))


def test_strict_false_initialises_a_new_head_as_from_pretrained_does(llama, tmp_path):
    from transformers import AutoModelForSequenceClassification
    model = dict(type="transformers.LlamaForSequenceClassification",
                 config=dict(type="transformers.AutoConfig.from_pretrained",
                             pretrained_model_name_or_path=str(llama), num_labels=3))
    with pytest.raises(ConfigError, match="has no tensor for score.weight"):
        Runner.from_cfg(cfg(tmp_path / "a", llama, model=model))
    ours = Runner.from_cfg(cfg(tmp_path / "b", llama, model=model,
                               load_from=dict(path=str(llama), strict=False))).model
    theirs = AutoModelForSequenceClassification.from_pretrained(llama, num_labels=3)
    body = {k: v for k, v in theirs.state_dict().items() if not k.startswith("score")}
    assert all(torch.equal(ours.state_dict()[k], v) for k, v in body.items())
    head = ours.score.weight  # initialised (transformers' _init_weights), not left empty
    assert torch.isfinite(head).all() and 0.005 < head.std().item() < 0.05


def test_a_lora_run_resumed_midway_ends_as_the_uninterrupted_one(llama, tmp_path):
    def run(work_dir, **extra):
        config = cfg(work_dir, llama, model=lora(llama_model(llama)), iters=6,
                     optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)), **extra)
        config["default_hooks"]["checkpoint"]["interval"] = 3
        return Runner.from_cfg(config)
    straight = run(tmp_path / "straight")
    straight.train()
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "straight" / "iter_3.pth"))
    resumed.train()
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_tied_embeddings_are_loaded_once_and_exported_once(tmp_path):
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    source = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                               n_positions=32)).save_pretrained(source)
    assert "lm_head.weight" not in tensors(source)  # save_pretrained stores the tie once
    model = dict(type="transformers.AutoModelForCausalLM.from_config",
                 config=dict(type="transformers.AutoConfig.from_pretrained",
                             pretrained_model_name_or_path=str(source)))
    runner = Runner.from_cfg(cfg(tmp_path / "run", source, model=model, lr=0.0))
    assert runner.model.lm_head.weight is runner.model.transformer.wte.weight
    runner.train()
    out = export(tmp_path / "run" / "iter_4.pth", tmp_path / "out")
    assert tensors(out).keys() == tensors(source).keys()
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert torch.equal(loaded.lm_head.weight, tensors(source)["transformer.wte.weight"])


def test_checkpoints_without_the_frozen_base_resume_exactly_and_export_whole(llama, tmp_path):
    """``save_frozen_weights=False``: a LoRA checkpoint holds the adapters (and what else
    trains), the frozen base comes back from load_from's directory, on resume and on export."""
    def run(work_dir, **extra):
        config = cfg(work_dir, llama, model=lora(llama_model(llama)), iters=6,
                     optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
                     randomness=dict(seed=0), **extra)
        config["default_hooks"]["checkpoint"].update(interval=3, save_frozen_weights=False)
        return Runner.from_cfg(config)
    straight = run(tmp_path / "straight")
    straight.train()
    saved = torch.load(tmp_path / "straight" / "iter_3.pth", weights_only=False)
    assert saved["meta"]["weights"] == "trainable"
    assert saved["state_dict"] and all("lora_" in k for k in saved["state_dict"])
    full = tmp_path / "full"
    Runner.from_cfg({**cfg(full, llama, model=lora(llama_model(llama)), iters=3,
                          optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
                          randomness=dict(seed=0))}).train()
    assert (tmp_path / "straight" / "iter_3.pth").stat().st_size * 5 < \
        (full / "iter_3.pth").stat().st_size
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "straight" / "iter_3.pth"))
    resumed.train()
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    merged = tensors(export(tmp_path / "straight" / "iter_6.pth", tmp_path / "m",
                            "--merge-adapters"))
    whole = tensors(export(full / "iter_3.pth", tmp_path / "w", "--merge-adapters"))
    assert merged.keys() == whole.keys() == tensors(llama).keys()
    with pytest.raises(ConfigError, match=r"save_frozen_weights: False needs load_from=<a model "
                                          r"directory>"):
        run(tmp_path / "no_base", load_from=None).train()


def test_a_folder_that_is_no_model_directory_is_one_line(tmp_path):
    (tmp_path / "weights").mkdir()
    with pytest.raises(ConfigError, match=r"^load_from: .*/weights is a folder but neither a "
                                          r"checkpoint nor a model directory \(config.json"):
        Runner.from_cfg(cfg(tmp_path / "run", tmp_path / "weights"))


def test_the_ray_driver_makes_weight_paths_absolute_and_knows_a_remote_one(tmp_path,
                                                                           monkeypatch):
    from distributed_runner.checkpoint.hf.directory import weight_sources_absolute
    monkeypatch.chdir(tmp_path)
    plain = dict(load_from="models/llama", model=dict(type="HFModel", path="models/llama"))
    assert weight_sources_absolute(plain) is False
    assert plain["load_from"] == plain["model"]["path"] == str(tmp_path / "models" / "llama")
    remote = dict(load_from=dict(path="s3://b/llama", strict=False))
    assert weight_sources_absolute(remote) is True and remote["load_from"]["path"] == "s3://b/llama"


def test_lora_with_modules_to_save_and_biases_loads_both_copies_and_merges_as_peft(tmp_path):
    """Review findings: PEFT's ``modules_to_save`` keeps the original module and its trained
    copy, both from one file tensor; a LoRA layer with a bias (GPT-2's Conv1D ``c_attn``,
    fan_in_fan_out) merges into its weight only."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    source = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                               resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
                    ).save_pretrained(source)
    files = tensors(source)
    model = dict(type="peft.get_peft_model", model=dict(type="HFModel", path=str(source)),
                 peft_config=dict(type="peft.LoraConfig", r=4, lora_alpha=8,
                                  target_modules=["c_attn"], fan_in_fan_out=True,
                                  modules_to_save=["ln_f"]))
    runner = Runner.from_cfg(cfg(tmp_path / "run", source, model=model,
                                 optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01))))
    state = runner.model.state_dict()
    for copy in ("original_module", "modules_to_save.default"):
        assert torch.equal(state[f"base_model.model.transformer.ln_f.{copy}.weight"],
                           files["transformer.ln_f.weight"])
    runner.train()
    merged = export(tmp_path / "run" / "iter_4.pth", tmp_path / "merged", "--merge-adapters")
    adapters = export(tmp_path / "run" / "iter_4.pth", tmp_path / "adapters")
    ours, info = AutoModelForCausalLM.from_pretrained(merged, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    theirs = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(source),
                                       adapters).merge_and_unload()
    ids = torch.arange(32).view(2, 16)
    with torch.no_grad():
        assert torch.allclose(ours(input_ids=ids).logits, theirs(input_ids=ids).logits,
                              atol=1e-5)
    assert torch.equal(ours.transformer.h[0].attn.c_attn.bias, files["transformer.h.0.attn.c_attn.bias"])


def test_export_never_mixes_with_an_older_one_and_a_slim_checkpoint_needs_its_base(llama,
                                                                                   tmp_path):
    Runner.from_cfg(cfg(tmp_path / "run", llama, lr=0.0)).train()
    ckpt = tmp_path / "run" / "iter_4.pth"
    export(ckpt, tmp_path / "out")  # one file
    assert main(["export", str(ckpt), str(tmp_path / "out"), "--max-shard-size", "60KB"]) == 2
    export(ckpt, tmp_path / "out", "--max-shard-size", "60KB", "--overwrite")
    assert not (tmp_path / "out" / "model.safetensors").exists()  # the shards alone
    assert tensors(tmp_path / "out").keys() == tensors(llama).keys()
    assert main(["export", str(ckpt), str(tmp_path / "x"), "--cfg-options", "a=1"]) == 2
    slim = cfg(tmp_path / "slim", llama, model=lora(llama_model(llama)))
    slim["default_hooks"]["checkpoint"]["save_frozen_weights"] = False
    Runner.from_cfg(slim).train()
    with pytest.raises(ConfigError, match=r"^resume: .*iter_4.pth holds the trainable weights "
                                          r"only; the rest came from load_from='.*tiny_llama': "
                                          r"set load_from to that model directory$"):
        Runner.from_cfg(dict(slim, work_dir=str(tmp_path / "again"), load_from=None,
                             resume=str(tmp_path / "slim" / "iter_4.pth"))).train()


def test_a_model_built_without_weights_keeps_its_ties_and_refuses_buffers_made_from_them():
    from torch import nn

    from distributed_runner.model.build import WeightSource, build_empty_model
    from distributed_runner.model.empty_init import materialize, parameters_on_meta

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            shared = nn.Parameter(torch.randn(3, 3))  # tied through a local variable
            self.a, self.b = nn.Linear(3, 3), nn.Linear(3, 3)
            self.a.weight = shared
            self.b.weight = shared
            self.register_buffer("steps", torch.arange(3.0))

    with parameters_on_meta():
        model = Tied()
    assert model.a.weight is model.b.weight and model.a.weight.is_meta
    assert not model.steps.is_meta
    materialize(model, torch.device("cpu"))
    assert model.a.weight is model.b.weight and not model.a.weight.is_meta
    assert torch.equal(model.steps, torch.arange(3.0))

    class FromWeights(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(3, 3)
            self.register_buffer("norm", self.proj.weight.detach().norm(dim=1))

    class Nothing(WeightSource):
        def prepare(self, model):
            pass

        def load(self, model):
            pass

    with pytest.raises(ConfigError, match=r"^load_from: the model computes its buffer norm "
                                          r"from its weights while it is built"):
        build_empty_model(dict(type=FromWeights), Nothing())
