"""The config's sections, declared once (engine/sections.py) and checked on the Ray driver.

Everything here runs the driver's checks only (``drun check``, ``validate_config``,
``RayLauncher(cfg)``): seconds each, no Ray and no worker started. What a check needs is real: the
example configs and the docs' config blocks as a user has them, a GPT-2 and a Llama built from
their transformers configs, a model directory written by ``save_pretrained``.
"""
from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from distributed_runner.cli import main
from tests.docs_blocks import ROOT

sys.path.insert(0, str(ROOT / "tools"))

CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py"))


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory):
    """A folder laid out as the configs expect after their README steps: the digits as Parquet,
    a small byte corpus, a tiny Llama from tools/make_tiny_llama.py."""
    import digits_to_parquet
    import make_byte_corpus
    import make_tiny_llama

    root = tmp_path_factory.mktemp("user")
    digits_to_parquet.main(str(root / "data" / "digits_parquet"))
    src = root / "src"
    for i in range(12):
        (src / f"mod{i}.py").parent.mkdir(parents=True, exist_ok=True)
        (src / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * (i + 20))
    make_byte_corpus.build(root / "data" / "byte_corpus", src, block_size=16, val_percent=30,
                           rows_per_shard=64)
    make_tiny_llama.main([str(root / "data" / "tiny_llama"), "--layers", "2", "--hidden", "64"])
    return root


