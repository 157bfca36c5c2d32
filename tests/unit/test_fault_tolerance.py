"""Fault tolerance (distributed_runner/fault_tolerance, engine/replica_step.py,
launch/replicas.py): replica processes agree on every step through torchft's lighthouse; a
SIGKILLed replica costs the step it was in, the survivor goes on in its own process with the
lost replica's share, a replacement heals from it, and the weights equal a one-process run over
the same global batches. Real processes, a real lighthouse, real SIGKILLs."""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.config_prep import prepare_config
from distributed_runner.fault_tolerance.events import ReplicaEvent
from distributed_runner.fault_tolerance.options import parse_fault_tolerance
from distributed_runner.fault_tolerance.shares import shares_for
from distributed_runner.launch.launcher_config import validate_config
from distributed_runner.launch.replicas import ReplicaLauncher
from tests.hf_llama import LLAMA

# found, not imported: torchft's Rust core sets its log level (RUST_LOG) when first imported,
# which the launcher does itself
pytestmark = pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="no torchft")

N, BATCH, EPOCHS = 67, 4, 14  # 67: a prime, so the epoch ends in a smaller global batch


def cfg(work_dir: Path, kill: tuple[int, int] | None = None, pace: float = 0.05, **ft) -> dict:
    """TinyBlocks (LayerNorm: no batch statistics) over N samples, global batches of 8 on 2
    replicas, SGD with momentum, a checkpoint each epoch; each replica's iterations recorded."""
    out = dict(
        custom_imports=dict(imports=["tests.ft_probe"]),
        work_dir=str(work_dir),
        model=dict(type="TinyBlocks"),
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=N), batch_size=BATCH,
                              sampler=dict(type="DefaultSampler", shuffle=True)),
        train_cfg=dict(by_epoch=True, max_epochs=EPOCHS),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1, max_keep_ckpts=2)),
        custom_hooks=[dict(type="ReplicaDiary", path=f"{work_dir}.diary"),
                      dict(type="Pace", seconds=pace)],
        randomness=dict(seed=5),
        fault_tolerance=dict(mode="replicas", replicas=2, heartbeat_timeout=1.0, join_timeout=3.0,
                             **ft),
    )
    if kill:
        out["custom_hooks"].append(dict(type="KillReplica", slot=kill[0], at=kill[1],
                                        marker=f"{work_dir}.killed"))
    return out


def diary(work_dir: Path) -> list[dict]:
    return [json.loads(line) for line in Path(f"{work_dir}.diary").read_text().splitlines()]


def killed_at(marker: str) -> int:
    """The iteration (1-based) a probe killed or hung its replica at (its marker file)."""
    return int(Path(marker).read_text().split()[1])


