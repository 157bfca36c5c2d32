"""Every form a user holds as a checkpoint is taken, and ends where its ``.pth`` would:
``resume`` (``drun train --resume PATH``), ``load_from`` (``drun test --checkpoint PATH``) and
``drun export`` read the file itself, a run's folder (its ``last_checkpoint``), a sharded
checkpoint's own ``<name>.<token>.dcp`` folder and Ray's copy of a checkpoint (the folder
``Result.checkpoint.path`` gives, built here from RayReportHook's own ``_files`` into a folder
named as it names one). One resolver decides (resume_choice.checkpoint_file_of); a path that is
none of these is one line naming the key. Sharded checkpoints are written in one process (the
writer is told that the model shards: DCP writes the shards as FSDP's ranks do), so every test
runs on CPU in seconds."""
from __future__ import annotations

import contextlib
import json
import shutil
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
import torch

import distributed_runner.checkpoint.writer as writer
from distributed_runner import Runner
from distributed_runner.checkpoint.files import peek
from distributed_runner.checkpoint.resume_choice import checkpoint_file_of, choose_run, resume_path
from distributed_runner.cli import main
from distributed_runner.core.errors import ConfigError
from hooks.ray_report_hook import RayReportHook
from tests.toy import assert_state_equal, base_cfg, make_runner, params_of

# the Runner resolves resume= (resume_path) and a load_from that is no model directory
# (checkpoint_file_of(..., 'load_from', model_dir=True)) before anything is chosen
TWO_EPOCHS = dict(by_epoch=True, max_epochs=2, val_interval=1)
TEST = dict(test_dataloader=dict(dataset=dict(type="ToyDataset", n=20, seed=2), batch_size=8,
                                 sampler=dict(type="DefaultSampler", shuffle=False)),
            test_evaluator=dict(type="Accuracy"), test_cfg=dict())

@contextlib.contextmanager
def sharded_writes() -> Iterator[None]:
    """Checkpoints as FSDP's sharded ones (a manifest and its DCP folder), in one process."""
    with mock.patch.object(writer, "writes_shards", lambda strategy, model: True), \
            warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # one process: yes
        yield


def ray_copy(path: Path, storage: Path) -> Path:
    """The folder Ray persists for checkpoint ``path`` (``ray_storage/<run>/<name>-<ns>``):
    the files RayReportHook hands over (one process: rank 0 hands over every one)."""
    folder = storage / "run" / f"{path.stem}-{time.time_ns()}"
    for source, relative in RayReportHook._files(0, path, peek(path).get("sharded")):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, folder / relative)
    return folder


