"""The ``hardware`` backend on the NKI 0.6 path: NEFFs compiled by a compile worker, timed on
a NeuronCore by a measure worker in the nrtpy environment (:mod:`.hw_protocol`).

One trial (:meth:`HardwareBackend.measure`):

1. the op's kernels are traced once on the interpreter (no arithmetic) at the full problem,
   which gives the modeled floors (as for the model backend) and the shape and dtype of
   every launch's outputs;
2. ``spec.run_kernels`` runs on the point's inputs with a :class:`NeffRunner`: for each
   kernel launch a **compile worker** makes its NEFF (a fresh process; NEFFs are cached by
   what decides them: the kernel's code hash, the argument shapes and dtypes, the
   compile-time arguments, the target, the LNC and the nki version), then a **measure
   worker** loads it with nrtpy on one logical NeuronCore, runs it on the inputs for its
   outputs and times it in ``mode="device"``;
3. this process (which has torch) computes the op's reference on the same inputs and gates
   the trial on the op's tolerance for the dtype: a wrong result fails the trial.

The latency is the sum over launches of the device-side median; the 90th and 99th
percentiles, the compiler and nki versions, the instance type and the LNC are recorded.

LNC. Kernels are compiled, measured and stored at the LNC asked for (``autotune --lnc``,
the tuned point's, at which the tuner also checks each config), else at the node's launch
LNC (``neuron_kernels.hardware.launch_lnc(target)`` where it exists, else the LNC
``neuron-ls`` reports). Both workers get it as ``NEURON_LOGICAL_NC_CONFIG``, the runtime
environment variable that "controls how many physical NeuronCores are grouped to make up a
logical NeuronCore" and that a NEFF's LNC must match
(about-neuron/arch/neuron-features/logical-neuroncore-config.rst; nki/api/nki/__init__.py,
``jit``: "Mismatching the two will cause a runtime error"), so ``--lnc 1`` on a node whose
runtime defaults to LNC=2 launches ``kernel[1]`` on the node's physical cores one by one.

Cores. At that LNC (the node's logical cores regrouped: :meth:`NodeInfo.cores_at`), the
logical cores are split: the last
``compile_jobs`` are kept for compiles (a standalone ``nki.jit`` call compiles *and runs*,
tutorial-debug-neff-nrtpy.rst Step 2), the others are measured on, one measure worker per
core. Each worker gets its core through ``NEURON_RT_VISIBLE_CORES`` (the variable
``nrtpy.configure(visible_cores=...)`` sets, neuron-runtime/nrtpy/configuration.rst), so a
compile never runs on a core being measured. A core is held with an exclusive ``flock`` on
``<workdir>/slots/core<N>.lock`` for the life of its worker, so every tuner process of a
``--jobs`` run shares the same pool: at most ``compile_jobs`` compiles at once, in parallel
with at most one measurement per measure core.

Deadline. Every worker of a trial must finish within ``trial_deadline_s`` of the trial's
start (waiting for a free core included); a worker still running then is killed with its
process group, and one that exits non-zero or writes no result has died. Either raises
:class:`WorkerFailure`, which fails that trial (its reason in ``user_attrs["failed"]``) and
never the study: Optuna's heartbeat only catches a dead *tuner* process, not a hung child.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from neuron_kernels.autotune import hw_node, hw_protocol
from neuron_kernels.autotune.backends import (
    BackendUnavailable,
    Measurement,
    MeasurementFailure,
    ModelBackend,
)
from neuron_kernels.hardware import target_from_name

__all__ = [
    "DEFAULT_BENCHMARK_ITER",
    "DEFAULT_TRIAL_DEADLINE_S",
    "DEFAULT_WARMUP_ITER",
    "HARDWARE_ATTRS",
    "HardwareBackend",
    "NeffRunner",
    "WorkerFailure",
    "default_workdir",
]

# A trial's workers must finish within this many seconds (--trial-deadline): a large
# kernel's compile takes minutes, its measurement seconds; a worker past this has hung.
DEFAULT_TRIAL_DEADLINE_S = 900.0
# tutorial-validate-benchmark.rst, Step 3: warmup_iter=10, benchmark_iter=100.
DEFAULT_WARMUP_ITER = 10
DEFAULT_BENCHMARK_ITER = 100
POLL_S = 0.05
# What a hardware measurement records on its trial (and the study keeps on its entry).
HARDWARE_ATTRS = (
    "p50_us",
    "p90_us",
    "p99_us",
    "mean_us",
    "min_us",
    "max_us",
    "launches",
    "timing",
    "warmup_iter",
    "benchmark_iter",
    "compiler_version",
    "nki_version",
    "instance_type",
    "lnc",
)


class WorkerFailure(MeasurementFailure):
    """A worker of this trial hung past the deadline, died, or could not do its job."""


def default_workdir() -> Path:
    """NEFFs, trial folders and core locks: ``$XDG_CACHE_HOME/neuron-kernels/hardware``."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "neuron-kernels" / "hardware"


