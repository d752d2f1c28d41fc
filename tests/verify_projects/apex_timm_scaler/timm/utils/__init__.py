"""Stand-in for `timm.utils`: the two loss scalers and the clip dispatcher they use."""
from .clip_grad import dispatch_clip_grad
from .cuda import ApexScaler, NativeScaler

__all__ = ["ApexScaler", "NativeScaler", "dispatch_clip_grad"]
