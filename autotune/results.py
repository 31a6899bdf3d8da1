"""The results store: tuned configs in ``perf_results/<target>/<op>.json``, read by the ops.

File format (version 1)::

    {
      "format": "neuron-kernels/perf-results",
      "version": 1,
      "op": "matmul",
      "target": "trn2",
      "entries": [
        {
          "shape_bucket": "m1024_n1024_k1024",    # OpSpec.shape_bucket(problem)
          "dtype": "bfloat16",                     # NKI dtype name
          "lnc": 2,                                # launch LNC (kernel[lnc]); absent: 1
          "kernel_hash": "sha256:...",             # kernel_hash(spec): what decides its instructions
          "model_version": "1",                    # cost model version (modeled) or null (hardware)
          "source": "modeled",                     # "modeled" (cost model) | "hardware" (Trn run)
          "config": {"block_m": 4, ...},
          "metric": {"latency_us": 123.4},         # labelled by "source"
          "trials": 50,
          "created": "2026-12-03T08:00:00+00:00",
          # a "hardware" entry (autotune/neff_backend.py) also has "lnc": 2 and
          # "hardware": {"instance_type", "compiler_version", "nki_version", "lnc", "timing",
          # "warmup_iter", "benchmark_iter"}; its metric: "p50_us", "p90_us", "p99_us", ...
        }
      ]
    }

An entry applies only when every key matches: op, target, shape bucket, dtype, launch
LNC (the physical cores the kernel splits its work over; an entry without ``lnc`` was
tuned at LNC=1, before kernels split), kernel hash, and for a modeled entry the cost-model version (``COST_MODEL_VERSION``) that ranked
it. Every field is checked by type before use. A corrupt file, an entry of the wrong
type, or one tuned for another kernel or cost model falls back to the op's default config
with one warning; a plain miss falls back silently (logged once).

The kernel hash covers what changes the instructions a kernel issues: the code of the
op's kernels, its ``plan`` and ``run_kernels``, the helpers they reach by name inside
``neuron_kernels.kernels`` and ``neuron_kernels.hardware``, and the module constants they
read; comments, docstrings, tolerances and tests are outside it
(:func:`neuron_kernels.fingerprint.kernel_fingerprint`).
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from neuron_kernels._version import COST_MODEL_VERSION
from neuron_kernels.errors import LimitError
from neuron_kernels.fingerprint import kernel_fingerprint

__all__ = [
    "FORMAT",
    "VERSION",
    "SOURCES",
    "PERF_RESULTS_ENV",
    "ConfigChoice",
    "perf_results_dir",
    "results_path",
    "kernel_hash",
    "load_entries",
    "entry_lnc",
    "lookup",
    "write_entry",
    "PerfResultsWarning",
]

FORMAT = "neuron-kernels/perf-results"
VERSION = 1
SOURCES = ("modeled", "hardware")
PERF_RESULTS_ENV = "NEURON_KERNELS_PERF_RESULTS"

_log = logging.getLogger(__name__)
_said: set[tuple] = set()


class PerfResultsWarning(UserWarning):
    """A perf_results file could not be used; the op runs with its default config."""


def _warn_once(key: tuple, message: str) -> None:
    if key not in _said:
        _said.add(key)
        warnings.warn(message, PerfResultsWarning, stacklevel=3)


def _log_once(key: tuple, message: str) -> None:
    if key not in _said:
        _said.add(key)
        _log.info(message)


def perf_results_dir() -> Path:
    """``$NEURON_KERNELS_PERF_RESULTS`` if set, else the ``perf_results/`` shipped with the package."""
    env = os.environ.get(PERF_RESULTS_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            what = "a file" if path.exists() else "missing"
            _warn_once(
                ("env", env),
                f"{PERF_RESULTS_ENV}={env} is {what}, not a folder; every op uses its default config",
            )
        return path
    return Path(str(resources.files("neuron_kernels.perf_results")))


def results_path(op: str, target: str, root: Path | None = None) -> Path:
    return (root or perf_results_dir()) / target / f"{op}.json"


HASHED_PACKAGES = ("neuron_kernels.kernels", "neuron_kernels.hardware")


def kernel_hash(spec) -> str:
    """Hash of what decides the op's instructions (see the module docstring): a tuned config
    is valid only for the kernel code it was tuned on."""
    roots = [*spec.kernels, spec.plan, spec.run_kernels]
    return "sha256:" + kernel_fingerprint(roots, HASHED_PACKAGES)


@dataclass(frozen=True)
class ConfigChoice:
    """The config an op will run with, and why."""

    config: Any
    source: str  # "default", "modeled" or "hardware"
    entry: dict | None = None


_ENTRY_FIELDS = {  # field: (types, required)
    "shape_bucket": ((str,), True),
    "dtype": ((str,), True),
    "lnc": ((int,), False),  # the launch's LNC; absent: 1
    "kernel_hash": ((str,), True),
    "source": ((str,), True),
    "config": ((dict,), True),
    "model_version": ((str, type(None)), False),
    "metric": ((dict,), False),
    "trials": ((int,), False),
    "created": ((str,), False),
    "shape": ((str,), False),  # the shape tuned (the bucket's representative)
    "backend": ((str,), False),  # "model" or "hardware": what measured it
    "tuner_version": ((str,), False),
    # a hardware entry: the LNC it ran at, and {"instance_type", "compiler_version",
    # "nki_version", "lnc", "timing", "warmup_iter", "benchmark_iter"} (autotune/neff_backend.py)
    "hardware": ((dict,), False),
}


def _check_entry(i: int, e: Any) -> None:
    if not isinstance(e, dict):
        raise ValueError(f"entry {i} must be an object, got {type(e).__name__} {e!r}")
    missing = sorted(k for k, (_, required) in _ENTRY_FIELDS.items() if required and k not in e)
    if missing:
        raise ValueError(f"entry {i} lacks {missing}")
    for key, (types, _) in _ENTRY_FIELDS.items():
        if key in e and (not isinstance(e[key], types) or isinstance(e[key], bool)):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"entry {i} {key!r} must be {names}, got {e[key]!r}")
    if entry_lnc(e) < 1:
        raise ValueError(f"entry {i} 'lnc' must be >= 1, got {e['lnc']!r}")
    if e["source"] not in SOURCES:
        raise ValueError(f"entry {i} 'source' must be one of {SOURCES}, got {e['source']!r}")
    if e["source"] == "modeled" and not isinstance(e.get("model_version"), str):
        raise ValueError(f"entry {i} is modeled, so 'model_version' must be a string")
    bad_keys = [k for k in e["config"] if not isinstance(k, str)]
    if bad_keys:
        raise ValueError(f"entry {i} 'config' keys must be strings, got {bad_keys!r}")


def entry_lnc(entry: dict) -> int:
    """The LNC an entry was tuned at: its ``lnc``, or 1 for an entry written before the
    kernels split their work over the cores of a logical NeuronCore."""
    return entry.get("lnc", 1)


def load_entries(path: Path, op: str, target: str) -> list[dict]:
    """Entries of one results file; raises ValueError describing what is wrong with it."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"'format' must be {FORMAT!r}")
    if data.get("version") != VERSION or isinstance(data.get("version"), bool):
        raise ValueError(f"'version' must be {VERSION}, got {data.get('version')!r}")
    if data.get("op") != op or data.get("target") != target:
        raise ValueError(
            f"holds op {data.get('op')!r} / target {data.get('target')!r}, expected {op!r} / {target!r}"
        )
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ValueError("'entries' must be a list")
    for i, e in enumerate(entries):
        _check_entry(i, e)
    return entries


