"""Which files of ``distributed_runner`` and ``hooks`` one training iteration runs in, case by case.

A hook profiles this thread's Python calls (``sys.setprofile``) from one ``before_train_iter`` to
the next: the iteration's hooks, its step, the hooks after it, the loop's end of the iteration
and the next batch. Each call is named by its file, relative to the repository
(``distributed_runner/engine/loops.py``), or, for the dispatcher's generated callers, by their
code name (``<hook dispatch: after_train_iter>``). Calls into torch, the data (``tests/toy.py``'s
dataset here, torch's collate) and the test itself are not named, nor are other threads (the
sinks' writer, the watchdog).

Each case trains ToyModel-sized runs for one epoch of 20 iterations a rank (80 samples a rank in
batches of 4, no validation) and follows three iterations:

* the 3rd — the dispatcher times the first :data:`~distributed_runner.engine.dispatch.TIME_FIRST`
  (16) calls of each mount point, so its callers take ``dispatch.py``'s timed path;
* the 10th — LoggerHook's default ``interval=10``: the run's first record;
* the 17th — a call the dispatcher's fixed timing pattern leaves untimed (after the first 16,
  about one call in :data:`~distributed_runner.engine.dispatch.TIME_EVERY` is timed): what most
  iterations run.

:data:`GROUPS`, :data:`CASES`, :data:`ITERATIONS` and :data:`ROWS` are plain literals: ``docs/gen_inserts.py`` renders
them into docs/explanation/loop.md and architecture.md (``<!-- insert: iteration-files ... -->``),
so the pages state what this test asserts, and every assertion is an exact set."""
import json
import os
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp

import distributed_runner
from distributed_runner.engine.dispatch import TIME_EVERY, TIME_FIRST
from hooks import Hook
from tests.toy import free_port, gloo_rank, make_runner

ROOT = Path(distributed_runner.__file__).resolve().parent.parent
PACKAGES = ("distributed_runner", "hooks")

# group -> (what it does in the iteration, its files)
GROUPS = {
    "iteration": (
        "the loop (the heartbeat written out, the step called, the requests' check), the step, "
        "the loss parsed, and the dispatcher's generated callers of the two mount points",
        ["distributed_runner/engine/loops.py", "distributed_runner/engine/step.py",
         "distributed_runner/model/calling.py", "<hook dispatch: before_train_iter>",
         "<hook dispatch: after_train_iter>"]),
    "timed": (
        "a timed call: the generated caller hands the hooks to `HookDispatcher._call_timed` "
        "(the first 16 calls of each mount point, then about one in 16)",
        ["distributed_runner/engine/dispatch.py"]),
    "default hooks": (
        "RuntimeInfoHook, IterTimerHook and its throughput meter, ParamSchedulerHook, "
        "CheckpointHook and its interval, LoggerHook (is a record due?)",
        ["hooks/runtime_info_hook.py", "hooks/iter_timer_hook.py",
         "distributed_runner/tracking/throughput.py", "hooks/param_scheduler_hook.py",
         "hooks/checkpoint_hook.py", "distributed_runner/core/interval.py",
         "hooks/logger_hook.py"]),
    "record": (
        "LoggerHook's record: the window's values read from the MessageHub's histories",
        ["distributed_runner/engine/message_hub.py", "distributed_runner/engine/history_buffer.py"]),
    "record written": (
        "rank 0 only: the hooks' time shares (`Runner.hook_seconds`) and the record queued for "
        "the sinks, which a thread writes",
        ["distributed_runner/engine/runner.py", "distributed_runner/engine/hook_report.py",
         "distributed_runner/tracking/sinks/service.py",
         "distributed_runner/tracking/sinks/record_queue.py"]),
    "general step": (
        "GuardedStep: the model's data_preprocessor, the OptimWrapper's context, backward, "
        "step and zero_grad",
        ["distributed_runner/model/base.py", "distributed_runner/optim/wrapper.py"]),
    "ranks": (
        "several ranks: the requests' agreement (one all-reduce), StragglerHook's clock (a "
        "forward hook and an optimizer step post-hook, which torch calls)",
        ["distributed_runner/engine/requests.py", "distributed_runner/core/dist.py",
         "hooks/straggler_hook.py"]),
}
# case -> what it runs
CASES = {
    "a": "one process, no default hooks: ToyModel, whose step is PlainStep",
    "b": "one process, the default hooks: ToyModel (PlainStep)",
    "c": "one process, no default hooks: a model with a data_preprocessor (GuardedStep)",
    "d": "two gloo ranks, the default hooks: ToyModel under DDP (PlainStep)",
}
# the iterations followed (1-based) -> what is particular to them (the module docstring)
ITERATIONS = {3: "timed", 10: "LoggerHook's first record", 17: "untimed, as most are"}
# (case, rank or None for one process, the iteration, its groups of files)
ROWS = [
    ("a", None, 3, ["iteration", "timed"]),
    ("a", None, 17, ["iteration"]),
    ("b", None, 3, ["iteration", "timed", "default hooks"]),
    ("b", None, 10, ["iteration", "timed", "default hooks", "record", "record written"]),
    ("b", None, 17, ["iteration", "default hooks"]),
    ("c", None, 3, ["iteration", "timed", "general step"]),
    ("c", None, 17, ["iteration", "general step"]),
    ("d", 0, 3, ["iteration", "timed", "default hooks", "ranks"]),
    ("d", 1, 3, ["iteration", "timed", "default hooks", "ranks"]),
    ("d", 0, 10, ["iteration", "timed", "default hooks", "ranks", "record", "record written"]),
    ("d", 1, 10, ["iteration", "timed", "default hooks", "ranks", "record"]),
    ("d", 0, 17, ["iteration", "default hooks", "ranks"]),
    ("d", 1, 17, ["iteration", "default hooks", "ranks"]),
]
NO_DEFAULT_HOOKS = dict(runtime_info=None, timer=None, logger=None, param_scheduler=None,
                        checkpoint=None, sampler_seed=None, straggler=None)