def _launch_lnc(target, node) -> int:
    """The LNC kernels are launched with: ``hardware.launch_lnc`` (the LNC issue) when this
    package has it, else the node's runtime LNC; NeuronCore-v2 has no LNC (always 1)."""
    from neuron_kernels import hardware

    launch = getattr(hardware, "launch_lnc", None)
    if launch is not None:
        return int(launch(target))
    return int(node.lnc) if target.nc_version >= 3 else 1


@contextmanager
def _flock(path: Path, deadline: float, what: str, blocking_ok: bool = False):
    """Hold an exclusive lock on ``path`` until the block ends; WorkerFailure at ``deadline``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise WorkerFailure(f"waited past the trial deadline for {what}") from None
                time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)


@contextmanager
def _core(slots: Path, cores: tuple[int, ...], deadline: float, what: str):
    """A free core of ``cores`` (an exclusive lock on its slot file) for the block."""
    slots.mkdir(parents=True, exist_ok=True)
    fds = {}
    try:
        while True:
            for core in cores:
                fd = os.open(slots / f"core{core}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                fds[core] = fd
                yield core
                return
            if time.monotonic() >= deadline:
                raise WorkerFailure(f"waited past the trial deadline for a free {what} core")
            time.sleep(POLL_S)
    finally:
        for fd in fds.values():
            os.close(fd)


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def run_worker(
    cmd: list[str], env: dict, request: Path, deadline: float, what: str, limit_s: float
) -> dict:
    """Run one worker on ``request`` and return its result document.

    Raises:
        WorkerFailure: the worker was still running at ``deadline`` (killed with its
            process group), exited non-zero, or wrote no readable result.
    """
    log = request.with_suffix(".log")
    result = hw_protocol.result_path(request)
    result.unlink(missing_ok=True)
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WorkerFailure(f"no time left for the {what} worker (--trial-deadline {limit_s:g} s)")
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, str(request)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise WorkerFailure(
                f"the {what} worker hung past the {limit_s:g} s trial deadline "
                f"(--trial-deadline) and was killed"
            ) from None
    if code != 0:
        raise WorkerFailure(f"the {what} worker died (exit code {code}): {_tail(log)}")
    try:
        return hw_protocol.read_json(result, what)
    except (OSError, ValueError) as exc:
        raise WorkerFailure(f"the {what} worker wrote no result ({exc}): {_tail(log)}") from None


def _is_tensor(x) -> bool:
    import numpy as np
    import torch

    return isinstance(x, (torch.Tensor, np.ndarray))


def _locate(kernel, modules) -> tuple[str, str]:
    """(module, attribute) under which ``kernel`` can be imported by the compile worker; a
    ``kernel[lnc]`` launch is found as the kernel it indexes (the worker launches it at the
    request's LNC)."""
    function = getattr(kernel, "fn", None) or getattr(kernel, "func", None)
    for module in modules:
        if module is None:
            continue
        for name, value in vars(module).items():
            if name.startswith("__"):
                continue
            if value is kernel or (
                function is not None
                and (getattr(value, "fn", None) or getattr(value, "func", None)) is function
            ):
                return module.__name__, name
    raise MeasurementFailure(
        f"cannot find kernel {kernel!r} by name in {[m.__name__ for m in modules if m]}"
    )


def _param_names(kernel) -> list[str]:
    from neuron_kernels.interpreter.rebind import unwrap_kernel

    try:
        fn = (
            kernel.fn if hasattr(kernel, "fn") and callable(kernel.fn) else unwrap_kernel(kernel)[0]
        )
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


class _OutputRecorder:
    """A trace-only interpreter runner that keeps each launch's outputs' (shape, dtype)."""

    def __init__(self, target) -> None:
        from neuron_kernels.verification import InterpreterRunner

        self.inner = InterpreterRunner(target, compute=False)
        self.target = self.inner.target
        self.launches: list[tuple[bool, list[tuple[list[int], str]]]] = []

    def __call__(self, kernel, *args, **kwargs):
        out = self.inner(kernel, *args, **kwargs)
        many = isinstance(out, (tuple, list))
        outs = out if many else (out,)
        specs = [(list(o.shape), str(o.dtype).removeprefix("torch.")) for o in outs]
        self.launches.append((many, specs))
        return out


class NeffRunner:
    """A :class:`~neuron_kernels.kernels.spec.Runner` that compiles each launch to a NEFF and
    runs it on a NeuronCore through the workers; keeps each launch's measure result."""

    def __init__(
        self,
        backend: HardwareBackend,
        launches,
        trial_dir: Path,
        deadline: float,
        modules=(),
        code_hash: str = "",
    ) -> None:
        self.backend, self.launches = backend, launches
        self.target = backend.target
        self.lnc = backend.lnc  # run_kernels plans the split for it and launches kernel[lnc]
        self.trial_dir, self.deadline = trial_dir, deadline
        self.modules, self.code_hash = modules, code_hash
        self.results: list[dict] = []
        self.compiles: list[dict] = []

    def __call__(self, kernel, *args, **kwargs):
        if kwargs:  # compile-time keyword arguments: passed by position, as the kernel names them
            from neuron_kernels.interpreter.rebind import unwrap_kernel

            bound = inspect.signature(unwrap_kernel(kernel)[0]).bind(*args, **kwargs)
            bound.apply_defaults()
            args = tuple(bound.arguments.values())
        i = len(self.results)
        if i >= len(self.launches):
            raise MeasurementFailure("the op launched more kernels than its traced run did")
        many, out_specs = self.launches[i]
        launch = self.trial_dir / f"launch{i}"
        launch.mkdir(parents=True)
        module, name = _locate(
            kernel, (*self.modules, sys.modules.get(getattr(kernel, "__module__", "")))
        )
        params = _param_names(kernel)
        tensors, arg_entries, constants, inputs = {}, [], [], []
        for j, a in enumerate(args):
            pname = params[j] if j < len(params) else f"arg{j}"
            if _is_tensor(a):
                tensors[pname] = hw_protocol.save_tensor(launch / f"{pname}.npy", a)
                arg_entries.append({"tensor": pname})
                inputs.append({"name": pname, **tensors[pname]})
            elif isinstance(a, (tuple, list)) and a and all(_is_tensor(t) for t in a):
                keys = []
                for k, t in enumerate(a):
                    key = f"{pname}_{k}"
                    tensors[key] = hw_protocol.save_tensor(launch / f"{key}.npy", t)
                    inputs.append({"name": key, **tensors[key]})
                    keys.append(key)
                arg_entries.append({"tensors": keys})
            else:
                arg_entries.append({"constant": len(constants)})
                constants.append(a)
        compiled = self.backend.compile_launch(
            module,
            name,
            arg_entries,
            tensors,
            launch,
            pickle.dumps(constants),
            self.code_hash,
            self.deadline,
        )
        request = launch / "measure.json"
        outputs = [
            {"path": f"out{k}.npy", "dtype": dtype, "shape": shape}
            for k, (shape, dtype) in enumerate(out_specs)
        ]
        doc = {
            "protocol": hw_protocol.PROTOCOL,
            "version": hw_protocol.VERSION,
            "kind": "measure",
            "neff": compiled["neff_path"],
            "inputs": [{**e, "path": str((launch / e["path"]).resolve())} for e in inputs],
            "outputs": outputs,
            "warmup_iter": self.backend.warmup_iter,
            "benchmark_iter": self.backend.benchmark_iter,
        }
        hw_protocol.write_json(request, doc)
        result = self.backend.measure_launch(request, self.deadline)
        self.results.append(result)
        self.compiles.append(compiled)
        outs = [
            hw_protocol.load_tensor(launch / o["path"], o["dtype"], o["shape"]) for o in outputs
        ]
        return tuple(outs) if many else outs[0]


class HardwareBackend:
    """Latency measured on a NeuronCore from NEFFs (module docstring).

    ``lnc``: the LNC to compile, measure and store at (the tuned point's); None: the node's
    launch LNC.

    Raises:
        BackendUnavailable: at construction, naming the one thing this machine lacks
            (:func:`neuron_kernels.autotune.hw_node.readiness`), an ``lnc`` the target does
            not have, or when ``compile_jobs`` leaves no core to measure on.
    """

    name = "hardware"
    source = "hardware"

    def __init__(
        self,
        target,
        nrtpy_python: str | None = None,
        compile_jobs: int = 1,
        trial_deadline_s: float = DEFAULT_TRIAL_DEADLINE_S,
        warmup_iter: int = DEFAULT_WARMUP_ITER,
        benchmark_iter: int = DEFAULT_BENCHMARK_ITER,
        workdir: Path | None = None,
        probe=None,
        lnc: int | None = None,
    ) -> None:
        ready = hw_node.readiness(nrtpy_python, probe)
        if not ready.ready:
            raise BackendUnavailable(ready.missing)
        self.target = target_from_name(target)
        self.node, self.nrtpy_python, self.nki_version = (
            ready.node,
            ready.nrtpy_python,
            ready.nki_version,
        )
        if lnc is not None and int(lnc) not in self.target.lnc_choices:
            choices = "|".join(map(str, self.target.lnc_choices))
            raise BackendUnavailable(
                f"--lnc {lnc} must be an LNC {self.target.name} has ({choices})"
            )
        self.lnc = _launch_lnc(self.target, self.node) if lnc is None else int(lnc)
        cores = self.node.cores_at(self.lnc)
        if compile_jobs < 1 or compile_jobs >= len(cores):
            raise BackendUnavailable(
                f"--compile-jobs {compile_jobs} must be >= 1 and leave a core to measure on: "
                f"this node has {len(cores)} logical NeuronCores at LNC={self.lnc}"
            )
        self.compile_cores = tuple(cores[-compile_jobs:])
        self.measure_cores = tuple(cores[:-compile_jobs])
        self.trial_deadline_s = float(trial_deadline_s)
        self.warmup_iter, self.benchmark_iter = int(warmup_iter), int(benchmark_iter)
        self.workdir = Path(workdir) if workdir is not None else default_workdir()
        self._floor = ModelBackend(self.target.name)
        self._references: dict[tuple, object] = {}

    @property
    def study_label(self) -> str:
        """The backend part of the study name: numbers of another node or LNC never mix."""
        return f"hardware-{self.node.instance_type}-lnc{self.lnc}"

    # -- the two workers ---------------------------------------------------------------------

    def compile_launch(
        self,
        module,
        name,
        arg_entries,
        tensors,
        launch: Path,
        constants: bytes,
        code_hash: str,
        deadline: float,
    ) -> dict:
        """The NEFF of one launch, from the cache or a compile worker on a compile core."""
        shapes = {k: (v["shape"], v["dtype"]) for k, v in tensors.items()}
        key_text = json.dumps(
            [
                module,
                name,
                code_hash,
                shapes,
                arg_entries,
                self.target.name,
                self.lnc,
                self.nki_version,
            ],
            sort_keys=True,
        )
        key = hashlib.sha256(key_text.encode() + constants).hexdigest()[:24]
        folder = self.workdir / "neffs" / key
        request = folder / "compile.json"
        with _flock(folder / ".lock", deadline, "the NEFF being compiled by another trial"):
            cached = hw_protocol.result_path(request)
            if cached.exists():
                result = hw_protocol.read_json(cached, "compile")
            else:
                for (
                    e
                ) in tensors.values():  # the NEFF cache keeps its own inputs (it outlives trials)
                    shutil.copyfile(launch / e["path"], folder / e["path"])
                (folder / "constants.pkl").write_bytes(constants)
                hw_protocol.write_json(
                    request,
                    {
                        "protocol": hw_protocol.PROTOCOL,
                        "version": hw_protocol.VERSION,
                        "kind": "compile",
                        "kernel": {"module": module, "name": name},
                        "args": arg_entries,
                        "tensors": tensors,
                        "constants": "constants.pkl",
                        "artifacts_dir": "artifacts",
                        "target": self.target.name,
                        "lnc": self.lnc,
                    },
                )
                with _core(self.workdir / "slots", self.compile_cores, deadline, "compile") as core:
                    env = hw_node.worker_env()
                    env.update(
                        NKI_ARTIFACTS_DIR=str((folder / "artifacts").resolve()),
                        NEURON_LOGICAL_NC_CONFIG=str(self.lnc),
                        NEURON_RT_VISIBLE_CORES=str(core),
                        NEURON_PLATFORM_TARGET_OVERRIDE=self.target.name,
                    )
                    result = run_worker(
                        [sys.executable, "-m", "neuron_kernels.autotune.compile_worker"],
                        env,
                        request,
                        deadline,
                        "compile",
                        self.trial_deadline_s,
                    )
                if "ran" not in result:  # the worker failed before calling the kernel: retry later
                    cached.unlink(missing_ok=True)
        if not result.get("ok"):
            raise WorkerFailure(f"the kernel did not compile to a NEFF: {result.get('error')}")
        return {**result, "neff_path": str(hw_protocol.resolve(request, result["neff"]).resolve())}

    def measure_launch(self, request: Path, deadline: float) -> dict:
        """Run the measure worker on ``request`` on a free measure core."""
        with _core(self.workdir / "slots", self.measure_cores, deadline, "measure") as core:
            env = hw_node.worker_env()
            env.pop("NKI_ARTIFACTS_DIR", None)
            env.update(NEURON_RT_VISIBLE_CORES=str(core), NEURON_LOGICAL_NC_CONFIG=str(self.lnc))
            result = run_worker(
                [self.nrtpy_python, str(hw_node.MEASURE_WORKER)],
                env,
                request,
                deadline,
                "measure",
                self.trial_deadline_s,
            )
        if not result.get("ok"):
            raise WorkerFailure(f"nrtpy could not run the NEFF: {result.get('error')}")
        return {**result, "core": core}

    # -- one trial -------------------------------------------------------------------------

    def _launch_outputs(self, spec, problem, dtype, config):
        recorder = _OutputRecorder(self.target)
        spec.run_kernels(
            *self._floor.trace_inputs(spec, problem, dtype), config=config, runner=recorder
        )
        return recorder.launches

    def _reference(self, spec, problem, dtype, inputs):
        """The fp64 reference at this point (outputs, or the updated tensors of an in-place
        op), computed once per point in this process."""
        import torch

        from neuron_kernels.verification import copy_args

        key = (spec.name, tuple(sorted(problem.items())), dtype)
        if key not in self._references:
            if getattr(spec, "mutates", ()):
                ref = copy_args(inputs, torch.float64)
                spec.reference(*ref, upcast=True)
                self._references[key] = spec.mutated_tensors(ref)
            else:
                self._references[key] = spec.reference(*inputs, upcast=True)
        return self._references[key]

    def run_op(self, spec, inputs, config, launches, trial_dir: Path, deadline: float):
        """``spec.run_kernels`` on copies of ``inputs`` through a :class:`NeffRunner`;
        returns (outputs, the runner, the copies it ran on)."""
        from neuron_kernels.tuned_configs import kernel_hash
        from neuron_kernels.verification import copy_args

        runner = NeffRunner(
            self,
            launches,
            trial_dir,
            deadline,
            modules=(sys.modules.get(spec.run_kernels.__module__),),
            code_hash=kernel_hash(spec),
        )
        ran = copy_args(inputs)
        return spec.run_kernels(*ran, config=config, runner=runner), runner, ran

    def measure(self, spec, problem: dict, dtype: str, config) -> Measurement:
        from neuron_kernels.verification import assert_within_tolerance

        deadline = time.monotonic() + self.trial_deadline_s
        modeled = self._floor.measure(spec, problem, dtype, config)
        launches = self._launch_outputs(spec, problem, dtype, config)
        inputs = self._floor.inputs(spec, problem, dtype)
        (self.workdir / "trials").mkdir(parents=True, exist_ok=True)
        trial_dir = Path(tempfile.mkdtemp(prefix=f"{spec.name}-", dir=self.workdir / "trials"))
        out, runner, ran = self.run_op(spec, inputs, config, launches, trial_dir, deadline)
        ref = self._reference(spec, problem, dtype, inputs)
        tol = spec.tolerances[dtype]
        try:
            if getattr(spec, "mutates", ()):
                for i, (g, w) in enumerate(zip(spec.mutated_tensors(ran), ref)):
                    assert_within_tolerance(g, w, tol, f"on the NeuronCore [updated tensor {i}]")
            else:
                assert_within_tolerance(out, ref, tol, "on the NeuronCore")
        except AssertionError as exc:
            raise MeasurementFailure(
                f"wrong result on the NeuronCore: {str(exc).splitlines()[0]}"
            ) from None
        shutil.rmtree(trial_dir, ignore_errors=True)  # kept (with its logs) when it failed
        return Measurement(
            latency_us=sum(r["latency_us"]["p50"] for r in runner.results),
            source=self.source,
            floor_us=modeled.floor_us,
            floor_engine=modeled.floor_engine,
            binding_engine=modeled.binding_engine,
            extra=self._extra(runner),
        )

    def _extra(self, runner: NeffRunner) -> dict:
        def total(k):
            return sum(r["latency_us"][k] for r in runner.results)

        first = runner.compiles[0] if runner.compiles else {}
        return {
            "p50_us": total("p50"),
            "p90_us": total("p90"),
            "p99_us": total("p99"),
            "mean_us": total("mean"),
            "min_us": total("min"),
            "max_us": total("max"),
            "launches": len(runner.results),
            "timing": "device",  # BenchmarkResult of mode="device" (model.rst)
            "warmup_iter": self.warmup_iter,
            "benchmark_iter": self.benchmark_iter,
            "compiler_version": first.get("compiler_version") or "unknown",
            "nki_version": first.get("nki_version") or self.nki_version or "unknown",
            "instance_type": self.node.instance_type,
            "lnc": self.lnc,
        }
