"""A pipeline step for streamed-data tests on Ray (its workers import this module through
``custom_imports``): it appends each sample's ``index`` to a file, one line per sample with the
process id, and removes the column so the model gets only its own arguments."""
import os

from distributed_runner.core.registry import TRANSFORMS


@TRANSFORMS.register_module(force=True)
class RecordAndDropIndex:
    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, sample: dict) -> dict:
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()} {int(sample.pop('index'))}\n")
        return sample
