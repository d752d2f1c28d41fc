"""Stand-in for `timm.utils.clip_grad.dispatch_clip_grad`: clip by norm or by value (timm's
"agc" mode is not needed by the test script and raises here)."""
import torch


def dispatch_clip_grad(parameters, value, mode="norm", norm_type=2.0):
    if mode == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, value, norm_type=norm_type)
    elif mode == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        raise ValueError(f"unsupported clip mode {mode!r} in this stand-in")
