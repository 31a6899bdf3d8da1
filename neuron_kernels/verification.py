"""Verification on the interpreter: run an op's kernel there and compare it with its
reference within the declared tolerance, saying where and by how much it fails. The tuner
gates every config with it, the demo and the calibration run on it, and the tests use it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = [
    "InterpreterRunner",
    "assert_within_tolerance",
    "copy_args",
    "interpreter_runner_for",
    "run_kernel",
]


def copy_args(args, dtype=None) -> tuple:
    """Fresh copies of every tensor argument (also inside tensor lists), as ``dtype`` if
    given: an in-place op then runs on its own copy and its reference on another."""

    def copy(a):
        if isinstance(a, torch.Tensor):
            return a.detach().clone() if dtype is None else a.detach().to(dtype)
        if isinstance(a, (list, tuple)):
            return type(a)(copy(t) for t in a)
        return a

    return tuple(copy(a) for a in args)


def assert_within_tolerance(out: torch.Tensor, ref: torch.Tensor, tol, context: str = "") -> None:
    """Assert ``|out - ref| <= tol.atol + tol.rtol * |ref|`` elementwise.

    On failure the message gives the worst element's index, both values, the bound, the
    dtype and ``context`` (op, config, problem), so a failure reads without a debugger.
    Tuples or lists (an op with several outputs) are compared output by output. An
    infinity must match exactly (the bound is infinite there, so it would otherwise pass).
    """
    if isinstance(out, (tuple, list)) or isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            raise AssertionError(f"outputs {type(out).__name__} != reference's {context}")
        for i, (o, r) in enumerate(zip(out, ref)):
            assert_within_tolerance(o, r, tol, f"{context} [output {i}]")
        return
    if out.shape != ref.shape:
        raise AssertionError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)} {context}")
    got, want = out.detach().double().cpu(), ref.detach().double().cpu()
    bound = tol.atol + tol.rtol * want.abs()
    excess = (got - want).abs() - bound
    nan_mismatch = torch.isnan(got) != torch.isnan(want)
    if nan_mismatch.any():
        idx = tuple(int(i) for i in nan_mismatch.nonzero()[0])
        raise AssertionError(
            f"NaN mismatch at {idx}: got {got[idx].item()}, reference {want[idx].item()} "
            f"(dtype {out.dtype}) {context}"
        )
    inf_mismatch = (torch.isinf(got) | torch.isinf(want)) & (got != want)
    if inf_mismatch.any():
        idx = tuple(int(i) for i in inf_mismatch.nonzero()[0])
        raise AssertionError(
            f"infinity mismatch at {idx}: got {got[idx].item()}, reference {want[idx].item()} "
            f"(dtype {out.dtype}) {context}"
        )
    excess = torch.nan_to_num(excess, nan=0.0)
    if excess.numel() and excess.max() > 0:
        flat = int(excess.argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), excess.shape))
        n_bad = int((excess > 0).sum())
        raise AssertionError(
            f"{n_bad}/{excess.numel()} elements outside atol={tol.atol:g} rtol={tol.rtol:g} ({tol.reason}); "
            f"worst at {idx}: got {got[idx].item():.9g}, reference {want[idx].item():.9g}, "
            f"|diff| {abs(got[idx] - want[idx]).item():.3g} > bound {bound[idx].item():.3g} "
            f"(dtype {out.dtype}) {context}"
        )


class InterpreterRunner:
    """A :class:`~neuron_kernels.kernels.spec.Runner` that executes kernels on our interpreter
    for ``target`` at LNC ``lnc`` (the op splits its work over that many program instances),
    whichever ``nki`` the kernel's module bound at import; keeps each
    :class:`~neuron_kernels.interpreter.Run` (trace and memory peaks) in ``runs`` when given."""

    def __init__(
        self, target=None, compute: bool = True, runs: list | None = None, lnc: int = 1
    ) -> None:
        from neuron_kernels.hardware import default_target, target_from_name

        self.target = target_from_name(target) if target is not None else default_target()
        self.lnc = lnc
        self.compute = compute
        self.runs = runs

    def __call__(self, kernel, *args, **kwargs):
        from neuron_kernels.interpreter import run

        result = run(kernel, args, kwargs, target=self.target, compute=self.compute)
        if self.runs is not None:
            self.runs.append(result)
        return result.outputs


def interpreter_runner_for(
    target=None, compute: bool = True, runs: list | None = None, lnc: int = 1
):
    """An :class:`InterpreterRunner` for ``target`` (default: the interpreter's default)."""
    return InterpreterRunner(target, compute=compute, runs=runs, lnc=lnc)


def run_kernel(
    spec, args: tuple, config=None, target=None, runs: list | None = None, lnc: int = 1
) -> Any:
    """``spec.run_kernels`` on the interpreter with ``config`` (default: the op's default)
    at LNC ``lnc``."""
    config = config if config is not None else spec.config.default()
    runner = InterpreterRunner(target, runs=runs, lnc=lnc)
    return spec.run_kernels(*args, config=config, runner=runner)
