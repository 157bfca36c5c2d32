"""Where the Runner's cost per iteration goes in the user's path: hook_overhead.py's headline
case taken apart.

Five Runners, each with one part more than the one before, measured as the headline figure is
(each Runner epoch preceded by a bare epoch in the same process; the median of the pairs'
differences in process CPU time), their runs interleaved round by round so that the machine's
drift spreads over all five:

1. no default hooks: the loop, ``DefaultSampler`` and collate, the step wrapper;
2. the default hooks registered, their ``before_train_iter``/``after_train_iter`` emptied: what
   dispatching them costs;
3. RuntimeInfoHook, IterTimerHook and ParamSchedulerHook at work (lr, loss, times and the ETA in
   the MessageHub every iteration; the schedulers stepped), LoggerHook's method still empty;
4. LoggerHook building its record every 10 iterations (smoothed scalars, ETA), with no sinks;
5. the records written: the terminal line (stdout sent to a file, and ``run.log``) and the JSON
   line — the headline figure.

Timing a part from inside the loop would time it with the timer's own cost and with warm caches
for whatever the timer touches; removing it from a real run, as here, measures what the run
saves. The parts are additive up to the noise (their quartiles are printed).

    python benchmarks/overhead_parts.py [--rounds 8] [--epochs 5]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.hook_overhead import USER_ITERS, paired_user_run, spread
from distributed_runner.engine.hook import overrides
from hooks import Hook, IterTimerHook, LoggerHook, ParamSchedulerHook, RuntimeInfoHook

PER_ITERATION = ("before_train_iter", "after_train_iter")


def emptied(cls: type) -> Hook:
    """An instance of ``cls`` whose per-iteration mount points do nothing — still overridden,
    so the dispatcher still calls them."""
    def before(self, runner, batch_idx, data_batch=None) -> None:
        return None

    def after(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        return None

    real = cls()  # the dispatcher's rule: a mount point it would call, helpers included
    body = {name: fn for name, fn in zip(PER_ITERATION, (before, after)) if overrides(real, name)}
    return type(f"Emptied{cls.__name__}", (cls,), body)()


def variants() -> list[tuple[str, dict]]:
    """(label, default_hooks) for the five Runners, in order; a fresh hook instance each run."""
    off = dict(runtime_info=None, timer=None, sampler_seed=None, logger=None,
               param_scheduler=None, checkpoint=None)
    working = dict(checkpoint=None, logger=emptied(LoggerHook))
    return [
        ("loop, DefaultSampler + collate, step wrapper (no default hooks)", off),
        ("+ the default hooks dispatched, per-iteration bodies empty",
         dict(checkpoint=None, runtime_info=emptied(RuntimeInfoHook), timer=emptied(IterTimerHook),
              param_scheduler=emptied(ParamSchedulerHook), logger=emptied(LoggerHook))),
        ("+ RuntimeInfo, IterTimer, ParamScheduler hooks at work", working),
        ("+ LoggerHook's record every 10 iterations, no sinks",
         dict(checkpoint=None, logger=dict(sinks=[]))),
        ("+ the records written: terminal line (to a file), JSON line", dict(checkpoint=None)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    labels = [label for label, _ in variants()]
    diffs: dict[str, list[float]] = {label: [] for label in labels}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (label, default_hooks) in enumerate(variants()):
                pairs = paired_user_run(args.epochs, f"{tmp}/r{r}v{i}", "INFO", default_hooks)
                diffs[label] += [ours - bare for bare, ours in pairs]
    print(f"overhead parts: the user path of hook_overhead.py ({USER_ITERS} iters/epoch), each "
          f"Runner with one part more than the one above; {len(diffs[labels[0]])} pairs each, "
          f"process CPU time, runs interleaved")
    before = 0.0
    for label in labels:
        median, q1, q3 = (x * 1e6 for x in spread(diffs[label]))
        print(f"{label:<62} {median:5.1f} us/iter (quartiles {q1:5.1f} .. {q3:5.1f}) | "
              f"part {median - before:+5.1f}")
        before = median


if __name__ == "__main__":
    main()
