"""resume_choice decides where a run starts: its choices for the Runner's start and for a Ray
worker group restarted by Ray Train (one process here: the collectives are no-ops)."""
import logging

from distributed_runner.checkpoint.files import atomic_save
from distributed_runner.checkpoint.resume_choice import choose_restart, choose_start


def _save(path, iteration):
    return atomic_save({"meta": {"iter": iteration}, "state_dict": {}}, path)


def test_the_start_is_resume_path_then_resume_true_then_load_from(tmp_path):
    log = logging.getLogger("test")
    _save(tmp_path / "iter_3.pth", 3)
    assert choose_start("w.pth", "given.pth", tmp_path, log) == ("resume", "given.pth", None)
    how, path, ckpt = choose_start("w.pth", True, tmp_path, log)
    assert (how, path.name, ckpt["meta"]["iter"]) == ("resume", "iter_3.pth", 3)
    assert choose_start("w.pth", True, tmp_path / "empty", log) == ("load_from", "w.pth", None)
    assert choose_start(None, False, tmp_path, log) == (None, None, None)


def test_a_restart_takes_a_newer_persisted_checkpoint_that_verifies(tmp_path):
    storage = tmp_path / "storage"
    ray_copy = _save(tmp_path / "restore" / "iter_4.pth", 4)
    _save(storage / "run" / "checkpoint_1" / "iter_4.pth", 4)
    newer = _save(storage / "run" / "checkpoint_2" / "iter_8.pth", 8)
    launcher = {"storage_path": str(storage), "name": "run"}
    path, why = choose_restart(str(ray_copy), launcher, rank=0)
    assert path == str(newer) and "newer and verifies" in why
    assert choose_restart(str(ray_copy), {}, rank=0) == (str(ray_copy), None)
    newer.write_bytes(newer.read_bytes()[:-8])  # a torn upload: Ray's stays
    assert choose_restart(str(ray_copy), launcher, rank=0) == (str(ray_copy), None)
