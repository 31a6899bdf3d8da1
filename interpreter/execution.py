"""Running a kernel on the interpreter: arguments in, program instances, results out.

Calling convention as ``nki.simulate`` (nki/guides/nki_simulator.rst): NumPy arrays or
torch CPU tensors become HBM tensors, other arguments pass through; the kernel body runs
eagerly once per program instance; returned ``shared_hbm`` tensors come back as the same kind
of array that went in; HBM inputs the kernel wrote are updated in place.

Launch grids are NKI 0.6's: ``kernel[lnc]`` with one number, the LNC, which the target must
have (nki/get-started/about/lnc.rst). ``kernel[2]`` runs its two instances as the two
physical cores of a logical core, in lock-step (``cores.py``), and refuses races between them
on shared HBM (``races.py``).
"""

from __future__ import annotations

import functools
import gc
import inspect
import itertools
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target, default_target, target_from_name
from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.classes import rebuilt_argument
from neuron_kernels.interpreter.context import Launch, ProgramInstance, activate
from neuron_kernels.interpreter.cores import check_same_dynamic_flow, run_lock_step
from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.identity import with_checked_identity
from neuron_kernels.interpreter.instructions import collective
from neuron_kernels.interpreter.kernel import Kernel
from neuron_kernels.interpreter.memory import MemoryPeak, check_capacity
from neuron_kernels.interpreter.python_subset import check_kernel
from neuron_kernels.interpreter.races import check_hbm_races
from neuron_kernels.interpreter.rebind import rebound_to_interpreter
from neuron_kernels.interpreter.storage import MemoryRegion
from neuron_kernels.interpreter.tensor import NkiTensor, wrap_host_array
from neuron_kernels.interpreter.trace import Trace

__all__ = ["Run", "run"]


@dataclass
class Run:
    """The result of one launch: outputs, instruction trace and on-chip memory peaks."""

    outputs: Any
    trace: Trace
    target: Target
    grid: tuple[int, ...]
    memory: list[MemoryPeak] = field(default_factory=list)


def run(
    kernel,
    args=(),
    kwargs=None,
    *,
    target: str | Target | None = None,
    precise_fp: bool | None = None,
    compute: bool = True,
) -> Run:
    """Run ``kernel`` on the interpreter: a :class:`Kernel`, a plain function, or a kernel
    jitted by AWS's ``nki`` (its module's NKI names are rebound to the interpreter's for the
    run, see :mod:`.rebind`).

    Args:
        kernel: the kernel, optionally bound to a grid (``kernel[2]``).
        args, kwargs: kernel arguments; NumPy arrays and torch CPU tensors become HBM tensors.
        target: ``trn1``/``trn2``/``trn3``; default ``NEURON_PLATFORM_TARGET_OVERRIDE`` or trn2.
        precise_fp: store low-precision floats through ml_dtypes; default ``NKI_PRECISE_FP``.
        compute: False skips the arithmetic but keeps every check, the liveness accounting,
            the PSUM accumulation state and the trace; for profiling large shapes quickly.
            Outputs then hold zeros and written inputs are not updated. Checks that depend on
            values (transpose-mode identity) cannot run.
    """
    with cyclic_gc_paused():
        return _run(kernel, args, kwargs, target, precise_fp, compute)


