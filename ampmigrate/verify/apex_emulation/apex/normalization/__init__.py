"""apex.normalization emulated with torch.nn (apex's eps default, 1e-5, kept for the RMS norms)."""

import torch


class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


class FusedRMSNorm(torch.nn.RMSNorm):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)


class MixedFusedLayerNorm(FusedLayerNorm):
    """Parameters stay fp32, the output has the input's dtype."""

    def forward(self, input):
        return super().forward(input.float()).to(input.dtype)


class MixedFusedRMSNorm(FusedRMSNorm):
    def forward(self, input):
        return super().forward(input.float()).to(input.dtype)
