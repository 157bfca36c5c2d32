"""One training iteration reads in three files: the loop (loops.py), the step (step.py) and the
dispatcher (dispatch.py, whose generated callers run under the name ``<hook dispatch: MOUNT>``).

The test follows every Python call the engine makes from one ``before_train_iter`` to the next and
names the engine files they run in. What the iteration hands work to is left out: the hooks' own
code (the only hook here is the tracer), the model (with its ``data_preprocessor``: ``model.py``'s
``BaseDataPreprocessor`` here), torch, and the data (``data.py``'s sampler and collate, which the
loop's ``for data_batch in dataloader`` reaches through torch's DataLoader)."""
import sys
from pathlib import Path

import pytest

import distributed_runner
from hooks import Hook
from tests.toy import make_runner

ENGINE = Path(distributed_runner.__file__).parent
NO_DEFAULT_HOOKS = dict(runtime_info=None, timer=None, logger=None, param_scheduler=None,
                        checkpoint=None, sampler_seed=None)


class EngineFilesOfOneIteration(Hook):
    """Profiles the engine's Python calls from the 3rd ``before_train_iter`` to the 4th."""

    def __init__(self) -> None:
        self.files: set[str] = set()

    def _record(self, frame, event, arg) -> None:
        if event != "call":
            return
        name = frame.f_code.co_filename
        if name.startswith("<hook dispatch"):
            self.files.add("dispatch.py")
        elif Path(name).is_relative_to(ENGINE):
            self.files.add(str(Path(name).relative_to(ENGINE)))

    def before_train_iter(self, runner, batch_idx=None, data_batch=None) -> None:
        if runner.iter == 2:
            sys.setprofile(self._record)
        elif runner.iter == 3:
            sys.setprofile(None)


# the plain step (ToyModel) does its update itself; the general one (a model with a
# data_preprocessor) hands it to the configured OptimWrapper's methods (context, backward,
# accumulation, clipping, step: optim.py), a component the config chooses as it chooses the model
@pytest.mark.parametrize("model, component", [("ToyModel", set()),
                                              ("StepToyPreprocessed", {"optim.py"})])
def test_one_iteration_runs_in_the_loop_the_step_and_the_dispatcher(tmp_path, model, component):
    import tests.unit.test_step_strategy  # noqa: F401  (registers StepToyPreprocessed)
    tracer = EngineFilesOfOneIteration()
    runner = make_runner(tmp_path, model=dict(type=model), default_hooks=NO_DEFAULT_HOOKS,
                         custom_hooks=[tracer], val_dataloader=None, val_evaluator=None,
                         val_cfg=None, train_cfg=dict(by_epoch=True, max_epochs=1))
    runner.train()
    assert tracer.files - {"data.py", "model.py"} == {"loops.py", "step.py", "dispatch.py",
                                                      *component}