@contextmanager
def cyclic_gc_paused():
    """Python's cyclic garbage collector paused for one launch (re-enabled after it, if it
    was on; nests: an inner pause leaves it to the outer one): a launch allocates a few container objects per traced instruction (views,
    Access records, instructions) and keeps the trace alive, so the collector's periodic
    passes over the young and growing generations cost ~20% of a trace-only run, while a
    launch leaves almost nothing for it to find (about 30 objects in reference cycles per
    launch: the launch, its instances and the kernel's frames; every view, tile and
    instruction is freed by reference counting as before). It collects those afterwards.
    No check or traced value depends on it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _run(kernel, args, kwargs, target, precise_fp, compute) -> Run:
    kernel = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    kwargs = dict(kwargs or {})
    tgt = _resolve_target(target)
    precise = dtypes.precise_fp_from_env() if precise_fp is None else precise_fp
    _check_python_subset(kernel.fn)
    check_kernel(kernel.fn, (*args, *kwargs.values()))  # python_subset.py
    body = with_checked_identity(kernel.fn)
    grid = kernel.grid
    n_programs = int(np.prod(grid)) if grid else 1
    lnc = _check_lnc(grid, tgt)
    launch = Launch(
        target=tgt, grid=grid, precise_fp=precise, trace=Trace(target=tgt.name), compute=compute
    )
    framework = "torch" if any(_is_torch(a) for a in (*args, *kwargs.values())) else "numpy"
    in_buffer = MemoryRegion.shared_hbm if n_programs > 1 else MemoryRegion.private_hbm

    setup = ProgramInstance(launch, program_id=())
    hosts: list[tuple[Any, NkiTensor]] = []

    def to_device(name, value):
        return _to_device(setup, hosts, in_buffer, name, value)

    params = _param_names(kernel.fn, len(args))
    dev_args = [to_device(params[i], a) for i, a in enumerate(args)]
    dev_kwargs = {k: to_device(k, v) for k, v in kwargs.items()}

    result = None
    peaks = []
    if lnc == 1:
        ids = list(itertools.product(*(range(g) for g in grid))) if grid else [()]
        for pid in ids:
            sim = ProgramInstance(launch, program_id=pid)
            first = len(launch.trace.instructions)
            with activate(sim), rebound_to_interpreter(kernel.fn):
                result = body(*dev_args, **dev_kwargs)
            _check_outputs(result)
            _apply_schedule(kernel.schedule, launch.trace.instructions[first:])
            peaks.append(check_capacity(sim))
    else:
        result, peaks = _run_cores(kernel, body, launch, lnc, dev_args, dev_kwargs)
    if compute:  # without arithmetic the values are meaningless: leave the inputs alone
        for value, t in hosts:
            if t._storage.written:
                _write_back(value, t)
    outputs = _convert_outputs(result, framework)
    return Run(outputs=outputs, trace=launch.trace, target=tgt, grid=grid, memory=peaks)


def _to_device(setup: ProgramInstance, hosts: list, in_buffer, name: str, value):
    """A kernel argument as the launch sees it: host arrays become HBM tensors of ``setup``'s
    launch (the same array passed twice is one tensor, ``hosts``), tuples element-wise.
    A module function, not a closure calling itself: such a closure is a reference cycle
    holding the launch, so a dropped Run would keep its trace until the cyclic GC ran."""
    _reject_lists(name, value)
    value = rebuilt_argument(value, name)  # NKIObjects from their __dict__ (classes.py)
    if isinstance(value, tuple):  # a tuple of arrays is a tuple of HBM tensors
        return tuple(
            _to_device(setup, hosts, in_buffer, f"{name}[{i}]", v) for i, v in enumerate(value)
        )
    for seen_value, seen in hosts:  # the same array passed twice is one HBM tensor
        if seen_value is value:
            return seen
    host = _host_array(name, value)
    if host is None:
        return value
    dtype = dtypes.normalize(host.dtype, "nki.simulate")
    t = wrap_host_array(setup, host, dtype, in_buffer, name)
    hosts.append((value, t))
    return t


def _check_lnc(grid: tuple[int, ...], target: Target) -> int:
    """The launch's LNC: ``kernel[lnc]`` with ``lnc`` one the target has (trn1: 1; trn2,
    trn3: 1 or 2). "If the number is too large for the current architecture, then you will
    receive an error" (nki/get-started/about/lnc.rst)."""
    lnc = grid[0] if grid else 1
    if len(grid) > 1 or lnc not in target.lnc_choices:
        choices = " or ".join(f"kernel[{c}]" for c in target.lnc_choices)
        raise NkiValidationError(
            "nki.jit",
            "launch grid (LNC)",
            f"must be an LNC {target.name} has ({choices})",
            grid,
            limit=target.lnc_choices,
        )
    return lnc


