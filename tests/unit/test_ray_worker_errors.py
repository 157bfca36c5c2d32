"""What a Ray worker raises, without Ray workers: the worker records it (the stack in the run's
log, one line for Ray, the record pickled with the exception) and the driver turns Ray's
``WorkerGroupError`` into drun's one line: a ConfigError as ``drun: error:`` (exit 2), anything
else as one line per distinct error and one stack (exit 1). The run through Ray itself:
tests/integration/test_ray_driver_errors.py."""
from __future__ import annotations

import pickle
import time
from types import SimpleNamespace

import pytest

from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.launch.launcher import (
    RayLauncher,
    failure_report,
    worker_config_error,
)
from distributed_runner.launch.ray_worker import FAILURE, failure_line, one_line, record_failure


def raised(error):
    try:
        raise error
    except Exception as e:  # noqa: BLE001
        return e


def config_of(tmp_path):
    return {"cfg": {"work_dir": str(tmp_path), "run_name": "run1"}}


def test_a_recorded_error_carries_its_line_and_stack_and_the_log_has_the_stack(tmp_path, capsys):
    error = raised(ConfigError("model.shards", "3 shards do not divide the 2 ranks"))
    record_failure(config_of(tmp_path), error)
    info = getattr(error, FAILURE)
    assert info["line"] == "model.shards: 3 shards do not divide the 2 ranks" == failure_line(error)
    assert info["stack"].startswith("Traceback (most recent call last):")
    assert info["log"] == str(tmp_path / "run1" / "logs" / "run.log")
    log = (tmp_path / "run1" / "logs" / "run.log").read_text()
    assert "ERROR training failed on this worker: model.shards: 3 shards" in log
    assert "Traceback (most recent call last):" in log and "test_ray_worker_errors.py" in log
    out = capsys.readouterr()
    assert out.out == out.err == ""  # the stack goes to the log, never the terminal
    # what Ray pickles to the controller and on to the driver: the same error and its record
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is ConfigError and (back.key, back.message) == (error.key, error.message)
    assert getattr(back, FAILURE) == info


def test_rank_0_writes_through_the_run_loggers_own_file(tmp_path, capsys):
    from distributed_runner.core.log import setup_logger

    logger = setup_logger(tmp_path / "run1", 0)
    try:
        logger.info("the run's first line")
        record_failure(config_of(tmp_path), raised(RuntimeError("boom\nsecond line")))
        text = (tmp_path / "run1" / "logs" / "run.log").read_text()
    finally:
        for h in list(logger.handlers):
            logger.removeHandler(h)
            h.close()
    first, *_ = text.splitlines()
    assert first.endswith("INFO the run's first line")
    assert "ERROR training failed on this worker: RuntimeError: boom\n" in text
    assert "RuntimeError: boom\nsecond line" in text  # the stack has the whole message
    assert "Traceback" not in capsys.readouterr().out


def test_one_line():
    assert one_line(ArgumentError("lr", "must be > 0").under("optim_wrapper")) == (
        "optim_wrapper.lr: must be > 0")
    assert one_line(ValueError("\nfirst\nsecond")) == "ValueError: first"
    assert one_line(KeyError()) == "KeyError"


def test_ray_gets_the_line_of_a_recorded_error_and_its_traceback_otherwise(tmp_path, monkeypatch):
    from ray.train.v2._internal.execution.worker_group import thread_runner

    from distributed_runner.core.ray_private import short_worker_errors

    monkeypatch.setattr(thread_runner, "construct_user_exception_with_traceback",
                        thread_runner.construct_user_exception_with_traceback)
    assert short_worker_errors(failure_line) and short_worker_errors(failure_line)  # idempotent
    construct = thread_runner.construct_user_exception_with_traceback
    recorded = raised(RuntimeError("boom"))
    record_failure(config_of(tmp_path), recorded)
    wrapped = construct(recorded)
    assert str(wrapped) == "RuntimeError: boom" and wrapped._base_exc is recorded
    try:  # Ray formats the exception being handled
        raise RuntimeError("not recorded")
    except RuntimeError as other:
        assert "Traceback (most recent call last)" in str(construct(other))  # Ray's own


def worker_group_error(failures):
    import ray.train

    return ray.train.WorkerGroupError("[Rank 0,1 Error Snippet]: ...", failures)


def recorded_at(tmp_path, error, at, rank):
    error = raised(error)
    record_failure(config_of(tmp_path), error)
    getattr(error, FAILURE).update(at=at, rank=rank)
    return error


def test_the_driver_names_the_first_failure_first_and_prints_one_stack(tmp_path):
    now = time.time()
    collateral = recorded_at(tmp_path, RuntimeError("Connection closed by peer"), now + 1, 0)
    cause = recorded_at(tmp_path, RuntimeError("boom"), now, 1)
    also = recorded_at(tmp_path, RuntimeError("Connection closed by peer"), now + 2, 2)
    error = pickle.loads(pickle.dumps(worker_group_error({0: collateral, 1: cause, 2: also})))
    text = failure_report(error)
    lines = text.splitlines()
    assert lines[0] == "RuntimeError: boom (rank 1)"
    assert lines[1] == "RuntimeError: Connection closed by peer (ranks 0, 2)"
    assert lines[2].startswith("rank 1's stack (every failing rank's is in ")
    assert text.count("Traceback") == 1 and lines[-1] == "RuntimeError: boom"
    assert worker_config_error(error) is None


def test_a_worker_error_without_a_record_and_a_controller_error():
    error = worker_group_error({1: MemoryError()})
    assert failure_report(error) == "MemoryError (rank 1)"
    hang = worker_group_error({})  # the hang watch's: its report is the message
    assert failure_report(hang).startswith("Training failed due to worker errors:")


def test_a_config_error_on_any_worker_is_what_train_raises(tmp_path, capsys):
    launcher = RayLauncher.__new__(RayLauncher)  # what train() reads, no config to check
    launcher.cfg, launcher.work_dir, launcher.run_name = {}, tmp_path, "run1"
    launcher.settings = SimpleNamespace(fault_tolerance=None)  # a Ray Train run, not replicas
    now = time.time()
    mistake = recorded_at(tmp_path, ConfigError("model.shards", "3 shards"), now + 1, 1)
    other = recorded_at(tmp_path, RuntimeError("Connection closed by peer"), now, 0)
    group = pickle.loads(pickle.dumps(worker_group_error({0: other, 1: mistake})))

    def fit():
        raise group

    launcher.fit = fit
    with pytest.raises(ConfigError) as caught:
        launcher.train()
    assert str(caught.value) == "model.shards: 3 shards"
    assert capsys.readouterr().err == ""  # the command line prints it: drun: error: ...
    group = worker_group_error({0: other})
    assert launcher.train() == 1
    err = capsys.readouterr().err
    assert err.startswith("drun: training failed on the Ray workers: RuntimeError: Connection")
    assert err.count("Traceback") == 1