RUNS = {"a": ("ToyModel", NO_DEFAULT_HOOKS), "b": ("ToyModel", {}),
        "c": ("StepToyPreprocessed", NO_DEFAULT_HOOKS), "d": ("ToyModel", {})}


def expected(case: str, rank: int | None) -> dict[int, set[str]]:
    """Iteration (1-based) -> the exact set of files ROWS gives for ``case`` on ``rank``."""
    return {it: {f for g in groups for f in GROUPS[g][1]}
            for c, r, it, groups in ROWS if (c, r) == (case, rank)}


def test_the_rows_follow_what_they_say():
    assert set(RUNS) == set(CASES) == {row[0] for row in ROWS}
    assert set(ITERATIONS) == {row[2] for row in ROWS}
    assert TIME_FIRST < 17 and TIME_EVERY > 1  # the 3rd and 10th calls timed, the 17th not
    assert all(f.startswith(PACKAGES) or f.startswith("<hook dispatch: ")
               for _, files in GROUPS.values() for f in files)


class FilesOfIterations(Hook):
    """For each iteration in ``iters`` (1-based): the files its calls run in (module docstring)."""

    def __init__(self, iters) -> None:
        self.iters = set(iters)
        self.files: dict[int, set[str]] = {}
        self._now: set[str] = set()

    def _record(self, frame, event, arg) -> None:
        if event != "call":
            return
        name = frame.f_code.co_filename
        if name.startswith("<hook dispatch"):
            self._now.add(name)
            return
        path = Path(name)
        if path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[0] in PACKAGES:
            self._now.add(path.relative_to(ROOT).as_posix())

    def before_train_iter(self, runner, batch_idx=None, data_batch=None) -> None:
        sys.setprofile(None)
        if runner.iter + 1 in self.iters:
            self._now = self.files[runner.iter + 1] = set()
            sys.setprofile(self._record)

    def after_train(self, runner) -> None:
        sys.setprofile(None)


def train(work_dir, case: str, tracer: FilesOfIterations, ranks: int = 1) -> None:
    """``case``'s run: one epoch of 20 iterations a rank, no validation."""
    import tests.unit.test_step_strategy  # noqa: F401  (registers StepToyPreprocessed)
    model, default_hooks = RUNS[case]
    runner = make_runner(
        work_dir, model=dict(type=model), default_hooks=default_hooks, custom_hooks=[tracer],
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=80 * ranks), batch_size=4,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        val_dataloader=None, val_evaluator=None, val_cfg=None,
        train_cfg=dict(by_epoch=True, max_epochs=1))
    runner.train()


def differences(found: dict[int, set[str]], wanted: dict[int, set[str]]) -> dict:
    """What differs, per iteration: files found but not expected, and the reverse."""
    return {i: {"unexpected": sorted(found.get(i, set()) - files),
                "missing": sorted(files - found.get(i, set()))}
            for i, files in wanted.items() if found.get(i) != files}


@pytest.mark.parametrize("case", ["a", "b", "c"])
def test_files_of_one_iteration_in_one_process(tmp_path, case):
    wanted = expected(case, None)
    tracer = FilesOfIterations(wanted)
    train(tmp_path, case, tracer)
    assert differences(tracer.files, wanted) == {}


def _rank(rank: int, port: int, out_dir: str) -> None:
    with gloo_rank(rank, port):
        tracer = FilesOfIterations(expected("d", rank))
        train(os.path.join(out_dir, "wd"), "d", tracer, ranks=2)
        found = {i: sorted(files) for i, files in tracer.files.items()}
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(found))


@pytest.mark.timeout(120)
def test_files_of_one_iteration_on_two_ranks(tmp_path):
    mp.spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        found = {int(i): set(files) for i, files in found.items()}
        assert (rank, differences(found, expected("d", rank))) == (rank, {})