def final_weights(run_folder: Path) -> dict:
    ckpt = torch.load(run_folder / f"epoch_{EPOCHS}.pth", weights_only=False)
    return ckpt["state_dict"]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    """The same run in this process without fault tolerance: global batches of 8 in one."""
    plain = cfg(tmp_path_factory.mktemp("one") / "one")
    del plain["fault_tolerance"]
    plain["custom_hooks"] = []
    plain["train_dataloader"]["batch_size"] = BATCH * 2
    runner = Runner.from_cfg(plain)
    runner.train()
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def close(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(((a[k] - b[k]).abs().max() / (b[k].abs().max() + 1e-12)).item() for k in a)


def test_the_missing_slots_are_dealt_out_over_the_quorum_the_same_way_on_every_replica():
    assert [shares_for(s, {0, 1, 2, 3}, 4) for s in range(4)] == [[0], [1], [2], [3]]
    assert shares_for(0, {0, 2}, 4) == [0, 1] and shares_for(2, {0, 2}, 4) == [2, 3]
    assert shares_for(1, {1}, 3) == [1, 0, 2]
    every = [m for s in (0, 3) for m in shares_for(s, {0, 3}, 5)]
    assert sorted(every) == [0, 1, 2, 3, 4]  # each slot's share once, whoever is present
    with pytest.raises(ValueError, match="not in the quorum"):
        shares_for(1, {0}, 2)


@pytest.mark.parametrize(("spec", "key"), [
    ("replicas", "fault_tolerance"),
    (dict(mode="replica", replicas=2), "fault_tolerance.mode"),
    (dict(replicas=1), "fault_tolerance.replicas"),
    (dict(replicas=2, min_replicas=3), "fault_tolerance.min_replicas"),
    (dict(replicas=2, heartbeat_timout=1.0), "fault_tolerance.heartbeat_timout"),
    (dict(replicas=2, heartbeat_timeout=0), "fault_tolerance.heartbeat_timeout"),
])
def test_a_wrong_fault_tolerance_option_is_one_line_naming_it(spec, key):
    with pytest.raises(ConfigError) as caught:
        parse_fault_tolerance(spec)
    assert caught.value.key == key and "\n" not in str(caught.value)
    if "timout" in key:
        assert "heartbeat_timeout" in str(caught.value)  # did you mean


@pytest.mark.parametrize(("change", "key", "words"), [
    (dict(strategy=dict(type="fsdp")), "fault_tolerance.ranks_per_replica",
     "set ranks_per_replica=2 or more"),
    (dict(fault_tolerance=dict(replicas=2, ranks_per_replica=2)), "strategy",
     "strategy=dict(type='fsdp')"),
    (dict(fault_tolerance=dict(replicas=2, ranks_per_replica=2),
          strategy=dict(type="fsdp", tp=2, tp_plan={"inp": "colwise", "head": "rowwise"})),
     "strategy.tp", "not built yet"),
    (dict(fault_tolerance=dict(replicas=2, ranks_per_replica=2),
          strategy=dict(type="fsdp", pp=2), model=LLAMA), "strategy.pp",
     "pipeline stages inside"),
    (dict(fault_tolerance=dict(replicas=2, ranks_per_replica=2),
          strategy=dict(type="fsdp", dp_replicate=2)), "strategy.dp_replicate",
     "the replica groups are HSDP's replicated dimension"),
    (dict(fault_tolerance=dict(replicas=2, ranks_per_replica=2), strategy=dict(type="fsdp"),
          launcher=dict(type="ray", num_workers=2)), "launcher.num_workers",
     "2 workers a replica: set num_workers=4"),
    (dict(launcher=dict(type="ray", num_workers=3)), "launcher.num_workers",
     "set num_workers=2"),
    (dict(launcher=dict(type="ray", num_workers=(1, 2))), "launcher.num_workers", "elastic"),
    (dict(launcher=dict(type="ray", num_workers=2, max_failures=3)), "launcher.max_failures",
     "fault_tolerance.max_replacements"),
    (dict(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), accumulative_counts=2)),
     "optim_wrapper.accumulative_counts", "once per global batch"),
])
def test_the_driver_refuses_what_the_replicas_cannot_keep_exact(tmp_path, change, key, words):
    bad = {**cfg(tmp_path / "w"), **change}
    with pytest.raises(ConfigError) as caught:
        validate_config(bad)
    assert caught.value.key == key and words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_driver_checks_a_fault_tolerant_config_and_says_what_it_runs(tmp_path):
    plan = validate_config(cfg(tmp_path / "w"))
    assert plan.settings.fault_tolerance["replicas"] == 2
    assert "2 replica groups" in plan.lines["fault tolerance"][0]


def test_without_torchft_a_fault_tolerant_config_is_one_line(tmp_path, monkeypatch):
    import distributed_runner.fault_tolerance.options as options

    monkeypatch.setattr(options, "torchft_missing", lambda: True)
    with pytest.raises(ConfigError, match=r"pip install 'distributed-runner\[ft\]'"):
        validate_config(cfg(tmp_path / "w"))


def iterations(records: list[dict], pid: int) -> tuple[int, list[int]]:
    """Where process ``pid`` started its loop and the iterations it committed."""
    mine = [r for r in records if r["pid"] == pid]
    start = next(r["iter"] for r in mine if r["kind"] == "start")
    return start, [r["iter"] for r in mine if r["kind"] == "iter"]


@pytest.mark.slow("two replica processes killed in turn, a replacement killed while it heals")
def test_replicas_killed_in_turn_cost_a_step_each_and_the_weights_stay_those_of_one_process(
    tmp_path, one_process
):
    """Replica 1 killed at iteration 5, its first replacement killed while it takes the peer's
    state, then, once its second replacement is in the quorum, replica 0 killed: no process
    restarts but the killed ones, none loads a checkpoint, every step is committed once."""
    work = tmp_path / "ft"
    launcher = ReplicaLauncher(prepare_config(killed_in_turn(cfg(work, kill=(1, 5), pace=0.25)))[0])
    assert launcher.run() == 0
    check_killed_in_turn(work, launcher, one_process)


