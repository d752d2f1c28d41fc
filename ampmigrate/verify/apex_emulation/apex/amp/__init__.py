"""apex.amp emulated with torch: `initialize` (O0-O3), `scale_loss`, `master_params`,
`state_dict`/`load_state_dict`, the function annotations.

O1 patches every torch function with apex's casting lists; here that is fp16 autocast switched on
for the rest of the run (its weight cache off, as weights change between steps). O2 and O3 convert
the model to fp16 (O2 keeps batch norm in fp32 and gives the optimizer fp32 master weights; the
model's forward casts inputs to fp16 and outputs to fp32). `scale_loss` yields `loss.float() *
scale`; on leaving it the gradients of that backward are unscaled (into the master gradients under
O2), added to those of earlier backwards of the step (which apex set aside on entering) and checked,
and on overflow a dynamic scale halves and the optimizer's next `step()` is skipped.
"""

import contextlib
import functools

import torch

from apex import REMOVED_IN_CURRENT_APEX, removed

if REMOVED_IN_CURRENT_APEX:
    raise removed("apex.amp")

from apex.amp import _amp_state  # noqa: E402
from apex.amp.scaler import LossScaler  # noqa: E402

try:  # inside a verify run: tell the harness about scaled losses and skipped steps
    from ampmigrate.verify import observe as _observe
except ImportError:  # pragma: no cover - the emulation on its own
    _observe = None

_OPT_LEVELS = {
    # cast_model_type, patch_torch_functions, keep_batchnorm_fp32, master_weights, loss_scale
    "O0": (torch.float32, False, None, False, 1.0),
    "O1": (None, True, None, None, "dynamic"),
    "O2": (torch.float16, False, True, True, "dynamic"),
    "O3": (torch.float16, False, False, False, 1.0),
}


class Properties:
    def __init__(self, opt_level, cast_model_type, patch_torch_functions, keep_batchnorm_fp32, master_weights, loss_scale):
        self.enabled = True
        self.opt_level = opt_level
        self.cast_model_type = cast_model_type
        self.patch_torch_functions = patch_torch_functions
        self.keep_batchnorm_fp32 = keep_batchnorm_fp32
        self.master_weights = master_weights
        self.loss_scale = loss_scale
        self.cast_model_outputs = None


def _as_bool(value):
    if isinstance(value, str):
        if value not in ("True", "False"):
            raise RuntimeError("keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None, found "
                               f"keep_batchnorm_fp32 = {value}")
        return value == "True"
    return value


def _as_loss_scale(value):
    if value == "dynamic":
        return value
    return float(value)


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None, loss_scale=None,
               cast_model_outputs=None, num_losses=1, verbosity=1, min_loss_scale=None, max_loss_scale=2.0**24):
    _amp_state.verbosity = verbosity
    if not enabled:
        _amp_state.opt_properties = None
        return (models, optimizers) if optimizers is not None else models
    if opt_level not in _OPT_LEVELS:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', 'O3'.  Note that in "
                           "`O0`, `O1`, etc., the prefix O is the letter O, not the number zero.")
    defaults = _OPT_LEVELS[opt_level]
    props = Properties(opt_level, *defaults)
    for name, value in (("cast_model_type", cast_model_type), ("patch_torch_functions", patch_torch_functions),
                        ("keep_batchnorm_fp32", _as_bool(keep_batchnorm_fp32)), ("master_weights", master_weights),
                        ("loss_scale", None if loss_scale is None else _as_loss_scale(loss_scale))):
        if value is not None:
            setattr(props, name, value)
    props.cast_model_outputs = cast_model_outputs
    _amp_state.opt_properties = props
    _amp_state.min_loss_scale, _amp_state.max_loss_scale = min_loss_scale, max_loss_scale
    _amp_state.loss_scalers = [LossScaler(props.loss_scale, min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
                               for _ in range(num_losses)]

    model_list = list(models) if isinstance(models, (list, tuple)) else [models]
    optimizer_list = [] if optimizers is None else (list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers])
    if props.cast_model_type is not None:
        for model in model_list:
            _convert_model(model, props.cast_model_type, bool(props.keep_batchnorm_fp32))
            _patch_forward(model, props.cast_model_type, props.cast_model_outputs or torch.float32)
        if _observe is not None and props.cast_model_type != torch.float32:
            _observe.model_cast(props.cast_model_type)
    for optimizer in optimizer_list:
        _process_optimizer(optimizer, bool(props.master_weights))
    if props.patch_torch_functions:
        _patch_torch_functions()

    models_out = model_list if isinstance(models, (list, tuple)) else model_list[0]
    if optimizers is None:
        return models_out
    optimizers_out = optimizer_list if isinstance(optimizers, (list, tuple)) else optimizer_list[0]
    return models_out, optimizers_out


