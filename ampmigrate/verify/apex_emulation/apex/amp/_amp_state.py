"""apex.amp's global state, as far as training scripts read it (`_amp_state.loss_scalers[i]`,
`_amp_state.opt_properties`, `_amp_state.verbosity`)."""

opt_properties = None
loss_scalers = []
verbosity = 1
min_loss_scale = None
max_loss_scale = 2.0**24
allow_incoming_model_not_fp32 = False
handle = None