@pytest.mark.parametrize("name", CONFIGS)
def test_every_example_config_passes_the_ray_drivers_checks(name, user_folder, monkeypatch,
                                                           capsys):
    monkeypatch.chdir(user_folder)
    replicas = "_ft" in name  # fault tolerance: a Ray actor a replica
    code = main(["check", str(ROOT / "configs" / name), "--launcher", "ray", "--num-workers", "2",
                 "--work-dir", str(user_folder / "work_dirs")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "the driver's checks pass for 2 Ray worker(s)" in out
    if replicas:
        assert "2 replicas x batch 16 x 1 accumulation = global batch 32" in out
        assert "2 replica groups, a step commits with at least 1" in out
    assert "built on the meta device" in out, out  # the model was built, not only resolved
    assert "mesh" in out and "hooks" in out and "train_dataloader" in out


def test_the_fault_tolerance_pages_ray_config_passes_the_ray_drivers_checks(
        user_folder, tmp_path, monkeypatch, capsys):
    """docs/how-to/fault-tolerance.md's Ray form, beside the example configs it builds on."""
    import shutil

    from tests.docs_blocks import docs_block

    folder = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", folder)
    (folder / "digits_cnn_ft_ray.py").write_text(docs_block("fault-tolerance-ray"))
    monkeypatch.chdir(user_folder)
    code = main(["check", str(folder / "digits_cnn_ft_ray.py"), "--work-dir", str(tmp_path / "w")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "the driver's checks pass for 2 Ray worker(s)" in out
    assert "2 replica groups, a step commits with at least 1" in out
    code = main(["check", str(folder / "digits_cnn_ft_ray.py"), "--num-workers", "3"])
    assert code == 2
    assert "launcher.num_workers: fault_tolerance on Ray runs one worker a replica: set " \
        "num_workers=2" in capsys.readouterr().err
    (folder / "digits_cnn_hsdp_ft.py").write_text(docs_block("fault-tolerance-hsdp"))
    code = main(["check", str(folder / "digits_cnn_hsdp_ft.py"), "--launcher", "ray",
                 "--num-workers", "4", "--work-dir", str(tmp_path / "w")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "fsdp, mesh dp_replicate=1 x dp_shard=2 x tp=1 over 2 ranks in each of 2 replica " \
        "groups" in out
    assert "2 replicas x 2 ranks x batch 8 x 1 accumulation = global batch 32" in out
    code = main(["check", str(folder / "digits_cnn_hsdp_ft.py"), "--launcher", "ray",
                 "--num-workers", "2"])
    assert code == 2
    assert "launcher.num_workers: fault_tolerance on Ray runs 2 workers a replica: set " \
        "num_workers=4" in capsys.readouterr().err


def test_the_check_prints_the_mesh_the_data_and_the_checkpoint_layout(user_folder, monkeypatch,
                                                                      capsys):
    monkeypatch.chdir(user_folder)
    code = main(["check", str(ROOT / "configs" / "gpt_bytes_fsdp.py"), "--launcher", "ray",
                 "--num-workers", "2", "--work-dir", str(user_folder / "w"), "--cfg-options",
                 "optim_wrapper.accumulative_counts=2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "fsdp, mesh" in out and "over 2 ranks" in out
    assert "2 data-parallel rank(s) x batch 16 x 2 accumulation = global batch 64" in out
    assert "sharded: every rank writes its own shards" in out
    assert "ray_report" in out  # the hooks as the Ray launcher runs them


def gpt2_cfg(tmp_path, **more):
    cfg = dict(
        work_dir=str(tmp_path),
        model=dict(type="transformers.GPT2LMHeadModel",
                   config=dict(type="transformers.GPT2Config", n_layer=2, n_embd=64, n_head=4,
                               vocab_size=256, n_positions=64)),
        launcher=dict(type="ray", num_workers=2),
    )
    cfg.update(more)
    return cfg


def test_a_model_without_a_plan_and_tp_2_is_one_line_and_exit_2_before_any_worker(tmp_path,
                                                                                 capsys,
                                                                                 monkeypatch):
    pytest.importorskip("transformers")
    from distributed_runner.core.errors import ConfigError
    from distributed_runner.launch.launcher import RayLauncher

    def never(self):
        raise AssertionError("the driver connected to Ray: the check came too late")

    monkeypatch.setattr(RayLauncher, "connect", never)  # no cluster joined, no worker started
    cfg = gpt2_cfg(tmp_path, strategy=dict(type="fsdp", tp=2))
    with pytest.raises(ConfigError, match="strategy.tp") as info:
        RayLauncher(cfg)  # the constructor checks
    assert "\n" not in str(info.value)

    config = tmp_path / "gpt2_tp.py"
    config.write_text(f"cfg = {cfg!r}\n" "globals().update(cfg)\n")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("drun: error: strategy.tp"), err


def test_the_hf_model_form_and_load_from_are_checked_against_the_files_headers(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "llama"
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    cfg = tmp_path / "hf.py"
    cfg.write_text(
        f"work_dir = {str(tmp_path / 'w')!r}\n"
        f"model = dict(type='HFModel', path={str(folder)!r})\n"
        f"load_from = {str(folder)!r}\n"
        "strategy = dict(type='fsdp', tp=2)\n")
    assert main(["check", str(cfg), "--launcher", "ray", "--num-workers", "2"]) == 0
    out = capsys.readouterr().out
    assert "LlamaForCausalLM" in out and "every name and shape matches" in out
    assert "tensor-parallel plan" in out

    other = tmp_path / "other"  # the same names, another width: refused on the driver
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256)).save_pretrained(other)
    capsys.readouterr()  # save_pretrained's progress bars
    cfg.write_text(cfg.read_text().replace(f"load_from = {str(folder)!r}",
                                           f"load_from = {str(other)!r}"))
    assert main(["check", str(cfg), "--launcher", "ray", "--num-workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "load_from" in err[0] and "in the files" in err[0], err


def test_a_lora_target_the_model_lacks_is_refused_on_the_driver(tmp_path):
    pytest.importorskip("peft")
    from distributed_runner.core.errors import ConfigError
    from distributed_runner.launch.launcher_config import validate_config

    cfg = gpt2_cfg(tmp_path)
    cfg["model"] = dict(type="peft.get_peft_model", model=cfg["model"],
                        peft_config=dict(type="peft.LoraConfig", r=4, target_modules=["q_proj"]))
    with pytest.raises(ConfigError, match="^model") as info:
        validate_config(cfg)
    assert "q_proj" in str(info.value)


def test_a_model_that_cannot_be_built_on_the_driver_is_left_to_the_workers(tmp_path):
    from distributed_runner.launch.launcher_config import validate_config

    cfg = dict(work_dir=str(tmp_path), launcher=dict(type="ray", num_workers=2),
               model=dict(type="NeedsRealTensors"), custom_imports=dict(imports=["tests.toy"]))
    plan = validate_config(cfg)
    assert "not built on the driver" in plan.lines["model"][0]


def test_relative_paths_of_every_stage_are_made_absolute_for_the_workers(user_folder,
                                                                        monkeypatch):
    from distributed_runner import Config
    from distributed_runner.launch.launcher_config import validate_config

    monkeypatch.chdir(user_folder)
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn_streaming.py",
                          cfg_options=[f"work_dir={user_folder / 'w'}"])
    cfg["val_dataloader"] = dict(cfg["train_dataloader"],
                                 dataset=dict(type="ParquetShards",
                                              paths="data/digits_parquet/val"))
    cfg["launcher"] = dict(type="ray", num_workers=2)
    cfg["resume"] = "work_dirs/x/epoch_1.1234.dcp"  # --resume PATH, any form
    plan = validate_config(cfg)
    assert plan.cfg["resume"] == str(user_folder / "work_dirs/x/epoch_1.1234.dcp")
    for stage in ("train", "val"):
        paths = plan.cfg[f"{stage}_dataloader"]["dataset"]["paths"]
        assert Path(paths).is_absolute() and Path(paths).is_dir(), (stage, paths)
    assert cfg["val_dataloader"]["dataset"]["paths"] == "data/digits_parquet/val"  # as given


def test_a_streaming_datasets_pipeline_passes_the_drivers_check(user_folder, monkeypatch):
    """MMEngine's place for transforms, ``dataset.pipeline`` (issue 48), through the Ray
    driver's checks: accepted as the workers will take it (ParquetShards alone would refuse
    the argument), and refused in one line when the loader has a pipeline too."""
    from distributed_runner import Config
    from distributed_runner.core.errors import ConfigError
    from distributed_runner.launch.launcher_config import validate_config

    monkeypatch.chdir(user_folder)
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn_streaming.py",
                          cfg_options=[f"work_dir={user_folder / 'w'}"])
    cfg["custom_imports"] = dict(imports=["distributed_runner.examples.digits", "tests.stream_probe"])
    steps = [dict(type="RecordAndDropIndex", path=str(user_folder / "seen.txt"))]
    cfg["train_dataloader"]["dataset"]["pipeline"] = steps
    plan = validate_config(cfg)
    assert plan.cfg["train_dataloader"]["dataset"]["pipeline"] == steps  # as the workers get it
    cfg["train_dataloader"]["pipeline"] = steps
    with pytest.raises(ConfigError, match=r"^train_dataloader\.dataset\.pipeline: given with "):
        validate_config(cfg)


def test_the_driver_indexes_the_shards_once_and_the_workers_config_names_the_index(
        user_folder, monkeypatch, tmp_path):
    """The Ray driver reads every footer while it checks (issue 48) and writes the index into
    the run's Ray storage; the workers' config names it, so a worker's ParquetShards opens no
    footer. The driver's own config is left as the user wrote it."""
    from distributed_runner import Config
    from distributed_runner.data.streaming import ParquetShards
    from distributed_runner.data.streaming import shards as shards_module
    from distributed_runner.launch.launcher import RayLauncher

    monkeypatch.chdir(user_folder)
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn_streaming.py",
                          cfg_options=[f"work_dir={tmp_path / 'w'}"])
    launcher = RayLauncher(cfg)
    (stored,) = launcher.plan.stored
    assert stored.relative == "data_index/train_dataloader.arrow"
    assert any("files indexed for the workers" in line for line in launcher.plan.lines["data"])
    plain = launcher._write_stored(dict(launcher.plan.cfg))
    uri = plain["train_dataloader"]["dataset"]["index"]
    assert uri == f"{tmp_path / 'w' / 'ray_storage'}/w/data_index/train_dataloader.arrow"
    assert "index" not in launcher.plan.cfg["train_dataloader"]["dataset"]
    opened = []
    real = shards_module._open_filesystem

    def counting(path, options):
        fs, inner = real(path, options)
        class Counting:
            def open_input_file(self, name):
                opened.append(name)
                return fs.open_input_file(name)
            def __getattr__(self, name):
                return getattr(fs, name)
        return Counting(), inner

    monkeypatch.setattr(shards_module, "_open_filesystem", counting)
    worker = ParquetShards(**{k: v for k, v in plain["train_dataloader"]["dataset"].items()
                              if k != "type"})
    footers = ParquetShards(plain["train_dataloader"]["dataset"]["paths"])
    assert opened == footers.files  # the second read every footer; the worker's none
    assert worker.blocks == footers.blocks and len(worker) == len(footers)


def test_settings_are_read_only(tmp_path):
    from distributed_runner.engine.config_prep import prepare_config
    from distributed_runner.engine.sections import settings_of

    cfg, _ = prepare_config(dict(work_dir=str(tmp_path), model=dict(type="Linear",
                                                                    in_features=2,
                                                                    out_features=1)))
    settings = settings_of(cfg)
    assert settings.watchdog["hang_timeout"] > 0 and settings.launcher is None
    with pytest.raises(AttributeError, match="read-only"):
        settings.watchdog = {}
    with pytest.raises(TypeError, match="read-only"):
        settings.strategy["type"] = "fsdp"
    import pickle

    assert pickle.loads(pickle.dumps(settings.watchdog)) == dict(settings.watchdog)


def parser_calls(run) -> dict[str, int]:
    """How often each section's parser ran during ``run()``, counted by its code object (an
    alias imported elsewhere counts too), on every thread."""
    from distributed_runner.engine.sections import sections

    codes = {row.parse.__code__: row.key for row in sections() if row.parse is not None}
    counts = dict.fromkeys(codes.values(), 0)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return counts


def test_each_section_is_parsed_once_per_process(tmp_path, capsys):
    config = tmp_path / "toy.py"
    config.write_text(
        "custom_imports = dict(imports=['tests.toy'])\n"
        "model = dict(type='ToyModel')\n"
        "train_dataloader = dict(dataset=dict(type='ToyDataset', n=16), batch_size=4)\n"
        "train_cfg = dict(by_epoch=True, max_epochs=1)\n"
        "optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))\n"
        "default_hooks = dict(straggler=dict(type='StragglerHook'))\n"
        "watchdog = dict(hang_timeout=60)\n"
        "strategy = 'ddp'\n")
    work = str(tmp_path / "w")
    local = parser_calls(lambda: main(["train", str(config), "--work-dir", work]))
    # compile= is not in the config: its optional parser is not called at all
    assert local.pop("compile") == 0 and set(local.values()) == {1}, local
    driver = parser_calls(lambda: main(["check", str(config), "--work-dir", work,
                                        "--launcher", "ray", "--num-workers", "2"]))
    assert driver.pop("compile") == 0 and set(driver.values()) == {1}, driver
    capsys.readouterr()
