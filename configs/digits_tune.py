# A sweep over the digits example: drun tune configs/digits_tune.py
# (four learning rates and two widths; ASHA stops the weak trials after their first epochs)
_base_ = 'digits_cnn.py'
work_dir = 'work_dirs/digits_tune'

tune = dict(
    metric='accuracy', mode='max',
    param_space={
        'optim_wrapper.optimizer.lr': dict(type='loguniform', lower=1e-4, upper=3e-2),
        'model.width': dict(type='choice', categories=[8, 16]),
    },
    num_samples=4,
    scheduler=dict(type='ASHA', grace_period=1, reduction_factor=2),
)
