"""Where a run's records go: the sinks (terminal, JSON lines, Parquet, TensorBoard, MLflow,
wandb) and their service, the throughput meter, and ``drun plot``.

May import: core.
"""
