"""``drun``: train, test and inspect from a config file.

    drun train CONFIG [--work-dir D] [--name RUN] [--resume [PATH]] [--cfg-options k=v ...]
               [--launcher ray --num-workers N|MIN-MAX [--gpu] [--address A] [--storage-path S]
                [--max-failures K] [--verbose]]
    drun test  CONFIG --checkpoint PATH [--work-dir D] [--cfg-options k=v ...]
    drun hooks CONFIG [--cfg-options k=v ...] [--launcher none|ray]
    drun check CONFIG [--cfg-options k=v ...] [--launcher none|ray --num-workers N]
    drun plot  WORK_DIR|RUN_DIR [...] [--all] [--out curves.png] [--smooth W]
    drun tune  CONFIG [--work-dir D] [--cfg-options ...] [--num-samples N]
               [--max-concurrent-trials K] [--scheduler S] [--search-alg A]
               [--trial-launcher none|ray --num-workers N [--gpu]]
               [--address auto] [--resume] [--dry-run]        (distributed_runner.tune)

A user mistake prints one line (``drun: error: <key>: <what to do>``) and exits with status 2
(``--debug`` shows its traceback); a checkpoint that cannot be written (a full disk) is one line
and status 1, and so is training data that stays unreadable; anything else is a bug and keeps
its traceback. Each ``drun train`` writes into a folder of its own under work_dir (a timestamp,
or ``--name``); ``--resume`` continues the newest run that has a checkpoint, in its folder. A run
stopped by SIGTERM after writing its checkpoint exits with 143; Ctrl-C while
training stops at the end of the iteration with a checkpoint and one line saying how to continue,
and exits with 130 (see :mod:`distributed_runner.core.preemption`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distributed_runner.core.errors import CheckpointWriteError, ConfigError, DataReadError
from distributed_runner.core.log import redact_process_output
from distributed_runner.core.preemption import EXIT_CODE as PREEMPTED_EXIT_CODE
from distributed_runner.core.preemption import INTERRUPT_EXIT_CODE, TrainingPreempted
from distributed_runner.launch.ray_connect import announced_path


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a .py or .yaml config file")
    p.add_argument(
        "--work-dir",
        help="the folder of this config's runs, one folder each (overrides work_dir)",
    )
    p.add_argument(
        "--cfg-options",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="override config keys, e.g. train_cfg.max_epochs=3 'x=[1,2]'",
    )


def build_parser() -> argparse.ArgumentParser:
    """``drun``'s parser: the global ``--debug`` flag and one subcommand parser each."""
    parser = argparse.ArgumentParser(
        prog="drun",
        description="distributed-runner: hooked PyTorch training on a laptop or a Ray cluster",
    )
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks for configuration errors too"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_train_parser(sub)
    _add_test_parser(sub)
    _add_hooks_parser(sub)
    _add_check_parser(sub)
    _add_plot_parser(sub)
    _add_export_parser(sub)
    from distributed_runner.tune.cli_args import add_tune_parser

    add_tune_parser(sub, _add_common)
    return parser


def _add_train_parser(sub: argparse._SubParsersAction) -> None:
    """``drun train``: kept apart so build_parser stays short; adds the Ray flag group too."""
    train = sub.add_parser("train", help="train a model")
    _add_common(train)
    train.add_argument(
        "--resume",
        nargs="?",
        const=True,
        default=None,
        metavar="PATH",
        help="resume from PATH, or, with no PATH, the newest run under work_dir that has a "
        "checkpoint, from its newest that verifies (in that run's folder)",
    )
    train.add_argument(
        "--name",
        help="the run's folder under work_dir (default: its start time, 20261128_194500); "
        "an existing run's name needs --resume",
    )
    train.add_argument(
        "--strategy",
        choices=["ddp", "fsdp"],
        help="overrides strategy's type (the config's options are kept: all of "
        "them for fsdp, activation_checkpointing for ddp)",
    )
    _add_ray_flags(train)