def _run_cores(kernel, body, launch: Launch, lnc: int, dev_args, dev_kwargs):
    """Run the ``lnc`` program instances of one launch as physical cores in lock-step
    (interpreter/cores.py), then refuse races between them on HBM (interpreter/races.py).
    Each core's SBUF and PSUM capacity is checked on its own."""
    launch.hbm_views = {}
    instances: list[ProgramInstance] = []

    def make_instance(core: int) -> ProgramInstance:
        instances.append(ProgramInstance(launch, program_id=(core,), core=core))
        return instances[-1]

    def run_body(sim: ProgramInstance):
        with activate(sim):
            return body(*dev_args, **dev_kwargs)

    def synchronise(points) -> None:
        collective.synchronise(points, launch.compute)

    with rebound_to_interpreter(kernel.fn):
        results = run_lock_step(lnc, make_instance, run_body, synchronise, check_same_dynamic_flow)
    by_core: dict[int, list] = {}
    for ins in launch.trace.instructions:
        by_core.setdefault(ins.core, []).append(ins)
    for core, result in enumerate(results):
        _check_outputs(result)
        _apply_schedule(kernel.schedule, by_core.get(core, []))
    peaks = [check_capacity(sim) for sim in instances]
    check_hbm_races(launch.trace.instructions, launch.hbm_views, launch.compute)
    return results[-1], peaks


def _apply_schedule(schedule, instructions) -> None:
    """``with_schedule`` edges of one program instance as ``depends_on`` edges."""
    if not schedule:
        return
    by_name: dict[str, list[int]] = {}
    for ins in instructions:
        if ins.name is not None:
            by_name.setdefault(ins.name, []).append(ins.index)
    by_index = {ins.index: ins for ins in instructions}
    for consumer, producers in schedule:
        for label in (consumer, *producers):
            if label not in by_name:
                raise NkiValidationError(
                    "Kernel.with_schedule",
                    f"instruction name {label!r}",
                    "must name an instruction of the kernel (name=...)",
                    sorted(by_name),
                )
        for c in by_name[consumer]:
            for producer in producers:
                by_index[c].depends_on.extend(i for i in by_name[producer] if i != c)


def _resolve_target(target) -> Target:
    """The run's target; a bad name is an NkiValidationError, as every interpreter refusal."""
    try:
        return target_from_name(target) if target is not None else default_target()
    except NkiValidationError:
        raise
    except LimitError as exc:
        raise NkiValidationError(exc.op, exc.arg, exc.rule, exc.value) from None


# -- argument and result conversion --------------------------------------------------


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


_TORCH_VIEW = {
    "bfloat16": ("int16", ml_dtypes.bfloat16),
    "float8_e4m3fn": ("uint8", ml_dtypes.float8_e4m3fn),
    "float8_e5m2": ("uint8", ml_dtypes.float8_e5m2),
}


def _reject_lists(name, value) -> None:
    """Kernel arguments may not be lists, also inside tuples (NKI language guide)."""
    if isinstance(value, list):
        raise NkiValidationError(
            "nki.jit", f"argument {name!r}", "must not be a list (pass a tuple)", "list"
        )
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            _reject_lists(f"{name}[{i}]", item)


def _host_array(name, value) -> np.ndarray | None:
    if _is_torch(value):
        import torch

        t = value.detach()
        if t.device.type != "cpu":
            raise NkiValidationError(
                "nki.simulate", f"argument {name!r}", "must be a CPU tensor", str(t.device)
            )
        t = t.contiguous()
        try:
            nki_name = dtypes.normalize(t.dtype, "nki.simulate")
        except NkiValidationError:
            raise NkiValidationError(
                "nki.simulate",
                f"argument {name!r} dtype",
                "must be an NKI dtype (no float64/int64)",
                t.dtype,
            ) from None
        if nki_name in _TORCH_VIEW:
            int_name, np_type = _TORCH_VIEW[nki_name]
            return t.view(getattr(torch, int_name)).numpy().view(np_type)
        if nki_name == "bool_":
            return t.numpy().view(np.uint8)
        return t.numpy()
    if isinstance(value, np.ndarray):
        try:
            dtypes.normalize(value.dtype, "nki.simulate")
        except NkiValidationError:
            raise NkiValidationError(
                "nki.simulate",
                f"argument {name!r} dtype",
                "must be an NKI dtype (no float64/int64)",
                value.dtype,
            ) from None
        return value
    return None


def _write_back(value, t: NkiTensor) -> None:
    """Copy a written HBM argument back into the caller's array / tensor, in place."""
    data = t._storage.array.reshape(t._storage.shape)
    if _is_torch(value):
        value.data.copy_(_to_torch(data, t.dtype).reshape(value.shape))
    else:
        value[...] = (
            _to_host_dtype(data, t.dtype).reshape(value.shape).astype(value.dtype, copy=False)
        )


