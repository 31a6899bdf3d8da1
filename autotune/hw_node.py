"""What the hardware backend needs from the node, and the one thing missing when it cannot run.

In the order checked (:func:`readiness`):

1. a NeuronCore: a ``/dev/neuron*`` device (a Trn2/Trn3 node);
2. ``nki`` in this Python (the compile worker runs here), at NKI 0.6 or later: the API this
   backend is written against (aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py);
3. an nrtpy interpreter: ``--nrtpy-python PATH`` or ``NEURON_KERNELS_NRTPY_PYTHON``, a Python
   in which ``import nrtpy`` works (a separate environment: nrtpy and nki "cannot be installed
   in the same Python environment", neuron-runtime/nrtpy/nrtpy-getting-started.rst);
4. the node's logical NeuronCores, read from ``neuron-ls --json-output``
   (tools/neuron-sys-tools/neuron-ls.rst: per device ``nc_count``,
   ``logical_neuroncore_config`` and ``neuroncore_ids``, the ids ``NEURON_RT_VISIBLE_CORES``
   takes) and the instance type from ``neuron-ls``' ``instance-type:`` line.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

__all__ = [
    "MEASURE_WORKER",
    "MIN_NKI",
    "NRTPY_PYTHON_ENV",
    "NodeInfo",
    "Readiness",
    "neuron_devices",
    "nki_version",
    "nrtpy_python",
    "probe_node",
    "probe_nrtpy",
    "readiness",
    "worker_env",
]

NRTPY_PYTHON_ENV = "NEURON_KERNELS_NRTPY_PYTHON"
MIN_NKI = (0, 6)
MEASURE_WORKER = Path(__file__).resolve().parent / "measure_worker.py"
# nrtpy finds libnrt through LD_LIBRARY_PATH (nrtpy-getting-started.rst: "export
# LD_LIBRARY_PATH=/opt/aws/neuron/lib:$LD_LIBRARY_PATH"); a worker started by path, not from
# an activated venv, gets it from the tuner.
NEURON_LIB = "/opt/aws/neuron/lib"
NRTPY_SETUP = (
    "python3 -m venv ~/nrtpy_venv && ~/nrtpy_venv/bin/pip install nrtpy "
    "--extra-index-url=https://pip.repos.neuron.amazonaws.com, then pass "
    "--nrtpy-python ~/nrtpy_venv/bin/python (neuron-runtime/nrtpy/nrtpy-getting-started.rst)"
)


@dataclass(frozen=True)
class NodeInfo:
    """The node as ``neuron-ls`` reports it."""

    instance_type: str
    lnc: int  # the runtime's logical NeuronCore config (physical cores per logical core)
    logical_cores: tuple[int, ...]  # the ids NEURON_RT_VISIBLE_CORES takes

    def cores_at(self, lnc: int) -> tuple[int, ...]:
        """The logical core ids at another LNC (the same physical cores, regrouped)."""
        if lnc == self.lnc:
            return self.logical_cores
        physical = len(self.logical_cores) * self.lnc
        return tuple(range(physical // lnc))


@dataclass(frozen=True)
class Readiness:
    """Whether the hardware backend can run here; if not, ``missing`` says the one thing."""

    ready: bool
    missing: str | None = None
    node: NodeInfo | None = None
    nki_version: str | None = None
    nrtpy_python: str | None = None
    details: dict = field(default_factory=dict)


def neuron_devices() -> list[str]:
    """The ``/dev/neuron<N>`` devices of this machine."""
    return sorted(p for p in glob.glob("/dev/neuron*") if re.fullmatch(r"/dev/neuron\d+", p))


def nki_version() -> str | None:
    """The installed ``nki`` distribution's version, None when it is not installed."""
    try:
        return metadata.version("nki")
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:2])


def nrtpy_python(flag_value: str | None = None) -> str | None:
    """The nrtpy interpreter: the flag, else ``$NEURON_KERNELS_NRTPY_PYTHON``, else None."""
    return flag_value or os.environ.get(NRTPY_PYTHON_ENV) or None


