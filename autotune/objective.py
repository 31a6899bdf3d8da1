"""The tuner's objective: one Optuna trial = one config of an op at one (shape, dtype).

A trial goes through three steps, each recorded on the trial (``user_attrs``):

1. the op's own ``check`` (``OpSpec.check``): a config it rejects with a ``LimitError`` is
   a *pruned* trial, its reason in ``user_attrs["pruned"]`` (the tuner restates no limit);
2. the correctness gate: the config runs *with arithmetic* on the interpreter at the op's
   ``test_problems["probe"]`` (sized by each op to hit its blocking and remainder tiles)
   and must match the fp64 reference within the op's tolerance for the dtype; else the
   trial *fails*, its reason in ``user_attrs["failed"]``;
3. the backend measures it at the full shape; the latency (microseconds) is the value. A
   config the backend cannot measure (``MeasurementFailure``: a hardware worker hung or died,
   or the result on the device is wrong) *fails*, its reason in ``user_attrs["failed"]``.

A config already measured in the study (by any worker sharing its storage) is not
measured again: the trial returns the stored value, marked ``user_attrs["duplicate_of"]``.
"""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass

import optuna

from neuron_kernels.autotune.backends import MeasurementFailure
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels.spec import measure_generator

__all__ = ["GateFailure", "Objective", "Point", "gate_reason", "make_point", "params_key"]


class GateFailure(Exception):
    """The config's output on the interpreter does not match the reference."""


@dataclass(frozen=True)
class Point:
    """One (shape, dtype) the tuner is asked about."""

    shape: str  # as written on the command line, e.g. "4096x4096x4096"
    problem: dict
    dtype: str
    lnc: int = 1  # the launch's LNC: the kernels split their work over this many cores


def make_point(spec, shape: str, dtype: str, lnc: int = 1) -> Point:
    """The point for ``shape`` (in the op's shape syntax) as the op itself sees it at call
    time: the problem is ``spec.problem`` of inputs of that shape, so it holds every entry the
    op's lookup keys on (a casting mode, amsgrad, causal) and a tuned config is stored under
    the very shape bucket a call with such inputs looks up. Inputs are built on the meta
    device (nothing is allocated)."""
    import torch

    with torch.device("meta"):
        args = spec.make_inputs(spec.parse_shape(shape), dtype, measure_generator())
    return Point(shape, spec.problem(*args), dtype, lnc)


def params_key(params: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in params.items()))


def gate_reason(
    spec, config, dtype: str, target: str, lnc: int = 1, problem: dict | None = None
) -> str | None:
    """Why ``config`` is not correct on the interpreter at LNC ``lnc`` (None when it is).

    Runs at ``problem`` (default the op's probe) with a fixed seed and compares every output
    with the fp64 reference within ``spec.tolerances[dtype]``.
    """
    import torch

    from neuron_kernels.verification import (
        InterpreterRunner,
        assert_within_tolerance,
        copy_args,
    )

    problem = dict(problem or spec.test_problems["probe"])
    try:
        spec.check(problem, dtype, config, target, lnc)
    except LimitError as exc:
        return f"cannot run the gate problem {problem}: {exc}"
    args = spec.make_inputs(problem, dtype, torch.Generator().manual_seed(1234))
    tol = spec.tolerances[dtype]
    try:
        if not getattr(spec, "mutates", ()):
            out = spec.run_kernels(*args, config=config, runner=InterpreterRunner(target, lnc=lnc))
            assert_within_tolerance(out, spec.reference(*args, upcast=True), tol, f"at {problem}")
        else:  # an in-place op: compare every tensor it updates, each side on its own copies
            ran, ref = copy_args(args), copy_args(args, torch.float64)
            spec.run_kernels(*ran, config=config, runner=InterpreterRunner(target, lnc=lnc))
            spec.reference(*ref, upcast=True)
            for i, (g, w) in enumerate(zip(spec.mutated_tensors(ran), spec.mutated_tensors(ref))):
                assert_within_tolerance(g, w, tol, f"at {problem} [updated tensor {i}]")
    except AssertionError as exc:
        return f"wrong result on the interpreter: {str(exc).splitlines()[0]}"
    except Exception as exc:  # the interpreter refused the kernel: a defect of this config
        return f"the interpreter refused the kernel: {type(exc).__name__}: {exc}"
    return None


class Objective:
    """``objective(trial) -> latency_us`` for ``spec`` at ``point`` on ``target``.

    ``gate`` is :func:`gate_reason` (a test may pass another); its verdicts are kept per
    config for the life of the objective.
    """

    def __init__(self, spec, point: Point, target: str, backend, gate=gate_reason) -> None:
        self.spec, self.point, self.target, self.backend = spec, point, target, backend
        self.gate = gate
        self.space = spec.config.space()
        self._gate_verdicts: dict[tuple, str | None] = {}
        self.measured = 0  # measurements this process made (not duplicates)

    def suggest(self, trial: optuna.Trial) -> dict:
        return {
            name: trial.suggest_categorical(name, choices) for name, choices in self.space.items()
        }

    def _earlier(self, trial: optuna.Trial, params: dict):
        """An earlier finished trial of the study with the same params, if any."""
        key = params_key(params)
        states = (optuna.trial.TrialState.COMPLETE,)
        for other in trial.study.get_trials(deepcopy=False, states=states):
            if other.number != trial.number and params_key(other.params) == key:
                return other
        return None

    def __call__(self, trial: optuna.Trial) -> float:
        params = self.suggest(trial)
        config = self.spec.config.from_dict(params)
        p = self.point
        try:
            self.spec.check(p.problem, p.dtype, config, self.target, p.lnc)
        except LimitError as exc:
            trial.set_user_attr("pruned", str(exc))
            raise optuna.TrialPruned(str(exc)) from None
        earlier = self._earlier(trial, params)
        if earlier is not None:
            trial.set_user_attr("duplicate_of", earlier.number)
            for key in ("floor_us", "floor_engine", "binding_engine", "source"):
                if key in earlier.user_attrs:
                    trial.set_user_attr(key, earlier.user_attrs[key])
            return float(earlier.value)
        key = params_key(params)
        if key not in self._gate_verdicts:
            self._gate_verdicts[key] = self.gate(self.spec, config, p.dtype, self.target, lnc=p.lnc)
        reason = self._gate_verdicts[key]
        if reason is not None:
            trial.set_user_attr("failed", reason)
            raise GateFailure(reason)
        try:
            m = self.backend.measure(self.spec, p.problem, p.dtype, config)
        except MeasurementFailure as exc:
            trial.set_user_attr("failed", str(exc))
            raise GateFailure(str(exc)) from None
        self.measured += 1
        if not math.isfinite(m.latency_us) or m.latency_us <= 0:
            reason = f"the {self.backend.name} backend gave latency {m.latency_us}"
            trial.set_user_attr("failed", reason)
            raise GateFailure(reason)
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr("source", m.source)
        trial.set_user_attr("floor_us", m.floor_us)
        trial.set_user_attr("floor_engine", m.floor_engine)
        trial.set_user_attr("binding_engine", m.binding_engine)
        for k, v in m.extra.items():
            trial.set_user_attr(k, v)
        return m.latency_us
