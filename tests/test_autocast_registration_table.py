"""AMP105 drops `amp.register_half_function(M, "op")` / `register_float_function` only for the ops of
`ampmigrate.api.AUTOCAST_CUDA_HALF_OPS` / `AUTOCAST_CUDA_FLOAT_OPS`. bench/gpu/autocast_registrations.py
checks each entry on a GPU (bench/gpu/RESULTS.md); this keeps the table and that check in step on a
machine without one: every entry names a real function and has inputs in the GPU check."""

import importlib.util
from pathlib import Path

import pytest

from ampmigrate.api import AUTOCAST_CUDA_FLOAT_OPS, AUTOCAST_CUDA_HALF_OPS


CHECK = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "autocast_registrations.py"
ENTRIES = sorted(
    {(module, op) for table in (AUTOCAST_CUDA_HALF_OPS, AUTOCAST_CUDA_FLOAT_OPS) for module, ops in table.items() for op in ops}
)


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("autocast_registrations", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.DEVICE = "cpu"  # builds the inputs only; CPU autocast has other cast lists
    return module


def test_the_tables_keep_apart_and_leave_out_what_the_gpu_check_found_different():
    for module in AUTOCAST_CUDA_HALF_OPS.keys() & AUTOCAST_CUDA_FLOAT_OPS.keys():
        assert not AUTOCAST_CUDA_HALF_OPS[module] & AUTOCAST_CUDA_FLOAT_OPS[module]
    assert "sum" not in AUTOCAST_CUDA_FLOAT_OPS["torch"]  # an H200 measured it rounding differently


@pytest.mark.parametrize("module,op", ENTRIES)
def test_every_entry_is_a_real_function_with_inputs_in_the_gpu_check(gpu_check, module, op):
    assert callable(getattr(gpu_check.MODULES[module], op))
    found = gpu_check.cases(module, op)
    assert found, f"{module}.{op} has no inputs in {CHECK.name}"
    for inputs, call in found:
        output = call(*inputs)
        assert output.dtype.is_floating_point
