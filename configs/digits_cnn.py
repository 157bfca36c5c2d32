# A small CNN on scikit-learn's bundled 8x8 digits: >= 95 % validation accuracy in seconds on a CPU.
#   drun train configs/digits_cnn.py
custom_imports = dict(imports=['distributed_runner.examples.digits'])

work_dir = 'work_dirs/digits_cnn'
model = dict(type='DigitsCNN', width=16)

train_dataloader = dict(
    dataset=dict(type='DigitsDataset', split='train'),
    batch_size=32,
    sampler=dict(type='DefaultSampler', shuffle=True),
    num_workers=0,
)
val_dataloader = dict(
    dataset=dict(type='DigitsDataset', split='val'),
    batch_size=128,
    sampler=dict(type='DefaultSampler', shuffle=False),
)
val_evaluator = dict(type='Accuracy', topk=1)
val_cfg = dict()
test_dataloader = val_dataloader
test_evaluator = val_evaluator
test_cfg = dict()

train_cfg = dict(by_epoch=True, max_epochs=12, val_interval=1)
optim_wrapper = dict(optimizer=dict(type='AdamW', lr=3e-3, weight_decay=1e-4))
param_scheduler = [
    # one epoch of linear warmup, stepped every iteration ...
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=45),
    # ... then a cosine decay over the remaining epochs, also stepped every iteration
    dict(type='CosineAnnealingLR', by_epoch=True, begin=1, end=12, eta_min=1e-5,
         convert_to_iter_based=True),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', interval=4, max_keep_ckpts=2, save_best='accuracy'),
)
randomness = dict(seed=0)
