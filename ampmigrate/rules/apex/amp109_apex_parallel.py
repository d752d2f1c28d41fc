"""AMP109: apex.parallel (removed in May 2025) -> torch DDP and SyncBatchNorm."""

from ampmigrate.api import APEX_PARALLEL
from ampmigrate.rules.apex._class_migration import CallArgs, ClassSite, Converted, Mapping, report_class_sites
from ampmigrate.rules.base import Rule

_DDP_DROPPED = ("message_size", "delay_allreduce", "shared_param", "allreduce_trigger_params",
                "retain_allreduce_buffers", "allreduce_always_fp32", "num_allreduce_streams",
                "allreduce_communicators", "prof")


def ddp(call: CallArgs) -> Converted:
    call.require("gradient_average", (True,), "`gradient_average=False` (summed gradients) has no DDP argument")
    call.require("gradient_predivide_factor", (1.0, 1), "`gradient_predivide_factor` has no DDP argument")
    call.require("gradient_average_split_factor", (None,), "`gradient_average_split_factor` has no DDP argument")
    dropped = [name for name in _DDP_DROPPED if call.has(name)]
    note = f"{', '.join(f'`{n}`' for n in dropped)} only tuned apex's communication; dropped" if dropped else None
    return Converted("torch.nn.parallel.DistributedDataParallel", call.keep(("module",), positional_prefix=1), note=note)


ddp.params = ("module", "message_size", "delay_allreduce", "shared_param", "allreduce_trigger_params",
              "retain_allreduce_buffers", "allreduce_always_fp32", "num_allreduce_streams",
              "allreduce_communicators", "gradient_average", "gradient_predivide_factor",
              "gradient_average_split_factor", "prof")


def convert_syncbn(call: CallArgs) -> Converted:
    call.require("channel_last", (False,), "`channel_last=True` has no torch equivalent")
    args = call.keep(("module", "process_group"), positional_prefix=2)
    return Converted("torch.nn.SyncBatchNorm.convert_sync_batchnorm", args)


convert_syncbn.params = ("module", "process_group", "channel_last")


def sync_bn(call: CallArgs) -> Converted:
    call.require("channel_last", (False,), "`channel_last=True` has no torch equivalent")
    call.require("fuse_relu", (False,), "`fuse_relu=True` has no torch equivalent")
    args = call.keep(("num_features", "eps", "momentum", "affine", "track_running_stats", "process_group"), positional_prefix=6)
    return Converted("torch.nn.SyncBatchNorm", args)


sync_bn.params = ("num_features", "eps", "momentum", "affine", "track_running_stats", "process_group", "channel_last", "fuse_relu")

_NO_EQUIVALENT = {
    "LARC": "apex.parallel.LARC (layer-wise adaptive rate clipping) has no torch equivalent; vendor it or drop it",
    "Reducer": "apex.parallel.Reducer has no torch equivalent; use torch.distributed.all_reduce on the gradients",
    "create_syncbn_process_group": "apex.parallel.create_syncbn_process_group has no torch equivalent; build the "
    "group with torch.distributed.new_group(ranks) and pass it to torch.nn.SyncBatchNorm.convert_sync_batchnorm",
}

MAPPINGS = {}
for qname, short in APEX_PARALLEL.items():
    if short == "DistributedDataParallel":
        MAPPINGS[qname] = Mapping("AMP109", "torch.nn.parallel.DistributedDataParallel", (1, 0), ddp, value_use_ok=True)
    elif short == "convert_syncbn_model":
        MAPPINGS[qname] = Mapping("AMP109", None, (1, 2), convert_syncbn)
    elif short == "SyncBatchNorm":
        MAPPINGS[qname] = Mapping("AMP109", "torch.nn.SyncBatchNorm", (1, 2), sync_bn, value_use_ok=True)
    elif short in _NO_EQUIVALENT:
        MAPPINGS[qname] = Mapping("AMP109", None, (0, 0), None, reason=_NO_EQUIVALENT[short])


class ApexParallel(Rule):
    code = "AMP109"
    triggers = (r"\bapex\b",)  # every use resolves through an import that names apex
    qualified_prefixes = ("apex",)  # every finding is on a name imported from apex

    def check(self, ctx) -> None:
        report_class_sites(ctx, MAPPINGS, "parallel", self.message)

    @staticmethod
    def message(site: ClassSite) -> str:
        replacement = {
            "DistributedDataParallel": "`torch.nn.parallel.DistributedDataParallel`",
            "convert_syncbn_model": "`torch.nn.SyncBatchNorm.convert_sync_batchnorm`",
            "SyncBatchNorm": "`torch.nn.SyncBatchNorm`",
        }.get(site.short)
        what = f"`apex.parallel.{site.short}`"
        if replacement is None:
            return f"{what} was removed from apex in May 2025, so this no longer runs; it has no torch equivalent"
        return f"{what} was removed from apex in May 2025, so this no longer runs; use {replacement}"
