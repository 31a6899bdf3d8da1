"""A tuner killed with SIGKILL mid-trial and restarted with the same arguments continues
the same study: completed trials are kept, the orphaned RUNNING trial is failed by Optuna's
heartbeat (not counted as a result) and its config is tried again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import _synthetic as syn
import optuna
import pytest
from optuna.trial import TrialState

from neuron_kernels.autotune.objective import Point, params_key
from neuron_kernels.autotune.study import tune

HEARTBEAT = (1, 2)  # seconds: beat every 1 s, a trial silent for 2 s is stale
POINT = Point("64x64x64", {"m": 64, "n": 64, "k": 64}, "bfloat16")

CHILD = """
import sys
sys.path.insert(0, {here!r})
import _synthetic as syn
from pathlib import Path
from neuron_kernels.autotune.objective import Point
from neuron_kernels.autotune.study import tune
tune(syn.SPEC, [Point("64x64x64", {{"m": 64, "n": 64, "k": 64}}, "bfloat16")], trials=6,
     storage_url={url!r}, backend=syn.SyntheticBackend(hang_at=3, marker=Path({marker!r})),
     gate=syn.no_gate, results_root=Path({root!r}), sampler="random", seed=5,
     heartbeat={heartbeat!r})
"""


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_sigkill_then_resume_keeps_completed_trials_and_fails_the_orphan(tmp_path):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    marker = tmp_path / "hung"
    code = CHILD.format(
        here=str(Path(__file__).parent),
        url=url,
        marker=str(marker),
        root=str(tmp_path / "perf"),
        heartbeat=HEARTBEAT,
    )
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)])
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the tuner exited before reaching the hung trial"
            assert time.monotonic() < deadline, "the tuner never reached its third measurement"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()

    name = next(s.study_name for s in optuna.get_all_study_summaries(url))
    before = optuna.load_study(study_name=name, storage=url).get_trials()
    done_before = {t.number: t.value for t in before if t.state == TrialState.COMPLETE}
    (running,) = [t for t in before if t.state == TrialState.RUNNING]
    assert len(done_before) == 2 and not (tmp_path / "perf").exists()

    time.sleep(HEARTBEAT[1] + 1)  # the dead worker's heartbeat is now stale
    backend = syn.SyntheticBackend()
    (r,) = tune(
        syn.SPEC,
        [POINT],
        trials=6,
        storage_url=url,
        backend=backend,
        gate=syn.no_gate,
        results_root=tmp_path / "perf",
        sampler="random",
        seed=5,
        heartbeat=HEARTBEAT,
    )
    after = {t.number: t for t in optuna.load_study(study_name=name, storage=url).get_trials()}
    assert {n: after[n].value for n in done_before} == done_before  # kept, not re-run
    orphan = after[running.number]
    assert orphan.state == TrialState.FAIL and "failed" not in orphan.user_attrs
    retried = [
        t
        for t in after.values()
        if optuna.storages.RetryHeartbeatStaleTrialCallback.retried_trial_number(t)
        == running.number
    ]
    assert len(retried) == 1 and retried[0].params == orphan.params
    assert retried[0].state == TrialState.COMPLETE
    assert r.orphaned == 1 and r.trials == 6  # the orphan is not counted as a result
    first_run = {params_key(after[n].params) for n in done_before}
    assert not first_run & {params_key(c) for c in backend.calls}  # nothing measured twice
    assert r.best_us == min(t.value for t in after.values() if t.state == TrialState.COMPLETE)
