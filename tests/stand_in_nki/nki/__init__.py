"""Stand-in ``nki``: records calls and raises on every one (see ../README.md)."""

import functools

from nki import isa, language  # noqa: F401

CALLS = []


class StandInReached(AssertionError):
    """A kernel run reached the stand-in nki instead of the interpreter."""


def record(api, args, kwargs):
    CALLS.append(api)
    tensors = [
        a for a in (*args, *kwargs.values()) if type(a).__module__.startswith("neuron_kernels")
    ]
    what = f" with interpreter values {tensors!r}" if tensors else ""
    raise StandInReached(f"stand-in {api} was called{what}")


class _Kernel:
    """What AWS's nki.jit returns: callable, ``kernel[grid]``, the function under ``.func``."""

    def __init__(self, func, grid=()):
        self.func, self.grid = func, grid
        functools.update_wrapper(self, func)

    def __getitem__(self, grid):
        return _Kernel(self.func, grid if isinstance(grid, tuple) else (grid,))

    def __call__(self, *args, **kwargs):
        return record("nki.jit kernel call", args, kwargs)


def jit(func=None, **options):
    if func is None:
        return lambda f: _Kernel(f)
    return _Kernel(func)


def simulate(kernel):
    return lambda *args, **kwargs: record("nki.simulate", args, kwargs)
