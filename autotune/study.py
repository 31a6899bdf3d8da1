"""Tune one op at a list of (shape, dtype) points: one Optuna study per point.

    from neuron_kernels.autotune.study import tune
    results = tune("matmul", ["4096x4096x4096"], "bfloat16", target="trn2", trials=100)

Each study is named by what makes its numbers comparable (op, shape, dtype, target,
backend, kernel hash, cost-model version), so re-running the same command resumes it and a
changed kernel starts afresh. The default config is enqueued first, so the best is never
worse than the default; then, unless ``warm_start`` is off, the configs already tuned for
the op at its nearest other shapes (:func:`warm_start_configs`), so a new shape starts
from what won next door instead of from scratch.

``jobs`` worker processes share the study through its storage
(Optuna's distributed mode: each worker asks the storage for trials); a trial budget counts
the trials of every worker. The best config per point is merged into
``<results folder>/<target>/<op>.json`` (the user's folder unless told otherwise;
:mod:`neuron_kernels.tuned_configs`): the faster of it and the stored entry for the same
key stays, unless ``replace``.
"""

from __future__ import annotations

import math
import multiprocessing
import re
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import optuna
from optuna.trial import TrialState

from neuron_kernels import tuned_configs
from neuron_kernels._version import COST_MODEL_VERSION
from neuron_kernels.autotune.backends import make_backend
from neuron_kernels.autotune.objective import GateFailure, Objective, Point, gate_reason, params_key
from neuron_kernels.autotune.storage import open_storage
from neuron_kernels.errors import LimitError

__all__ = [
    "SAMPLERS",
    "TUNER_VERSION",
    "PointResult",
    "SamplerError",
    "make_sampler",
    "study_name",
    "summarize",
    "tune",
    "warm_start_configs",
]

TUNER_VERSION = "1"
SAMPLERS = ("tpe", "random", "grid", "cmaes", "gp", "auto")
POLL_S = 0.5  # how often the parent of --jobs workers reads the study for the progress bar


class SamplerError(ValueError):
    """The sampler cannot search this op's space here; the message says why."""


def make_sampler(name: str, space: dict[str, tuple], seed: int | None, trials: int):
    """An Optuna sampler over ``space`` (every tunable is a categorical choice).

    ``auto``: the grid when the budget covers the whole space, else TPE.
    """
    size = math.prod(len(c) for c in space.values())
    if name == "auto":
        name = "grid" if trials >= size else "tpe"
    if name == "tpe":
        # multivariate: the tile fields interact (block sizes share one SBUF budget)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, multivariate=True, n_startup_trials=min(10, max(1, size // 10))
            )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        return optuna.samplers.GridSampler({k: list(v) for k, v in space.items()}, seed=seed)
    if name == "cmaes":
        raise SamplerError(
            "Optuna's CmaEsSampler samples no categorical parameter (it falls back to random "
            "search for them), and every tunable here is a categorical choice: use tpe, gp or random"
        )
    if name == "gp":
        import importlib.util

        if importlib.util.find_spec("scipy") is None:
            raise SamplerError(
                "Optuna's GPSampler needs scipy, which is not one of this package's "
                "dependencies: pip install scipy, or use tpe"
            )
        return optuna.samplers.GPSampler(seed=seed)
    raise SamplerError(f"must be one of {', '.join(SAMPLERS)}")


def study_name(spec, point: Point, target: str, backend: str) -> str:
    version = f"model{COST_MODEL_VERSION}" if backend == "model" else "hw"
    digest = tuned_configs.kernel_hash(spec).removeprefix("sha256:")[:12]
    lnc = f"/lnc{point.lnc}" if point.lnc != 1 else ""
    return f"{spec.name}/{point.shape}/{point.dtype}{lnc}/{target}/{backend}/{version}/{digest}"


def _shape_distance(a: str, b: str) -> float:
    """How far apart two shapes in an op's syntax are: the sum of |log2| of the ratios of
    their dimensions (flags such as ``:causal`` must match); infinite when not comparable."""
    dims_a, flags_a = a.split(":")[0], a.split(":")[1:]
    dims_b, flags_b = b.split(":")[0], b.split(":")[1:]
    xs, ys = re.findall(r"\d+", dims_a), re.findall(r"\d+", dims_b)
    if flags_a != flags_b or len(xs) != len(ys) or not xs:
        return math.inf
    return sum(abs(math.log2(max(int(x), 1) / max(int(y), 1))) for x, y in zip(xs, ys))