def killed_in_turn(run_cfg: dict) -> dict:
    """``run_cfg`` (with its KillReplica of slot 1) with the rest of the scenario: replica 1's
    first replacement killed while it heals, replica 0 killed once the quorum is whole again,
    and Pace fast once the kills are over."""
    work = Path(run_cfg["work_dir"])
    markers = [f"{work}.killed", f"{work}.healing", f"{work}.rejoined"]
    run_cfg["custom_hooks"] += [
        dict(type="KillWhileHealing", slot=1, marker=markers[1]),
        dict(type="KillAfterRejoin", slot=0, marker=markers[2]),
        dict(type="MarkWhenWhole", markers=markers, path=f"{work}.whole"),
    ]
    run_cfg["custom_hooks"][1]["until"] = f"{work}.whole"
    return run_cfg


def check_killed_in_turn(work: Path, launcher: ReplicaLauncher, one_process: dict) -> None:
    """What :func:`killed_in_turn` must leave: no process restarted but the killed ones, none
    loaded a checkpoint, every step committed once, one process's weights."""
    records, total = diary(work), EPOCHS * 9
    zero, one = launcher.pids[0], launcher.pids[1]
    assert (len(zero), len(one)) == (2, 3)  # killed: 0 once, 1 twice (its first replacement too)
    start, done = iterations(records, zero[0])  # the first replica 0: never restarted
    assert start <= 3 and done == list(range(start, done[-1] + 1))  # a peer may start first
    lost = [(r["slots"], r["iter"]) for r in records if r["pid"] == zero[0] and r["kind"] == "lost"]
    at = killed_at(f"{work}.killed")  # 5, or later when replica 1 joined late
    assert lost == [([1], at - 1)]  # that iteration (0-based) trained again without replica 1
    assert [r for r in records if r["pid"] == one[1]] == []  # killed while it healed
    healed_one, done_one = iterations(records, one[2])  # replica 1's second replacement
    assert at < healed_one and done_one == list(range(healed_one, total))  # to the end, no replay
    healed_zero, done_zero = iterations(records, zero[1])  # replica 0's replacement
    assert done[-1] < healed_zero and done_zero == list(range(healed_zero, total))
    assert any(r["kind"] == "lost" and r["slots"] == [0] for r in records if r["pid"] == one[2])
    weights_zero = final_weights(work / launcher.run_name)
    weights_one = final_weights(work / "replicas" / "1" / launcher.run_name)
    for key, value in weights_zero.items():
        assert torch.equal(value, weights_one[key]), key  # both replicas hold the same weights
    assert close(weights_zero, one_process) < 1e-5  # every sample once: one process's weights


@pytest.mark.slow("two replica processes, one SIGKILLed, both restarted from a checkpoint")
def test_too_few_replicas_left_falls_back_to_the_restart_with_its_line(
    tmp_path, one_process, caplog
):
    work = tmp_path / "ft"
    launcher = ReplicaLauncher(prepare_config(cfg(work, kill=(1, 12), pace=0.02,
                                                  min_replicas=2))[0])
    with caplog.at_level("WARNING", logger="distributed_runner.replicas"):
        assert launcher.run() == 0
    lines = [r.getMessage() for r in caplog.records if "restarting" in r.getMessage()]
    assert lines == ["fault_tolerance: replica 1 died (exit -9) and 1 replica(s) left, fewer "
                     "than min_replicas=2: restarting every replica from the newest checkpoint"]
    assert all(len(pids) == 2 for pids in launcher.pids.values())  # both processes restarted
    starts = [r["iter"] for r in diary(work) if r["kind"] == "start"]
    assert sorted(starts) == [0, 0, 9, 9]  # the second pair resumed epoch_1.pth
    assert close(final_weights(work / launcher.run_name), one_process) < 1e-5


