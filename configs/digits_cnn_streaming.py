# The digits CNN on 2 Ray Train workers streaming Parquet shards with StreamingLoader: each worker
# reads its own part of the files straight from storage (a folder here; s3://... works the same),
# in an order fixed by the seed, so the run resumes exactly at any worker count.
#   python tools/digits_to_parquet.py            # writes data/digits_parquet/{train,val}
#   drun train configs/digits_cnn_streaming.py
_base_ = 'digits_cnn_ray.py'
work_dir = 'work_dirs/digits_cnn_streaming'
launcher = dict(num_workers=(1, 2))  # elastic: the same global batches on 1 or 2 workers
train_dataloader = dict(
    _delete_=True,
    type='StreamingLoader',
    dataset=dict(type='ParquetShards', paths='data/digits_parquet/train'),
    batch_size=16,  # per worker at 2 workers: a global batch of 32, as the single-process example
    shuffle=True,
    num_workers=1,  # loader processes per worker: the worker's streams are dealt to them
    num_streams=32,  # fixes the order with the seed; every worker count must divide it
    shuffle_window=64,
)
# 1438 rows: 30 streams of 45 rows and 2 of 44; an epoch is 44 global batches of 32 and a last
# one of the 30 rows left (45 iterations)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=44),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=1, end=12, eta_min=1e-5,
         convert_to_iter_based=True),
]
