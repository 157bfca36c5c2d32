"""Metrics and the evaluator that gathers them across ranks; which metric is better larger.

May import: model, core.
"""
