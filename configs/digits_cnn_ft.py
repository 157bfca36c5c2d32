# The digits CNN as 2 replica processes that survive a lost one (docs/how-to/fault-tolerance.md):
#   drun train configs/digits_cnn_ft.py
# Each replica trains 16 samples of every global batch of 32 (the base config's); when one is
# killed, the other trains the whole batch until drun's replacement has healed from it.
_base_ = ['digits_cnn.py']

work_dir = 'work_dirs/digits_cnn_ft'
train_dataloader = dict(batch_size=16)  # x 2 replicas: the base config's global batch of 32
fault_tolerance = dict(mode='replicas', replicas=2, min_replicas=1, heartbeat_timeout=1.0)