def warm_start_configs(
    spec, point: Point, target: str, limit: int, root: Path | None = None
) -> list[tuple[dict, str]]:
    """Up to ``limit`` distinct configs from the op's ``perf_results`` entries (same target
    and dtype), nearest shape first (at the point's LNC before another LNC's), each as ``(config, the shape it was tuned at)``.

    Entries of another kernel hash count too (after a kernel change the old winners are
    still the best first guesses), but the default config and any config the op's ``check``
    refuses at ``point`` are left out, so no warm-start trial is spent on a known answer or
    a pruned config. An unreadable results file gives no warm start, never an error.
    """
    if limit <= 0:
        return []
    roots = [root] if root is not None else [folder for _, folder in tuned_configs.layer_roots()]
    entries = []
    for folder in roots:
        path = tuned_configs.results_path(spec.name, target, folder)
        try:
            entries += tuned_configs.load_entries(path, spec.name, target) if path.exists() else []
        except (OSError, ValueError):
            continue
    here = spec.shape_bucket(point.problem)
    current = tuned_configs.kernel_hash(spec)

    def rank(e: dict) -> tuple:
        same = e["shape_bucket"] == here
        distance = 0.0 if same else _shape_distance(point.shape, e.get("shape", ""))
        other_lnc = tuned_configs.entry_lnc(e) != point.lnc
        return (not same, distance, other_lnc, e["kernel_hash"] != current, e.get("shape", ""))

    seen = {params_key(spec.config.default().to_dict())}
    out: list[tuple[dict, str]] = []
    for e in sorted((e for e in entries if e["dtype"] == point.dtype), key=rank):
        try:
            config = spec.config.from_dict(e["config"])
        except (LimitError, TypeError):
            continue  # the op's tunables changed since
        key = params_key(config.to_dict())
        if key in seen:
            continue
        seen.add(key)
        try:
            spec.check(point.problem, point.dtype, config, target, point.lnc)
        except LimitError:
            continue  # it cannot run at this point
        out.append((config.to_dict(), e.get("shape", e["shape_bucket"])))
        if len(out) == limit:
            break
    return out


def _counted(t) -> bool:
    """A trial that spent the budget: a measurement, a pruned config, or a gate failure. A
    repeat of a measured config (answered from the study) is not counted, nor is a trial
    failed by the heartbeat (its worker died; its config is enqueued again)."""
    if t.state == TrialState.COMPLETE:
        return "duplicate_of" not in t.user_attrs
    if t.state == TrialState.PRUNED:
        return True
    return t.state == TrialState.FAIL and "failed" in t.user_attrs


CONVERGED_AFTER = 25  # this many repeats in a row: the sampler proposes nothing new


class _Budget:
    """Stops a worker once the study holds ``trials`` counted trials, every config of the
    space has been tried, or the sampler has converged (:data:`CONVERGED_AFTER`)."""

    def __init__(self, trials: int, space_size: int) -> None:
        self.trials, self.space_size = trials, space_size

    def done(self, study) -> bool:
        finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
        counted = [t for t in finished if _counted(t)]
        tail = finished[-CONVERGED_AFTER:]
        return (
            len(counted) >= self.trials
            or len({params_key(t.params) for t in counted}) >= self.space_size
            or (len(tail) == CONVERGED_AFTER and all("duplicate_of" in t.user_attrs for t in tail))
        )

    def __call__(self, study, trial) -> None:
        if self.done(study):
            study.stop()


@dataclass
class PointResult:
    """What a study found for one point (latencies in microseconds, labelled by ``source``)."""

    point: Point
    study_name: str
    source: str
    best_config: dict | None
    best_us: float | None
    default_us: float | None
    floor_us: float | None
    floor_engine: str
    binding_engine: str
    trials: int  # counted trials (measured, pruned, failed by the gate; not repeats)
    measured: int  # distinct configs measured
    pruned: int
    failed: int
    orphaned: int  # trials failed by the heartbeat (a dead worker)
    repeats: int = 0  # trials that proposed a measured config again (answered, not measured)
    written: Path | None = None
    merge: tuned_configs.Merge | None = None  # which entry the results file kept, and why
    extra: dict = field(default_factory=dict)

    @property
    def speedup(self) -> float | None:
        if self.best_us and self.default_us:
            return self.default_us / self.best_us
        return None

    @property
    def floor_fraction(self) -> float | None:
        if self.best_us and self.floor_us:
            return self.floor_us / self.best_us
        return None


# What a model_slice measurement records (autotune/backends.py): kept on the shipped entry.
MODEL_SLICE_ATTRS = ("traced_problem", "copies")
# What a hardware measurement records (autotune/neff_backend.py): its latency percentiles go
# to the entry's metric, where and how it was measured to the entry's "hardware" object.
HARDWARE_METRIC_ATTRS = ("p50_us", "p90_us", "p99_us", "mean_us", "min_us", "max_us", "launches")
HARDWARE_RUN_ATTRS = (
    "timing",
    "warmup_iter",
    "benchmark_iter",
    "compiler_version",
    "nki_version",
    "instance_type",
    "lnc",
)