def _add_ray_flags(train: argparse.ArgumentParser) -> None:
    """``drun train``'s Ray group: the flags apply_launcher_flags lays over the launcher."""
    ray = train.add_argument_group("Ray (override the config's launcher=dict(type='ray', ...))")
    ray.add_argument("--launcher", choices=["none", "ray"])
    ray.add_argument(
        "--num-workers",
        type=worker_count,
        metavar="N|MIN-MAX",
        help="workers, or an elastic range such as 2-4",
    )
    ray.add_argument("--gpu", action="store_true", default=None, help="one GPU per worker")
    ray.add_argument("--address", help="'auto' or ray://...: join a running cluster")
    ray.add_argument(
        "--storage-path", help="where Ray persists checkpoints (shared for multi-node)"
    )
    ray.add_argument("--max-failures", type=int, help="worker-group restarts Ray may make")
    ray.add_argument(
        "--verbose",
        action="store_true",
        default=None,
        help="show Ray Train's per-report lines (hidden by default)",
    )


def _add_test_parser(sub: argparse._SubParsersAction) -> None:
    """``drun test``: the common arguments plus the checkpoint to evaluate."""
    test = sub.add_parser("test", help="evaluate a checkpoint on test_dataloader")
    _add_common(test)
    test.add_argument(
        "--checkpoint",
        required=True,
        help="weights to load (load_from): a .pth, a run's or a .dcp folder, Ray's copy of a "
        "checkpoint, or a model directory",
    )
    _add_ray_flags(test)


def _add_hooks_parser(sub: argparse._SubParsersAction) -> None:
    """``drun hooks``: no --work-dir (nothing is written), so not _add_common."""
    hooks = sub.add_parser("hooks", help="print the resolved hook plan without training")
    hooks.add_argument("config")
    hooks.add_argument("--cfg-options", nargs="+", default=[], metavar="KEY=VALUE")
    hooks.add_argument(
        "--launcher",
        choices=["none", "ray"],
        default=None,
        help="plan as this launcher runs it (ray adds its RayReportHook)",
    )


def _add_check_parser(sub: argparse._SubParsersAction) -> None:
    """``drun check``: the Ray driver's checks and the plan they resolve, no worker started."""
    check = sub.add_parser(
        "check",
        help="run the driver's checks (the model built on the meta device) and print the plan",
    )
    _add_common(check)
    check.add_argument("--launcher", choices=["none", "ray"])
    check.add_argument(
        "--num-workers", type=worker_count, metavar="N|MIN-MAX", help="workers to plan for"
    )
    check.add_argument("--gpu", action="store_true", default=None, help="one GPU per worker")


def _add_plot_parser(sub: argparse._SubParsersAction) -> None:
    """``drun plot``: takes work_dirs, not a config, so it shares nothing with the others."""
    plot = sub.add_parser(
        "plot", help="draw loss, lr and validation curves of one run or several overlaid"
    )
    plot.add_argument(
        "work_dir",
        nargs="+",
        help="a work_dir (its newest run), a run's folder, or a sweep's work_dir (its trials)",
    )
    plot.add_argument(
        "--all",
        action="store_true",
        dest="every_run",
        help="every run of each work_dir, overlaid and labelled (oldest first)",
    )
    plot.add_argument("--out", help="image file (default FIRST_WORK_DIR/curves.png)")
    plot.add_argument(
        "--smooth",
        type=float,
        default=0.0,
        metavar="W",
        help="EMA weight in [0, 1) for the training curves, e.g. 0.6 (default 0)",
    )


def _add_export_parser(sub: argparse._SubParsersAction) -> None:
    """``drun export``: a checkpoint to a model directory other tools read."""
    export = sub.add_parser(
        "export", help="write a checkpoint as a Hugging Face model directory (from_pretrained)"
    )
    export.add_argument(
        "checkpoint",
        help="a checkpoint: a .pth, a run's folder, a sharded checkpoint's .dcp folder or Ray's "
        "copy of one",
    )
    export.add_argument("out_dir", help="the directory to write")
    export.add_argument("--format", choices=["hf"], default="hf", help="hf: safetensors shards")
    export.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], help="cast the weights"
    )
    export.add_argument(
        "--merge-adapters",
        action="store_true",
        help="fold LoRA adapters into the base weights (default: PEFT's adapter files)",
    )
    export.add_argument(
        "--max-shard-size", default="5GB", help="largest safetensors file (default 5GB)"
    )
    export.add_argument(
        "--config", help="build the model from this config (default: the checkpoint's own)"
    )
    export.add_argument("--cfg-options", nargs="+", default=[], metavar="KEY=VALUE")
    export.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")


