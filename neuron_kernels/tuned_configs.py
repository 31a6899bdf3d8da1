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

Where results live (two layers, searched at every lookup):

- the *user* folder: ``$NEURON_KERNELS_PERF_RESULTS`` if set, else
  ``<user cache>/neuron-kernels/perf_results`` (``$XDG_CACHE_HOME``, else ``~/.cache``).
  ``neuron-kernels autotune`` merges into it by default, so tuning never edits the
  installed package (a wheel's site-packages, or a clone's tracked files);
- the *shipped* folder: ``perf_results/`` inside the package. Only contributors write
  there, with ``neuron-kernels autotune --write-shipped``.

Precedence at lookup: a hardware entry beats a modeled one; within each kind, the user's
entry beats the shipped one (:data:`LAYERS`).

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
    "KEY_FIELDS",
    "LAYERS",
    "ConfigChoice",
    "Merge",
    "entry_key",
    "entry_lnc",
    "merge_entry",
    "perf_results_dir",
    "shipped_dir",
    "user_dir",
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
# What one entry is tuned for, besides op and target (the file): a call looks up the entry
# whose fields equal its own. A new key field (e.g. the LNC) is one more name here and one
# more item in :func:`call_key`.
KEY_FIELDS = ("shape_bucket", "dtype", "lnc")
# Where the entries come from, in precedence order within one source (user before shipped).
LAYERS = ("user", "shipped")

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


def shipped_dir() -> Path:
    """The ``perf_results/`` shipped with the package (written only with ``--write-shipped``)."""
    return Path(str(resources.files("neuron_kernels.perf_results")))


def user_dir() -> Path:
    """The user's results folder: ``$NEURON_KERNELS_PERF_RESULTS`` if set, else
    ``<user cache>/neuron-kernels/perf_results``; layered over :func:`shipped_dir` at lookup."""
    env = os.environ.get(PERF_RESULTS_ENV)
    if env:
        path = Path(env)
        if path.exists() and not path.is_dir():
            _warn_once(
                ("env", env),
                f"{PERF_RESULTS_ENV}={env} is a file, not a folder; only the shipped configs apply",
            )
        return path
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-kernels" / "perf_results"


def layer_roots() -> list[tuple[str, Path]]:
    """``[("user", folder), ("shipped", folder)]``: the folders a lookup reads, in order."""
    return [("user", user_dir()), ("shipped", shipped_dir())]


def perf_results_dir() -> Path:
    """The folder the tuner writes by default: :func:`user_dir`."""
    return user_dir()


def results_path(op: str, target: str, root: Path | None = None) -> Path:
    return (root or perf_results_dir()) / target / f"{op}.json"


def entry_lnc(entry: dict) -> int:
    """The LNC an entry was tuned at: its ``lnc``, or 1 for an entry written before the
    kernels split their work over the cores of a logical NeuronCore."""
    return entry.get("lnc", 1)


def entry_key(entry: dict) -> tuple:
    """The fields of ``entry`` that say which calls it serves (:data:`KEY_FIELDS`)."""
    return tuple(entry_lnc(entry) if k == "lnc" else entry[k] for k in KEY_FIELDS)


def call_key(spec, problem: dict, dtype: str, lnc: int = 1) -> tuple:
    """The key a call with this problem, dtype and launch LNC looks up (:data:`KEY_FIELDS`)."""
    return (spec.shape_bucket(problem), dtype, lnc)


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
    path: Path | None = None  # the results file the entry came from
    layer: str | None = None  # "user" or "shipped" (LAYERS)

    def describe(self) -> str:
        """Where the config came from, in words (``profile`` and ``doctor`` print it)."""
        if self.entry is None:
            return "the op's default config (no tuned entry applies)"
        return f"the {self.layer} {self.source} entry in {self.path}"


