"""Virtual registers and the runtime loops that read them.

Semantics from aws-neuron/aws-neuron-sdk nki/api/nki/isa/__init__.py (``VirtualRegister``,
``register_alloc``/``move``/``load``/``store``: 32-bit values, one-element tensors in HBM or
SBUF) and nki/api/nki/language/__init__.py (``fori_loop``, ``while_loop``,
``dynamic_range``). The interpreter runs eagerly, like the tracer frontend the
``VirtualRegister`` note describes: a register's value is not a trace-time Python value, so
``bool(reg)``, ``int(reg)``, ``range(reg)`` and arithmetic raise ``TypeError`` (use
``nl.fori_loop`` / ``nl.while_loop``); it is read by the loops, by ``register_store`` and as
an ``.ap(scalar_offset=...)``.

``register_load`` and ``register_store`` move memory, so they are traced on the sync engine
(the sequencers' own unit in the cost model); ``register_alloc``/``register_move`` touch no
memory and are not traced.
"""

from __future__ import annotations

import numpy as np

from neuron_kernels.interpreter import dtypes
from neuron_kernels.interpreter.errors import NkiValidationError, not_implemented
from neuron_kernels.interpreter.tensor import NKIObject, NkiTensor

__all__ = [
    "VirtualRegister",
    "register_alloc",
    "register_move",
    "register_load",
    "register_store",
    "register_value",
    "fori_loop",
    "while_loop",
    "dynamic_range",
]

_INT32 = (-(2**31), 2**31 - 1)


class VirtualRegister(NKIObject):
    """A 32-bit engine-sequencer register (``nisa.register_alloc``)."""

    def __init__(self, state=None, frozen=False):
        self._value = None if state is None else _int32("nisa.register_alloc", "x", state)
        self._frozen = bool(frozen)

    def _read(self, api: str) -> int:
        if self._value is None:
            raise NkiValidationError(
                api, "register", "must be initialised before it is read", "uninitialised"
            )
        return self._value

    def _set(self, api: str, value: int) -> None:
        if self._frozen:
            raise NkiValidationError(
                api, "dst", "must not be a loop's induction register (read-only)", "frozen"
            )
        self._value = value

    def _no_trace_time_value(self, *_):
        raise TypeError(
            "VirtualRegister has no value at trace time: use it as nl.fori_loop / "
            "nl.while_loop bounds, .ap(scalar_offset=reg) or nisa.register_store, not in "
            "Python control flow or arithmetic"
        )

    __bool__ = __int__ = __index__ = __float__ = _no_trace_time_value
    __lt__ = __le__ = __gt__ = __ge__ = _no_trace_time_value
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _no_trace_time_value
    __floordiv__ = __truediv__ = __mod__ = __neg__ = _no_trace_time_value
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"VirtualRegister({'frozen' if self._frozen else 'mutable'})"


def _int32(api: str, arg: str, value) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise NkiValidationError(api, arg, "must be a compile-time int", repr(value))
    if not _INT32[0] <= int(value) <= _INT32[1]:
        raise NkiValidationError(api, arg, "must fit a 32-bit register", value, limit=_INT32)
    return int(value)


def _register(api: str, arg: str, reg) -> VirtualRegister:
    if not isinstance(reg, VirtualRegister):
        raise NkiValidationError(
            api, arg, "must be a VirtualRegister (nisa.register_alloc)", type(reg).__name__
        )
    return reg


def register_value(api: str, arg: str, value) -> int:
    """An int or a register's current value (loop bounds, scalar offsets)."""
    if isinstance(value, VirtualRegister):
        return value._read(api)
    return _int32(api, arg, value)


def register_alloc(x=None) -> VirtualRegister:
    """A new register, uninitialised or holding the int ``x``."""
    return VirtualRegister(x)


def register_move(dst, src) -> None:
    """``dst = src`` (a compile-time int or another register); no memory access."""
    api = "nisa.register_move"
    dst = _register(api, "dst", dst)
    dst._set(api, register_value(api, "src", src))


