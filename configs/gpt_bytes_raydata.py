# configs/gpt_bytes.py on Ray Train workers, the training set streamed by Ray Data from the
# same Parquet shards (columns input_ids and labels: the model's keyword arguments).
#   python tools/make_byte_corpus.py        # data/byte_corpus/{train,val}
#   drun train configs/gpt_bytes_raydata.py
# Ray Data needs CPUs besides the workers' (the launcher refuses a request that starves it): on a
# 2-core machine add `--num-workers 1`. Validation reads data/byte_corpus/val on every worker
# (ByteShards, the base config's absolute data_root): on a multi-node cluster put the corpus on
# shared storage.
_base_ = 'gpt_bytes.py'
work_dir = 'work_dirs/gpt_bytes_raydata'
launcher = dict(type='ray', num_workers=2, use_gpu=False)
train_dataloader = dict(
    _delete_=True,
    type='RayDataLoader',
    dataset=dict(type='parquet', paths='data/byte_corpus/train'),
    batch_size=16,  # per worker: 2 x 16 = the single-process example's 32
    local_shuffle_buffer_size=1024,  # the rows were shuffled when written; this mixes more
)
