"""Hyperparameter sweeps over hooked configs (``drun tune``): Ray Tune drives trials, each an
ordinary drun run in its own ``work_dir/trials/<trial_id>/``.

May import: launch and everything below it.
"""
