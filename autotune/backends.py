"""Measurement backends: how the tuner times one config at the full problem size.

``model``: the cost model. The op's kernels run on the interpreter trace-only (no
arithmetic) at the full shape and the trace is scheduled by ``cost_model``; the latency is
*modeled*. It runs anywhere and is the default wherever no Neuron device is present. An op
whose kernels repeat one independent piece (``OpSpec.model_slice``: attention's (batch, KV
head) groups) has one piece traced and its latency multiplied by the piece count; the
measurement records ``traced_problem`` and ``copies``.

``hardware``: a Trn2/Trn3 node with NKI 0.6 and nrtpy
(:mod:`neuron_kernels.autotune.neff_backend`): each launch is compiled to a NEFF by a compile
worker and timed on a NeuronCore by a measure worker in the nrtpy environment; the latency
is the device-side median (``NrtpyModel.benchmark(..., mode="device")``,
aws-neuron/aws-neuron-sdk neuron-runtime/nrtpy/model.rst).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from neuron_kernels.hardware import target_from_name
from neuron_kernels.kernels.spec import measure_generator

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "Measurement",
    "MeasurementFailure",
    "ModelBackend",
    "default_backend_name",
    "make_backend",
]

BACKENDS = ("model", "hardware")


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine; the message names the one thing missing."""


class MeasurementFailure(Exception):
    """This config could not be measured (a worker hung or died, or its result on the
    device is wrong): the trial fails with this reason; the study goes on."""


@dataclass(frozen=True)
class Measurement:
    """One config's latency at the full problem, and the floor it is compared with.

    ``floor_us`` is the larger of the TensorE floor (its matmul FLOPs at BF16 peak) and the
    DMA floor (``OpSpec.min_traffic_bytes``: inputs read once, outputs and in-place updates
    written once, at the core's DMA rate): no config can beat it. Both are modeled, also for
    a hardware measurement.
    """

    latency_us: float
    source: str  # "modeled" or "hardware"
    floor_us: float = 0.0
    floor_engine: str = ""  # "TensorE" or "DMA": whichever floor binds
    binding_engine: str = ""  # the modeled critical engine of this config
    extra: dict[str, Any] = field(default_factory=dict)


def has_neuron_device() -> bool:
    """A /dev/neuron* device is present (where the hardware backend is the default)."""
    from neuron_kernels.autotune import hw_node

    return bool(hw_node.neuron_devices())


def default_backend_name() -> str:
    return "hardware" if has_neuron_device() else "model"


def _floors(report, spec, problem: dict, dtype: str, copies: int = 1) -> tuple[float, str]:
    """(floor in us, the engine that binds) for the op at ``problem``: see :class:`Measurement`.
    ``report`` profiles one of ``copies`` identical slices of it (``OpSpec.model_slice``)."""
    from neuron_kernels.cost_model.profiler import dma_floor_ns

    dma_ns = dma_floor_ns(report.params, spec.min_traffic_bytes(problem, dtype), report.lnc)
    tensor_ns = copies * report.floors_ns()["tensor"]
    return (tensor_ns / 1e3, "TensorE") if tensor_ns >= dma_ns else (dma_ns / 1e3, "DMA")


class ModelBackend:
    """Modeled latency: trace-only interpreter run at the full shape (or one of its
    ``model_slice`` pieces, times their count: at LNC=k a piece holds one independent
    group per core) + the cost model, the kernels launched at LNC ``lnc``."""

    name = "model"
    source = "modeled"

    def __init__(self, target: str, lnc: int = 1, **param_overrides) -> None:
        self.target = target_from_name(target)
        self.lnc = lnc
        self.param_overrides = param_overrides
        self._inputs: dict[tuple, tuple] = {}

    def inputs(self, spec, problem: dict, dtype: str) -> tuple:
        """The op's inputs at ``problem`` with values (what a hardware run needs), built
        once per point."""

        key = (spec.name, tuple(sorted(problem.items())), dtype)
        if key not in self._inputs:
            self._inputs[key] = spec.make_inputs(problem, dtype, measure_generator())
        return self._inputs[key]

    def trace_inputs(self, spec, problem: dict, dtype: str) -> tuple:
        """Inputs of the right shapes and dtypes but uninitialized (``torch.empty``): a
        trace-only run reads no values, so a full-size point costs no time and no memory
        pages to set up (``make_inputs`` runs on the meta device)."""
        import torch

        key = ("trace", spec.name, tuple(sorted(problem.items())), dtype)
        if key not in self._inputs:
            with torch.device("meta"):
                metas = spec.make_inputs(problem, dtype, measure_generator())
            self._inputs[key] = _materialize(metas)
        return self._inputs[key]

    def measure(self, spec, problem: dict, dtype: str, config) -> Measurement:
        from neuron_kernels.interpreter.execution import cyclic_gc_paused

        # One trial without the cyclic GC (see cyclic_gc_paused): its traces die by
        # reference counting when _measure returns, so the collector never walks them.
        with cyclic_gc_paused():
            return self._measure(spec, problem, dtype, config)

    def _measure(self, spec, problem: dict, dtype: str, config) -> Measurement:
        from neuron_kernels.cost_model.profiler import Profiler

        sliced = spec.model_slice is not None
        traced, copies = spec.model_slice(problem, self.lnc) if sliced else (problem, 1)
        profiler = Profiler(target=self.target, compute=False, **self.param_overrides)
        profiler.lnc = self.lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
        spec.run_kernels(*self.trace_inputs(spec, traced, dtype), config=config, runner=profiler)
        report = profiler.report()
        floor_us, floor_engine = _floors(report, spec, problem, dtype, copies)
        extra = {} if copies == 1 else {"traced_problem": _describe(traced), "copies": copies}
        return Measurement(
            latency_us=copies * report.latency_ns / 1e3,
            source=self.source,
            floor_us=floor_us,
            floor_engine=floor_engine,
            binding_engine=report.critical()[0],
            extra=extra,
        )


def _materialize(value):
    """``value`` with every meta tensor (also inside lists and tuples) replaced by an
    uninitialized CPU tensor of its shape and dtype."""
    import torch

    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return torch.empty(value.shape, dtype=value.dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_materialize(v) for v in value)
    return value


def _describe(problem: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in problem.items())


def __getattr__(name: str):
    if name == "HardwareBackend":  # its own module; imported on use (it imports this one)
        from neuron_kernels.autotune.neff_backend import HardwareBackend

        return HardwareBackend
    raise AttributeError(name)


def make_backend(name: str, target: str, lnc: int | None = None, **options):
    """The backend ``name`` for ``target``, launching kernels at LNC ``lnc`` (the tuned
    point's: configs are checked, measured and stored at one LNC). When ``lnc`` is None the
    model backend launches at 1 and the hardware backend at ``launch_lnc``; ``options`` go to
    the hardware backend (``nrtpy_python``, ``compile_jobs``, ``trial_deadline_s``, ...)."""
    if name == "model":
        return ModelBackend(target, lnc=1 if lnc is None else lnc)
    if name == "hardware":
        from neuron_kernels.autotune.neff_backend import HardwareBackend

        return HardwareBackend(target, lnc=lnc, **options)
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