def lookup(
    spec, problem: dict, dtype: str, target: str, root: Path | None = None, lnc: int = 1
) -> ConfigChoice:
    """The tuned config for (op, shape bucket, dtype, target, launch LNC), else the default."""
    default = ConfigChoice(spec.config.default(), "default")
    path = results_path(spec.name, target, root)
    bucket = spec.shape_bucket(problem)
    if not path.exists():
        _log_once(
            ("miss", str(path)), f"{path}: no tuned configs; {spec.name} uses its default config"
        )
        return default
    try:
        entries = load_entries(path, spec.name, target)
    except (OSError, ValueError) as exc:
        _warn_once(
            ("corrupt", str(path)),
            f"{path} is unreadable ({exc}); {spec.name} uses its default config",
        )
        return default
    matches = [
        e
        for e in entries
        if e["shape_bucket"] == bucket and e["dtype"] == dtype and entry_lnc(e) == lnc
    ]
    if not matches:
        _log_once(
            ("miss", str(path), bucket, dtype, lnc),
            f"{path}: no entry for {bucket} {dtype} at LNC={lnc}; using the default",
        )
        return default
    current = kernel_hash(spec)
    fresh = [e for e in matches if e["kernel_hash"] == current]
    if not fresh:
        _warn_once(
            ("stale", str(path), bucket, dtype),
            f"{path}: the entry for {bucket} {dtype} was tuned for another version of the {spec.name} "
            f"kernel ({matches[0]['kernel_hash']} != {current}); using the default config",
        )
        return default
    fresh_model = [
        e for e in fresh if e["source"] == "hardware" or e["model_version"] == COST_MODEL_VERSION
    ]
    if not fresh_model:
        _warn_once(
            ("stale-model", str(path), bucket, dtype),
            f"{path}: the entry for {bucket} {dtype} was ranked by cost model "
            f"{fresh[0]['model_version']!r}, not the current {COST_MODEL_VERSION!r}; "
            "using the default config",
        )
        return default
    fresh = fresh_model
    best = sorted(fresh, key=lambda e: SOURCES.index(e["source"]))[-1]  # hardware beats modeled
    try:
        config = spec.config.from_dict(best["config"])
        spec.check(problem, dtype, config, target, lnc)
    except (LimitError, TypeError) as exc:
        _warn_once(
            ("invalid", str(path), bucket, dtype),
            f"{path}: the entry for {bucket} {dtype} is not usable here ({exc}); using the default config",
        )
        return default
    return ConfigChoice(config, best["source"], best)


def write_entry(spec, entry: dict, target: str, root: Path | None = None) -> Path:
    """Merge one entry into the op's file (replacing the one with the same bucket, dtype and
    source and LNC, keeping every other); returns the file written.

    The read-merge-write holds an exclusive ``flock`` on the target's folder (concurrent
    tuners never lose each other's entries; no lock file is left behind), and the new file is written to a temporary file in
    the same folder, flushed to disk, then renamed over the old one: a kill at any moment
    leaves either the old file or the new one, never a torn one. An existing file that
    does not parse is refused (ValueError), not overwritten.
    """
    import fcntl
    import tempfile

    if entry.get("source") not in SOURCES:
        raise ValueError(f"entry 'source' must be one of {SOURCES}, got {entry.get('source')!r}")
    _check_entry(0, entry)
    path = results_path(spec.name, target, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        entries = load_entries(path, spec.name, target) if path.exists() else []

        def key(e):
            return (e["shape_bucket"], e["dtype"], entry_lnc(e), e["source"])

        entries = [e for e in entries if key(e) != key(entry)]
        entries.append(entry)
        entries.sort(key=key)
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "op": spec.name,
            "target": target,
            "entries": entries,
        }
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(doc, indent=2) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    finally:
        os.close(folder)  # releases the lock
    return path
