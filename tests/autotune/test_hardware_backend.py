"""The hardware backend's full protocol, on test doubles of nki and nrtpy (``hw_doubles/``).

The real worker programs (``autotune/compile_worker.py``, ``autotune/measure_worker.py``) run
as the tuner starts them, in their own processes, against doubles written from the published
surface of ``nki.jit`` + ``NKI_ARTIFACTS_DIR`` and of nrtpy (each behaviour cites its doc line
in ``hw_doubles/``): a study completes and writes "hardware" entries the op then reads, a
wrong result fails its trial, a crashed measure or compile worker fails its trial (and the
study goes on), a worker hung past the deadline is killed and fails its trial, and a resumed
study measures only what is new.

What this proves: the tuner's side of the protocol (requests, results, the NEFF cache, core
assignment through ``NEURON_RT_VISIBLE_CORES``, deadlines, the correctness gate, what is
stored) and that the workers call the documented surface as documented.

What only a Trn2 run can confirm: that ``nki.jit`` on NumPy arrays writes exactly one NEFF
named ``kernel.neff`` per launch and whether it also runs it on the visible core; the NEFF's
input names (parameter names; a tuple parameter's elements) and its output order; that
nrtpy accepts bfloat16 inputs given as raw 16-bit patterns; the device-side durations
themselves (here they are the cost model's, modeled); ``neuron-ls``' output; how long real
compiles take against the default deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from neuron_kernels import tuned_configs
from neuron_kernels.autotune import hw_node, hw_protocol, measure_worker
from neuron_kernels.autotune.backends import BackendUnavailable
from neuron_kernels.autotune.neff_backend import HardwareBackend, WorkerFailure, run_worker
from neuron_kernels.autotune.objective import make_point
from neuron_kernels.autotune.study import tune
from neuron_kernels.kernels.spec import get_spec

DOUBLES = Path(__file__).resolve().parent / "hw_doubles"
NODE = hw_node.NodeInfo("trn2.48xlarge", 2, (0, 1, 2, 3))  # one Trn2 device at LNC=2
SHAPE = "256x256x256"
# Normal trials on the doubles take ~20-40 s here (two Python processes each); a hung one is
# killed at this deadline.
DEADLINE_S = 150.0
HANG_DEADLINE_S = 75.0


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A NEFF cache shared by the module's studies (the grid visits the same configs)."""
    return tmp_path_factory.mktemp("hw")


