# Fine-tuning a pretrained model with LoRA: the weights come from a directory save_pretrained
# wrote (here a small Llama made by tools/make_tiny_llama.py; on a cluster, a real one such as
# Llama-3-8B on shared storage or s3://), only the adapters train, and `drun export` writes the
# result back as a directory transformers, vLLM or the Hub read. See docs/how-to/pretrained.md.
#   python tools/make_tiny_llama.py        # data/tiny_llama: config.json, sharded safetensors
#   python tools/make_byte_corpus.py       # data/byte_corpus: the byte corpus (vocabulary 256)
#   drun train configs/llama_lora.py --name lora
#   drun export work_dirs/llama_lora/lora exported/llama_lora --merge-adapters
import os

custom_imports = dict(imports=['distributed_runner.examples.lm'])
work_dir = 'work_dirs/llama_lora'

# absolute on the driver: Ray workers run in a working directory of Ray's
pretrained = os.path.abspath('data/tiny_llama')
data_root = os.path.abspath('data/byte_corpus')
block_size = 128

# the model as its config.json describes it, built without weights; load_from fills it (each
# rank reading only its shards under FSDP), and PEFT wraps it: only lora_A / lora_B train
model = dict(
    type='peft.get_peft_model',
    model=dict(type='transformers.AutoModelForCausalLM.from_config',
               config=dict(type='transformers.AutoConfig.from_pretrained',
                           pretrained_model_name_or_path=pretrained)),
    peft_config=dict(type='peft.LoraConfig', r=8, lora_alpha=16, lora_dropout=0.0,
                     target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj']),
)
load_from = pretrained

train_dataloader = dict(
    dataset=dict(type='ByteShards', data_root=data_root, split='train', block_size=block_size),
    batch_size=16,
    sampler=dict(type='DefaultSampler', shuffle=True),
)
val_dataloader = dict(
    dataset=dict(type='ByteShards', data_root=data_root, split='val', max_rows=256,
                 block_size=block_size),
    batch_size=64,
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Perplexity')
val_cfg = dict()

max_iters = 200
train_cfg = dict(by_epoch=False, max_iters=max_iters, val_interval=100)
optim_wrapper = dict(optimizer=dict(type='AdamW', lr=3e-3, weight_decay=0.0),
                     clip_grad=dict(max_norm=1.0))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=False, begin=0, end=max_iters,
                        eta_min=3e-4)]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=100, max_keep_ckpts=1,
                    save_last=True),
)
randomness = dict(seed=0)
