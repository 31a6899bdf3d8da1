"""The tuner's study: finds a known optimum, prunes what the op's check rejects, fails what
the correctness gate rejects, never measures a config twice, starts from the default, and
writes a result the op then reads."""

from __future__ import annotations

import dataclasses

import _synthetic as syn
import optuna
import pytest
import torch
from optuna.trial import TrialState

from neuron_kernels import tuned_configs
from neuron_kernels.autotune.objective import Point, gate_reason, params_key
from neuron_kernels.autotune.study import SamplerError, make_sampler, tune, warm_start_configs
from neuron_kernels.kernels import matmul

POINT = Point("64x64x64", {"m": 64, "n": 64, "k": 64}, "bfloat16")


def _tune(tmp_path, backend, storage=None, **kw):
    kw.setdefault("trials", 24)
    return tune(
        syn.SPEC,
        [POINT],
        storage_url=storage or f"sqlite:///{tmp_path / 'studies.db'}",
        backend=backend,
        gate=syn.no_gate,
        results_root=tmp_path / "perf",
        **kw,
    )


def _trials(tmp_path, result):
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    return optuna.load_study(study_name=result.study_name, storage=storage).get_trials()


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid"])
def test_finds_the_known_optimum_of_a_synthetic_objective(tmp_path, sampler):
    backend = syn.SyntheticBackend()
    (r,) = _tune(tmp_path, backend, trials=20, sampler=sampler, seed=3)
    assert r.best_config == syn.OPTIMUM and r.best_us == pytest.approx(10.0)
    assert len(backend.calls) == len({params_key(c) for c in backend.calls})  # none twice
    assert r.measured == len(backend.calls) and r.trials == r.measured + r.pruned <= 20


def test_rejected_configs_are_pruned_with_the_reason(tmp_path):
    (r,) = _tune(tmp_path, syn.SyntheticBackend(), sampler="grid")
    pruned = [t for t in _trials(tmp_path, r) if t.state == TrialState.PRUNED]
    assert r.pruned == len(pruned) == 2  # tile 8 with depth 3, in both orders
    for t in pruned:
        assert t.params["tile"] == 8 and t.params["depth"] == 3
        assert "synthetic: config depth must be < 3 when tile is 8, got 3" in t.user_attrs["pruned"]


def test_the_default_is_the_first_trial_and_the_best_is_never_worse(tmp_path):
    (r,) = _tune(tmp_path, syn.SyntheticBackend(), trials=3, sampler="random")
    first = _trials(tmp_path, r)[0]
    assert first.params == syn.SyntheticConfig.default().to_dict()
    assert r.default_us == first.value and r.best_us <= r.default_us


def test_a_duplicate_config_is_not_measured_again(tmp_path):
    backend = syn.SyntheticBackend()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="dup")
    for _ in range(3):
        study.enqueue_trial(syn.OPTIMUM)
    from neuron_kernels.autotune.objective import Objective

    study.optimize(Objective(syn.SPEC, POINT, "trn2", backend, gate=syn.no_gate), n_trials=3)
    assert backend.calls == [syn.OPTIMUM]
    later = study.get_trials()[1:]
    assert [t.user_attrs["duplicate_of"] for t in later] == [0, 0]
    assert all(t.value == study.trials[0].value for t in later)


def _wrong_when_b_stationary(a, b, *, config, runner):
    """A test-only variant of the matmul kernel that drops the last row of K when B is
    stationary: the kind of bug a tile config can expose."""
    if config.stationary == "b":
        b = b.clone()
        b[-1] = 0
    return matmul.run_kernels(a, b, config=config, runner=runner)


WRONG = dataclasses.replace(
    matmul.SPEC, name="matmul_wrong_b", run_kernels=_wrong_when_b_stationary
)


def test_the_gate_rejects_a_deliberately_wrong_config(tmp_path):
    good = matmul.MatmulConfig(block_m=1, block_n=1, block_k=1, stationary="a")
    bad = dataclasses.replace(good, stationary="b")
    assert gate_reason(WRONG, good, "bfloat16", "trn2") is None
    reason = gate_reason(WRONG, bad, "bfloat16", "trn2")
    assert reason is not None and reason.startswith("wrong result on the interpreter")

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="gate")
    study.enqueue_trial(bad.to_dict())
    study.enqueue_trial(good.to_dict())
    backend = syn.SyntheticBackend()
    from neuron_kernels.autotune.objective import GateFailure, Objective

    point = Point("130x520x260", dict(matmul.SPEC.test_problems["probe"]), "bfloat16")
    study.optimize(
        Objective(WRONG, point, "trn2", _MatmulConstant(backend)),
        n_trials=2,
        catch=(GateFailure,),
    )
    failed, complete = study.trials
    assert failed.state == TrialState.FAIL and "wrong result" in failed.user_attrs["failed"]
    assert complete.state == TrialState.COMPLETE and backend.calls == [good.to_dict()]


class _MatmulConstant:
    """Records what it is asked to measure; every config measures 1 us."""

    name, source = "constant", "modeled"

    def __init__(self, log):
        self.log = log

    def measure(self, spec, problem, dtype, config):
        from neuron_kernels.autotune.backends import Measurement

        self.log.calls.append(config.to_dict())
        return Measurement(1.0, "modeled")


