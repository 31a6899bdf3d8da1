"""Run any kernel on the interpreter, whichever ``nki`` its module bound at import.

On a Trn node ``neuron_kernels.backend`` hands kernel modules AWS's ``nki``, ``nki.language``
and ``nki.isa``; the profiler, the calibration, the demo and the autotuner's correctness gate
still run those kernels here. For the duration of one interpreter run, every global name that
binds one of AWS's NKI modules (or an object taken from one, ``from nki.isa import
nc_matmul``) is rebound to the interpreter's counterpart, in the kernel's module and in every
module whose functions or classes it reaches through its globals (helpers in other files),
and restored afterwards, also when the kernel raises. Triton's interpreter patches the
language module in a kernel's globals the same way (python/triton/runtime/interpreter.py).

Why rebinding and not a copy of the kernel with fresh globals: a copy would leave helpers,
methods of ``nl.NKIObject`` classes and sub-kernels in the same module bound to AWS's
modules. The cost of rebinding is that, while an interpreter run is in progress, another
thread calling the same kernel modules on the device would see the interpreter: runs hold
one lock, and device calls are not expected to overlap interpreter runs of the same module.

A module that binds no AWS NKI name (the kernels here, when the interpreter is the backend)
is left untouched: the check costs one scan of its globals, cached per kernel.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["OFFICIAL_MODULES", "rebound_to_interpreter", "unwrap_kernel"]

OFFICIAL_MODULES = ("nki", "nki.language", "nki.isa", "nki.typing")
_LOCK = threading.RLock()
_ACTIVE: dict[int, int] = {}  # id(globals dict) -> nesting depth of runs that rebound it


def _ours() -> dict[str, types.ModuleType]:
    from neuron_kernels.interpreter import nki

    return {
        "nki": nki,
        "nki.language": nki.language,
        "nki.isa": nki.isa,
        "nki.typing": nki.typing,
    }


def _official_names() -> dict[int, tuple[str, str]]:
    """id of every public object of AWS's loaded NKI modules -> (module, name)."""
    import sys

    names: dict[int, tuple[str, str]] = {}
    for module_name in OFFICIAL_MODULES:
        module = sys.modules.get(module_name)
        if module is None or _is_ours(module):
            continue
        names[id(module)] = (module_name, "")
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and not isinstance(value, types.ModuleType):
                names.setdefault(id(value), (module_name, name))
    return names


def _official_module_of(value: Any, names: dict[int, tuple[str, str]] | None = None) -> str | None:
    """The AWS NKI module ``value`` is or comes from, if any."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
        return name if name in OFFICIAL_MODULES and not _is_ours(value) else None
    found = (names if names is not None else _official_names()).get(id(value))
    return found[0] if found else None


def _is_ours(value: Any) -> bool:
    if isinstance(value, types.ModuleType):
        module = value.__name__
    else:
        module = getattr(value, "__module__", "") or ""
    return module.startswith("neuron_kernels.interpreter")


def _replacement(value: Any, ours: dict[str, types.ModuleType], names: dict) -> Any:
    """The interpreter's counterpart of an AWS NKI module or object, or ``value`` itself."""
    if isinstance(value, types.ModuleType):
        official = _official_module_of(value)
        return ours[official] if official else value
    found = names.get(id(value))
    if found is None:
        return value
    module, name = found
    return getattr(ours[module], name)  # raises naming the API if we lack it


def _binds_official(namespace: dict, names: dict | None = None) -> bool:
    names = names if names is not None else _official_names()
    return any(_official_module_of(v, names) is not None for v in list(namespace.values()))


def _kernel_code(namespace: dict) -> bool:
    """Whether a module is kernel code: it binds an AWS NKI name or the interpreter's."""
    return _binds_official(namespace) or any(
        isinstance(v, types.ModuleType) and _is_ours(v) for v in list(namespace.values())
    )


