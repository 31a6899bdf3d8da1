"""A kernel object of the interpreter's ``nki``: ``nki.jit``, ``kernel[lnc]`` and
``nki.simulate``, without the interpreter itself.

Decorating costs nothing: ``@nki.jit`` wraps the function (the kernel modules do it at
import, for every op), and the interpreter (:mod:`.execution`, with NumPy's ml_dtypes,
the instructions and the tensor model) loads at the kernel's first launch.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import numpy as np

from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.rebind import unwrap_kernel

__all__ = ["Kernel", "jit", "simulate"]


class Kernel:
    """A kernel function plus its launch grid (``kernel[grid]``)."""

    def __init__(self, fn: Callable, grid: tuple[int, ...] = (), **options: Any) -> None:
        if isinstance(fn, Kernel):
            fn, grid = fn.fn, grid or fn.grid
        elif not isinstance(fn, types.FunctionType):  # AWS's nki.jit kernel object
            fn, foreign_grid = unwrap_kernel(fn)
            grid = grid or foreign_grid
        self.fn = fn
        self.grid = grid
        self.options = options
        self.schedule: tuple[tuple[str, tuple[str, ...]], ...] = ()
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid) -> Kernel:
        """``kernel[lnc]``: NKI 0.6 launches on a logical NeuronCore of ``lnc`` physical cores;
        "The bracket syntax must contain only one number" (nki/get-started/about/lnc.rst). The
        target decides which numbers exist (``Target.lnc_choices``), checked at launch."""
        grid = grid if isinstance(grid, tuple) else (grid,)
        for g in grid:
            if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
                raise NkiValidationError("nki.jit", "launch grid", "must be positive ints", grid)
        if len(grid) != 1:
            raise NkiValidationError(
                "nki.jit",
                "launch grid",
                "must be one int, the LNC (kernel[1] or kernel[2]; nki/get-started/about/lnc.rst)",
                grid,
            )
        k = Kernel(self.fn, tuple(int(g) for g in grid), **self.options)
        k.schedule = self.schedule
        return k

    def with_schedule(self, edges) -> Kernel:
        """This kernel with extra scheduling edges (nki/guides/how-to-scheduling-apis.rst):
        pairs ``(consumer, producer)`` or ``(consumer, [producers])`` of instruction names.
        They are checked at each run (every name must label an instruction of the kernel)
        and become ``depends_on`` edges of the trace, which the cost model schedules."""
        api = "Kernel.with_schedule"
        parsed = []
        if isinstance(edges, (str, bytes)) or not hasattr(edges, "__iter__"):
            raise NkiValidationError(api, "edges", "must be a list of (name, name(s)) pairs", edges)
        for pair in edges:
            ok = isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], str)
            producers = pair[1] if ok else None
            if ok and isinstance(producers, str):
                producers = [producers]
            if not ok or not producers or not all(isinstance(n, str) for n in producers):
                raise NkiValidationError(
                    api, "edge", "must be (consumer name, producer name or list of names)", pair
                )
            parsed.append((pair[0], tuple(producers)))
        k = Kernel(self.fn, self.grid, **self.options)
        k.schedule = self.schedule + tuple(parsed)
        return k

    def __call__(self, *args, **kwargs):
        from neuron_kernels.interpreter.execution import run  # the interpreter, at launch

        return run(self, args, kwargs).outputs

    def __repr__(self) -> str:
        grid = f"[{', '.join(map(str, self.grid))}]" if self.grid else ""
        return f"Kernel({self.fn.__name__}){grid}"


def jit(fn=None, **kwargs):
    """Decorate a top-level NKI kernel. On this backend, calling it runs the interpreter
    (as ``NKI_SIMULATOR=1`` does with the official package)."""
    if "platform_target" in kwargs:
        raise NkiValidationError(
            "nki.jit",
            "platform_target",
            "was removed in NKI 0.3.0",
            kwargs["platform_target"],
            hint="set NEURON_PLATFORM_TARGET_OVERRIDE instead",
        )
    kwargs.pop("mode", None)  # accepted and ignored, as in NKI 0.6
    if fn is None:
        return lambda f: Kernel(f, **kwargs)
    return Kernel(fn, **kwargs)


def simulate(kernel):
    """Return a callable that runs ``kernel`` on the interpreter (``nki.simulate``)."""
    kernel = kernel if isinstance(kernel, Kernel) else Kernel(kernel)

    @functools.wraps(kernel.fn)
    def simulated(*args, **kwargs):
        from neuron_kernels.interpreter.execution import run  # the interpreter, at launch

        return run(kernel, args, kwargs).outputs

    return simulated