def _to_host_dtype(array: np.ndarray, dtype: str) -> np.ndarray:
    """The array in the NumPy type of ``dtype`` (bool for bool_, bfloat16 under
    NKI_PRECISE_FP=0 where storage is widened to fp32)."""
    if dtype == "bool_":
        return array != 0
    want = dtypes.storage_dtype(dtype, True)
    return array if array.dtype == want else array.astype(want)


def _to_torch(array: np.ndarray, dtype: str):
    import torch

    array = np.ascontiguousarray(_to_host_dtype(array, dtype))
    if dtype in _TORCH_VIEW:
        int_name = _TORCH_VIEW[dtype][0]
        return torch.from_numpy(array.view(int_name).copy()).view(getattr(torch, dtype))
    return torch.from_numpy(array.copy())


def _returned_items(result, path=""):
    """(path, item) for every leaf of a returned value: tuples, lists and dict values nest."""
    if isinstance(result, (tuple, list)):
        for i, item in enumerate(result):
            yield from _returned_items(item, f"{path}[{i}]" if path else str(i))
    elif isinstance(result, dict):
        for key, item in result.items():
            yield from _returned_items(item, f"{path}[{key!r}]" if path else repr(key))
    else:
        yield path or "0", result


def _check_outputs(result) -> None:
    """Every tensor a kernel returns, however deep in a container, lives in shared HBM."""
    for path, item in _returned_items(result):
        if isinstance(item, NkiTensor) and item.buffer is not MemoryRegion.shared_hbm:
            raise NkiValidationError(
                "nki.jit",
                f"returned tensor {path} ({item.name!r})",
                "must be allocated in nl.shared_hbm",
                item.buffer.value,
                hint="allocate kernel outputs with nl.ndarray(..., buffer=nl.shared_hbm)",
            )


def _convert_outputs(result, framework: str):
    def convert(item):
        if isinstance(item, tuple):
            return tuple(convert(r) for r in item)
        if isinstance(item, list):
            return [convert(r) for r in item]
        if isinstance(item, dict):
            return {k: convert(v) for k, v in item.items()}
        if not isinstance(item, NkiTensor):
            return item
        if not item._storage.compute:
            return _zeros_output(item, framework)
        array = item._read_raw()
        if framework == "torch":
            return _to_torch(array, item.dtype)
        return _to_host_dtype(array, item.dtype)

    return convert(result)


def _zeros_output(item: NkiTensor, framework: str):
    """A trace-only launch's output: zeros of the output's host dtype and shape, in
    ``np.zeros`` memory (pages the OS maps on first write, so an unread full-size output
    costs no resident memory; a 8192x28672 bf16 C was ~1 GB of copies before)."""
    host = np.dtype(bool) if item.dtype == "bool_" else dtypes.storage_dtype(item.dtype, True)
    if framework != "torch":
        return np.zeros(item.shape, dtype=host)
    import torch

    if item.dtype in _TORCH_VIEW:
        int_name = _TORCH_VIEW[item.dtype][0]
        zeros = np.zeros(item.shape, dtype=int_name)
        return torch.from_numpy(zeros).view(getattr(torch, item.dtype))
    return torch.from_numpy(np.zeros(item.shape, dtype=host))


def _param_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"arg{i}" for i in range(n)]


# -- the parts of the NKI Python subset that are cheap to check -----------------------


@functools.lru_cache(maxsize=256)
def _subset_violations(fn) -> tuple[str, ...]:
    problems = []
    try:
        sig = inspect.signature(fn)
        if any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values()):
            problems.append("kernel signature must not use the keyword-only separator *")
    except (TypeError, ValueError):
        pass
    # is / is not: allowed on trace-time values, checked per operand at run time (identity.py)
    return tuple(problems)


def _check_python_subset(fn) -> None:
    problems = _subset_violations(fn)
    if problems:
        raise NkiValidationError(
            "nki.jit",
            f"kernel {getattr(fn, '__name__', fn)!r}",
            "must stay in the NKI Python subset",
            "; ".join(problems),
        )