def load_config(args: argparse.Namespace):
    from distributed_runner.core.config import Config

    cfg = Config.fromfile(args.config, cfg_options=args.cfg_options)
    if getattr(args, "work_dir", None):
        cfg["work_dir"] = args.work_dir
    if cfg.get("work_dir") is None:
        cfg["work_dir"] = str(Path("work_dirs") / Path(args.config).stem)
    # moved out of a `ray job submit` package folder (which Ray deletes), and said so
    cfg["work_dir"] = announced_path(str(cfg["work_dir"]), "work_dir")
    return cfg


def worker_count(text: str) -> int | tuple[int, int]:
    """``--num-workers``: ``N`` or an elastic ``MIN-MAX`` (launcher.num_workers=(MIN, MAX))."""
    low, sep, high = text.partition("-")
    try:
        return (int(low), int(high)) if sep else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected N or MIN-MAX (e.g. 2-4), got {text!r}"
        ) from None  # the message says it all


RAY_FLAGS = {
    "num_workers": "num_workers",
    "gpu": "use_gpu",
    "address": "address",
    "storage_path": "storage_path",
    "max_failures": "max_failures",
    "verbose": "verbose",
}


def apply_launcher_flags(cfg: dict, args: argparse.Namespace) -> None:
    """``--launcher``/``--num-workers``/... override the config's launcher."""
    flags = {
        key: getattr(args, flag)
        for flag, key in RAY_FLAGS.items()
        if getattr(args, flag, None) is not None
    }
    if args.launcher == "none":
        cfg["launcher"] = "none"
        return
    if args.launcher is None and not flags:
        return
    current = cfg.get("launcher")
    base = dict(current) if isinstance(current, dict) else {"type": "ray"}
    if args.launcher == "ray" or flags:
        base["type"] = "ray"
    base.update(flags)
    cfg["launcher"] = base


def override_strategy(base: Any, kind: str) -> Any:
    """``--strategy KIND`` over the config's ``strategy``: its options stay where KIND takes
    them (all of them for FSDP; only ``activation_checkpointing`` for DDP, whose other options
    live in model_wrapper_cfg)."""
    options = {k: v for k, v in base.items() if k != "type"} if isinstance(base, dict) else {}
    if kind == "ddp":
        options = {k: v for k, v in options.items() if k == "activation_checkpointing"}
    return {"type": kind, **options} if options else kind


def cmd_train(args: argparse.Namespace) -> int:
    from distributed_runner.launch.launcher import run

    cfg = load_config(args)
    if args.resume is not None:
        cfg["resume"] = args.resume
    if args.name is not None:
        cfg["run_name"] = args.name
    check_named_run(cfg)
    if args.strategy is not None:
        cfg["strategy"] = override_strategy(cfg.get("strategy"), args.strategy)
    apply_launcher_flags(cfg, args)
    return run(cfg)


def check_named_run(cfg: dict) -> None:
    """A run named after one that has checkpoints continues it only with ``--resume``: a fresh
    start there would mix two runs' logs and let one delete the other's checkpoints."""
    from distributed_runner.checkpoint.resume_choice import has_checkpoints
    from distributed_runner.core.run_folders import FLAT, run_dir

    name = cfg.get("run_name")
    if name in (None, FLAT) or cfg.get("resume"):
        return
    folder = run_dir(Path(str(cfg["work_dir"])).expanduser(), str(name))
    if folder.is_dir() and has_checkpoints(folder):
        raise ConfigError(
            "run_name",
            f"{folder} already holds run {name!r} and its checkpoints: add --resume to "
            f"continue it, or choose another --name",
        )


def cmd_test(args: argparse.Namespace) -> int:
    """The test loop over ``--checkpoint`` where the config's launcher (or the Ray flags) runs
    it: in this process, or on the Ray workers."""
    from distributed_runner.launch.launcher import test

    cfg = load_config(args)
    cfg["load_from"] = args.checkpoint
    cfg["resume"] = False
    cfg.pop("fault_tolerance", None)  # replicas only train: a test runs once, on every rank
    apply_launcher_flags(cfg, args)
    print(json.dumps(test(cfg)))
    return 0


