"""The child side of `verify`: run one training script as `__main__` and record its loss curve.

    python -m ampmigrate.verify.harness SPEC.json

SPEC names the script, its arguments, the number of optimizer steps, the seed, the device and
the precision mode; the result (a JSON file named by SPEC) holds the loss of every step, the step
times, the peak memory and, if the script failed, its traceback. Nothing in the script is edited:

- seeds: `random`, `numpy` (if installed) and `torch` are seeded before the script starts; in the
  noise-floor runs the script's own `torch.manual_seed`/`random.seed`/`numpy.random.seed` calls
  are shifted by the run's offset, so those runs differ even in a script that seeds itself;
- the loss: every `backward()` on a one-element tensor is observed (`torch.autograd.backward`,
  which `Tensor.backward` calls); a tensor made by `GradScaler.scale` carries the loss it scaled,
  so the curve is the true, unscaled loss. A step's loss is the sum of the losses backpropagated
  since the previous step (gradient accumulation divides them already);
- the steps: torch's global optimizer post-step hook counts the steps of the first optimizer that
  steps. An iteration whose step a GradScaler skipped (inf/NaN gradients) is noted but not
  counted, and its loss is left out, so curves line up by updates applied: loss number k is
  always measured on the weights after k-1 updates, whether or not the run skipped steps on the
  way. After N steps the run stops (an exception from the hook that `except Exception` does not
  catch) and the harness writes its result;
- timing and memory: the time between consecutive steps (after a CUDA synchronize on a GPU; the
  process CPU time too, which other load on the machine does not inflate);
  `torch.cuda.max_memory_allocated` on a GPU, the peak resident set size on the CPU.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional

HARNESS_DIR = os.path.dirname(os.path.abspath(__file__))
APEX_EMULATION = os.path.join(HARNESS_DIR, "apex_emulation")  # holds the emulated `apex` package


class StopTraining(BaseException):
    """Raised from the optimizer hook once the requested steps have run."""


class Recorder:
    """Loss, step count and step times of one run."""

    def __init__(self, torch: Any, steps: int, synchronize: bool) -> None:
        self.torch = torch
        self.target = steps
        self.synchronize = torch.cuda.synchronize if synchronize else None
        self.primary: Optional[Any] = None  # the optimizer whose steps are counted
        self.pending: List[Any] = []  # losses backpropagated since the last step (tensors)
        self.step_losses: List[List[Any]] = []
        self.step_times: List[float] = []
        self.step_cpu_times: List[float] = []  # process CPU time: steady on a loaded machine
        self.skipped: List[int] = []
        self.backward_calls = 0
        self.optimizer_steps = 0
        self.scaler_used = False  # an enabled GradScaler scaled a loss
        self.scaler_calls = {"scale": 0, "unscale_": 0, "step": 0}  # calls on enabled scalers
        self.autocast_dtypes: Dict[str, None] = {}  # ordered set of "device:dtype" of enabled regions
        self.model_dtypes: Dict[str, None] = {}  # ordered set of dtypes apex O2/O3 cast a model to
        self.apex_scaled = False  # apex's scale_loss scaled a loss
        self.clips_on_scaled = 0  # gradient clips while a GradScaler's gradients were still scaled
        self._scaled_pending = False  # a loss was scaled since the last update() and not unscaled
        self._hook_fired = False

    # ------------------------------------------------------------------ observations
    def on_backward(self, tensors: Any) -> None:
        tensor_type = self.torch.Tensor
        for tensor in (tensors,) if isinstance(tensors, tensor_type) else tensors:
            if isinstance(tensor, tensor_type) and tensor.numel() == 1:
                self.backward_calls += 1
                unscaled = tensor.__dict__.get("_ampmigrate_unscaled")
                self.pending.append(tensor.detach() if unscaled is None else unscaled)

    def on_optimizer_step(self, optimizer: Any, args: Any = None, kwargs: Any = None) -> None:
        self.optimizer_steps += 1
        self._hook_fired = True
        self._close_step(optimizer, skipped=False)

    def on_scaled(self) -> None:
        self.scaler_used = True
        self.scaler_calls["scale"] += 1
        self._scaled_pending = True

    def on_apex_scaled(self) -> None:
        """apex's scale_loss scaled a loss (it unscales by itself when its block ends)."""
        self.scaler_used = True
        self.apex_scaled = True

    def on_model_cast(self, dtype: Any) -> None:
        """apex O2/O3 cast a model's weights to `dtype`."""
        self.model_dtypes.setdefault(str(dtype).replace("torch.", ""), None)

    def on_unscaled(self) -> None:
        self._scaled_pending = False

    def on_clip(self) -> None:
        if self._scaled_pending:
            self.clips_on_scaled += 1

    def on_skipped(self, optimizer: Any) -> None:
        self._close_step(optimizer, skipped=True)

    def on_scaler_step_start(self) -> None:
        self._hook_fired = False

    def on_scaler_step_done(self, optimizer: Any) -> None:
        """After `GradScaler.step`: if the optimizer did not step, the scaler skipped it."""
        if not self._hook_fired:
            self._close_step(optimizer, skipped=True)

    def _close_step(self, optimizer: Any, skipped: bool) -> None:
        if self.primary is None:
            self.primary = optimizer
        elif optimizer is not self.primary:
            return
        if skipped:
            # No update happened: the curve follows applied updates, so the iteration's loss is
            # set aside and the run goes on until N updates were applied.
            self.skipped.append(len(self.step_losses))
            self.pending = []
            if not self.step_losses and len(self.skipped) >= self.target:
                raise StopTraining  # N iterations and not one update: every step is being skipped
            return
        if self.synchronize is not None:
            self.synchronize()
        self.step_times.append(time.perf_counter())
        self.step_cpu_times.append(time.process_time())
        self.step_losses.append(self.pending)
        self.pending = []
        if len(self.step_losses) >= self.target:
            raise StopTraining

    # ------------------------------------------------------------------ results
    def losses(self) -> List[Optional[float]]:
        values = []
        for tensors in self.step_losses:
            if not tensors:
                values.append(None)
            else:
                values.append(float(sum(t.detach().float().sum().item() for t in tensors)))
        return values

    def intervals(self, cpu: bool = False) -> List[float]:
        stamps = self.step_cpu_times if cpu else self.step_times
        return [b - a for a, b in zip(stamps, stamps[1:])]


def install_instruments(torch: Any, recorder: Recorder) -> Callable[[], None]:
    """Observe backward(), GradScaler, autocast and optimizer steps; returns the undo."""
    import functools

    original_backward = torch.autograd.backward

    @functools.wraps(original_backward)
    def backward(tensors, *args, **kwargs):
        if not isinstance(tensors, torch.Tensor):
            tensors = tuple(tensors)
        recorder.on_backward(tensors)
        return original_backward(tensors, *args, **kwargs)

    scaler_class = torch.amp.grad_scaler.GradScaler
    original_scale = scaler_class.scale

    @functools.wraps(original_scale)
    def scale(self, outputs):
        scaled = original_scale(self, outputs)
        if scaled is not outputs and isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            scaled._ampmigrate_unscaled = outputs.detach()
            recorder.on_scaled()
        return scaled

    original_step = scaler_class.step

    @functools.wraps(original_step)
    def scaler_step(self, optimizer, *args, **kwargs):
        if self.is_enabled():
            recorder.scaler_calls["step"] += 1
        recorder.on_scaler_step_start()
        result = original_step(self, optimizer, *args, **kwargs)
        recorder.on_scaler_step_done(optimizer)
        return result

    original_unscale = scaler_class.unscale_

    @functools.wraps(original_unscale)
    def unscale(self, optimizer):
        if self.is_enabled():
            recorder.scaler_calls["unscale_"] += 1
            recorder.on_unscaled()
        return original_unscale(self, optimizer)

    original_update = scaler_class.update

    @functools.wraps(original_update)
    def update(self, *args, **kwargs):
        recorder.on_unscaled()
        return original_update(self, *args, **kwargs)

    autocast_class = torch.amp.autocast_mode.autocast
    original_enter = autocast_class.__enter__

    @functools.wraps(original_enter)
    def enter(self):
        if getattr(self, "_enabled", False):
            key = f"{self.device}:{str(self.fast_dtype).replace('torch.', '')}"
            if key not in recorder.autocast_dtypes:
                recorder.autocast_dtypes[key] = None
        return original_enter(self)

    from torch.optim.optimizer import register_optimizer_step_post_hook
    from ampmigrate.verify import observe

    observe.listen("scaled", recorder.on_apex_scaled)
    observe.listen("skipped", recorder.on_skipped)
    observe.listen("model_cast", recorder.on_model_cast)
    clip_module = torch.nn.utils.clip_grad
    clips = []
    for name in ("clip_grad_norm_", "clip_grad_value_"):
        original_clip = getattr(clip_module, name)

        def clip(*args, __original=original_clip, **kwargs):
            recorder.on_clip()
            return __original(*args, **kwargs)

        functools.update_wrapper(clip, original_clip)
        clips += [(clip_module, name, original_clip, clip), (torch.nn.utils, name, getattr(torch.nn.utils, name), clip)]

    replaced = [*clips,
        (torch.autograd, "backward", original_backward, backward),
        (scaler_class, "scale", original_scale, scale),
        (scaler_class, "step", original_step, scaler_step),
        (scaler_class, "unscale_", original_unscale, unscale),
        (scaler_class, "update", original_update, update),
        (autocast_class, "__enter__", original_enter, enter),
    ]
    for owner, name, _, wrapper in replaced:
        setattr(owner, name, wrapper)
    handle = register_optimizer_step_post_hook(recorder.on_optimizer_step)

    def uninstall() -> None:
        handle.remove()
        for owner, name, original, _ in replaced:
            setattr(owner, name, original)

    return uninstall


def install_step_counter(torch: Any, recorder: Recorder) -> None:
    """The bare mode of the overhead benchmark: only the step hook (timing and the stop)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(recorder.on_optimizer_step)


def install_seed_offset(torch: Any, offset: int) -> None:
    """Shift the script's own seeding by `offset`, so the runs of other seeds differ even in a script
    that seeds itself: the global seeds and the generators it makes (`torch.Generator().manual_seed`,
    `numpy.random.default_rng`, `numpy.random.RandomState`, `random.Random`)."""
    import functools

    def shift(value):
        if isinstance(value, int) and not isinstance(value, bool):
            return (value + offset) % (2**32)
        return value

    def shifted(func):
        @functools.wraps(func)
        def seed(value=None, *args, **kwargs):
            value = shift(value)
            return func(value, *args, **kwargs) if value is not None else func(*args, **kwargs)

        return seed

    torch.manual_seed = torch.random.manual_seed = shifted(torch.manual_seed)
    random.seed = shifted(random.seed)

    class Generator(torch.Generator):
        def manual_seed(self, seed):
            return super().manual_seed(shift(seed))

    class Random(random.Random):
        def seed(self, a=None, version=2):
            super().seed(shift(a), version)

    torch.Generator = Generator
    random.Random = Random
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed = shifted(numpy.random.seed)
        numpy.random.default_rng = shifted(numpy.random.default_rng)

        class RandomState(numpy.random.RandomState):
            def __init__(self, seed=None):
                super().__init__(shift(seed))

            def seed(self, seed=None):
                super().seed(shift(seed))

        numpy.random.RandomState = RandomState


def install_heartbeat(torch: Any, path: Optional[str]) -> None:
    """Write the number of optimizer steps so far to `path`: the parent's time limit watches it."""
    if not path:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    count = [0]

    def beat(optimizer, args, kwargs) -> None:
        count[0] += 1
        os.pwrite(handle, b"%d\n" % count[0], 0)  # the count only grows longer: no stale digits

    register_optimizer_step_post_hook(beat)


def watch_parent() -> None:
    """When `verify` is gone, however it ended (its pipe reads EOF), kill this run's process group:
    the script, its DataLoader workers and its children (no orphans)."""
    import signal
    import threading

    fd = os.environ.pop("AMPMIGRATE_VERIFY_WATCH_FD", None)
    if not fd:
        return

    def watch() -> None:
        try:
            while os.read(int(fd), 1):
                pass
        except OSError:
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, name="ampmigrate-watchdog", daemon=True).start()


def seed_everything(torch: Any, seed: int) -> None:
    random.seed(seed)
    numpy = _import_numpy()
    if numpy is not None:
        numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed)  # seeds CUDA too


def _import_numpy():
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        return None
    import numpy

    return numpy


def _peak_rss_bytes() -> Optional[int]:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def map_sys_path(path_map: Dict[str, str]) -> None:
    """Imports that would resolve into the original project resolve into the migrated copy."""
    for index, entry in enumerate(sys.path):
        real = os.path.realpath(entry or os.getcwd())
        for original, copy in path_map.items():
            if _inside(real, original):
                sys.path[index] = copy + real[len(original):]
                break


def modules_from(roots: List[str]) -> List[str]:
    """Modules loaded from files under `roots` (an "after" run that imported unmigrated code)."""
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and os.path.isabs(path) and any(_inside(os.path.realpath(path), root) for root in roots):
            found.append(name)
    return sorted(found)


def _is_runpy(filename: str) -> bool:
    return filename.endswith(os.sep + "runpy.py") or filename == "<frozen runpy>"


def format_traceback(exc: BaseException) -> str:
    """The script's traceback, without the harness's and runpy's own frames."""
    summary = traceback.TracebackException.from_exception(exc)
    pending = [summary]
    while pending:
        current = pending.pop()
        current.stack[:] = [
            frame
            for frame in current.stack
            if not frame.filename.startswith(HARNESS_DIR) and not _is_runpy(frame.filename)
        ]
        for chained in (current.__cause__, current.__context__):
            if chained is not None:
                pending.append(chained)
    return "".join(summary.format())


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Set up, run the script, and collect what was recorded (the result JSON's content)."""
    result: Dict[str, Any] = {"status": "crashed", "python": sys.version.split()[0]}
    started = time.perf_counter()
    try:
        import torch
    except ImportError as exc:
        result["error"] = {"type": "ImportError", "message": f"torch is not installed: {exc}", "module": "torch"}
        return result
    result["torch"] = torch.__version__
    device = spec["device"]
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        result["error"] = {"type": "RuntimeError", "message": "--device cuda: CUDA is not available here"}
        return result
    result["device"] = device
    result["cuda_mapped"] = device == "cpu"

    recorder, sandbox = _set_up(torch, spec, device)
    result["setup_seconds"] = time.perf_counter() - started
    try:
        _run_script(spec, result)
    finally:
        sandbox.uninstall()
    result["run_seconds"] = time.perf_counter() - started
    _collect(torch, result, recorder, device)
    result["written_files"] = sandbox.written
    if spec.get("path_map"):
        result["unmigrated_modules"] = modules_from(list(spec["path_map"]))
    return result


def _set_up(torch: Any, spec: Dict[str, Any], device: str):
    from ampmigrate.verify import compat, devicemap
    from ampmigrate.verify.sandbox import Sandbox

    if device == "cpu":
        devicemap.map_cuda_to_cpu()
    compat.install(torch, mapped=device == "cpu")
    if spec["precision"] == "fp32":
        devicemap.disable_amp()
    seed_everything(torch, spec["seed"])
    if spec.get("seed_offset"):
        install_seed_offset(torch, spec["seed_offset"])
    recorder = Recorder(torch, spec["steps"], synchronize=device == "cuda")
    if spec.get("instrument", True):
        install_instruments(torch, recorder)
    else:
        install_step_counter(torch, recorder)
    install_heartbeat(torch, spec.get("progress"))
    # Under namespace isolation the kernel keeps the user's files: nothing to redirect here.
    protected = [] if spec.get("isolation") == "namespace" else spec.get("protect", [])
    sandbox = Sandbox(protected, spec["scratch"], exempt=spec.get("exempt", []))
    if protected:
        sandbox.install()
        sandbox.install_torch(torch)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    script = spec["script"]
    sys.argv = [script, *spec.get("args", [])]
    sys.path[0] = os.path.dirname(script)  # as `python script.py` would
    map_sys_path(spec.get("path_map", {}))
    sys.path[:0] = spec.get("python_path", [])
    sys.dont_write_bytecode = True
    return recorder, sandbox


def _run_script(spec: Dict[str, Any], result: Dict[str, Any]) -> None:
    import runpy

    try:
        runpy.run_path(spec["script"], run_name="__main__")
        result["status"] = "finished"
    except StopTraining:
        result["status"] = "completed"
    except SystemExit as exc:
        if exc.code in (None, 0):
            result["status"] = "finished"
        else:
            result["status"] = "crashed"
            result["error"] = {"type": "SystemExit", "message": f"the script exited with status {exc.code!r}", "traceback": ""}
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the script's own failure, reported with its traceback
        result["status"] = "crashed"
        error = {"type": type(exc).__name__, "message": str(exc), "traceback": format_traceback(exc)}
        if isinstance(exc, ImportError) and exc.name:
            error["module"] = exc.name
        result["error"] = error


def _collect(torch: Any, result: Dict[str, Any], recorder: Recorder, device: str) -> None:
    result["losses"] = recorder.losses()
    result["step_intervals"] = recorder.intervals()
    result["step_cpu_intervals"] = recorder.intervals(cpu=True)
    result["skipped_steps"] = recorder.skipped
    result["backward_calls"] = recorder.backward_calls
    result["optimizer_steps"] = recorder.optimizer_steps
    result["grad_scaler"] = recorder.scaler_used
    result["grad_scaler_calls"] = recorder.scaler_calls
    result["autocast"] = list(recorder.autocast_dtypes)
    result["model_cast"] = list(recorder.model_dtypes)
    result["apex_loss_scale"] = recorder.apex_scaled
    result["clips_on_scaled_gradients"] = recorder.clips_on_scaled
    result["apex_emulation"] = modules_from([APEX_EMULATION])  # the emulated apex modules the script imported
    if device == "cuda":
        result["peak_memory"] = torch.cuda.max_memory_allocated()
        result["memory_kind"] = "cuda"
    else:
        result["peak_memory"] = _peak_rss_bytes()
        result["memory_kind"] = "rss"


def main(argv: List[str]) -> None:
    watch_parent()
    with open(argv[1], encoding="utf-8") as handle:
        spec = json.load(handle)
    try:
        result = run(spec)
    except BaseException as exc:  # a harness failure: still leave a result behind
        result = {"status": "harness_error", "error": {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()}}
    with open(spec["result"], "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass
    # Threads or data-loader workers the script left behind must not keep the run alive.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
