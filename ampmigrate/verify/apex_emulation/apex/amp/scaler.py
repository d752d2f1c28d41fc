"""apex's LossScaler: a static scale, or a dynamic one that halves on overflow and doubles after
2000 clean steps (apex `scaler.py`)."""

import torch


class LossScaler:
    warned_no_fused_kernel = False

    def __init__(self, loss_scale, init_scale=2.0**16, scale_factor=2.0, scale_window=2000,
                 min_loss_scale=None, max_loss_scale=2.0**24):
        self.dynamic = loss_scale == "dynamic"
        self._loss_scale = min(max_loss_scale, init_scale) if self.dynamic else float(loss_scale)
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._scale_factor = scale_factor
        self._unskipped = 0
        self._has_overflow = False

    def loss_scale(self):
        return self._loss_scale

    def unscale(self, params, scale):
        """Divide the gradients of `params` by `scale`; note an inf/NaN among them."""
        self.unscale_grads([param.grad for param in params if param.grad is not None], scale)

    def unscale_grads(self, grads, scale):
        """Divide the gradient tensors `grads` by `scale` in place; note an inf/NaN among them."""
        for grad in grads:
            if scale != 1.0:
                grad.mul_(1.0 / scale)
            if not torch.isfinite(grad).all():
                self._has_overflow = True

    def clear_overflow_state(self):
        self._has_overflow = False

    def update_scale(self):
        """After a backward: returns whether the step must be skipped (only a dynamic scale skips)."""
        if self._has_overflow and self.dynamic:
            should_skip = True
            if self._min_loss_scale:
                self._loss_scale = max(self._min_loss_scale, self._loss_scale / 2.0)
            else:
                self._loss_scale = self._loss_scale / 2.0
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip
