"""How code that runs inside a verify run tells the harness what it cannot see by itself.

The apex emulation scales losses and skips optimizer steps on overflow in its own code, not through
`torch.amp.GradScaler`, which the harness instruments; it reports both here. Outside a verify run
nobody listens and the calls do nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Dict

_listeners: Dict[str, Callable[..., None]] = {}


def listen(event: str, callback: Callable[..., None]) -> None:
    _listeners[event] = callback


def loss_scaled(loss: Any, scaled: Any) -> None:
    """`scaled` is `loss` times a loss scale: the curve records `loss`."""
    scaled.__dict__["_ampmigrate_unscaled"] = loss.detach()
    callback = _listeners.get("scaled")
    if callback is not None:
        callback()


def model_cast(dtype: Any) -> None:
    """apex O2/O3 converted a model's weights to `dtype` (no autocast region shows that precision)."""
    callback = _listeners.get("model_cast")
    if callback is not None:
        callback(dtype)


def step_skipped(optimizer: Any) -> None:
    """The optimizer's step was skipped for inf/NaN gradients."""
    callback = _listeners.get("skipped")
    if callback is not None:
        callback(optimizer)
