"""Test double of AWS's ``nki`` as the compile worker uses it (see ../README.md).

Behaviours, each from aws-neuron/aws-neuron-sdk:

* ``jit(fn=None, **kwargs)`` is the decorator (nki/api/nki/__init__.py: ``def jit(fn=None,
  **kwargs)``); the object it returns is callable and takes ``kernel[lnc]``.
* ``NKI_ARTIFACTS_DIR`` is read when ``nki`` is imported, not at the call
  (neuron-runtime/nrtpy/tutorial-debug-neff-nrtpy.rst, Step 2 note: "must be set **before**
  importing ``nki``. The compile options are resolved at import time.").
* Calling the kernel on NumPy arrays compiles it and saves the NEFF as ``kernel.neff`` in that
  folder (same tutorial, Step 2: ``neff_path = os.path.join(ARTIFACTS_DIR, "kernel.neff")``).
* The NEFF's inputs are named after the kernel's parameters (same tutorial, Step 3: the kernel
  ``oob_dma_kernel(src_tensor)`` gives the input ``src_tensor``); a tuple parameter's
  elements are named ``<param>_<i>`` here, which the docs do not say (only a Trn2 run can).

What it does not do: run the kernel after compiling (the real call does, on the visible core;
the double logs the visible core instead, so the tests can check it is not a measured one),
or check anything the real compiler checks. Its "NEFF" is JSON naming the kernel by module
and attribute, with the compile-time arguments pickled, for the nrtpy double to run.
"""

from __future__ import annotations

import base64
import inspect
import json
import os
import pickle
import sys
from pathlib import Path

import hw_double_faults

from neuron_kernels.interpreter import nki as _interpreter_nki

_ARTIFACTS_DIR = os.environ.get("NKI_ARTIFACTS_DIR")  # resolved at import time (see above)
NEFF_FORMAT = "neuron-kernels-test-double-neff/1"
__version__ = "0.6.0-double"


def _is_array(x) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and hasattr(x, "tobytes")


class _Kernel:
    """What ``jit`` returns: callable on arrays, ``kernel[lnc]``, the function under ``.func``."""

    def __init__(self, func, grid=()):
        self.func, self.grid = func, grid

    def __getitem__(self, grid):
        return _Kernel(self.func, grid if isinstance(grid, tuple) else (grid,))

    def _attribute_name(self) -> str:
        module = sys.modules[self.func.__module__]
        for name, value in vars(module).items():
            if isinstance(value, _Kernel) and value.func is self.func:
                return name
        raise RuntimeError(f"double nki: {self.func.__qualname__} is not a module attribute")

    def __call__(self, *args):
        if hw_double_faults.fault("compile") == "compile_crash":
            os.abort()  # the compiler process dies
        if _ARTIFACTS_DIR is None:
            raise RuntimeError("double nki: NKI_ARTIFACTS_DIR was not set before import")
        params = list(inspect.signature(self.func).parameters)
        inputs, structure, constants = [], [], []
        for i, a in enumerate(args):
            name = params[i]
            if _is_array(a):
                inputs.append({"name": name, "shape": list(a.shape), "dtype": str(a.dtype)})
                structure.append({"tensor": name})
            elif isinstance(a, tuple) and a and all(_is_array(t) for t in a):
                names = [f"{name}_{k}" for k in range(len(a))]
                for n, t in zip(names, a):
                    inputs.append({"name": n, "shape": list(t.shape), "dtype": str(t.dtype)})
                structure.append({"tensors": names})
            else:
                structure.append({"constant": len(constants)})
                constants.append(a)
        neff = {
            "format": NEFF_FORMAT,
            "module": self.func.__module__,
            "name": self._attribute_name(),
            "inputs": inputs,
            "args": structure,
            "constants": base64.b64encode(pickle.dumps(constants)).decode(),
            "target": os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2"),
            # the launch grid (nki/api/nki/__init__.py: ``kernel[lnc]``, default 1)
            "lnc": int(self.grid[0]) if self.grid else 1,
        }
        folder = Path(_ARTIFACTS_DIR)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "kernel.neff").write_text(json.dumps(neff))
        hw_double_faults.log("compile", kernel=neff["name"], artifacts=str(folder))
        return None


def jit(fn=None, **kwargs):
    if fn is None:
        return lambda f: _Kernel(f)
    return _Kernel(fn)


def simulate(kernel):
    return _interpreter_nki.simulate(kernel)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_interpreter_nki, name)  # language, isa and the rest: the interpreter's
