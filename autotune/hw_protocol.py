"""The JSON contract between the tuner and its hardware workers (version 1).

NKI 0.6 has no benchmark API (its ``nki`` module defines ``jit`` and ``simulate`` only:
aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py, nki/api/nki.rst). A kernel launch is
measured in two processes instead:

* the **compile worker** (``python -m neuron_kernels.autotune.compile_worker REQUEST``, in
  the tuner's NKI environment) calls the ``nki.jit`` kernel on NumPy arrays with
  ``NKI_ARTIFACTS_DIR`` set before ``nki`` is imported, which leaves ``kernel.neff`` in that
  folder (neuron-runtime/nrtpy/tutorial-debug-neff-nrtpy.rst, Step 2 and its note);
* the **measure worker** (``NRTPY_PYTHON measure_worker.py REQUEST``, in the nrtpy
  environment: the nrtpy and nki wheels "cannot be installed in the same Python environment",
  neuron-runtime/nrtpy/nrtpy-getting-started.rst) loads the NEFF with
  ``NrtpyModel.load_from_neff``, runs it once for its outputs and times it with
  ``.benchmark(inputs, warmup_iter, benchmark_iter, mode="device")``
  (neuron-runtime/nrtpy/model.rst, tutorial-validate-benchmark.rst Step 3).

Each worker reads one request file and writes one result file beside it
(``<request>.result.json``, written to a temporary name and renamed). Paths inside a
request or result are relative to the request file's folder (or absolute). A worker that
exits non-zero or writes no result has crashed; one that is still running at the trial's
deadline is killed. Either fails that trial, never the study.

Compile request (``kind: "compile"``)::

    {"protocol": "neuron-kernels/hw-worker", "version": 1, "kind": "compile",
     "kernel": {"module": "neuron_kernels.kernels.matmul", "name": "forward"},
     "args": [{"tensor": "a"}, {"tensors": ["w0", "w1"]}, {"constant": 0}],
     "tensors": {"a": {"path": "a.npy", "dtype": "bfloat16", "shape": [256, 512]}, ...},
     "constants": "constants.pkl",      # pickled list of the non-tensor arguments
     "artifacts_dir": "artifacts",      # the worker's NKI_ARTIFACTS_DIR
     "target": "trn2", "lnc": 2}

Compile result: ``{"ok": true, "neff": "artifacts/kernel.neff", "nki_version": "...",
"compiler_version": "...", "ran": true, "error": null}``; ``ok: false`` with ``error``
when no NEFF was produced (the kernel did not compile).

Measure request (``kind: "measure"``)::

    {"protocol": ..., "version": 1, "kind": "measure", "neff": "/.../kernel.neff",
     "inputs": [{"name": "a", "path": "a.npy", "dtype": "bfloat16", "shape": [256, 512]}],
     "outputs": [{"path": "out0.npy", "dtype": "bfloat16", "shape": [256, 256]}],
     "warmup_iter": 10, "benchmark_iter": 100}

Measure result: ``{"ok": true, "latency_us": {"p50", "p90", "p99", "mean", "min", "max"},
"iterations": 100, "warmup_iterations": 10, "input_match": "name" | "position",
"outputs": ["out0.npy"]}``, device-side microseconds (``BenchmarkResult.durations_ms``
times 1000); ``ok: false`` with ``error`` when nrtpy raised.

Arrays are ``.npy`` files. bfloat16, which NumPy has no type for, is stored as its raw
16-bit patterns (``<u2``) and named ``"bfloat16"`` in the request: the measure worker
needs nothing but NumPy and nrtpy, and reinterprets the bytes nrtpy returns (auto-allocated
outputs may come back as ``void``: tutorial-validate-benchmark.rst, note).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "PROTOCOL",
    "VERSION",
    "STORAGE_DTYPES",
    "read_json",
    "resolve",
    "result_path",
    "write_json",
    "save_tensor",
    "load_tensor",
]

PROTOCOL = "neuron-kernels/hw-worker"
VERSION = 1
# NKI dtype name -> the NumPy dtype its .npy file holds (bfloat16: raw bits).
STORAGE_DTYPES = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int32": "<i4",
    "int8": "|i1",
    "uint8": "|u1",
}


def result_path(request: Path) -> Path:
    """Where a worker writes the result of ``request``."""
    return request.with_name(request.name.removesuffix(".json") + ".result.json")


def resolve(request: Path, path: str) -> Path:
    """A path of a request or result, relative to the request's folder unless absolute."""
    p = Path(path)
    return p if p.is_absolute() else request.parent / p


def write_json(path: Path, doc: dict) -> None:
    """Write ``doc`` to ``path`` atomically (a reader sees the old file or the whole new one)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def read_json(path: Path, kind: str | None = None) -> dict[str, Any]:
    """A request or result; ValueError when it is not one of this protocol's version."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("protocol") != PROTOCOL:
        raise ValueError(f"{path}: 'protocol' must be {PROTOCOL!r}")
    if doc.get("version") != VERSION:
        raise ValueError(f"{path}: 'version' must be {VERSION}, got {doc.get('version')!r}")
    if kind is not None and doc.get("kind") != kind:
        raise ValueError(f"{path}: 'kind' must be {kind!r}, got {doc.get('kind')!r}")
    return doc


def save_tensor(path: Path, value) -> dict:
    """Save a torch tensor or NumPy array (ml_dtypes bfloat16 included) as ``.npy``; returns
    its ``{"path", "dtype", "shape"}`` entry (path relative to its folder)."""
    import numpy as np

    try:
        import torch
    except ImportError:  # pragma: no cover - the tuner always has torch
        torch = None
    if torch is not None and isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        t = value.detach().cpu().contiguous()
        array = t.view(torch.int16).numpy().view("<u2") if dtype == "bfloat16" else t.numpy()
    else:
        array = np.ascontiguousarray(value)
        dtype = str(array.dtype)
        if dtype == "bfloat16":
            array = array.view("<u2")
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"{path.name}: dtype {dtype} is not one of {sorted(STORAGE_DTYPES)}")
    np.save(path, array.astype(STORAGE_DTYPES[dtype], copy=False), allow_pickle=False)
    return {"path": path.name, "dtype": dtype, "shape": list(array.shape)}


def load_tensor(path: Path, dtype: str, shape) -> Any:
    """The torch tensor of a ``.npy`` written by a worker or by :func:`save_tensor`."""
    import numpy as np
    import torch

    array = np.load(path, allow_pickle=False)
    array = array.view(STORAGE_DTYPES[dtype]).reshape(tuple(shape))
    if dtype == "bfloat16":
        return torch.from_numpy(array.view("<i2").copy()).view(torch.bfloat16)
    return torch.from_numpy(array.copy())