def cmd_hooks(args: argparse.Namespace) -> int:
    from distributed_runner.core.config import Config
    from distributed_runner.engine.hook_builder import plan_hooks

    cfg = Config.fromfile(args.config, cfg_options=args.cfg_options)
    if args.launcher is not None:
        cfg["launcher"] = args.launcher
    print(plan_hooks(cfg).plan_text())  # a misspelled sink fails here too
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """What ``drun train`` would start, checked as the Ray driver checks it before any worker
    starts (:func:`~distributed_runner.launch.launcher_config.validate_config`), and printed."""
    from distributed_runner.launch.launcher_config import validate_config

    cfg = load_config(args)
    apply_launcher_flags(cfg, args)
    plan = validate_config(cfg)
    launcher = plan.settings.launcher
    where = f"{launcher['num_workers']} Ray worker(s)" if launcher else "this process"
    print(f"{args.config}: the driver's checks pass for {where}")
    width = max((len(topic) for topic in plan.lines), default=0)
    for topic, lines in plan.lines.items():
        for i, line in enumerate(lines):
            print(f"  {topic if i == 0 else '':<{width}}  {line}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from distributed_runner.tracking.plot import plot

    if not 0.0 <= args.smooth < 1.0:
        raise ConfigError("--smooth", f"{args.smooth} is not in [0, 1): try 0.6")
    try:
        path = plot(args.work_dir, args.out, smooth=args.smooth, every_run=args.every_run)
    except FileNotFoundError as e:
        raise ConfigError("work_dir", str(e)) from None
    print(path)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from distributed_runner.checkpoint.hf.export import export_hf, parse_size
    from distributed_runner.core.config import Config

    if args.config:
        cfg = Config.fromfile(args.config, cfg_options=args.cfg_options)
    elif args.cfg_options:
        raise ConfigError("--cfg-options", "change --config's values: pass the config too")
    else:
        cfg = None
    out = export_hf(
        args.checkpoint,
        args.out_dir,
        dtype=args.dtype,
        merge_adapters=args.merge_adapters,
        max_shard_bytes=parse_size(args.max_shard_size),
        cfg=dict(cfg) if cfg is not None else None,
        overwrite=args.overwrite,
    )
    print(out)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from distributed_runner.tune.driver import run_sweep

    return run_sweep(load_config(args), args)


def main(argv: Sequence[str] | None = None) -> int:
    redact_process_output()  # secrets in URLs and keys masked in every line drun prints
    args = build_parser().parse_args(argv)
    commands = {
        "train": cmd_train,
        "test": cmd_test,
        "hooks": cmd_hooks,
        "check": cmd_check,
        "plot": cmd_plot,
        "tune": cmd_tune,
        "export": cmd_export,
    }
    try:
        return commands[args.command](args)
    except ConfigError as e:
        if args.debug:
            raise
        print(f"drun: error: {e}", file=sys.stderr)
        return 2
    except TrainingPreempted as e:
        if e.interrupted:
            print(f"drun: {paused_line(e, argv)}", file=sys.stderr)
            return INTERRUPT_EXIT_CODE
        print(f"drun: {e}", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (setup, a test, a plot)
        print("\ndrun: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPT_EXIT_CODE
    except (CheckpointWriteError, DataReadError) as e:  # a full disk, lost data: what is intact
        if args.debug:
            raise
        print(f"drun: error: {e}", file=sys.stderr)
        return 1


def paused_line(stopped: TrainingPreempted, argv: Sequence[str] | None) -> str:
    """Where a run stopped by Ctrl-C stands, and the command that continues it: the one that
    ran, with ``--resume`` (the newest verified checkpoint) in place of any ``--resume``."""
    words = list(sys.argv[1:] if argv is None else argv)
    kept: list[str] = []
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word == "--resume":
            following = words[i + 1] if i + 1 < len(words) else ""
            skip = bool(following) and not following.startswith("-")  # --resume PATH
            continue
        if not word.startswith("--resume="):
            kept.append(word)
    again = shlex.join(["drun", *kept, "--resume"])
    return (
        f"stopped by Ctrl-C after iteration {stopped.iteration}; checkpoint "
        f"{stopped.checkpoint}. Continue with: {again}"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