def shard_folder(path: Path) -> Path:
    return path.parent / peek(path)["sharded"]["dir"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Two toy runs of 2 epochs, a checkpoint each epoch (``last_checkpoint``: epoch_2): one
    writing one-file checkpoints, one sharded ones; Ray's copy of each one's epoch_1."""
    out = tmp_path_factory.mktemp("forms")
    make_runner(out / "plain", train_cfg=TWO_EPOCHS).train()
    with sharded_writes():
        make_runner(out / "sharded", train_cfg=TWO_EPOCHS).train()
    assert "sharded" in peek(out / "sharded" / "epoch_1.pth")
    return {name: out / name for name in ("plain", "sharded")} | {
        f"ray_{name}": ray_copy(out / name / "epoch_1.pth", out / name / "ray_storage")
        for name in ("plain", "sharded")}


def forms(runs: dict[str, Path]) -> dict[str, tuple[Path, Path]]:
    """Each form, by name: (what the user passes, the checkpoint file it names)."""
    plain, sharded = runs["plain"], runs["sharded"]
    ray_plain, ray_sharded = runs["ray_plain"], runs["ray_sharded"]
    return {
        "plain file": (plain / "epoch_1.pth", plain / "epoch_1.pth"),
        "plain run folder": (plain, plain / "epoch_2.pth"),
        "plain ray copy": (ray_plain, ray_plain / "epoch_1.pth"),
        "sharded file": (sharded / "epoch_1.pth", sharded / "epoch_1.pth"),
        "sharded run folder": (sharded, sharded / "epoch_2.pth"),
        "sharded dcp folder": (shard_folder(sharded / "epoch_1.pth"), sharded / "epoch_1.pth"),
        "sharded ray copy": (ray_sharded, ray_sharded / "epoch_1.pth"),
        "sharded ray dcp folder": (shard_folder(ray_sharded / "epoch_1.pth"),
                                   ray_sharded / "epoch_1.pth"),
    }


FORMS = ["plain file", "plain run folder", "plain ray copy", "sharded file",
         "sharded run folder", "sharded dcp folder", "sharded ray copy", "sharded ray dcp folder"]
FOLDER_FORMS = [f for f in FORMS if not f.endswith(" file")]


def original(form: str, file: Path, runs: dict[str, Path]) -> Path:
    """The ``.pth`` the run wrote that ``file`` is (Ray's copy: the file it was copied from)."""
    return runs[form.split()[0]] / file.name


@pytest.mark.parametrize("form", FORMS)
def test_each_form_names_its_checkpoint_file(runs, form):
    given, expected = forms(runs)[form]
    assert checkpoint_file_of(given, "resume").resolve() == expected.resolve()
    assert checkpoint_file_of(str(given), "CHECKPOINT").resolve() == expected.resolve()
    assert Path(resume_path(str(given))).resolve() == expected.resolve()
    source = original(form, expected, runs)  # Ray's copy is the saved bytes, shards and all
    assert expected.read_bytes() == source.read_bytes()
    if "sharded" in form:
        copied, saved = shard_folder(expected), shard_folder(source)
        assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in saved.iterdir())


def resumed(work_dir: Path, resume: str | Path) -> tuple[dict, int, int]:
    runner = make_runner(work_dir, resume=str(resume), train_cfg={**TWO_EPOCHS, "max_epochs": 3})
    runner.train()
    return params_of(runner.model), runner.iter, runner.epoch


@pytest.fixture(scope="module")
def resumed_from_files(runs, tmp_path_factory) -> dict[Path, tuple[dict, int, int]]:
    """Each original .pth resumed to epoch 3: where every form of it must end."""
    out = tmp_path_factory.mktemp("resumed")
    return {path: resumed(out / f"{path.parent.name}_{path.stem}", path)
            for path in (runs[r] / f"epoch_{e}.pth" for r in ("plain", "sharded") for e in (1, 2))}


@pytest.mark.parametrize("form", FOLDER_FORMS)
def test_resume_from_each_form_ends_where_its_pth_does(runs, resumed_from_files, tmp_path, form):
    given, file = forms(runs)[form]
    weights, iteration, epoch = resumed(tmp_path, given)
    want_weights, want_iter, want_epoch = resumed_from_files[original(form, file, runs)]
    assert (iteration, epoch) == (want_iter, want_epoch) == (30, 3)
    assert_state_equal(weights, want_weights)


def loaded(work_dir: Path, load_from: str | Path) -> tuple[dict, dict]:
    """(weights, test metrics) of a run that loads ``load_from`` and tests."""
    runner = make_runner(work_dir, load_from=str(load_from), **TEST)
    metrics = runner.test()
    return params_of(runner.model), metrics


@pytest.mark.parametrize("form", FOLDER_FORMS)
def test_load_from_each_form_loads_the_weights_of_its_pth(runs, tmp_path, form):
    given, file = forms(runs)[form]
    weights, metrics = loaded(tmp_path / "form", given)
    want_weights, want_metrics = loaded(tmp_path / "file", original(form, file, runs))
    assert_state_equal(weights, want_weights)
    assert metrics == want_metrics


def test_drun_test_takes_a_dcp_folder_and_rays_copy(runs, tmp_path, capsys):
    config = tmp_path / "toy.py"
    config.write_text("".join(f"{k} = {v!r}\n" for k, v in
                              base_cfg(tmp_path / "test", **TEST).items()))

    def drun_test(checkpoint: Path) -> dict:
        assert main(["test", str(config), "--checkpoint", str(checkpoint)]) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    manifest = runs["sharded"] / "epoch_1.pth"
    want = drun_test(manifest)
    assert drun_test(shard_folder(manifest)) == want
    assert drun_test(runs["ray_sharded"]) == want


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory) -> Path:
    """A tiny GPT-2 trained 2 iterations, its checkpoint sharded (a manifest and a .dcp)."""
    pytest.importorskip("transformers")
    from tests.hf_toy import gpt2_cfg
    out = tmp_path_factory.mktemp("gpt2") / "run"
    cfg = gpt2_cfg(out, train_cfg=dict(by_epoch=False, max_iters=2),
                   default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=2,
                                                      by_epoch=False)))
    cfg["train_dataloader"]["dataset"]["n"] = 8
    with sharded_writes():
        Runner.from_cfg(cfg).train()
    assert "sharded" in peek(out / "iter_2.pth")
    return out


