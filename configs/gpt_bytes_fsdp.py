# configs/gpt_bytes.py on 2 Ray workers with FSDP2, each GPT2Block sharded on its own.
#   drun train configs/gpt_bytes_fsdp.py
# (`drun train configs/gpt_bytes.py --launcher ray --num-workers 2 --strategy fsdp` also runs,
# with the whole model as one FSDP unit: correct, no memory saved.)
_base_ = 'gpt_bytes.py'
work_dir = 'work_dirs/gpt_bytes_fsdp'
launcher = dict(type='ray', num_workers=2, use_gpu=False)
strategy = dict(type='fsdp', shard_modules=['GPT2Block'], checkpoint='sharded')
train_dataloader = dict(batch_size=16)  # per worker: 2 x 16 = the single-process 32