@pytest.mark.slow("two replica processes, one hung until its watchdog ends it")
def test_a_hung_replica_is_evicted_by_its_watchdog_and_replaced_while_the_other_goes_on(
    tmp_path, one_process, caplog
):
    """Replica 1 sleeps at iteration 5 (it still heartbeats to the lighthouse, so replica 0
    alone has no quorum): replica 0 tries again each quorum_timeout, its hang watch counting
    afresh; replica 1's watchdog ends it after hang_timeout (exit 75), the launcher replaces it
    and replica 0 goes on in its own process."""
    work = tmp_path / "ft"
    run_cfg = cfg(work, pace=0.05, timeout=2.0, quorum_timeout=2.0)
    run_cfg["custom_hooks"].append(dict(type="HangReplica", slot=1, at=5, marker=f"{work}.hung"))
    run_cfg["watchdog"] = dict(hang_timeout=5.0)
    launcher = ReplicaLauncher(prepare_config(run_cfg)[0])
    with caplog.at_level("WARNING", logger="distributed_runner.replicas"):
        assert launcher.run() == 0
    lines = [r.getMessage() for r in caplog.records if r.name == "distributed_runner.replicas"]
    assert lines == ["replica 1 hung (the watchdog's verdict after watchdog.hang_timeout; its "
                     "stacks are in its run folder's hangs/): starting a replacement"]
    assert list(map(len, launcher.pids.values())) == [1, 2]  # replica 0 never restarted
    records = diary(work)
    start, done = iterations(records, launcher.pids[0][0])
    assert done == list(range(start, EPOCHS * 9))  # every step once, to the end
    lost = [(r["slots"], r["iter"], r["seconds"]) for r in records if r["kind"] == "lost"]
    at = killed_at(f"{work}.hung")
    assert [(slots, i) for slots, i, _ in lost] == [([1], at - 1)] and lost[0][2] > 5.0
    assert list((work / "replicas" / "1" / launcher.run_name / "hangs").glob("rank0-*.txt"))
    healed, done_one = iterations(records, launcher.pids[1][1])
    assert at < healed and done_one == list(range(healed, EPOCHS * 9))
    assert close(final_weights(work / launcher.run_name), one_process) < 1e-5


def test_waits_for_peers_longer_than_the_hang_watch_are_refused_in_one_line(tmp_path):
    bad = {**cfg(tmp_path / "w", quorum_timeout=400.0)}
    with pytest.raises(ConfigError) as caught:
        validate_config(bad)
    assert caught.value.key == "fault_tolerance.quorum_timeout"
    assert "watchdog.hang_timeout (300 s)" in str(caught.value) and "\n" not in str(caught.value)
    validate_config({**bad, "watchdog": dict(enabled=False)})  # no hang watch: no conflict


def test_the_docs_config_is_the_example_config_and_its_hook_pages_a_lost_replica(tmp_path):
    from tests.docs_blocks import ROOT, docs_block

    example = (ROOT / "configs" / "digits_cnn_ft.py").read_text()
    for line in docs_block("fault-tolerance-config").strip().splitlines():
        assert line in example, line  # the page shows the file as it is (drun check runs it)
    namespace: dict = {}
    exec(compile(docs_block("replica-change-hook"), "fault-tolerance.md", "exec"), namespace)
    page = namespace["PageOnLostReplica"](str(tmp_path / "lost.txt"))
    runner = SimpleNamespace(replicas=SimpleNamespace(slot=0))
    page.after_replica_change(runner, ReplicaEvent("joined", (1,), 70, 0.07, 2))
    page.after_replica_change(runner, ReplicaEvent("lost", (1,), 59, 1.03, 1))
    assert (tmp_path / "lost.txt").read_text() == "(1,) lost at iteration 60, 1.0 s\n"
    assert ReplicaEvent("lost", (1,), 59, 1.03, 1).describe() == (
        "replica 1 lost at iteration 60: the step was trained again by 1 replica(s), 1.03 s lost")


def test_a_misspelled_fault_tolerance_key_is_refused_not_ignored(tmp_path):
    typo = cfg(tmp_path / "w")
    typo["fault_tolerence"] = typo.pop("fault_tolerance")
    with pytest.raises(ConfigError, match="did you mean 'fault_tolerance'") as caught:
        prepare_config(typo)
    assert caught.value.key == "fault_tolerence"


