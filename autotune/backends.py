"""Measurement backends: how the tuner times one config at the full problem size.

``model``: the cost model. The op's kernels run on the interpreter trace-only (no
arithmetic) at the full shape and the trace is scheduled by ``cost_model``; the latency is
*modeled*. It runs anywhere and is the default wherever no Neuron device is present. An op
whose kernels repeat one independent piece (``OpSpec.model_slice``: attention's (batch, KV
head) groups) has one piece traced and its latency multiplied by the piece count; the
measurement records ``traced_problem`` and ``copies``.

``hardware``: a Trn2/Trn3 node with the Neuron SDK. Each kernel launch goes through
``nki.benchmark(warmup=W, iters=N)(kernel)(*numpy_args)`` (the NKI API reference page
``nki.benchmark``: it compiles the kernel to a NEFF and runs ``neuron-bench``, which
launches it ``W + N`` times on one NeuronCore); the tuner reads
``benchmarked.benchmark_result.nc_latency.get_latency_percentile(50)`` and ``(99)``
(microseconds), as the NKI matrix-multiplication tutorial does. The docs say these
inputs are ``numpy.ndarray`` (as for ``nki.baremetal``), so torch tensors are converted
(bf16 through ``ml_dtypes``). This path needs ``nki`` and ``/dev/neuron*``; it has not
run in this repository's CI, which has neither.
"""

from __future__ import annotations

import glob
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from neuron_kernels.hardware import target_from_name
from neuron_kernels.kernels.spec import measure_generator

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "HardwareBackend",
    "Measurement",
    "ModelBackend",
    "default_backend_name",
    "make_backend",
]

BACKENDS = ("model", "hardware")


class BackendUnavailable(RuntimeError):
    """The backend cannot run on this machine (no Neuron SDK or device)."""


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
    return importlib.util.find_spec("nki") is not None and bool(glob.glob("/dev/neuron*"))


def default_backend_name() -> str:
    return "hardware" if has_neuron_device() else "model"


def dma_floor_ns(report, nbytes: int) -> float:
    """The DMA floor of moving ``nbytes`` on the logical core ``report`` was modeled on: at
    the full rate of its DMA engines, bounded by its HBM (LNC=1: the core's share,
    ``dma_core_gbps``; LNC=2: the one stack both cores share, ``hbm_stack_gbps``), as the
    profile's own floors (``Profile.floors_ns``). The one floor formula of the tuner and the
    benchmarks."""
    params, cores = report.params, report.lnc
    hbm = params.dma_core_gbps if cores == 1 else params.hbm_stack_gbps
    return nbytes / min(float(hbm), float(params.dma_engine_gbps) * int(params.dma_engines) * cores)


def _floors(report, spec, problem: dict, dtype: str, copies: int = 1) -> tuple[float, str]:
    """(floor in us, the engine that binds) for the op at ``problem``: see :class:`Measurement`.
    ``report`` profiles one of ``copies`` identical slices of it (``OpSpec.model_slice``)."""
    dma_ns = dma_floor_ns(report, spec.min_traffic_bytes(problem, dtype))
    tensor_ns = copies * report.floors_ns()["tensor"]
    return (tensor_ns / 1e3, "TensorE") if tensor_ns >= dma_ns else (dma_ns / 1e3, "DMA")


class ModelBackend:
    """Modeled latency: trace-only interpreter run at the full shape (or, at LNC=1, one of
    its ``model_slice`` pieces, times their count) + the cost model, the kernels launched
    at LNC ``lnc``. At LNC > 1 the whole launch is traced (every core's share): a slice
    does not split over the cores as the whole problem does."""

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
        from neuron_kernels.cost_model.profiler import Profiler

        sliced = spec.model_slice is not None and self.lnc == 1
        traced, copies = spec.model_slice(problem) if sliced else (problem, 1)
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


class _BenchmarkRunner:
    """A :class:`~neuron_kernels.kernels.spec.Runner` that benchmarks each launch with
    ``nki.benchmark`` and keeps the latency percentiles (microseconds)."""

    def __init__(self, target, warmup: int, iters: int) -> None:
        self.target = target
        self.warmup, self.iters = warmup, iters
        self.p50_us: list[float] = []
        self.p99_us: list[float] = []

    def __call__(self, kernel, *args, **kwargs):
        import nki  # the Neuron SDK's package; present only on a Trn node
        import torch

        def to_numpy(x):
            if isinstance(x, torch.Tensor):
                if x.dtype == torch.bfloat16:
                    import ml_dtypes

                    return x.float().numpy().astype(ml_dtypes.bfloat16)
                return x.numpy()
            return x

        bench = nki.benchmark(warmup=self.warmup, iters=self.iters)(kernel)
        out = bench(*[to_numpy(a) for a in args], **{k: to_numpy(v) for k, v in kwargs.items()})
        latency = bench.benchmark_result.nc_latency
        self.p50_us.append(float(latency.get_latency_percentile(50)))
        self.p99_us.append(float(latency.get_latency_percentile(99)))
        if out is None:
            raise BackendUnavailable("nki.benchmark returned no output for this kernel")
        outs = out if isinstance(out, (tuple, list)) else (out,)
        converted = [torch.from_numpy(o.astype("float32")) for o in outs]
        return converted[0] if len(converted) == 1 else tuple(converted)


class HardwareBackend:
    """Latency measured on a NeuronCore through ``nki.benchmark`` (module docstring)."""

    name = "hardware"
    source = "hardware"

    def __init__(self, target: str, warmup: int = 5, iters: int = 20, lnc: int = 1) -> None:
        if not has_neuron_device():
            raise BackendUnavailable(
                "the hardware backend needs the Neuron SDK's nki package and a /dev/neuron* "
                "device; use --backend model on this machine"
            )
        self.target = target_from_name(target)
        self.warmup, self.iters = warmup, iters
        self.lnc = lnc
        self._floor = ModelBackend(target, lnc=lnc)

    def measure(self, spec, problem: dict, dtype: str, config) -> Measurement:
        runner = _BenchmarkRunner(self.target, self.warmup, self.iters)
        runner.lnc = self.lnc
        spec.run_kernels(*self._floor.inputs(spec, problem, dtype), config=config, runner=runner)
        modeled = self._floor.measure(spec, problem, dtype, config)
        return Measurement(
            latency_us=sum(runner.p50_us),
            source=self.source,
            floor_us=modeled.floor_us,
            floor_engine=modeled.floor_engine,
            binding_engine=modeled.binding_engine,
            extra={"p99_us": sum(runner.p99_us), "warmup": self.warmup, "iters": self.iters},
        )


def make_backend(name: str, target: str, lnc: int = 1):
    if name == "model":
        return ModelBackend(target, lnc=lnc)
    if name == "hardware":
        return HardwareBackend(target, lnc=lnc)
    raise ValueError(f"backend must be one of {BACKENDS}, got {name!r}")
