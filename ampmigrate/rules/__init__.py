"""The rule registry: every rule class, listed explicitly (no import-time magic)."""

from __future__ import annotations

from typing import List

from ampmigrate.rules.base import Rule


def rule_classes() -> List[type]:
    from ampmigrate.rules.meta.amp001_unused_noqa import UnusedNoqa
    from ampmigrate.rules.apex.amp101_apex_amp import ApexAmp
    from ampmigrate.rules.apex.cross_module import ApexAmpPassedIn
    from ampmigrate.rules.apex.amp_from_helper import ApexAmpFromHelper
    from ampmigrate.rules.apex.amp_attribute import ApexAmpAttribute
    from ampmigrate.rules.apex.amp_unbound import ApexAmpUnbound
    from ampmigrate.rules.apex.amp102_apex_amp_o3 import ApexAmpO3
    from ampmigrate.rules.apex.amp103_apex_amp_o0 import ApexAmpO0
    from ampmigrate.rules.apex.amp104_apex_amp_handle import ApexAmpHandle
    from ampmigrate.rules.apex.amp105_apex_amp_cast_annotations import ApexAmpCastAnnotations
    from ampmigrate.rules.apex.amp106_apex_fp16_utils import ApexFp16Utils
    from ampmigrate.rules.apex.amp107_apex_fused_optimizer import ApexFusedOptimizer
    from ampmigrate.rules.apex.amp108_apex_fused_norm import ApexFusedNorm
    from ampmigrate.rules.apex.amp109_apex_parallel import ApexParallel
    from ampmigrate.rules.apex.amp110_apex_no_equivalent import ApexNoTorchEquivalent
    from ampmigrate.rules.apex.amp111_apex_removed_import import ApexRemovedImport
    from ampmigrate.rules.legacy_api.amp201_legacy_autocast import LegacyAutocast
    from ampmigrate.rules.legacy_api.amp202_legacy_grad_scaler import LegacyGradScaler
    from ampmigrate.rules.legacy_api.amp203_legacy_custom_fwd_bwd import LegacyCustomFwdBwd
    from ampmigrate.rules.legacy_api.amp204_isinstance_legacy_class import IsinstanceLegacyClass
    from ampmigrate.rules.legacy_api.amp205_legacy_autocast_state import LegacyAutocastState
    from ampmigrate.rules.legacy_api.amp206_version_gated_legacy_api import VersionGatedLegacyApi
    from ampmigrate.rules.legacy_api.amp207_autocast_positional_enabled import AutocastPositionalEnabled
    from ampmigrate.rules.legacy_api.amp208_legacy_amp_import import LegacyAmpImport
    from ampmigrate.rules.grad_scaler.amp301_clip_without_unscale import ClipWithoutUnscale
    from ampmigrate.rules.grad_scaler.amp302_unscale_without_step import UnscaleWithoutStep
    from ampmigrate.rules.grad_scaler.amp303_optimizer_step_bypasses_scaler import OptimizerStepBypassesScaler
    from ampmigrate.rules.grad_scaler.amp304_step_without_update import StepWithoutUpdate
    from ampmigrate.rules.grad_scaler.amp305_update_without_step import UpdateWithoutStep
    from ampmigrate.rules.grad_scaler.amp306_backward_inside_autocast import BackwardInsideAutocast
    from ampmigrate.rules.grad_scaler.amp307_loss_outside_autocast import LossOutsideAutocast
    from ampmigrate.rules.grad_scaler.amp308_checkpoint_without_scaler_state import CheckpointWithoutScalerState
    from ampmigrate.rules.precision.amp401_float16_autocast import Float16Autocast
    from ampmigrate.rules.precision.amp402_redundant_grad_scaler import RedundantGradScaler
    from ampmigrate.rules.precision.amp403_hf_fp16_training_args import HfFp16TrainingArgs
    from ampmigrate.rules.precision.amp404_hf_removed_precision_args import HfRemovedPrecisionArgs
    from ampmigrate.rules.precision.amp405_lightning_fp16_precision import LightningFp16Precision
    from ampmigrate.rules.precision.amp406_lightning_precision_alias import LightningPrecisionAlias
    from ampmigrate.rules.precision.amp407_accelerate_fp16 import AccelerateFp16
    from ampmigrate.rules.precision.amp408_deepspeed_fp16_config import DeepSpeedFp16Config
    from ampmigrate.rules.precision.amp409_pure_fp16_training import PureFp16Training
    from ampmigrate.rules.precision.amp410_legacy_tf32_flags import LegacyTf32Flags
    from ampmigrate.rules.precision.amp411_hand_rolled_loss_scaling import HandRolledLossScaling

    return [
        UnusedNoqa,
        ApexAmp,
        ApexAmpPassedIn,
        ApexAmpFromHelper,
        ApexAmpAttribute,
        ApexAmpUnbound,
        ApexAmpO3,
        ApexAmpO0,
        ApexAmpHandle,
        ApexAmpCastAnnotations,
        ApexFp16Utils,
        ApexFusedOptimizer,
        ApexFusedNorm,
        ApexParallel,
        ApexNoTorchEquivalent,
        ApexRemovedImport,
        LegacyAutocast,
        LegacyGradScaler,
        LegacyCustomFwdBwd,
        IsinstanceLegacyClass,
        LegacyAutocastState,
        VersionGatedLegacyApi,
        AutocastPositionalEnabled,
        LegacyAmpImport,
        ClipWithoutUnscale,
        UnscaleWithoutStep,
        OptimizerStepBypassesScaler,
        StepWithoutUpdate,
        UpdateWithoutStep,
        BackwardInsideAutocast,
        LossOutsideAutocast,
        CheckpointWithoutScalerState,
        Float16Autocast,
        RedundantGradScaler,
        HfFp16TrainingArgs,
        HfRemovedPrecisionArgs,
        LightningFp16Precision,
        LightningPrecisionAlias,
        AccelerateFp16,
        DeepSpeedFp16Config,
        PureFp16Training,
        LegacyTf32Flags,
        HandRolledLossScaling,
    ]


def rule_codes() -> List[str]:
    """The codes of `rule_classes()` (as a set), without importing a rule module (nor LibCST):
    every rule has a catalogue entry `rules/<CODE>.toml` and every entry a rule
    (tests/test_catalogue.py), so the entries' file names are the codes. Settings are validated
    against these, so that a run whose files are all cached imports no rule at all."""
    from ampmigrate.catalogue import CatalogueError, catalogue_dir

    try:
        return sorted(path.stem for path in catalogue_dir().glob("*.toml"))
    except CatalogueError:  # no catalogue: the engine reports it on the first file it checks
        return [cls.code for cls in rule_classes()]


def all_rules() -> List[Rule]:
    return [cls() for cls in rule_classes()]