@pytest.fixture
def node(monkeypatch, shared, tmp_path):
    """A Trn2 node played by the doubles: the workers import them (PYTHONPATH), this process
    sees a device, nki 0.6 and the node ``neuron-ls`` would describe."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(DOUBLES), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("NEURON_KERNELS_DOUBLE_STATE", str(state))
    monkeypatch.delenv("NEURON_KERNELS_DOUBLE_FAULT", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared / "cache"))
    monkeypatch.setattr(hw_node, "neuron_devices", lambda: ["/dev/neuron0"])
    monkeypatch.setattr(hw_node, "nki_version", lambda: "0.6.0")
    monkeypatch.setattr(hw_node, "probe_node", lambda: NODE)
    return state


def _calls(state: Path) -> list[dict]:
    path = state / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _backend(**kw):
    kw.setdefault("trial_deadline_s", DEADLINE_S)
    return HardwareBackend(
        "trn2", nrtpy_python=sys.executable, warmup_iter=2, benchmark_iter=5, **kw
    )


def _tune(tmp_path, backend, trials, storage=None):
    spec = get_spec("matmul")
    point = make_point(spec, SHAPE, "bfloat16", backend.lnc)  # checked where it is measured
    (found,) = tune(
        spec,
        [point],
        trials=trials,
        storage_url=storage or f"sqlite:///{tmp_path / 'studies.db'}",
        backend=backend,
        sampler="grid",
        seed=0,
        results_root=tmp_path / "perf_results",
        warm_start=False,
    )
    study = optuna.load_study(
        study_name=found.study_name, storage=storage or f"sqlite:///{tmp_path / 'studies.db'}"
    )
    return spec, point, found, study.get_trials()


def test_worker_protocol_constants_agree():
    """The standalone measure worker restates the protocol; it must not drift."""
    assert measure_worker.PROTOCOL == hw_protocol.PROTOCOL
    assert measure_worker.VERSION == hw_protocol.VERSION
    assert measure_worker.STORAGE_DTYPES == hw_protocol.STORAGE_DTYPES


def test_readiness_names_the_one_missing_thing(monkeypatch, tmp_path):
    monkeypatch.setattr(hw_node, "neuron_devices", lambda: [])
    assert hw_node.readiness().missing.startswith("no NeuronCore")
    monkeypatch.setattr(hw_node, "neuron_devices", lambda: ["/dev/neuron0"])
    monkeypatch.setattr(hw_node, "nki_version", lambda: None)
    assert hw_node.readiness().missing.startswith("no nki package")
    monkeypatch.setattr(hw_node, "nki_version", lambda: "0.5.2")
    assert hw_node.readiness().missing.startswith("version mismatch: nki 0.5.2")
    monkeypatch.setattr(hw_node, "nki_version", lambda: "0.6.0")
    monkeypatch.delenv(hw_node.NRTPY_PYTHON_ENV, raising=False)
    assert hw_node.readiness().missing.startswith("no nrtpy interpreter: pass --nrtpy-python")
    # a Python without nrtpy (this one, without the doubles on its path)
    monkeypatch.setenv("PYTHONPATH", "")
    why = hw_node.readiness(sys.executable).missing
    assert (
        why.startswith("no nrtpy interpreter: import nrtpy fails") and "ModuleNotFoundError" in why
    )
    assert hw_node.readiness(str(tmp_path / "nope")).missing.endswith("is not an executable file")


def test_compile_jobs_must_leave_a_core_to_measure_on(node):
    with pytest.raises(BackendUnavailable, match="leave a core to measure on: .* 4 logical"):
        _backend(compile_jobs=4)


def test_run_worker_kills_a_hung_worker_at_the_deadline(tmp_path):
    request = tmp_path / "r.json"
    request.write_text("{}")
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match="hung past the 2 s trial deadline"):
        run_worker(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            dict(os.environ),
            request,
            time.monotonic() + 2,
            "measure",
            2,
        )
    assert time.monotonic() - start < 30
    with pytest.raises(WorkerFailure, match=r"died \(exit code 3\)"):
        run_worker(
            [sys.executable, "-c", "raise SystemExit(3)"],
            dict(os.environ),
            request,
            time.monotonic() + 60,
            "measure",
            60,
        )


def test_a_study_on_the_doubles_writes_hardware_entries_the_op_reads(node, tmp_path, monkeypatch):
    spec, point, found, trials = _tune(tmp_path, _backend(), trials=2)
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 2
    assert found.source == "hardware" and found.best_us > 0
    (entry,) = tuned_configs.load_entries(found.written, "matmul", "trn2")
    assert entry["source"] == "hardware" and entry["backend"] == "hardware"
    assert entry["lnc"] == 2
    assert entry["hardware"]["instance_type"] == "trn2.48xlarge"
    assert entry["hardware"]["timing"] == "device" and entry["hardware"]["nki_version"] == "0.6.0"
    assert "compiler_version" in entry["hardware"]
    m = entry["metric"]
    assert m["latency_us"] == m["p50_us"] <= m["p90_us"] <= m["p99_us"] <= m["max_us"]
    # every compile ran on the core kept for compiles, every measurement on another one
    calls = _calls(node)
    compiles = {c["visible_cores"] for c in calls if c["stage"] == "compile"}
    measures = {c["visible_cores"] for c in calls if c["stage"] == "load"}
    assert compiles == {"3"} and measures and measures <= {"0", "1", "2"}
    assert {c["lnc"] for c in calls} == {"2"}
    # a modeled entry for the same bucket does not win over the hardware one
    modeled = {
        **entry,
        "source": "modeled",
        "backend": "model",
        "model_version": _model_version(),
        "config": spec.config.default().to_dict(),
    }
    modeled.pop("hardware")  # same key, LNC included
    tuned_configs.write_entry(spec, modeled, "trn2", tmp_path / "perf_results")
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path / "perf_results"))
    from neuron_kernels.torch_ops.routing import select_config

    args = spec.make_inputs(
        point.problem, "bfloat16", __import__("torch").Generator().manual_seed(0)
    )
    choice = select_config(spec, args, "trn2", lnc=2)  # what the op runs with at LNC=2
    assert choice.source == "hardware" and choice.config.to_dict() == found.best_config


def _model_version():
    from neuron_kernels._version import COST_MODEL_VERSION

    return COST_MODEL_VERSION


def test_crash_and_wrong_result_fail_their_trials_not_the_study(node, tmp_path, monkeypatch):
    # the 1st NEFF load aborts the measure worker; the 1st run (trial 2) returns wrong outputs
    monkeypatch.setenv("NEURON_KERNELS_DOUBLE_FAULT", "crash@1,wrong@1")
    _, _, found, trials = _tune(tmp_path, _backend(), trials=3)
    states = [t.state for t in trials]
    F, C = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE
    assert states == [F, F, C]
    assert trials[0].user_attrs["failed"].startswith("the measure worker died (exit code -6)")
    assert trials[1].user_attrs["failed"].startswith("wrong result on the NeuronCore:")
    assert found.failed == 2 and found.best_config == trials[2].params


def test_a_compile_worker_crash_fails_its_trial_not_the_study(node, tmp_path, monkeypatch):
    """The compiler process dies mid-compile (the nki double aborts at the kernel call,
    ``hw_double_faults.py``: ``compile_crash``): the compile worker "exits non-zero", which
    fails that trial and never the study (``autotune/neff_backend.py``, Deadline); the next
    trial compiles and completes."""
    # a NEFF cache of its own: the first trial's kernel must really be compiled here (the
    # module's shared cache may already hold it, and then nothing would crash)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("NEURON_KERNELS_DOUBLE_FAULT", "compile_crash@1")
    _, _, found, trials = _tune(tmp_path, _backend(), trials=2)
    F, C = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE
    assert [t.state for t in trials] == [F, C]
    assert trials[0].user_attrs["failed"].startswith("the compile worker died (exit code -6)")
    assert found.failed == 1 and found.best_config == trials[1].params
    # the crashed compile left no NEFF behind for a later trial to pick up: one compile
    # finished (the second trial's), and only its NEFF was loaded
    calls = _calls(node)
    assert len([c for c in calls if c["stage"] == "compile"]) == 1
    assert len([c for c in calls if c["stage"] == "load"]) == 1


def test_a_hung_worker_is_killed_at_the_deadline_and_fails_only_its_trial(
    node, tmp_path, monkeypatch
):
    monkeypatch.setenv("NEURON_KERNELS_DOUBLE_FAULT", "hang@1")
    start = time.monotonic()
    # the hung trial's NEFF is in the shared cache: its load hangs at once; the next trial
    # (a cached NEFF too, measured only) needs well under this deadline
    _, _, found, trials = _tune(tmp_path, _backend(trial_deadline_s=HANG_DEADLINE_S), trials=2)
    F, C = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE
    assert [t.state for t in trials] == [F, C]
    assert (
        f"hung past the {HANG_DEADLINE_S:g} s trial deadline (--trial-deadline) and was killed"
        in (trials[0].user_attrs["failed"])
    )
    assert time.monotonic() - start < 3 * HANG_DEADLINE_S
    pid = int((node / "hung.pid").read_text())
    with pytest.raises(ProcessLookupError):  # killed with its process group, not left behind
        os.kill(pid, 0)


def test_a_resumed_study_measures_only_new_configs(node, tmp_path):
    storage = f"sqlite:///{tmp_path / 'resume.db'}"
    _, _, first, trials = _tune(tmp_path, _backend(), trials=1, storage=storage)
    loads = len([c for c in _calls(node) if c["stage"] == "load"])
    _, _, again, trials2 = _tune(tmp_path, _backend(), trials=2, storage=storage)
    assert len(trials2) == 2 and trials2[0].value == trials[0].value  # the first is kept
    assert len([c for c in _calls(node) if c["stage"] == "load"]) == loads + 1  # one new run
    assert again.study_name == first.study_name


def _autotune_on_doubles(tmp_path, *extra):
    """``neuron-kernels autotune matmul --backend hardware`` for one trial on the doubles,
    storing its study and results under ``tmp_path``; ``extra`` flags are added. Returns the
    exit code."""
    from neuron_kernels.cli import main

    return main(
        [
            "autotune",
            "matmul",
            "--shape",
            SHAPE,
            *extra,
            "--backend",
            "hardware",
            "--trials",
            "1",
            "--nrtpy-python",
            sys.executable,
            "--trial-deadline",
            str(DEADLINE_S),
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--results",
            str(tmp_path),
            "--quiet",
            "--no-warm-start",
        ]
    )


def test_lnc_1_on_an_lnc_2_node_compiles_measures_and_stores_at_lnc_1(node, tmp_path, capsys):
    """``autotune --lnc 1 --backend hardware`` on a node whose runtime launches at LNC=2: the
    config is checked at LNC=1 (the point's), so it is also compiled as ``kernel[1]``,
    measured with ``NEURON_LOGICAL_NC_CONFIG=1`` on the node's cores regrouped at LNC=1 (8
    where LNC=2 shows 4) and stored under LNC=1: the runtime variable sets the grouping
    (logical-neuroncore-config.rst) and a NEFF at another LNC would fail to run (the nrtpy
    double refuses one, as nki/api/nki/__init__.py ``jit`` says the runtime does)."""
    code = _autotune_on_doubles(tmp_path, "--lnc", "1")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "autotune matmul on trn2 at LNC=1:" in out
    assert (
        "hardware: trn2.48xlarge at LNC=1; compiles on logical core(s) [7], measurements on "
        "[0, 1, 2, 3, 4, 5, 6]" in out
    )
    (entry,) = tuned_configs.load_entries(tmp_path / "trn2" / "matmul.json", "matmul", "trn2")
    assert entry["lnc"] == 1 and entry["hardware"]["lnc"] == 1
    calls = _calls(node)
    assert {c["lnc"] for c in calls} == {"1"}  # both workers ran at the runtime LNC of 1
    assert {c["stage"] for c in calls} >= {"compile", "load", "call", "benchmark"}
    neffs = [
        json.loads(Path(c["artifacts"], "kernel.neff").read_text())
        for c in calls
        if c["stage"] == "compile"
    ]
    assert neffs and {n["lnc"] for n in neffs} == {1}  # launched as kernel[1]
    assert {c["visible_cores"] for c in calls if c["stage"] == "compile"} == {"7"}


def test_a_backend_at_another_lnc_than_the_point_is_refused(node, tmp_path):
    """A config checked at one LNC is never measured or stored at another (the tuner's API;
    the CLI makes the backend at the points' LNC)."""
    spec = get_spec("matmul")
    point = make_point(spec, SHAPE, "bfloat16", 1)
    with pytest.raises(ValueError, match="is at lnc=1, but the hardware backend launches at LNC=2"):
        tune(
            spec,
            [point],
            trials=1,
            storage_url=f"sqlite:///{tmp_path / 's.db'}",
            backend=_backend(),
            warm_start=False,
            results_root=tmp_path,
        )
    with pytest.raises(BackendUnavailable, match=r"--lnc 3 must be an LNC trn2 has \(1\|2\)"):
        _backend(lnc=3)


def test_autotune_cli_stops_before_tuning_naming_what_is_missing(monkeypatch, tmp_path, capsys):
    from neuron_kernels.cli import main

    monkeypatch.setattr(hw_node, "neuron_devices", lambda: [])
    code = main(
        [
            "autotune",
            "matmul",
            "--shape",
            SHAPE,
            "--backend",
            "hardware",
            "--storage",
            f"sqlite:///{tmp_path / 's.db'}",
            "--results",
            str(tmp_path),
        ]
    )
    err = capsys.readouterr()
    assert code == 2 and err.out == ""
    assert err.err.strip().splitlines() == [
        "neuron-kernels autotune: error: --backend hardware: no NeuronCore: no /dev/neuron* "
        "device here (the hardware backend runs on a Trn2/Trn3 node; use --backend model)"
    ]
    assert not (tmp_path / "trn2").exists()


def test_autotune_cli_completes_a_hardware_study_on_the_doubles(node, tmp_path, capsys):
    code = _autotune_on_doubles(tmp_path, "--compile-jobs", "1")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "backend hardware (hardware latency)" in out
    assert (
        "hardware: trn2.48xlarge at LNC=2; compiles on logical core(s) [3], measurements on [0, 1, 2]"
        in out
    )
    (entry,) = tuned_configs.load_entries(tmp_path / "trn2" / "matmul.json", "matmul", "trn2")
    assert entry["source"] == "hardware" and entry["hardware"]["lnc"] == 2


def test_trn2_smoke_example_passes_on_the_doubles(node, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        import trn2_smoke
    finally:
        sys.path.pop(0)
    code = trn2_smoke.main(["--nrtpy-python", sys.executable, "--shape", SHAPE])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("PASS hardware tuning: matmul 256x256x256 bf16, one trial: ")
    assert "on trn2.48xlarge at LNC=2" in out
    # issue 28: one line per op launched at LNC=2 (here on the interpreter's two cores)
    for op in ("matmul", "rms_norm_fwd", "rms_norm_bwd", "flash_attention_fwd", "fused_adamw_"):
        assert f"PASS {op} at LNC=2: " in out, out
    # issue 33: packed (varlen) attention, eager and compiled, and its kernels at LNC=2
    for line in ("flash_attention_varlen eager: ", "flash_attention_varlen compiled: "):
        assert f"PASS {line}" in out, out
    assert "PASS flash_attention_varlen_bwd at LNC=2: " in out, out


def test_trn2_smoke_example_fails_off_a_trn2_node(monkeypatch, capsys):
    monkeypatch.setattr(hw_node, "neuron_devices", lambda: [])
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    try:
        import trn2_smoke
    finally:
        sys.path.pop(0)
    assert trn2_smoke.main([]) == 1
    assert capsys.readouterr().out.startswith(
        "FAIL hardware tuning: matmul 1024x1024x1024 bf16, one trial: no NeuronCore"
    )


def test_measure_worker_runs_in_an_environment_without_neuron_kernels(tmp_path):
    """Its only imports are the standard library, NumPy and nrtpy (-I: isolated, no site
    packages of this venv beyond what -I keeps, and no repo on the path)."""
    import ast

    tree = ast.parse(Path(measure_worker.__file__).read_text())
    imported = {
        (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    assert imported <= {
        "__future__",
        "json",
        "os",
        "sys",
        "tempfile",
        "traceback",
        "pathlib",
        "numpy",
        "nrtpy",
        "importlib",
    }
    done = subprocess.run(
        [sys.executable, measure_worker.__file__, "--probe"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": ""},
        timeout=60,
    )
    assert json.loads(done.stdout)["nrtpy"] is None


def test_calibrate_measure_writes_the_file_fit_reads(node, tmp_path, capsys, monkeypatch):
    from neuron_kernels.cli import calibration_files, main

    out = tmp_path / "mine.json"
    # at the node's default LNC=2 the single-core tutorial kernels would race: refused first
    assert main(["calibrate", "--measure", str(out), "--nrtpy-python", sys.executable]) == 2
    assert "launch at LNC=1" in capsys.readouterr().err
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "1")
    code = main(
        [
            "calibrate",
            "--measure",
            str(out),
            "--rows",
            "A1-tiled",
            "--shape",
            "256x128x512",
            "--nrtpy-python",
            sys.executable,
            "--trial-deadline",
            str(DEADLINE_S),
        ]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    doc = calibration_files.load_measurements(out, "--fit")  # what --fit reads, checked row by row
    (row,) = doc["rows"]
    assert doc["target"] == "trn2" and doc["instance_type"] == "trn2.48xlarge" and doc["lnc"] == 1
    assert row["id"] == "A1-tiled" and row["shapes"] == [[256, 128], [256, 512]]
    assert row["kernel"].endswith("tutorial_matmul:matmul_tiled") and row["measured_ms"] > 0
    code = main(["calibrate", "--fit", str(out), "--params", "dma_core_gbps", "--iterations", "2"])
    assert code == 0 and "Fitted on trn2 to 1 hardware measurement(s)" in capsys.readouterr().out


def test_calibrate_measure_off_a_trn_node_is_one_line(monkeypatch, tmp_path, capsys):
    from neuron_kernels.cli import main

    monkeypatch.setattr(hw_node, "neuron_devices", lambda: [])
    code = main(["calibrate", "--measure", str(tmp_path / "m.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--measure" in err[0] and "no NeuronCore" in err[0]
    assert not (tmp_path / "m.json").exists()


def test_doctor_says_whether_the_hardware_backend_can_run_and_what_is_missing(
    node, monkeypatch, capsys
):
    from neuron_kernels.cli import main

    def doctor() -> dict:
        assert main(["doctor", "--json"]) == 0
        return json.loads(capsys.readouterr().out)["hardware_tuning"]

    monkeypatch.setenv(hw_node.NRTPY_PYTHON_ENV, sys.executable)
    hw = doctor()
    assert hw["ready"] and hw["missing"] is None
    assert (hw["instance_type"], hw["lnc"], hw["logical_cores"]) == ("trn2.48xlarge", 2, 4)
    monkeypatch.delenv(hw_node.NRTPY_PYTHON_ENV)
    hw = doctor()
    assert not hw["ready"] and hw["missing"].startswith("no nrtpy interpreter")
    monkeypatch.setattr(hw_node, "neuron_devices", lambda: [])
    assert main(["doctor"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("hardware tuning")]
    assert lines == [
        "hardware tuning (autotune --backend hardware): cannot run here: no NeuronCore: no "
        "/dev/neuron* device here (the hardware backend runs on a Trn2/Trn3 node; use "
        "--backend model)"
    ]


def test_a_core_is_held_by_one_worker_at_a_time(tmp_path):
    """The slot pool every tuner process shares: a held core is not handed out again, a free
    one is, and a trial that finds none free by its deadline fails (it does not wait on)."""
    from neuron_kernels.autotune.neff_backend import _core

    far = time.monotonic() + 60
    with _core(tmp_path, (0, 1), far, "measure") as first:
        with _core(tmp_path, (0, 1), far, "measure") as second:
            assert {first, second} == {0, 1}
            with pytest.raises(
                WorkerFailure, match="waited past the trial deadline for a free measure core"
            ):
                with _core(tmp_path, (0, 1), time.monotonic() + 0.3, "measure"):
                    pass
    with _core(tmp_path, (0, 1), far, "measure") as again:  # released at the end of the block
        assert again == 0
