# The digits CNN on 2 Ray Train workers reading Parquet through Ray Data.
#   python tools/digits_to_parquet.py            # writes data/digits_parquet/{train,val}
#   drun train configs/digits_cnn_raydata.py
# Ray Data needs CPUs besides the workers' (the launcher refuses a request that starves it).
_base_ = 'digits_cnn_ray.py'
work_dir = 'work_dirs/digits_cnn_raydata'
train_dataloader = dict(
    _delete_=True,
    type='RayDataLoader',
    dataset=dict(type='parquet', paths='data/digits_parquet/train'),
    batch_size=16,  # per worker: 2 x 16 = the single-process example's 32
    local_shuffle_buffer_size=256,
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=45),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=1, end=12, eta_min=1e-5,
         convert_to_iter_based=True),
]