def _patch_torch_functions():
    """apex O1: fp16 casting of the whole script from here on (autocast entered and never left)."""
    region = torch.autocast("cuda" if torch.cuda.is_available() else "cpu", dtype=torch.float16, cache_enabled=False)
    region.__enter__()
    _amp_state.handle = region


def _is_batchnorm(module):
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm)


def _convert_model(model, dtype, keep_batchnorm_fp32):
    for module in model.modules():
        if keep_batchnorm_fp32 and _is_batchnorm(module):
            module.float()
            _cast_around(module, torch.float32, dtype)
            continue
        for name, param in module.named_parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
        for name, buffer in module.named_buffers(recurse=False):
            if buffer is not None and buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _cast_around(module, inside, outside):
    forward = module.forward

    @functools.wraps(forward)
    def cast_forward(*args, **kwargs):
        return _cast(forward(*_cast(args, inside), **_cast(kwargs, inside)), outside)

    module.forward = cast_forward


def _patch_forward(model, input_type, output_type):
    _cast_around(model, input_type, output_type)


class _Stash:
    def __init__(self):
        self.masters = []  # (model param, fp32 master) pairs (O2)
        self.skip_next = False
        self.loss_ids = set()
        self.params_have_scaled_gradients = False  # a `delay_unscale=True` backward left them scaled
        self.grad_stash = []  # (param, gradient) set aside by `scale_loss` until its backward is unscaled


def _process_optimizer(optimizer, master_weights):
    stash = optimizer._amp_stash = _Stash()
    if master_weights:
        for group in optimizer.param_groups:
            params = []
            for param in group["params"]:
                if param.dtype == torch.float16:
                    master = param.detach().clone().float().requires_grad_(param.requires_grad)
                    stash.masters.append((param, master))
                    params.append(master)
                else:
                    params.append(param)
            group["params"] = params
    original_step = optimizer.step
    original_zero_grad = optimizer.zero_grad

    def step(*args, **kwargs):
        if stash.skip_next:
            stash.skip_next = False
            if _observe is not None:
                _observe.step_skipped(optimizer)
            return None
        result = original_step(*args, **kwargs)
        with torch.no_grad():
            for model_param, master in stash.masters:
                model_param.copy_(master)
        return result

    def zero_grad(*args, **kwargs):
        original_zero_grad(*args, **kwargs)
        for model_param, _ in stash.masters:  # apex O2 also clears the fp16 model gradients
            model_param.grad = None

    optimizer.step = step
    optimizer.zero_grad = zero_grad


def _optimizer_list(optimizers):
    return list(optimizers) if isinstance(optimizers, (list, tuple)) else [optimizers]


def _stepped_params(optimizer, stash):
    """The parameters the optimizer steps that the backward fills directly (not O2's masters)."""
    masters = {id(master) for _, master in stash.masters} if stash is not None else set()
    return [p for group in optimizer.param_groups for p in group["params"] if id(p) not in masters]


def _prepare_backward(optimizer):
    """apex `_prepare_amp_backward`: gradients already there (an earlier backward of this step,
    already unscaled) are set aside, so that only the new backward's gradients get unscaled."""
    stash = getattr(optimizer, "_amp_stash", None)
    if stash is None or stash.params_have_scaled_gradients:
        return
    stash.grad_stash = []
    for param in _stepped_params(optimizer, stash):
        stash.grad_stash.append((param, param.grad))
        param.grad = None
    for model_param, _ in stash.masters:
        model_param.grad = None


