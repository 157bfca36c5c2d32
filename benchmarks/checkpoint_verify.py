"""What verifying a checkpoint costs a resume: ``load_file`` of one checkpoint with its checksum
file (CRC-32 computed on a second thread while torch reads the file) and of the same bytes
without one (torch.load alone), each followed by copying the weights into a model's tensors (what
``load_state_dict`` does), interleaved, side by side in one run.

The checkpoint is a state_dict of float32 tensors (default 100 MB) written by ``atomic_save`` and
read from the page cache (the second load of a file, as a resume right after a save is). Printed:
median milliseconds of each and their ratio; the figure is read by people, not asserted.

    python benchmarks/checkpoint_verify.py [--mb 100] [--rounds 15]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from distributed_runner.checkpoint.files import atomic_save, checksum_path, load_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    tensors = max(args.mb // 4, 1)  # 4 MB each
    state = {"meta": {"iter": 1},
             "state_dict": {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(tensors)}}
    with tempfile.TemporaryDirectory() as tmp:
        verified = atomic_save(state, Path(tmp) / "verified.pth")
        plain = Path(tmp) / "plain.pth"
        shutil.copyfile(verified, plain)  # the same bytes, no checksum beside it
        assert checksum_path(verified).is_file() and not checksum_path(plain).exists()
        model = {k: torch.empty_like(v) for k, v in state["state_dict"].items()}

        def resume(path: Path) -> None:
            for key, value in load_file(path, "bench")["state_dict"].items():
                model[key].copy_(value)

        times: dict[str, list[float]] = {"verified": [], "unverified": []}
        size = verified.stat().st_size / 1e6
        for path in (verified, plain):  # warm the page cache
            resume(path)
        for _ in range(args.rounds):
            for name, path in (("verified", verified), ("unverified", plain)):
                start = time.perf_counter()
                resume(path)
                times[name].append(time.perf_counter() - start)
    med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(f"load and restore a {size:.0f} MB checkpoint (median of {args.rounds}, interleaved): "
          f"verified {med['verified']:.1f} ms | unverified {med['unverified']:.1f} ms | "
          f"ratio {med['verified'] / med['unverified']:.3f}")


if __name__ == "__main__":
    main()
