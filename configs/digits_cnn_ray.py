# The digits CNN on 2 Ray Train workers (CPU, gloo), same data and schedule as digits_cnn.py.
#   drun train configs/digits_cnn_ray.py
# or any config on Ray from the command line:
#   drun train configs/digits_cnn.py --launcher ray --num-workers 2
_base_ = 'digits_cnn.py'
work_dir = 'work_dirs/digits_cnn_ray'
launcher = dict(type='ray', num_workers=2, use_gpu=False, max_failures=1)
custom_hooks = [dict(type='SyncBuffersHook')]