def _post_backward(optimizer, scaler, scale):
    """apex `_post_amp_backward`: the new gradients divided by the scale (O2: into the fp32 master
    gradients), plus the gradients set aside before the backward; inf/NaN noted."""
    stash = getattr(optimizer, "_amp_stash", None)
    if stash is not None and stash.masters:
        for model_param, master in stash.masters:
            if model_param.grad is not None:
                new = model_param.grad.detach().float()
                scaler.unscale_grads([new], scale)
                master.grad = new if master.grad is None else master.grad.add_(new)
                model_param.grad = None
    stashed = {id(param): grad for param, grad in stash.grad_stash} if stash is not None else {}
    for param in _stepped_params(optimizer, stash):
        old = stashed.get(id(param))
        if param.grad is None:
            if old is not None:
                param.grad = old
            continue
        scaler.unscale_grads([param.grad], scale)
        if old is not None:
            param.grad.add_(old)
            scaler.unscale_grads([param.grad], 1.0)  # the overflow check sees the sum, as apex's
    if stash is not None:
        stash.grad_stash = []
        stash.params_have_scaled_gradients = False


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    props = _amp_state.opt_properties
    if props is None or not props.enabled:
        yield loss
        return
    scaler = _amp_state.loss_scalers[loss_id]
    scale = scaler.loss_scale()
    if not delay_unscale:
        for optimizer in _optimizer_list(optimizers):
            _prepare_backward(optimizer)
    scaled = loss.float() * scale
    if _observe is not None and scale != 1.0:
        _observe.loss_scaled(loss, scaled)
    yield scaled
    if delay_unscale:  # gradient accumulation: the gradients stay scaled until a later scale_loss
        for optimizer in _optimizer_list(optimizers):
            stash = getattr(optimizer, "_amp_stash", None)
            if stash is not None:
                stash.params_have_scaled_gradients = True
        return
    scaler.clear_overflow_state()
    for optimizer in _optimizer_list(optimizers):
        _post_backward(optimizer, scaler, scale)
    should_skip = scaler.update_scale()
    if should_skip:
        for optimizer in _optimizer_list(optimizers):
            stash = getattr(optimizer, "_amp_stash", None)
            if stash is not None:
                stash.skip_next = True
        if _amp_state.verbosity:
            print(f"Gradient overflow.  Skipping step, loss scaler {loss_id} reducing loss scale to {scaler.loss_scale()}")


def master_params(optimizer):
    """The parameters the optimizer steps (the fp32 masters under O2)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            yield param


def state_dict(destination=None):
    destination = {} if destination is None else destination
    for index, scaler in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{index}"] = {"loss_scale": scaler.loss_scale(), "unskipped": scaler._unskipped}
    return destination


def load_state_dict(state_dict):
    if len(state_dict) != len(_amp_state.loss_scalers):
        print(f"Warning:  state_dict contains {len(state_dict)} entries, while {len(_amp_state.loss_scalers)} loss_scalers are used")
    for index, scaler in enumerate(_amp_state.loss_scalers):
        entry = state_dict.get(f"loss_scaler{index}")
        if entry is not None:
            scaler._loss_scale = entry["loss_scale"]
            scaler._unskipped = entry["unskipped"]


# ------------------------------------------------------------------ function annotations (O1)
def _casting(dtype):
    def decorator(function):
        @functools.wraps(function)
        def wrapper(*args, **kwargs):
            props = _amp_state.opt_properties
            if props is None or not props.patch_torch_functions:
                return function(*args, **kwargs)
            with torch.autocast("cuda" if torch.cuda.is_available() else "cpu", enabled=False):
                return function(*_cast(args, dtype), **_cast(kwargs, dtype))

        return wrapper

    return decorator


half_function = _casting(torch.float16)
float_function = _casting(torch.float32)


def promote_function(function):
    return function


def _register(module, name, decorator):
    setattr(module, name, decorator(getattr(module, name)))


def register_half_function(module, name):
    _register(module, name, half_function)


def register_float_function(module, name):
    _register(module, name, float_function)


def register_promote_function(module, name):
    pass


@contextlib.contextmanager
def disable_casts():
    with torch.autocast("cuda" if torch.cuda.is_available() else "cpu", enabled=False):
        yield