_ENTRY_FIELDS = {  # field: (types, required)
    "shape_bucket": ((str,), True),
    "dtype": ((str,), True),
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
    "lnc": ((int,), False),
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


def _fresh_entries(spec, path: Path, key: tuple, target: str, current: str) -> list[dict]:
    """The entries of ``path`` for ``key`` tuned on this kernel (and, modeled, on this cost
    model); a corrupt file or stale entries are said once, as warnings."""
    label = " ".join(map(str, key))
    if not path.exists():
        _log_once(("miss", str(path)), f"{path}: no tuned configs for {spec.name}")
        return []
    try:
        entries = load_entries(path, spec.name, target)
    except (OSError, ValueError) as exc:
        _warn_once(
            ("corrupt", str(path)),
            f"{path} is unreadable ({exc}); {spec.name} does not use its entries",
        )
        return []
    matches = [e for e in entries if entry_key(e) == key]
    if not matches:
        _log_once(("miss", str(path), key), f"{path}: no entry for {label}")
        return []
    fresh = [e for e in matches if e["kernel_hash"] == current]
    if not fresh:
        _warn_once(
            ("stale", str(path), key),
            f"{path}: the entry for {label} was tuned for another version of the {spec.name} "
            f"kernel ({matches[0]['kernel_hash']} != {current}); not used",
        )
        return []
    fresh_model = [
        e for e in fresh if e["source"] == "hardware" or e["model_version"] == COST_MODEL_VERSION
    ]
    if not fresh_model:
        _warn_once(
            ("stale-model", str(path), key),
            f"{path}: the entry for {label} was ranked by cost model "
            f"{fresh[0]['model_version']!r}, not the current {COST_MODEL_VERSION!r}; not used",
        )
    return fresh_model


def lookup(
    spec, problem: dict, dtype: str, target: str, root: Path | None = None, lnc: int = 1
) -> ConfigChoice:
    """The tuned config for (op, key, target) at launch LNC ``lnc``, else the default.

    Reads the user's folder and the shipped one (only ``root`` when given) and takes the
    first usable entry in precedence order: hardware before modeled, and within each, the
    user's before the shipped (:data:`LAYERS`). An entry the op's check refuses here is
    said once and skipped."""
    default = ConfigChoice(spec.config.default(), "default")
    roots = [("user", root)] if root is not None else layer_roots()
    key = call_key(spec, problem, dtype, lnc)
    current = kernel_hash(spec)
    candidates = []
    for rank, (layer, folder) in enumerate(roots):
        path = results_path(spec.name, target, folder)
        for e in _fresh_entries(spec, path, key, target, current):
            candidates.append((-SOURCES.index(e["source"]), rank, layer, path, e))
    candidates.sort(key=lambda c: c[:2])  # hardware beats modeled; then user beats shipped
    for _, _, layer, path, entry in candidates:
        try:
            config = spec.config.from_dict(entry["config"])
            spec.check(problem, dtype, config, target, lnc)
        except (LimitError, TypeError) as exc:
            _warn_once(
                ("invalid", str(path), key, entry["source"]),
                f"{path}: the entry for {' '.join(map(str, key))} is not usable here ({exc}); "
                "not used",
            )
            continue
        return ConfigChoice(config, entry["source"], entry, path, layer)
    return default


MERGE_KEY = (*KEY_FIELDS, "source")  # one entry per key and source in a file
# Fields two entries must share for their latencies to be compared.
COMPARABLE_FIELDS = ("kernel_hash", "model_version")


@dataclass(frozen=True)
class Merge:
    """What :func:`merge_entry` did: ``kept`` is ``"new"`` (no entry for the key, or the
    new one is faster, or ``replace``) or ``"existing"`` (the stored one is faster)."""

    path: Path
    kept: str
    previous: dict | None  # the stored entry for the same key, if there was one
    why: str

    def describe(self, entry: dict) -> str:
        """One sentence for the tuner's output."""
        label = " ".join(str(v) for v in (*entry_key(entry), entry["source"]))
        return f"{label}: {self.why} ({self.path})"


def _latency(e: dict | None):
    value = (e or {}).get("metric", {}).get("latency_us")
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _decide(previous: dict | None, entry: dict, replace: bool) -> tuple[str, str]:
    """("new" | "existing", why) for merging ``entry`` over ``previous``."""
    if previous is None:
        return "new", "added"
    new_us, old_us = _latency(entry), _latency(previous)
    old = f"{old_us:,.2f} us" if old_us is not None else "no latency"
    new = f"{new_us:,.2f} us" if new_us is not None else "no latency"
    unit = entry["source"]
    if replace:
        return "new", f"replaced the stored entry ({old} {unit}) with this run's ({new}), --replace"
    comparable = all(previous.get(f) == entry.get(f) for f in COMPARABLE_FIELDS)
    if not comparable:
        return "new", "replaced the stored entry, tuned on another kernel or cost model"
    if "shape" in previous and "shape" in entry and previous["shape"] != entry["shape"]:
        return "existing", (
            f"kept the stored entry, tuned at {previous['shape']} ({old} {unit}): this run's "
            f"shape {entry['shape']} ({new}) falls in the same bucket, and latencies of two "
            "shapes are not compared (--replace stores this run's)"
        )
    if new_us is None or old_us is None:
        return "new", "replaced the stored entry (a latency is missing, so none to compare)"
    if new_us < old_us:
        return "new", f"kept this run's entry ({new} {unit}), faster than the stored {old}"
    return "existing", (
        f"kept the stored entry ({old} {unit}, {previous.get('trials', '?')} trials); this "
        f"run's best ({new}) is not faster (--replace stores it anyway)"
    )


def write_entry(
    spec, entry: dict, target: str, root: Path | None = None, replace: bool = False
) -> Path:
    """:func:`merge_entry`, returning the file written."""
    return merge_entry(spec, entry, target, root, replace).path


def merge_entry(
    spec, entry: dict, target: str, root: Path | None = None, replace: bool = False
) -> Merge:
    """Merge one entry into the op's file; every entry of another key or source is kept.

    For the same key and source (:data:`MERGE_KEY`), the faster of the stored and the new
    entry stays (a short run never loses a long run's better result), unless ``replace``
    or the stored entry was tuned on another kernel or cost model; an entry tuned at
    another shape of the same bucket stays too (two shapes' latencies say nothing about
    which config is better), unless ``replace``; the returned
    :class:`Merge` says which was kept.

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

        def merge_key(e):
            return (*entry_key(e), e["source"])

        key = merge_key(entry)
        previous = next((e for e in entries if merge_key(e) == key), None)
        kept, why = _decide(previous, entry, replace)
        if kept == "existing":
            return Merge(path, kept, previous, why)
        entries = [e for e in entries if merge_key(e) != key]
        entries.append(entry)
        entries.sort(key=merge_key)
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
    return Merge(path, kept, previous, why)
