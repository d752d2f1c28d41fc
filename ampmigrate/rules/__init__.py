"""The rule registry: every rule class, listed explicitly (no import-time magic)."""

from __future__ import annotations

from typing import List

from ampmigrate.rules.base import Rule


def rule_classes() -> List[type]:
    from ampmigrate.rules.apex.amp101_apex_amp import ApexAmp
    from ampmigrate.rules.apex.amp102_apex_amp_o3 import ApexAmpO3
    from ampmigrate.rules.apex.amp103_apex_amp_o0 import ApexAmpO0
    from ampmigrate.rules.apex.amp104_apex_amp_handle import ApexAmpHandle
    from ampmigrate.rules.apex.amp105_apex_amp_cast_annotations import ApexAmpCastAnnotations
    from ampmigrate.rules.apex.amp106_apex_fp16_utils import ApexFp16Utils
    from ampmigrate.rules.apex.amp107_apex_fused_optimizer import ApexFusedOptimizer
    from ampmigrate.rules.apex.amp108_apex_fused_norm import ApexFusedNorm
    from ampmigrate.rules.apex.amp109_apex_parallel import ApexParallel
    from ampmigrate.rules.apex.amp110_apex_no_equivalent import ApexNoTorchEquivalent
    from ampmigrate.rules.legacy_api.amp201_legacy_autocast import LegacyAutocast
    from ampmigrate.rules.legacy_api.amp202_legacy_grad_scaler import LegacyGradScaler
    from ampmigrate.rules.legacy_api.amp203_legacy_custom_fwd_bwd import LegacyCustomFwdBwd
    from ampmigrate.rules.legacy_api.amp204_isinstance_legacy_class import IsinstanceLegacyClass
    from ampmigrate.rules.legacy_api.amp205_legacy_autocast_state import LegacyAutocastState
    from ampmigrate.rules.legacy_api.amp206_version_gated_legacy_api import VersionGatedLegacyApi
    from ampmigrate.rules.legacy_api.amp207_autocast_positional_enabled import AutocastPositionalEnabled

    return [
        ApexAmp,
        ApexAmpO3,
        ApexAmpO0,
        ApexAmpHandle,
        ApexAmpCastAnnotations,
        ApexFp16Utils,
        ApexFusedOptimizer,
        ApexFusedNorm,
        ApexParallel,
        ApexNoTorchEquivalent,
        LegacyAutocast,
        LegacyGradScaler,
        LegacyCustomFwdBwd,
        IsinstanceLegacyClass,
        LegacyAutocastState,
        VersionGatedLegacyApi,
        AutocastPositionalEnabled,
    ]


def all_rules() -> List[Rule]:
    return [cls() for cls in rule_classes()]