def test_the_op_reads_the_tuned_config_at_call_time(tmp_path, monkeypatch):
    """A real (model backend) tune of matmul at a small shape, then the op's own lookup."""
    from neuron_kernels.torch_ops import routing

    point = Point("200x600x300", {"m": 200, "n": 600, "k": 300}, "bfloat16")
    (r,) = tune(
        matmul.SPEC,
        [point],
        trials=6,
        storage_url=f"sqlite:///{tmp_path / 'studies.db'}",
        results_root=tmp_path / "perf",
        seed=1,
    )
    assert r.written == tmp_path / "perf" / "trn2" / "matmul.json"
    monkeypatch.setenv(tuned_configs.PERF_RESULTS_ENV, str(tmp_path / "perf"))
    tuned_configs._said.clear()
    a, b = torch.zeros(200, 300, dtype=torch.bfloat16), torch.zeros(300, 600, dtype=torch.bfloat16)
    choice = routing.select_config(matmul.SPEC, (a, b), "trn2")
    assert choice.source == "modeled" and choice.config.to_dict() == r.best_config
    entry = choice.entry
    assert entry["metric"]["latency_us"] == r.best_us and entry["trials"] == r.trials
    assert entry["tuner_version"] and entry["backend"] == "model"
    assert entry["kernel_hash"] == tuned_configs.kernel_hash(matmul.SPEC)


def test_samplers_the_space_cannot_use_are_refused_with_a_reason():
    space = syn.SyntheticConfig.space()
    with pytest.raises(SamplerError, match="categorical"):
        make_sampler("cmaes", space, 0, 10)
    with pytest.raises(SamplerError, match="must be one of"):
        make_sampler("annealing", space, 0, 10)
    assert isinstance(make_sampler("auto", space, 0, 24), optuna.samplers.GridSampler)
    assert isinstance(make_sampler("auto", space, 0, 10), optuna.samplers.TPESampler)


def test_journal_storage_holds_a_study_that_a_second_run_continues(tmp_path):
    url = f"journal:{tmp_path / 'studies.log'}"
    (first,) = _tune(tmp_path, syn.SyntheticBackend(), trials=4, sampler="random", storage=url)
    backend = syn.SyntheticBackend()
    (second,) = _tune(tmp_path, backend, trials=8, sampler="random", storage=url)
    assert first.study_name == second.study_name and second.trials == 8
    assert len(backend.calls) == 8 - first.trials - second.pruned + first.pruned


def _ship(root, config: dict, shape: str, kernel_hash=None) -> None:
    """A perf_results entry for the synthetic op, as a tune at ``shape`` would write it."""
    m, n, k = (int(v) for v in shape.split("x"))
    entry = {
        "shape_bucket": syn.SPEC.shape_bucket({"m": m, "n": n, "k": k}),
        "dtype": "bfloat16",
        "shape": shape,
        "kernel_hash": kernel_hash or tuned_configs.kernel_hash(syn.SPEC),
        "model_version": "0",
        "source": "modeled",
        "config": config,
    }
    tuned_configs.write_entry(syn.SPEC, entry, "trn2", root)


def test_a_new_shape_starts_from_the_configs_tuned_at_the_nearest_shapes(tmp_path):
    perf = tmp_path / "perf"
    same = {"tile": 4, "depth": 1, "order": "a"}  # POINT's own bucket (64 rounds up to 128)
    near = {"tile": 8, "depth": 1, "order": "b"}
    far = {"tile": 2, "depth": 3, "order": "b"}
    refused = {"tile": 8, "depth": 3, "order": "a"}  # the plan refuses it at any shape
    _ship(perf, far, "4096x4096x4096")
    _ship(perf, near, "256x128x128")
    _ship(perf, refused, "128x256x128")
    _ship(perf, syn.SyntheticConfig.default().to_dict(), "128x128x256")
    _ship(perf, same, "128x128x128")
    (r,) = _tune(tmp_path, syn.SyntheticBackend(), trials=12, sampler="random")
    first = _trials(tmp_path, r)[:4]
    assert first[0].params == syn.SyntheticConfig.default().to_dict()
    # the same bucket, then nearest first; the default is not run twice and the refused
    # config spends no trial
    assert [t.params for t in first[1:]] == [same, near, far]
    warm_from = [t.user_attrs.get("warm_start") for t in first]
    assert warm_from == [None, "128x128x128", "256x128x128", "4096x4096x4096"]


def test_warm_start_takes_at_most_a_quarter_of_the_budget_and_can_be_turned_off(tmp_path):
    perf = tmp_path / "perf"
    for i, tile in enumerate((1, 2, 4, 8)):
        for j, depth in enumerate((1, 2)):
            _ship(perf, {"tile": tile, "depth": depth, "order": "b"}, f"{256 << i}x{256 << j}x128")
    # entries of another version of the kernel still seed the search (old winners are the
    # best first guesses after a change), after the current kernel's at the same distance
    _ship(perf, {"tile": 2, "depth": 2, "order": "a"}, "256x128x256", kernel_hash="sha256:old")
    warm = warm_start_configs(syn.SPEC, POINT, "trn2", 20, perf)
    assert len(warm) == 9 and warm[0] == ({"tile": 1, "depth": 1, "order": "b"}, "256x256x128")
    assert warm[1] == ({"tile": 2, "depth": 2, "order": "a"}, "256x128x256")
    (r,) = _tune(tmp_path, syn.SyntheticBackend(), trials=12, sampler="random")
    assert sum("warm_start" in t.user_attrs for t in _trials(tmp_path, r)) == 12 // 4
    storage = f"sqlite:///{tmp_path / 'cold.db'}"
    (cold,) = tune(
        syn.SPEC,
        [POINT],
        trials=12,
        storage_url=storage,
        backend=syn.SyntheticBackend(),
        gate=syn.no_gate,
        results_root=perf,
        sampler="random",
        warm_start=False,
    )
    trials = optuna.load_study(study_name=cold.study_name, storage=storage).get_trials()
    assert len(trials) >= 12 and not any("warm_start" in t.user_attrs for t in trials)