def hsdp(work_dir: Path, epochs: int = 4, pace: float = 0.25) -> dict:
    """:func:`cfg` as 2 replica groups of 2 FSDP ranks (4 processes; the same global batch of
    8: 2 samples a rank), full checkpoints (one file to compare), for ``epochs``; rank 1 of
    group 1 SIGKILLed at iteration 5, Pace fast once the new group has joined."""
    out = cfg(work_dir, kill=(1, 5), pace=pace)
    out["train_dataloader"]["batch_size"] = BATCH // 2
    out["train_cfg"]["max_epochs"] = epochs
    out["strategy"] = dict(type="fsdp", checkpoint="full")
    out["fault_tolerance"]["ranks_per_replica"] = 2
    out["default_hooks"]["checkpoint"]["interval"] = epochs
    out["custom_hooks"][-1]["rank"] = 1
    out["custom_hooks"] += [dict(type="MarkWhenWhole", markers=[f"{work_dir}.killed"],
                                 path=f"{work_dir}.whole")]
    out["custom_hooks"][1]["until"] = f"{work_dir}.whole"
    return out


@pytest.mark.slow("two replica groups of two FSDP processes each, one rank SIGKILLed")
def test_a_replica_group_of_fsdp_ranks_losing_a_rank_is_replaced_whole_and_heals_its_shards(
    tmp_path
):
    """HSDP: rank 1 of replica group 1 is SIGKILLed mid-epoch; the launcher kills the rest of
    that group (its FSDP collectives would wait for the lost rank) and starts a new group,
    whose ranks each heal their own shards (weights and optimizer) from the same rank of group
    0. Group 0's processes never restart, commit every step once, and end with one process's
    weights, as does the new group."""
    work = tmp_path / "ft"
    launcher = ReplicaLauncher(prepare_config(hsdp(work))[0])
    assert launcher.run() == 0
    check_hsdp(work, launcher)


def check_hsdp(work: Path, launcher: ReplicaLauncher, epochs: int = 4) -> None:
    """What :func:`hsdp`'s run must leave (locally and on Ray)."""
    assert list(map(len, launcher.pids.values())) == [1, 2]  # group 1 replaced once, whole
    records, total = diary(work), epochs * 9
    at = killed_at(f"{work}.killed")
    first = {r["pid"] for r in records if r["slot"] == 0}
    assert len(first) == 2  # group 0: its two ranks, never restarted
    for pid in first:
        start, done = iterations(records, pid)
        assert start <= 3 and done == list(range(start, total))  # every step once
        lost = [(r["slots"], r["iter"]) for r in records if r["pid"] == pid and r["kind"] == "lost"]
        assert lost == [([1], at - 1)]
    starts = {r["pid"]: r["iter"] for r in records if r["slot"] == 1 and r["kind"] == "start"}
    healed = [iterations(records, pid) for pid, start in starts.items() if start >= at]
    assert len(healed) == 2  # both ranks of the new group healed past the kill, to the end
    assert all(done == list(range(start, total)) for start, done in healed)
    plain = cfg(work.parent / "one")
    del plain["fault_tolerance"]
    plain.update(custom_hooks=[], train_cfg=dict(by_epoch=True, max_epochs=epochs))
    plain["train_dataloader"]["batch_size"] = BATCH * 2
    runner = Runner.from_cfg(plain)
    runner.train()
    one = {k: v.detach().clone() for k, v in runner.model.state_dict().items()}
    for folder in (work, work / "replicas" / "1"):
        ckpt = torch.load(folder / launcher.run_name / f"epoch_{epochs}.pth", weights_only=False)
        assert close(ckpt["state_dict"], one) < 1e-5


def test_each_replica_evaluates_the_whole_validation_set(tmp_path, monkeypatch):
    """Training data is cut over the replicas' ranks; validation and test data only over a
    replica group's own ranks: every replica's metrics are the whole set's."""
    monkeypatch.setenv("DRUN_REPLICA", "1")
    run_cfg = cfg(tmp_path / "w")
    loader = dict(dataset=dict(type="ToyDataset", n=N), batch_size=BATCH,
                  sampler=dict(type="DefaultSampler", shuffle=False))
    run_cfg.update(val_dataloader=loader, val_evaluator=dict(type="Accuracy"), val_cfg=dict())
    runner = Runner.from_cfg(run_cfg)
    train, val = runner.train_dataloader.sampler.plan, runner.val_dataloader.sampler
    assert (train.rank, train.world_size, train.global_batch) == (1, 2, 2 * BATCH)
    assert (val.rank, val.world_size) == (0, 1) and len(list(val)) == N
