"""Asynchronous validation (``val_cfg=dict(mode='async')``): the training loop's side and where
validations run. The validating process itself builds a Runner, so it lives in
:mod:`distributed_runner.launch.validation_worker`.

May import: checkpoint, health, core.
"""
