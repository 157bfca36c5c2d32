"""The example on a real terminal (a tmux pane): the progress bar and the log lines share it.

What a user sees must hold up: every log line written while the bar is live ("new best ...",
validation) is whole, the bar is on the screen once at the end, it moves between logging
intervals, it shows an ETA early, and the bundled example prints no warning."""
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow("the example trained in a real tmux terminal"),
              pytest.mark.timeout(300),
              pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]
ROOT = Path(__file__).resolve().parents[2]
# batches of 8 (180 an epoch): the first half of the run lasts seconds even on a fast machine.
# With the example's 32 (45 an epoch) it lasted ~0.5 s here, and whether a 0.15 s poll of the
# pane caught the bar with its ETA inside it depended on the machine (failed 3 of 3 runs alone
# at one commit, passed 3 of 3 at the next, failed in the full suite).
EPOCHS, PER_EPOCH, BATCH = 6, 180, 8
TOTAL = EPOCHS * PER_EPOCH


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30).stdout


@pytest.mark.serial("reads a live progress bar off the terminal")
def test_progress_bar_and_log_lines_on_a_real_tty(tmp_path):
    session = f"drun-tty-{os.getpid()}"
    command = (f"cd {ROOT} && {sys.executable} -m distributed_runner.cli train "
               f"configs/digits_cnn.py --work-dir {tmp_path / 'wd'} --cfg-options "
               f"train_cfg.max_epochs={EPOCHS} train_dataloader.batch_size={BATCH}; "
               f"echo DRUN_EXIT=$?; sleep 600")
    env = dict(os.environ, TERM="xterm-256color")
    env.pop("TMUX", None)
    # the pane's size is the terminal's: pytest-xdist's workers set COLUMNS=80 and LINES=24,
    # which would make drun draw for an 80-column terminal inside a 200-column pane
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "200", "-y", "50",
                    command], env=env, check=True, timeout=30)
    frames = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            screen = tmux("capture-pane", "-p", "-t", session)
            frames.append(screen)
            if "DRUN_EXIT=" in screen:
                break
            time.sleep(0.15)
        full = tmux("capture-pane", "-p", "-S", "-", "-E", "-", "-t", session)
    finally:
        tmux("kill-session", "-t", session)
    (tmp_path / "screen.txt").write_text(full)  # for a human: what the terminal showed
    assert "DRUN_EXIT=0" in full, full[-3000:]
    lines = [line.rstrip() for line in full.splitlines()]
    # every "new best" line whole, with its timestamp (none clobbered by the bar)
    best = [line for line in lines if "best_accuracy_epoch_" in line]
    assert best and all(re.fullmatch(r"\d\d/\d\d \d\d:\d\d:\d\d INFO new best accuracy = "
                                     r"[\d.]+: saved best_accuracy_epoch_\d+\.pth", line)
                        for line in best), best
    val = [line for line in lines if "Epoch(val)" in line]
    assert len(val) == EPOCHS and all(re.match(r"\d\d/\d\d \d\d:\d\d:\d\d INFO Epoch\(val\) "
                                               r"\[\d\]", line) for line in val), val
    # the bar once, finished, at the end; no stale copies
    bars = [line for line in lines if re.search(rf"\b\d+/{TOTAL}\b", line)]
    assert len(bars) == 1 and f"{TOTAL}/{TOTAL}" in bars[0], bars
    # while training: the bar moved between the logger's records (every 20 batches of an
    # epoch) and showed an ETA within the first half
    seen = []
    for frame in frames:
        for line in frame.splitlines():
            m = re.search(rf"\b(\d+)/{TOTAL}\b.*eta\s+(\S+)", line)
            if m:
                seen.append((int(m.group(1)), m.group(2)))
    logged = {e * PER_EPOCH + i for e in range(EPOCHS)
              for i in [*range(20, PER_EPOCH + 1, 20), PER_EPOCH]}
    assert any(done not in logged for done, _ in seen), seen
    assert any(done < TOTAL // 2 and re.fullmatch(r"\d+:\d\d:\d\d", eta) for done, eta in seen), \
        seen
    assert "WARNING" not in full and "Traceback" not in full
