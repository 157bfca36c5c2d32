# A Hugging Face ViT, built from its config (no download), on scikit-learn's 8x8 digits. The
# model does not know this runner: it is called as it is, forward(pixel_values=..., labels=...),
# its loss is the returned .loss and Accuracy reads the returned .logits.
#   drun train configs/vit_digits.py          (pip install -e ".[hf]" installs transformers)
_base_ = 'digits_cnn.py'  # the same data, schedule, metric and hooks

work_dir = 'work_dirs/vit_digits'
model = dict(
    _delete_=True,  # not a DigitsCNN with more arguments: replace the base's model
    type='transformers.ViTForImageClassification',
    config=dict(type='transformers.ViTConfig', image_size=8, patch_size=2, num_channels=1,
                hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, num_labels=10,
                hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
)
# the images under the key the model's forward takes
train_dataloader = dict(dataset=dict(inputs_key='pixel_values'))
val_dataloader = dict(dataset=dict(inputs_key='pixel_values'))
test_dataloader = val_dataloader
