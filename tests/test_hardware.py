"""LNC facts and the one place that decides a launch's LNC (neuron_kernels/hardware.py).

Sources: aws-neuron-sdk about-neuron/arch/neuron-features/logical-neuroncore-config.rst ("LNC
can only be set to 1 or 2 ... LNC applies only to Trn2 and Trn3"; LNC=2 is the Trn2
default), nki/api/nki/__init__.py ``jit`` (the launch's LNC must match
``NEURON_LOGICAL_NC_CONFIG``), torch-neuronx (public copy parmoham-aws/test-repo-parmoham)
``torch_neuronx/csrc/core/utils/PlatformUtils.cpp`` (trn1/inf2 -> "1", trn2/trn3 -> "2") and
``torch_neuronx/utils.py`` ``get_logical_neuron_cores()`` (a string: the variable, else the
instance's default).

torch-neuronx is not installed here: a test double of ``torch_neuronx.utils`` with that one
function stands in. What only a TorchNeuron node can show: the instance detection itself.
"""

from __future__ import annotations

import sys
import types

import pytest

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import LNC_ENV, TARGETS, launch_lnc


@pytest.fixture(autouse=True)
def no_lnc_env(monkeypatch):
    monkeypatch.delenv(LNC_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "torch_neuronx", raising=False)
    monkeypatch.delitem(sys.modules, "torch_neuronx.utils", raising=False)


@pytest.fixture
def torch_neuronx(monkeypatch):
    """A stand-in ``torch_neuronx.utils`` whose ``get_logical_neuron_cores`` returns ``value``."""
    state = {"value": "2"}
    package = types.ModuleType("torch_neuronx")
    utils = types.ModuleType("torch_neuronx.utils")
    utils.get_logical_neuron_cores = lambda: state["value"]
    package.utils = utils
    monkeypatch.setitem(sys.modules, "torch_neuronx", package)
    monkeypatch.setitem(sys.modules, "torch_neuronx.utils", utils)
    return state


def test_lnc_choices_and_defaults_per_target():
    got = {name: (t.lnc_choices, t.default_lnc) for name, t in TARGETS.items()}
    assert got == {"trn1": ((1,), 1), "trn2": ((1, 2), 2), "trn3": ((1, 2), 2)}


@pytest.mark.parametrize(("target", "want"), [("trn1", 1), ("trn2", 2), ("trn3", 2)])
def test_target_default_without_variable_or_torch_neuronx(target, want):
    assert launch_lnc(target) == want


def test_variable_wins(monkeypatch, torch_neuronx):
    monkeypatch.setenv(LNC_ENV, "1")
    torch_neuronx["value"] = "2"
    assert launch_lnc("trn2") == 1


def test_torch_neuronx_when_the_variable_is_unset(torch_neuronx):
    torch_neuronx["value"] = "1"
    assert launch_lnc("trn2") == 1


@pytest.mark.parametrize(("target", "value"), [("trn1", "2"), ("trn2", "4"), ("trn2", "two")])
def test_unsupported_variable_is_a_limit_error_naming_it(monkeypatch, target, value):
    monkeypatch.setenv(LNC_ENV, value)
    with pytest.raises(LimitError) as info:
        launch_lnc(target)
    assert (info.value.arg, info.value.value) == (LNC_ENV, value)
    assert target in info.value.rule


def test_unsupported_torch_neuronx_value_names_it(torch_neuronx):
    torch_neuronx["value"] = "2"
    with pytest.raises(LimitError) as info:
        launch_lnc("trn1")
    assert info.value.arg == "torch_neuronx.utils.get_logical_neuron_cores()"
