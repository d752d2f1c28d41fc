"""Stand-in for `timm.utils.cuda`, after timm's documented behaviour of its two loss scalers, which
share one call protocol: `scaler(loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None,
create_graph=False)`, `state_dict()`, `load_state_dict(state)` and a `state_dict_key`.

- ApexScaler: backward under `apex.amp.scale_loss`, then (when clipping) a clip of
  `amp.master_params(optimizer)`, then `optimizer.step()`. Its checkpoint key is "amp".
- NativeScaler: `GradScaler.scale(loss).backward()`, then (when clipping) `unscale_(optimizer)`
  and a clip of `parameters` (which must be given), then `step` and `update`. Its key is "amp_scaler".

apex is imported only where ApexScaler runs, so a program that no longer uses it never loads it.
"""
import torch

from .clip_grad import dispatch_clip_grad


class ApexScaler:
    state_dict_key = "amp"

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False):
        from apex import amp

        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward(create_graph=create_graph)
        if clip_grad is not None:
            dispatch_clip_grad(amp.master_params(optimizer), clip_grad, mode=clip_mode)
        optimizer.step()

    def state_dict(self):
        from apex import amp

        return amp.state_dict()

    def load_state_dict(self, state_dict):
        from apex import amp

        amp.load_state_dict(state_dict)


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cuda")

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if clip_grad is not None:
            assert parameters is not None
            self._scaler.unscale_(optimizer)  # the clip sees the true gradients
            dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
        self._scaler.step(optimizer)
        self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)
