"""The estimator of a CPU-sized adversarial-training project written for ampmigrate's tests, in the
shape of a robustness toolbox's classifier wrapper: apex is set up in `__init__` when `use_amp` is
given, its `enabled` chosen inside that `if`; `fit_batch()` scales its loss and steps, and
`loss_gradient()` scales a loss only to read the gradient of its input (it never steps).
"""

import torch


class Classifier:
    def __init__(self, model, loss, optimizer, use_amp=False, opt_level="O1", loss_scale=1.0):
        self._model = model
        self._loss = loss
        self._optimizer = optimizer
        self._use_amp = use_amp

        if self._use_amp:
            from apex import amp

            if next(self._model.parameters()).device.type == "meta":
                enabled = False
            else:
                enabled = True

            self._model, self._optimizer = amp.initialize(
                models=self._model,
                optimizers=self._optimizer,
                enabled=enabled,
                opt_level=opt_level,
                loss_scale=loss_scale,
                verbosity=0,
            )

    def fit_batch(self, x, y):
        self._model.train()
        self._optimizer.zero_grad()
        outputs = self._model(x)
        loss = self._loss(outputs, y)
        if self._use_amp:
            from apex import amp

            with amp.scale_loss(loss, self._optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        self._optimizer.step()
        return loss.item()

    def loss_gradient(self, x, y):
        x_grad = x.clone().detach().requires_grad_(True)
        outputs = self._model(x_grad)
        loss = self._loss(outputs, y)

        self._model.zero_grad()
        if self._use_amp:
            from apex import amp

            with amp.scale_loss(loss, self._optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()

        grads = x_grad.grad
        assert grads.shape == x.shape
        return grads