def _reachable_namespaces(fn: Callable) -> list[dict]:
    """The globals of ``fn`` and of every kernel-code module reached from them through
    functions and classes, restricted to those that bind an AWS NKI name."""
    seen: dict[int, dict] = {}
    todo = [fn.__globals__]
    while todo:
        ns = todo.pop()
        module_name = str(ns.get("__name__", ""))
        if module_name == "nki" or module_name.startswith("nki."):
            continue  # AWS's own modules are what gets replaced, never rebound
        if id(ns) in seen or (seen and not _kernel_code(ns)):
            continue
        seen[id(ns)] = ns
        for value in list(ns.values()):
            if isinstance(value, types.ModuleType):
                continue
            target = inspect.unwrap(value) if callable(value) else value
            if not isinstance(target, (types.FunctionType, type)):
                # a kernel object of either backend wraps its function
                target = next(
                    (
                        getattr(target, a)
                        for a in ("fn", "func")
                        if isinstance(getattr(target, a, None), types.FunctionType)
                    ),
                    target,
                )
            if isinstance(target, types.FunctionType):
                todo.append(target.__globals__)
            elif isinstance(target, type) and not _is_ours(target):
                module = inspect.getmodule(target)
                if module is not None and module.__name__ not in OFFICIAL_MODULES:
                    todo.append(vars(module))
    return [ns for ns in seen.values() if _binds_official(ns)]


@functools.lru_cache(maxsize=512)
def _namespaces_for(fn: Callable) -> tuple[dict, ...]:
    return tuple(_reachable_namespaces(fn))


@contextlib.contextmanager
def rebound_to_interpreter(fn: Callable) -> Iterator[None]:
    """Within the block, ``fn`` and the helpers it reaches see the interpreter's NKI."""
    namespaces = _namespaces_for(fn)
    if not namespaces:
        yield
        return
    ours = _ours()
    names = _official_names()
    with _LOCK:
        saved: list[tuple[dict, dict]] = []
        try:
            for ns in namespaces:
                depth = _ACTIVE.get(id(ns), 0)
                _ACTIVE[id(ns)] = depth + 1
                if depth:  # an outer run already rebound it
                    saved.append((ns, {}))
                    continue
                originals = {
                    k: v for k, v in ns.items() if _official_module_of(v, names) is not None
                }
                saved.append((ns, originals))
                for name, value in originals.items():
                    ns[name] = _replacement(value, ours, names)
            yield
        finally:
            for ns, originals in reversed(saved):
                ns.update(originals)
                _ACTIVE[id(ns)] -= 1
                if not _ACTIVE[id(ns)]:
                    del _ACTIVE[id(ns)]


def unwrap_kernel(kernel: Any) -> tuple[Callable, tuple[int, ...]]:
    """The Python function and launch grid of a kernel object from either backend.

    AWS's ``nki.jit`` returns its own kernel object; its documented surface is only
    "callable, ``kernel[lnc]`` sets the grid" (nki/api/nki/__init__.py), so the function is
    looked up under the attribute names such wrappers use (``func``, ``fn``, ``__wrapped__``,
    ``function``), and a ``grid`` attribute holding a tuple of ints is taken as its grid.
    """
    if isinstance(kernel, types.FunctionType):
        return kernel, ()
    fn = getattr(kernel, "fn", None)
    for attr in ("func", "fn", "__wrapped__", "function"):
        candidate = getattr(kernel, attr, None)
        if isinstance(candidate, types.FunctionType):
            fn = candidate
            break
    if not isinstance(fn, types.FunctionType):
        raise TypeError(
            f"nki.simulate: cannot find the Python function of kernel object {kernel!r} "
            "(looked for .func, .fn, .__wrapped__, .function)"
        )
    grid = getattr(kernel, "grid", ())
    if not (isinstance(grid, tuple) and all(isinstance(g, int) for g in grid)):
        grid = ()
    return fn, grid
