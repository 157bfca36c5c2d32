# configs/gpt_bytes.py with its training set streamed by StreamingLoader from the same Parquet
# shards (columns input_ids and labels: the model's keyword arguments), read row group by row
# group in an order fixed by the seed; on Ray each worker reads its own streams of the files.
#   python tools/make_byte_corpus.py        # data/byte_corpus/{train,val}
#   drun train configs/gpt_bytes_streaming.py
#   drun train configs/gpt_bytes_streaming.py --launcher ray --num-workers 2
_base_ = 'gpt_bytes.py'
work_dir = 'work_dirs/gpt_bytes_streaming'
train_dataloader = dict(
    _delete_=True,
    type='StreamingLoader',
    dataset=dict(type='ParquetShards', paths='data/byte_corpus/train'),
    batch_size=32,  # per worker: the single-process example's 32 on one worker
    shuffle=True,
    num_workers=1,
    num_streams=8,  # fixes the order with the seed; 1, 2, 4 or 8 workers divide it
    shuffle_window=4096,
)