def summarize(spec, study, point: Point, source: str) -> PointResult:
    trials = study.get_trials(deepcopy=False)
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.value) if complete else None
    default_key = params_key(spec.config.default().to_dict())
    defaults = [t for t in complete if params_key(t.params) == default_key]
    repeats = sum("duplicate_of" in t.user_attrs for t in complete)
    return PointResult(
        point=point,
        study_name=study.study_name,
        source=source,
        best_config=dict(best.params) if best else None,
        best_us=best.value if best else None,
        default_us=defaults[0].value if defaults else None,
        floor_us=best.user_attrs.get("floor_us") if best else None,
        floor_engine=best.user_attrs.get("floor_engine", "") if best else "",
        binding_engine=best.user_attrs.get("binding_engine", "") if best else "",
        trials=sum(_counted(t) for t in trials),
        measured=len({params_key(t.params) for t in complete}),
        pruned=sum(t.state == TrialState.PRUNED for t in trials),
        failed=sum(t.state == TrialState.FAIL and "failed" in t.user_attrs for t in trials),
        orphaned=sum(t.state == TrialState.FAIL and "failed" not in t.user_attrs for t in trials),
        repeats=repeats,
        extra={
            k: best.user_attrs[k]
            for k in (*MODEL_SLICE_ATTRS, *HARDWARE_METRIC_ATTRS, *HARDWARE_RUN_ATTRS)
            if best and k in best.user_attrs
        },
    )


def _optimize(
    spec,
    point: Point,
    target: str,
    backend_name,
    storage_url: str,
    name: str,
    trials: int,
    timeout: float | None,
    sampler_name: str,
    seed: int | None,
    gate: Callable = gate_reason,
    callbacks: tuple = (),
    heartbeat: tuple[int, int] | None = None,
) -> None:
    """One worker: run trials of the study ``name`` until the budget or the timeout."""
    storage = open_storage(storage_url, *(heartbeat or ()))
    space = spec.config.space()
    sampler = make_sampler(sampler_name, space, seed, trials)
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    budget = _Budget(trials, math.prod(len(c) for c in space.values()))
    if budget.done(study):
        return
    if isinstance(backend_name, str):
        backend = make_backend(backend_name, target, point.lnc)
    else:
        backend = backend_name
    objective = Objective(spec, point, target, backend, gate=gate)
    study.optimize(
        objective,
        timeout=timeout,
        catch=(GateFailure,),
        callbacks=[budget, *callbacks],
        gc_after_trial=False,
    )


def _worker_main(op: str, kwargs: dict) -> None:
    """Entry point of a ``--jobs`` worker process (spawned: it re-imports the registry)."""
    import torch

    from neuron_kernels.kernels.spec import get_spec

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _optimize(get_spec(op), **kwargs)


