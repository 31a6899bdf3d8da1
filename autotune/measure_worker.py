"""The measure worker: loads one NEFF with nrtpy, runs it, times it on the device.

    NRTPY_PYTHON measure_worker.py REQUEST.json     # writes REQUEST.result.json
    NRTPY_PYTHON measure_worker.py --probe          # prints {"nrtpy": ...} and exits

It runs in the nrtpy environment (neuron-runtime/nrtpy/nrtpy-getting-started.rst: nrtpy and
nki cannot share one Python environment), so it is a standalone script: it imports the
standard library, NumPy and ``nrtpy`` only, never ``neuron_kernels`` (the tuner runs it by
file path). The request and result formats are those of
:mod:`neuron_kernels.autotune.hw_protocol` (``PROTOCOL`` and ``VERSION`` below must match
it; a test checks).

The NeuronCore: the tuner sets ``NEURON_RT_VISIBLE_CORES`` to the one logical core this
worker owns, which is what ``nrtpy.configure(visible_cores=...)`` would do
(neuron-runtime/nrtpy/configuration.rst: it "only sets the NEURON_RT_VISIBLE_CORES
environment variable"), so the model is loaded on ``core_id=0``, the first (only) visible core.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

PROTOCOL = "neuron-kernels/hw-worker"
VERSION = 1
STORAGE_DTYPES = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int32": "<i4",
    "int8": "|i1",
    "uint8": "|u1",
}
PERCENTILES = {"p50": 50, "p90": 90, "p99": 99}


def _resolve(request: Path, path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else request.parent / p


def _write(path: Path, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def _probe() -> int:
    """Whether nrtpy imports here (what ``doctor`` and the tuner's pre-flight ask)."""
    try:
        import nrtpy  # noqa: F401
    except Exception as exc:  # noqa: BLE001  (any import failure is the answer)
        print(json.dumps({"nrtpy": None, "error": f"{type(exc).__name__}: {exc}"}))
        return 0
    try:
        from importlib import metadata

        version = metadata.version("nrtpy")
    except Exception:  # noqa: BLE001
        version = "unknown"
    print(json.dumps({"nrtpy": version, "python": sys.version.split()[0]}))
    return 0


def measure(request: Path) -> dict:
    """Run the request; the result document (``ok`` false with ``error`` when nrtpy raised)."""
    import numpy as np
    from nrtpy import NrtpyModel, NrtpyTensor

    req = json.loads(request.read_text())
    if req.get("protocol") != PROTOCOL or req.get("version") != VERSION:
        raise ValueError(f"{request}: not a {PROTOCOL} v{VERSION} request")
    if req.get("kind") != "measure":
        raise ValueError(f"{request}: 'kind' must be 'measure', got {req.get('kind')!r}")
    # model.rst: load_from_neff(neff_path, name=None, core_id=0, ...)
    model = NrtpyModel.load_from_neff(str(_resolve(request, req["neff"])), core_id=0)
    arrays = []
    for entry in req["inputs"]:
        array = np.load(_resolve(request, entry["path"]), allow_pickle=False)
        arrays.append((entry["name"], array.reshape(tuple(entry["shape"]))))
    # model.rst: input_tensors_info maps the NEFF's input names to their metadata, and the
    # inputs of __call__/benchmark are keyed by those names ("Keys must match the NEFF input
    # names"). tutorial-debug-neff-nrtpy.rst shows them named after the kernel's parameters;
    # when they are not (a tuple parameter), they are matched in order.
    neff_names = list(model.input_tensors_info)
    ours = [name for name, _ in arrays]
    if sorted(neff_names) == sorted(ours):
        match = "name"
    elif len(neff_names) == len(ours):
        match = "position"
        arrays = [(n, a) for n, (_, a) in zip(neff_names, arrays)]
    else:
        return {
            "ok": False,
            "error": f"the NEFF takes inputs {neff_names}, the request gives {ours}",
        }
    # tensor.rst: NrtpyTensor.from_numpy(array, name=None, core_id=0)
    tensors = {name: NrtpyTensor.from_numpy(a, name=name) for name, a in arrays}
    # model.rst: model(inputs) allocates and returns the outputs when outputs is None
    produced = model(inputs=tensors)
    wanted = req["outputs"]
    if len(produced) != len(wanted):
        return {
            "ok": False,
            "error": f"the NEFF returned {len(produced)} outputs, the kernel has {len(wanted)}",
        }
    written = []
    for entry, tensor in zip(wanted, produced.values()):
        # tutorial-validate-benchmark.rst (note): auto-allocated outputs may have a void
        # dtype; reinterpret the raw bytes as the kernel's output dtype.
        raw = np.ascontiguousarray(tensor.numpy())
        array = raw.view(STORAGE_DTYPES[entry["dtype"]]).reshape(tuple(entry["shape"]))
        np.save(_resolve(request, entry["path"]), array, allow_pickle=False)
        written.append(entry["path"])
    warmup, iters = int(req["warmup_iter"]), int(req["benchmark_iter"])
    # model.rst: benchmark(inputs, outputs=None, warmup_iter=5, benchmark_iter=5,
    # mode="device"); "device" is "NeuronCore execution time via device-side tracing".
    stats = model.benchmark(inputs=tensors, warmup_iter=warmup, benchmark_iter=iters, mode="device")
    durations_us = np.asarray(list(stats.durations_ms), dtype=np.float64) * 1e3  # ms -> us
    if durations_us.size == 0:
        return {"ok": False, "error": "nrtpy's benchmark returned no durations"}
    latency = {k: float(np.percentile(durations_us, q)) for k, q in PERCENTILES.items()}
    latency.update(
        mean=float(durations_us.mean()),
        min=float(durations_us.min()),
        max=float(durations_us.max()),
    )
    return {
        "ok": True,
        "latency_us": latency,
        "iterations": int(stats.iterations),
        "warmup_iterations": int(stats.warmup_iterations),
        "input_match": match,
        "outputs": written,
        "error": None,
    }


def main(argv: list[str]) -> int:
    if argv == ["--probe"]:
        return _probe()
    if len(argv) != 1:
        print("usage: measure_worker.py REQUEST.json | --probe", file=sys.stderr)
        return 2
    request = Path(argv[0]).resolve()
    try:
        doc = measure(request)
    except Exception as exc:  # noqa: BLE001  (nrtpy's NrtError & co: reported, not raised)
        traceback.print_exc()
        doc = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    doc.update(protocol=PROTOCOL, version=VERSION, kind="measure")
    _write(request.with_name(request.name.removesuffix(".json") + ".result.json"), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
