"""Does CUDA autocast already cast every op that AMP105 drops a registration for, as apex did?

`apex.amp.register_half_function(torch, "einsum")` (HF's `run_squad.py` and its many copies) and
`register_float_function(module, "name")` asked apex O1 to call a function with its floating
inputs cast to float16 / float32. ampmigrate's AMP105 removes such a registration when the op is
in `ampmigrate.api.AUTOCAST_CUDA_HALF_OPS` / `AUTOCAST_CUDA_FLOAT_OPS`, on the ground that
`torch.autocast("cuda", dtype=torch.float16)` casts it the same way by itself. This checks that
ground on a GPU, for every entry of those tables: apex's behaviour (inputs cast, then the call)
against the fp32 inputs called under fp16 autocast with nothing registered, forward outputs and
input gradients, bit for bit. For einsum it also covers the attention einsums of transformers'
XLNet/BERT and equations that are no matrix product.

    python bench/gpu/autocast_registrations.py [--json OUT]      # on a CUDA machine

Exit status 1 when any entry differs (or has no inputs defined here).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F

from ampmigrate.api import AUTOCAST_CUDA_FLOAT_OPS, AUTOCAST_CUDA_HALF_OPS

MODULES = {"torch": torch, "torch.nn.functional": F}
DEVICE = "cuda"  # `--device cpu` only checks that every entry runs: CPU autocast has other lists

# einsum equations: XLNet (modeling_xlnet.py, 2020) and BERT-style attention, then no matrix product.
EINSUMS = [
    ("ibnd,jbnd->bnij", [(64, 8, 12, 64), (64, 8, 12, 64)]),
    ("bnij,jbnd->ibnd", [(8, 12, 64, 64), (64, 8, 12, 64)]),
    ("ibh,hnd->ibnd", [(64, 8, 768), (768, 12, 64)]),
    ("ibnd,hnd->ibh", [(64, 8, 12, 64), (768, 12, 64)]),
    ("bhqd,bhkd->bhqk", [(8, 12, 128, 64), (8, 12, 128, 64)]),
    ("bi,bi->b", [(256, 1024), (256, 1024)]),
    ("ij,ij->ij", [(512, 512), (512, 512)]),
    ("i,j->ij", [(512,), (512,)]),
    ("ij->ji", [(512, 256)]),
    ("ii->i", [(512, 512)]),
]


def _randn(*shape):
    return torch.randn(*shape, device=DEVICE)


def _unit(*shape):  # inside (-1, 1)
    return torch.rand(*shape, device=DEVICE) * 1.8 - 0.9


def _positive(*shape):
    return torch.rand(*shape, device=DEVICE) + 0.1


def _signs(*shape):
    return torch.randint(0, 2, shape, device=DEVICE).float() * 2 - 1


# op -> (floating tensor inputs, call taking them). Non-tensor arguments are fixed in the call.
Case = Tuple[List[torch.Tensor], Callable[..., torch.Tensor]]
CONV = {
    "conv1d": (lambda: [_randn(2, 4, 16), _randn(8, 4, 3)], {}),
    "conv2d": (lambda: [_randn(2, 4, 8, 8), _randn(8, 4, 3, 3)], {}),
    "conv3d": (lambda: [_randn(2, 4, 4, 4, 4), _randn(8, 4, 3, 3, 3)], {}),
    "conv_transpose1d": (lambda: [_randn(2, 4, 16), _randn(4, 8, 3)], {}),
    "conv_transpose2d": (lambda: [_randn(2, 4, 8, 8), _randn(4, 8, 3, 3)], {}),
    "conv_transpose3d": (lambda: [_randn(2, 4, 4, 4, 4), _randn(4, 8, 3, 3, 3)], {}),
}


def cases(module: str, op: str) -> List[Case]:
    fn = getattr(MODULES[module], op)
    if op == "einsum":
        return [([_randn(*s) for s in shapes], lambda *t, e=eq: torch.einsum(e, *t)) for eq, shapes in EINSUMS]
    if op in CONV:
        return [(CONV[op][0](), fn)]
    unary = {
        "acos": _unit, "asin": _unit, "erfinv": _unit, "cosh": _unit, "sinh": _unit, "tan": _unit,
        "exp": _unit, "expm1": _unit, "log": _positive, "log10": _positive, "log2": _positive,
        "log1p": _positive, "reciprocal": _positive, "rsqrt": _positive, "softplus": _randn,
    }
    if op in unary:
        return [([unary[op](64, 64)], fn)]
    table: Dict[str, Case] = {
        "matmul": ([_randn(64, 32), _randn(32, 16)], fn),
        "mm": ([_randn(64, 32), _randn(32, 16)], fn),
        "bmm": ([_randn(4, 8, 16), _randn(4, 16, 8)], fn),
        "mv": ([_randn(32, 16), _randn(16)], fn),
        "addmm": ([_randn(64, 16), _randn(64, 32), _randn(32, 16)], fn),
        "addmv": ([_randn(32), _randn(32, 16), _randn(16)], fn),
        "addr": ([_randn(16, 8), _randn(16), _randn(8)], fn),
        "addbmm": ([_randn(8, 8), _randn(4, 8, 16), _randn(4, 16, 8)], fn),
        "baddbmm": ([_randn(4, 8, 8), _randn(4, 8, 16), _randn(4, 16, 8)], fn),
        "chain_matmul": ([_randn(16, 32), _randn(32, 8), _randn(8, 4)], fn),
        "prelu": ([_randn(2, 4, 8), _positive(4)], fn),
        "linear": ([_randn(8, 16), _randn(32, 16), _randn(32)], fn),
        "pow": ([_positive(64, 64)], lambda x: fn(x, 2.5)),
        "softmax": ([_randn(16, 64)], lambda x: fn(x, -1)),
        "log_softmax": ([_randn(16, 64)], lambda x: fn(x, -1)),
        "cumsum": ([_randn(64, 16)], lambda x: fn(x, 0)),
        "cumprod": ([_unit(16, 16)], lambda x: fn(x, 0)),
        "sum": ([_randn(256, 64)], fn),
        "prod": ([_unit(64)], fn),
        "logsumexp": ([_randn(16, 64)], lambda x: fn(x, -1)),
        "cdist": ([_randn(8, 4), _randn(6, 4)], fn),
        "pdist": ([_randn(8, 4)], fn),
        "cosine_similarity": ([_randn(8, 16), _randn(8, 16)], fn),
        "layer_norm": ([_randn(4, 16), _randn(16), _randn(16)], lambda x, w, b: fn(x, [16], w, b)),
        "group_norm": ([_randn(2, 4, 8), _randn(4), _randn(4)], lambda x, w, b: fn(x, 2, w, b)),
        "nll_loss": ([F.log_softmax(_randn(8, 5), -1)], lambda x, t=torch.arange(8, device=DEVICE) % 5: fn(x, t)),
        "mse_loss": ([_randn(8, 4), _randn(8, 4)], fn),
        "l1_loss": ([_randn(8, 4), _randn(8, 4)], fn),
        "smooth_l1_loss": ([_randn(8, 4), _randn(8, 4)], fn),
        "huber_loss": ([_randn(8, 4), _randn(8, 4)], fn),
        "kl_div": ([F.log_softmax(_randn(8, 5), -1), F.softmax(_randn(8, 5), -1)], lambda a, b: fn(a, b, reduction="batchmean")),
        "binary_cross_entropy_with_logits": ([_randn(8, 4), torch.rand(8, 4, device=DEVICE)], fn),
        "poisson_nll_loss": ([_randn(8, 4), _positive(8, 4)], fn),
        "margin_ranking_loss": ([_randn(8), _randn(8), _signs(8)], fn),
        "soft_margin_loss": ([_randn(8, 4)], lambda x, y=_signs(8, 4): fn(x, y)),
        "multilabel_margin_loss": ([_randn(4, 5)], lambda x, t=torch.tensor([[3, 0, -1, 1, 2]] * 4, device=DEVICE): fn(x, t)),
        "multi_margin_loss": ([_randn(4, 5)], lambda x, t=torch.tensor([1, 0, 4, 2], device=DEVICE): fn(x, t)),
        "hinge_embedding_loss": ([_randn(8, 4), _signs(8, 4)], fn),
        "cosine_embedding_loss": ([_randn(4, 8), _randn(4, 8), _signs(4)], fn),
        "triplet_margin_loss": ([_randn(4, 8), _randn(4, 8), _randn(4, 8)], fn),
    }
    return [table[op]] if op in table else []


def _same(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _call(call, inputs, mode: str):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    if mode == "half":  # apex's register_half_function: floating inputs cast to fp16
        output = call(*[x.half() for x in leaves])
    elif mode == "float":  # apex's register_float_function: inputs cast to fp32 (fed fp16 here)
        output = call(*[x.half().float() for x in leaves])
    else:  # torch.autocast, nothing registered (fed the same fp16 values for the float ops)
        with torch.autocast(DEVICE, dtype=torch.float16):
            output = call(*[(x.half() if mode == "autocast_from_half" else x) for x in leaves])
    output.float().sum().backward()
    return output.detach(), [x.grad for x in leaves]


def main() -> int:
    parser = argparse.ArgumentParser(description="CUDA autocast against apex's registered casts")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--device", default="cuda", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}")
    rows, failed = [], 0
    for api, table in (("register_half_function", AUTOCAST_CUDA_HALF_OPS), ("register_float_function", AUTOCAST_CUDA_FLOAT_OPS)):
        for module, ops in table.items():
            for op in sorted(ops):
                found = cases(module, op)
                same = bool(found)
                dtypes = set()
                for inputs, call in found:
                    apex_mode, auto_mode = ("half", "autocast") if api == "register_half_function" else (
                        "float", "autocast_from_half"  # float ops matter where autocast feeds them fp16
                    )
                    try:
                        apex, apex_grads = _call(call, inputs, apex_mode)
                        auto, auto_grads = _call(call, inputs, auto_mode)
                    except (RuntimeError, NotImplementedError) as error:
                        dtypes.add((f"error: {str(error).splitlines()[0][:60]}", ""))
                        same = False
                        continue
                    dtypes.add((str(apex.dtype), str(auto.dtype)))
                    same &= apex.dtype == auto.dtype and torch.equal(apex, auto)
                    same &= all(_same(a, b) for a, b in zip(apex_grads, auto_grads))
                failed += not same
                row = {"api": api, "op": f"{module}.{op}", "cases": len(found), "identical": same,
                       "dtypes": sorted(dtypes)}
                rows.append(row)
                print(f"{api:24} {module + '.' + op:50} cases {len(found):2}  {'identical' if same else 'DIFFERENT'}  {sorted(dtypes)}")
    print(f"{len(rows) - failed} of {len(rows)} registrations identical under autocast")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"torch": torch.__version__, "device": name, "rows": rows}, handle, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