def _one_element(api: str, arg: str, t) -> NkiTensor:
    from neuron_kernels.interpreter.instructions._common import HBM_OR_SBUF, OperandChecks

    check = OperandChecks(api)
    t = check.tensor(arg, t)
    check.buffer(arg, t, HBM_OR_SBUF)
    if t.size != 1:
        check.fail(arg, "must hold exactly one element (shape [1] or [1, 1])", t.shape, limit=1)
    info = dtypes.info(t.dtype)
    if info.kind not in ("int", "uint") or info.itemsize > 4:
        check.fail(
            f"{arg} dtype",
            "must be an integer type of at most 32 bits (the docs leave a float's "
            "register value unspecified)",
            t.dtype,
        )
    return t


def register_load(dst, src) -> None:
    """``dst = src[0]`` from a one-element integer tensor in HBM or SBUF."""
    from neuron_kernels.interpreter.instructions._common import OperandChecks

    api = "nisa.register_load"
    dst = _register(api, "dst", dst)
    src = _one_element(api, "src", src)
    check = OperandChecks(api)
    if not check.compute:
        raise not_implemented(
            f"{api} in a launch that does not compute (the register's value, and so the "
            "control flow, come from tensor data)"
        )
    dst._set(api, int(src._read_raw().reshape(-1)[0]))
    check.record("sync", [src], [], None)


def register_store(dst, src) -> None:
    """``dst[0] = src`` into a one-element integer tensor in HBM or SBUF."""
    from neuron_kernels.interpreter.instructions._common import OperandChecks

    api = "nisa.register_store"
    dst = _one_element(api, "dst", dst)
    value = register_value(api, "src", _register(api, "src", src))
    dst._write(np.array([value], dtype=np.int64), raw=False)
    OperandChecks(api).record("sync", [], [dst], None)


def _record_dynamic_flow(api: str, trips: int, *bounds) -> None:
    """Note a loop whose trip count is a register value (known only on the device), with
    its call site: every core of an LNC=2 launch must take the same (nki/get-started/about/
    lnc.rst); the lock-step runner compares them. Loops with compile-time bounds are not
    dynamic and are not noted."""
    if bounds and not any(isinstance(b, VirtualRegister) for b in bounds):
        return
    import sys

    from neuron_kernels.interpreter.context import current_or_none

    sim = current_or_none()
    if sim is None or sim.launch.cores is None:
        return
    frame = sys._getframe(2)
    site = f"{api} at {frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
    sim.dynamic_flow.append((site, trips))


def _step(api: str, step) -> int:
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 1:
        raise NkiValidationError(api, "step", "must be a positive compile-time int", step)
    return int(step)


def fori_loop(lower, upper, body_fun, step=1) -> None:
    """``for i in range(lower, upper, step): body_fun(i)`` with ``i`` a read-only register;
    bounds are ints or registers (read once, before the first iteration)."""
    api = "nl.fori_loop"
    step = _step(api, step)
    lo = register_value(api, "lower", lower)
    hi = register_value(api, "upper", upper)
    if not callable(body_fun):
        raise NkiValidationError(api, "body_fun", "must be callable", type(body_fun).__name__)
    _record_dynamic_flow(api, len(range(lo, hi, step)), lower, upper)
    for i in range(lo, hi, step):
        if body_fun(VirtualRegister(i, frozen=True)) is not None:
            raise NkiValidationError(api, "body_fun", "must not return a value", "a value")


def while_loop(init, body_fun) -> None:
    """``r = init; while r != 0: r = body_fun(r)``; the body returns the next condition
    register (nl.while_loop)."""
    api = "nl.while_loop"
    reg = _register(api, "init", init)
    trips = 0
    while reg._read(api) != 0:
        nxt = body_fun(reg)
        reg = _register(api, "body_fun's return value", nxt)
        trips += 1
    _record_dynamic_flow(api, trips)


def dynamic_range(start, stop=None, step=1):
    """Deprecated in NKI 0.6 for ``nl.fori_loop`` (nki/migration/index.rst); iterates
    read-only registers from ``start`` to ``stop`` (ints or registers)."""
    api = "nl.dynamic_range"
    step = _step(api, step)
    if stop is None:
        start, stop = 0, start
    lo = register_value(api, "start", start)
    hi = register_value(api, "stop", stop)
    _record_dynamic_flow(api, len(range(lo, hi, step)), start, stop)
    return (VirtualRegister(i, frozen=True) for i in range(lo, hi, step))
