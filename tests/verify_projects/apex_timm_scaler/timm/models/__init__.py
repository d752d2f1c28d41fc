"""Stand-in for `timm.models.model_parameters` (timm 0.4+, timm/models/helpers.py): every parameter,
or all but the last two (the classifier head's weight and bias) with `exclude_head`, which timm's
train.py asks for under adaptive gradient clipping (`clip_mode="agc"`)."""


def model_parameters(model, exclude_head=False):
    if exclude_head:
        return [p for p in model.parameters()][:-2]
    return model.parameters()
