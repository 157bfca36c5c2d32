"""Parallelism beyond data parallelism: the device mesh and tensor parallelism.

``strategy=dict(type='fsdp', tp=T, dp_replicate=R)`` lays the ``W`` ranks out as a mesh of shape
``(dp_replicate=R, dp_shard=W/(R*T), tp=T)`` (:mod:`.mesh`). The model's layers are first split
across the ``tp`` dimension by a tensor-parallel plan (:mod:`.tensor_parallel`: the model's own,
as transformers ships for Llama, Qwen, Mistral..., or ``tp_plan=`` in the config), then FSDP2
shards every parameter over ``dp_shard`` and replicates it over ``dp_replicate``
(:mod:`distributed_runner.model.sharding`). The ``T`` ranks of a tensor-parallel group read the
same batch (:func:`distributed_runner.core.dist.get_data_parallel_rank`); gradient norms over
parameters that live on different meshes are :mod:`.grad_norm`'s.

May import: core.
"""
