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
          "kernel_hash": "sha256:...",             # hash of the kernel module's source
          "model_version": "cost-model-1",         # cost model (modeled) or null (hardware)
          "source": "modeled",                     # "modeled" (cost model) | "hardware" (Trn run)
          "config": {"block_m": 4, ...},
          "metric": {"latency_us": 123.4},         # labelled by "source"
          "trials": 50,
          "created": "2026-12-03T08:00:00+00:00"
        }
      ]
    }

An entry applies only when every key matches (op, target, shape bucket, dtype, kernel
hash). A corrupt file, or an entry tuned for another version of the kernel, falls back to
the op's default config with one warning; a plain miss falls back silently (logged once).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import warnings
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from neuron_kernels.errors import LimitError

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
        return Path(env)
    return Path(str(resources.files("neuron_kernels.perf_results")))


def results_path(op: str, target: str, root: Path | None = None) -> Path:
    return (root or perf_results_dir()) / target / f"{op}.json"


def kernel_hash(spec) -> str:
    """sha256 of the source of the modules defining the op's kernels (a tuned config is
    only valid for the kernel code it was tuned on)."""
    digest = hashlib.sha256()
    modules = sorted(
        {inspect.getmodule(getattr(k, "fn", k)).__name__ for k in spec.kernels}
        or {spec.launch.__module__}
    )
    for name in modules:
        import sys

        digest.update(inspect.getsource(sys.modules[name]).encode())
    return "sha256:" + digest.hexdigest()[:16]


@dataclass(frozen=True)
class ConfigChoice:
    """The config an op will run with, and why."""

    config: Any
    source: str  # "default", "modeled" or "hardware"
    entry: dict | None = None


def load_entries(path: Path, op: str, target: str) -> list[dict]:
    """Entries of one results file; raises ValueError describing what is wrong with it."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"'format' must be {FORMAT!r}")
    if data.get("version") != VERSION:
        raise ValueError(f"'version' must be {VERSION}, got {data.get('version')!r}")
    if data.get("op") != op or data.get("target") != target:
        raise ValueError(
            f"holds op {data.get('op')!r} / target {data.get('target')!r}, expected {op!r} / {target!r}"
        )
    entries = data.get("entries")
    if not isinstance(entries, list):
        raise ValueError("'entries' must be a list")
    for i, e in enumerate(entries):
        missing = {"shape_bucket", "dtype", "kernel_hash", "source", "config"} - set(e)
        if missing:
            raise ValueError(f"entry {i} lacks {sorted(missing)}")
        if e["source"] not in SOURCES:
            raise ValueError(f"entry {i} 'source' must be one of {SOURCES}, got {e['source']!r}")
    return entries


def lookup(spec, problem: dict, dtype: str, target: str, root: Path | None = None) -> ConfigChoice:
    """The tuned config for (op, shape bucket, dtype, target), else the default."""
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
    matches = [e for e in entries if e["shape_bucket"] == bucket and e["dtype"] == dtype]
    if not matches:
        _log_once(
            ("miss", str(path), bucket, dtype),
            f"{path}: no entry for {bucket} {dtype}; using the default",
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
    best = sorted(fresh, key=lambda e: SOURCES.index(e["source"]))[-1]  # hardware beats modeled
    try:
        config = spec.config.from_dict(best["config"])
        spec.check(problem, dtype, config, target)
    except (LimitError, TypeError) as exc:
        _warn_once(
            ("invalid", str(path), bucket, dtype),
            f"{path}: the entry for {bucket} {dtype} is not usable here ({exc}); using the default config",
        )
        return default
    return ConfigChoice(config, best["source"], best)


def write_entry(spec, entry: dict, target: str, root: Path | None = None) -> Path:
    """Add or replace (same bucket, dtype and source) an entry; returns the file written."""
    if entry.get("source") not in SOURCES:
        raise ValueError(f"entry 'source' must be one of {SOURCES}, got {entry.get('source')!r}")
    path = results_path(spec.name, target, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = load_entries(path, spec.name, target) if path.exists() else []
    key = (entry["shape_bucket"], entry["dtype"], entry["source"])
    entries = [e for e in entries if (e["shape_bucket"], e["dtype"], e["source"]) != key] + [entry]
    entries.sort(key=lambda e: (e["shape_bucket"], e["dtype"], e["source"]))
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "op": spec.name,
        "target": target,
        "entries": entries,
    }
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return path
