"""The compile worker: one kernel launch -> one NEFF, in a fresh process.

    python -m neuron_kernels.autotune.compile_worker REQUEST.json   # writes REQUEST.result.json

The tuner starts it with ``NKI_ARTIFACTS_DIR`` (the request's ``artifacts_dir``),
``NEURON_LOGICAL_NC_CONFIG`` (the LNC) and ``NEURON_RT_VISIBLE_CORES`` (a core kept for
compiles) in its environment. The artifacts folder must be set before ``nki`` is imported
("The compile options are resolved at import time", neuron-runtime/nrtpy/
tutorial-debug-neff-nrtpy.rst, Step 2 note), which is why every compile is a new process.

The standalone NKI path compiles by calling the ``nki.jit`` kernel on NumPy arrays; that
call also *runs* the kernel (same tutorial, Step 2: "Compile and execute"). The tuner keeps
it off the cores being measured by giving this process a core of its own
(``NEURON_RT_VISIBLE_CORES``). A failed run after a successful compile still leaves the NEFF
("the NEFF is preserved because compilation succeeded"), so the result is the NEFF found in
the folder, whatever the call raised. Request and result: :mod:`.hw_protocol`.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import traceback
from importlib import metadata
from pathlib import Path

from neuron_kernels.autotune import hw_protocol

ARTIFACTS_ENV = "NKI_ARTIFACTS_DIR"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _array(request: Path, entry: dict):
    import numpy as np

    array = np.load(hw_protocol.resolve(request, entry["path"]), allow_pickle=False)
    array = array.reshape(tuple(entry["shape"]))
    if entry["dtype"] == "bfloat16":
        import ml_dtypes

        return array.view(ml_dtypes.bfloat16)
    return array


def compile_launch(request: Path) -> dict:
    """Compile the request's launch; the result document."""
    req = hw_protocol.read_json(request, "compile")
    artifacts = hw_protocol.resolve(request, req["artifacts_dir"]).resolve()
    # set by the tuner in this process's environment, so before anything imported nki
    if Path(os.environ.get(ARTIFACTS_ENV, "")).resolve() != artifacts:
        raise RuntimeError(f"{ARTIFACTS_ENV} must be {artifacts} before nki is imported")
    module = importlib.import_module(req["kernel"]["module"])  # imports nki (via the backend)
    kernel = getattr(module, req["kernel"]["name"])
    tensors = {key: _array(request, e) for key, e in req["tensors"].items()}
    constants = pickle.loads(hw_protocol.resolve(request, req["constants"]).read_bytes())
    args = []
    for a in req["args"]:
        if "tensor" in a:
            args.append(tensors[a["tensor"]])
        elif "tensors" in a:
            args.append(tuple(tensors[k] for k in a["tensors"]))
        else:
            args.append(constants[a["constant"]])
    ran, error = True, None
    try:
        lnc = int(req.get("lnc", 1))
        launch = kernel[lnc] if lnc > 1 else kernel  # nki/api/nki/__init__.py: kernel[lnc]
        launch(*args)  # compiles into NKI_ARTIFACTS_DIR, then runs on this worker's core
    except Exception as exc:  # noqa: BLE001  (the NEFF may exist all the same)
        ran, error = False, f"{type(exc).__name__}: {exc}"
    neffs = sorted(artifacts.rglob("*.neff"))
    preferred = [p for p in neffs if p.name == "kernel.neff"]  # the tutorial's name
    neff = (preferred or neffs or [None])[0]
    return {
        "ok": neff is not None,
        "neff": None if neff is None else str(neff.relative_to(request.parent.resolve())),
        "ran": ran,
        "error": None if neff is not None else (error or "the kernel call left no .neff"),
        "run_error": error,
        "nki_version": _version("nki"),
        "compiler_version": _version("neuronx-cc"),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(
            "usage: python -m neuron_kernels.autotune.compile_worker REQUEST.json", file=sys.stderr
        )
        return 2
    request = Path(argv[0]).resolve()
    try:
        doc = compile_launch(request)
    except Exception as exc:  # noqa: BLE001  (reported in the result; the tuner decides)
        traceback.print_exc()
        doc = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    doc.update(protocol=hw_protocol.PROTOCOL, version=hw_protocol.VERSION, kind="compile")
    hw_protocol.write_json(hw_protocol.result_path(request), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
