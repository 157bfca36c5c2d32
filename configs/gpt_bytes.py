# A GPT (Hugging Face's GPT-2 architecture, built from its config: 1.85M parameters, no
# download) learning Python's own standard library byte by byte. On a 2-core CPU it gets from
# perplexity 256 (guessing) to 4.83 in 600 iterations (3 min 52 s measured on an idle machine, see
# docs/how-to/gpt-example.md).
#   python tools/make_byte_corpus.py        # writes data/byte_corpus/{train,val}/*.parquet
#   drun train configs/gpt_bytes.py
# Variants (see docs/how-to/gpt-example.md, "Variants"):
#   drun train configs/gpt_bytes.py --launcher ray --num-workers 2        # DDP on 2 Ray workers
#   drun train configs/gpt_bytes_fsdp.py                # FSDP, each GPT2Block a shard unit
#   drun train configs/gpt_bytes_raydata.py             # training set read through Ray Data
#   drun train configs/gpt_bytes.py --cfg-options compile=True
# `--strategy fsdp` on this config shards the model as one unit (a DDP strategy refuses
# shard_modules, so the per-block list lives in gpt_bytes_fsdp.py).
import os

custom_imports = dict(imports=['distributed_runner.examples.lm'])
work_dir = 'work_dirs/gpt_bytes'

# what tools/make_byte_corpus.py wrote, made absolute here (on the driver) because Ray workers run
# in a working directory of Ray's; on a multi-node cluster put it on shared storage
data_root = os.path.abspath('data/byte_corpus')

# the corpus's block size (tools/make_byte_corpus.py --block-size); n_positions must cover it
block_size = 128
model = dict(
    type='transformers.GPT2LMHeadModel',
    config=dict(type='transformers.GPT2Config', vocab_size=256, n_positions=block_size,
                n_embd=192, n_layer=4, n_head=6,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,  # too short a run to overfit
                # GPT-2's 50256 is outside a byte vocabulary; nothing here generates with them
                bos_token_id=None, eos_token_id=None),
)

train_dataloader = dict(
    dataset=dict(type='ByteShards', data_root=data_root, split='train',
                 block_size=block_size),
    batch_size=32,
    sampler=dict(type='DefaultSampler', shuffle=True),
)
val_dataloader = dict(
    # the first 512 of the (shuffled) validation rows: 65k bytes, a few seconds on a CPU
    dataset=dict(type='ByteShards', data_root=data_root, split='val', max_rows=512,
                 block_size=block_size),
    batch_size=64,
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Perplexity')  # reports loss and perplexity (exp of the mean loss)
val_cfg = dict()
test_dataloader = val_dataloader
test_evaluator = val_evaluator
test_cfg = dict()

max_iters = 600
train_cfg = dict(by_epoch=False, max_iters=max_iters, val_interval=200)
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.02, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=max_iters, eta_min=2e-4),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=200, max_keep_ckpts=1,
                    save_best='perplexity', rule='less'),
)
randomness = dict(seed=0)