class _Progress:
    """tqdm bar per point: trials done, best so far, pruned, failed."""

    def __init__(self, enabled: bool, point: Point, total: int) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=f"{point.shape} {point.dtype}", unit="trial")

    def update(self, study) -> None:
        if self.bar is None:
            return
        trials = study.get_trials(deepcopy=False)
        done = sum(_counted(t) for t in trials)
        values = [t.value for t in trials if t.state == TrialState.COMPLETE]
        self.bar.n = min(done, self.bar.total)
        self.bar.set_postfix(
            best=f"{min(values):.2f}us" if values else "-",
            pruned=sum(t.state == TrialState.PRUNED for t in trials),
            failed=sum(t.state == TrialState.FAIL for t in trials),
            refresh=False,
        )
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def tune(
    spec,
    points: list[Point],
    target: str = "trn2",
    trials: int = 100,
    timeout: float | None = None,
    storage_url: str | None = None,
    backend="model",
    jobs: int = 1,
    seed: int | None = 0,
    sampler: str = "tpe",
    write: bool = True,
    results_root: Path | None = None,
    progress: bool = False,
    gate: Callable = gate_reason,
    heartbeat: tuple[int, int] | None = None,
    warm_start: bool = True,
    replace: bool = False,
) -> list[PointResult]:
    """Tune ``spec`` at each point; returns one :class:`PointResult` per point (see module).

    ``warm_start`` enqueues, after the default, up to a quarter of the budget of configs
    tuned at the op's nearest other shapes (read from ``results_root``, else from the
    user's and the shipped results). ``replace`` stores this run's best even when the stored
    entry for the same key is faster (:func:`tuned_configs.merge_entry`).

    ``backend`` is ``"model"``, ``"hardware"`` or an object with ``name``, ``source`` and
    ``measure(spec, problem, dtype, config)`` (tests pass synthetic ones; ``jobs`` 1 then).
    A backend object that launches at an ``lnc`` must launch at every point's: each config
    is checked at the point's LNC and stored under it, so it must be measured there too.

    Raises:
        ValueError: a point's LNC is not the backend object's.
    """
    from neuron_kernels.autotune.storage import default_storage_url

    if not isinstance(backend, str) and getattr(backend, "lnc", None) is not None:
        for p in points:
            if p.lnc != backend.lnc:
                raise ValueError(
                    f"point {p.shape} {p.dtype} is at lnc={p.lnc}, but the {backend.name} "
                    f"backend launches at LNC={backend.lnc}: a config is checked and stored "
                    "at its point's LNC and must be measured at it (make the backend with "
                    "that lnc)"
                )
    storage_url = storage_url or default_storage_url()
    storage = open_storage(storage_url, *(heartbeat or ()))
    make_sampler(sampler, spec.config.space(), seed, trials)  # refuse a bad sampler up front
    if isinstance(backend, str):
        source = "modeled" if backend == "model" else "hardware"
        backend_label = backend
    else:
        source, backend_label = backend.source, backend.name
    out = []
    for point in points:
        # a hardware study is also named by where it measures (instance type, LNC): numbers
        # from another node are not resumed into it
        name = study_name(spec, point, target, getattr(backend, "study_label", backend_label))
        study = optuna.create_study(
            study_name=name, storage=storage, direction="minimize", load_if_exists=True
        )
        study.enqueue_trial(spec.config.default().to_dict(), skip_if_exists=True)
        if warm_start:
            for config, shape in warm_start_configs(spec, point, target, trials // 4, results_root):
                study.enqueue_trial(config, user_attrs={"warm_start": shape}, skip_if_exists=True)
        bar = _Progress(progress, point, trials)
        kwargs = dict(
            point=point,
            target=target,
            backend_name=backend,
            storage_url=storage_url,
            name=name,
            trials=trials,
            timeout=timeout,
            sampler_name=sampler,
            heartbeat=heartbeat,
        )
        try:
            if jobs <= 1:
                _optimize(
                    spec,
                    **kwargs,
                    seed=seed,
                    gate=gate,
                    callbacks=(lambda s, t, bar=bar: bar.update(s),),
                )
            else:
                ctx = multiprocessing.get_context("spawn")
                workers = [
                    ctx.Process(
                        target=_worker_main,
                        args=(spec.name, {**kwargs, "seed": None if seed is None else seed + i}),
                    )
                    for i in range(jobs)
                ]
                for w in workers:
                    w.start()
                while any(w.is_alive() for w in workers):
                    bar.update(study)
                    time.sleep(POLL_S)
                for w in workers:
                    w.join()
                bad = [w.exitcode for w in workers if w.exitcode != 0]
                if bad:
                    raise RuntimeError(f"{len(bad)} of {jobs} tuner workers exited with {bad}")
            bar.update(study)
        finally:
            bar.close()
        result = summarize(spec, study, point, source)
        if write and result.best_config is not None:
            result.merge = tuned_configs.merge_entry(
                spec, _entry(spec, result, backend_label), target, results_root, replace
            )
            result.written = result.merge.path
        out.append(result)
    return out


def _entry(spec, r: PointResult, backend: str) -> dict:
    metric = {"latency_us": r.best_us}
    if r.default_us is not None:
        metric["default_latency_us"] = r.default_us
    if r.floor_us:
        metric.update(floor_us=r.floor_us, floor_engine=r.floor_engine)
    if r.binding_engine:
        metric["binding_engine"] = r.binding_engine
    # traced_problem, copies: a model_slice measurement says so; a hardware one its percentiles
    metric.update({k: v for k, v in r.extra.items() if k not in HARDWARE_RUN_ATTRS})
    run = {k: r.extra[k] for k in HARDWARE_RUN_ATTRS if k in r.extra}
    entry = {
        "shape_bucket": spec.shape_bucket(r.point.problem),
        "dtype": r.point.dtype,
        "lnc": r.point.lnc,
        "shape": r.point.shape,
        "kernel_hash": tuned_configs.kernel_hash(spec),
        "model_version": COST_MODEL_VERSION if r.source == "modeled" else None,
        "source": r.source,
        "backend": backend,
        "tuner_version": TUNER_VERSION,
        "config": r.best_config,
        "metric": metric,
        "trials": r.trials,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if run:  # a hardware entry: the NEFF's compiler, the instance, the LNC it ran at
        entry["hardware"] = run
        if "lnc" in run:
            entry["lnc"] = run["lnc"]
    return entry