def worker_env(base: dict | None = None) -> dict:
    """The environment of a worker: ours, plus the Neuron runtime library on the loader path."""
    env = dict(os.environ if base is None else base)
    if os.path.isdir(NEURON_LIB):
        parts = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
        env["LD_LIBRARY_PATH"] = ":".join([NEURON_LIB, *[p for p in parts if p != NEURON_LIB]])
    return env


def probe_nrtpy(python: str, timeout_s: float = 120.0) -> str | None:
    """None when ``import nrtpy`` works in ``python``, else why not."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)) and not shutil.which(python):
        return f"{python} is not an executable file"
    try:
        done = subprocess.run(
            [python, str(MEASURE_WORKER), "--probe"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=worker_env(),
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} did not answer: {exc}"
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"{python} could not run the probe: {done.stderr.strip()[-300:]}"
    return None if answer.get("nrtpy") else f"import nrtpy fails in {python}: {answer.get('error')}"


def probe_node(timeout_s: float = 60.0) -> NodeInfo:
    """The node from ``neuron-ls``; RuntimeError when it cannot be read."""
    exe = shutil.which("neuron-ls") or (
        "/opt/aws/neuron/bin/neuron-ls" if os.path.exists("/opt/aws/neuron/bin/neuron-ls") else None
    )
    if exe is None:
        raise RuntimeError("neuron-ls is not on PATH (export PATH=/opt/aws/neuron/bin:$PATH)")
    listing = subprocess.run(
        [exe, "--json-output"], capture_output=True, text=True, timeout=timeout_s
    )
    devices = json.loads(listing.stdout)
    if not devices:
        raise RuntimeError("neuron-ls lists no Neuron device")
    cores = tuple(sorted(int(c) for d in devices for c in d.get("neuroncore_ids", [])))
    lnc = int(devices[0].get("logical_neuroncore_config") or 1)
    text = subprocess.run([exe], capture_output=True, text=True, timeout=timeout_s).stdout
    found = re.search(r"instance-type:\s*(\S+)", text)
    return NodeInfo(found.group(1) if found else "unknown", lnc, cores)


def readiness(nrtpy: str | None = None, probe=None) -> Readiness:
    """Check the four things of the module docstring in order; stop at the first missing one.

    ``probe`` is :func:`probe_node` unless a test gives another.
    """
    if not neuron_devices():
        return Readiness(
            False,
            "no NeuronCore: no /dev/neuron* device here (the hardware backend runs on a "
            "Trn2/Trn3 node; use --backend model)",
        )
    version = nki_version()
    if version is None:
        return Readiness(
            False,
            "no nki package in this Python (on a Neuron DLAMI activate its PyTorch venv, "
            "e.g. source /opt/aws_neuronx_venv_pytorch_2_8/bin/activate: "
            "nki/get-started/setup-env.rst)",
        )
    if _version_tuple(version) < MIN_NKI:
        return Readiness(
            False,
            f"version mismatch: nki {version} is older than "
            f"{'.'.join(map(str, MIN_NKI))}, the NKI API this backend calls "
            "(pip install -U nki --extra-index-url https://pip.repos.neuron.amazonaws.com)",
            nki_version=version,
        )
    python = nrtpy_python(nrtpy)
    if python is None:
        return Readiness(
            False,
            f"no nrtpy interpreter: pass --nrtpy-python PATH or set {NRTPY_PYTHON_ENV} "
            f"({NRTPY_SETUP})",
            nki_version=version,
        )
    why = probe_nrtpy(python)
    if why is not None:
        return Readiness(False, f"no nrtpy interpreter: {why}", nki_version=version)
    try:
        node = (probe or probe_node)()
    except Exception as exc:  # noqa: BLE001  (any failure to read the node is the answer)
        return Readiness(False, f"no NeuronCore visible: {exc}", nki_version=version)
    if not node.logical_cores:
        return Readiness(False, "no NeuronCore: neuron-ls lists no core ids", nki_version=version)
    return Readiness(True, None, node, version, python, {"python": sys.executable})