def exported(checkpoint: Path, out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    assert main(["export", str(checkpoint), str(out)]) == 0
    return {k: v for f in sorted(out.glob("*.safetensors")) for k, v in load_file(f).items()}


def test_export_of_each_form_of_a_sharded_checkpoint_writes_the_pths_tensors(gpt2_run,
                                                                             tmp_path):
    manifest = gpt2_run / "iter_2.pth"
    ray = ray_copy(manifest, tmp_path / "ray_storage")
    want = exported(manifest, tmp_path / "from_pth")
    assert want and (tmp_path / "from_pth" / "config.json").is_file()
    folders = [shard_folder(manifest), gpt2_run, ray, shard_folder(ray / manifest.name)]
    for n, form in enumerate(folders):
        got = exported(form, tmp_path / f"from_form_{n}")
        assert got.keys() == want.keys(), form
        assert all(torch.equal(got[k], want[k]) for k in want), form


def one_line(err: pytest.ExceptionInfo, key: str, *says: str) -> None:
    text = str(err.value)
    assert err.value.key == key and "\n" not in text, text
    for fragment in says:
        assert fragment in text, text


WHAT_TO_PASS = ("pass a checkpoint file (.pth), a run's folder (it holds last_checkpoint), a "
                "sharded checkpoint's <name>.<token>.dcp folder or Ray's copy of a checkpoint")


@pytest.mark.parametrize("key, model_dir, says", [
    ("resume", False, "is a folder but no checkpoint: "),
    ("CHECKPOINT", False, "is a folder but no checkpoint: "),
    ("load_from", True, "is a folder but neither a checkpoint nor a model directory (config.json"),
])
def test_a_folder_that_is_none_of_them_is_one_line_naming_the_key(tmp_path, key, model_dir, says):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ConfigError) as err:
        checkpoint_file_of(tmp_path / "nothing", key, model_dir=model_dir)
    one_line(err, key, says, WHAT_TO_PASS)
    with pytest.raises(ConfigError) as err:
        checkpoint_file_of(tmp_path / "missing.pth", key)
    one_line(err, key, "does not exist: check the path")


def test_export_of_a_folder_that_is_none_of_them_is_one_line(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("drun: error: CHECKPOINT: ") and WHAT_TO_PASS in line, line
    assert not (tmp_path / "out").exists()


def test_folders_that_name_no_one_checkpoint_say_which_to_pass(runs, tmp_path):
    several = tmp_path / "several"
    several.mkdir()
    for name in ("epoch_1.pth", "epoch_2.pth"):
        shutil.copy2(runs["plain"] / name, several / name)
    with pytest.raises(ConfigError) as err:
        checkpoint_file_of(several, "resume")
    one_line(err, "resume", "holds 2 checkpoints and no last_checkpoint", "pass one of them")
    (several / "last_checkpoint").write_text("epoch_9.pth")  # dangling
    with pytest.raises(ConfigError) as err:
        checkpoint_file_of(several, "resume")
    one_line(err, "resume", "last_checkpoint names no checkpoint file")


def test_a_dcp_folder_without_its_manifest_or_left_from_an_older_save_is_one_line(runs, tmp_path):
    manifest = runs["sharded"] / "epoch_1.pth"
    alone = tmp_path / "alone" / shard_folder(manifest).name
    shutil.copytree(shard_folder(manifest), alone)
    with pytest.raises(ConfigError) as err:
        checkpoint_file_of(alone, "load_from", model_dir=True)
    one_line(err, "load_from", "without its manifest epoch_1.pth beside it")
    stale = runs["sharded"] / "epoch_1.0123abcd.dcp"  # an earlier save of epoch_1's shards
    shutil.copytree(shard_folder(manifest), stale)
    try:
        with pytest.raises(ConfigError) as err:
            checkpoint_file_of(stale, "resume")
        one_line(err, "resume", "does not hold the shards in epoch_1.0123abcd.dcp",
                 f"pass {manifest}")
    finally:
        shutil.rmtree(stale)


def test_resuming_a_run_folder_or_its_dcp_continues_that_run_and_rays_copy_a_new_one(runs,
                                                                                     tmp_path):
    work_dir = tmp_path / "work_dir"
    shutil.copytree(runs["sharded"], work_dir / "20260101_000000")
    run = work_dir / "20260101_000000"
    assert choose_run(work_dir, None, str(run)) == run.name  # not work_dir itself
    assert choose_run(work_dir, None, str(shard_folder(run / "epoch_1.pth"))) == run.name
    ray = next((run / "ray_storage" / "run").iterdir())
    assert choose_run(work_dir, None, str(ray)) not in (run.name, ".")


@pytest.mark.parametrize("key", ["resume", "load_from"])
def test_the_runner_says_what_to_pass_for_a_folder_that_is_none_of_them(tmp_path, key):
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path / "run", **{key: str(tmp_path / "nothing")})
    one_line(err, key, WHAT_TO_PASS)
