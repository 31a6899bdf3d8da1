"""The rollback switch ``NEURON_KERNELS_DISABLE=1``: every registered op runs its reference
math on every device, the ``neuron`` device included, checked by counting kernel launches.

Each check has its control: with the switch off the same call launches the kernel, so a
count of zero means the switch routed the call, not that nothing could have been counted.
"""

from __future__ import annotations

import pytest
import torch

import neuron_kernels.torch_ops  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.kernels.spec import FunctionRunner
from neuron_kernels.torch_ops import cpu_mode, neuron_device, routing

OPS = sorted(REGISTRY)
# The dispatch key TorchNeuron's `neuron` device uses; redispatching to it runs the op's
# neuron-device impl on CPU tensors, which is all this machine can do without the SDK.
NEURON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


@pytest.fixture
def launches(monkeypatch):
    """Kernels launched through the interpreter runner (CPU) and the device runner (neuron)."""
    calls = {"interpreter": [], "device": []}
    real = routing.interpreter_runner

    def counting_interpreter(kernel, *args, **kwargs):
        calls["interpreter"].append(kernel)
        return real(kernel, *args, **kwargs)

    def counting_device_runner():
        def run(kernel, *args, **kwargs):
            calls["device"].append(kernel)
            return real(kernel, *args, **kwargs)  # no device here: the kernel runs interpreted

        return FunctionRunner(run, neuron_device.device_target())

    monkeypatch.setattr(routing, "interpreter_runner", counting_interpreter)
    monkeypatch.setattr(neuron_device, "device_runner", counting_device_runner)
    return calls


def _probe_args(name):
    spec = REGISTRY[name]
    return spec.make_inputs(
        spec.test_problems["probe"], "float32", torch.Generator().manual_seed(0)
    )


def _clone(value):
    """A deep copy of op arguments (tensors, and lists of them for the multi-tensor ops)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _call(name, args, neuron=False):
    """Run the op on a copy of ``args``; returns (outputs, the copy: in-place ops change it)."""
    op = getattr(torch.ops.neuron, name).default
    args = _clone(tuple(args))
    out = op.redispatch(NEURON_KEY, *args) if neuron else op(*args)
    return out, args


@pytest.mark.parametrize("name", OPS)
def test_switch_routes_cpu_interpret_to_reference(name, launches, monkeypatch):
    args = _probe_args(name)
    with cpu_mode("interpret"):
        monkeypatch.setenv(routing.DISABLE_ENV, "0")
        _call(name, args)
        assert launches["interpreter"], "control: with the switch off the kernel runs"
        launches["interpreter"].clear()
        monkeypatch.setenv(routing.DISABLE_ENV, "1")
        out, changed = _call(name, args)
    assert launches["interpreter"] == []
    want_args = _clone(tuple(args))
    want = REGISTRY[name].reference(*want_args, upcast=False)
    # It IS the reference: bit-exact outputs, and the same in-place updates for in-place ops.
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(_tensors(changed), _tensors(want_args), rtol=0, atol=0)


def _tensors(value) -> list:
    """The tensors among op arguments, in order (lists of tensors flattened)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


# A composite op (spec.composite) has no neuron impl of its own: torch runs it as its
# parts, which are in this list.
DEVICE_OPS = [n for n in OPS if REGISTRY[n].composite is None]


@pytest.mark.parametrize("name", DEVICE_OPS)
def test_switch_holds_on_the_neuron_device(name, launches, monkeypatch):
    args = _probe_args(name)
    monkeypatch.setenv(routing.DISABLE_ENV, "0")
    _call(name, args, neuron=True)
    assert launches["device"], "control: the neuron impl launches its kernel when the switch is off"
    launches["device"].clear()
    monkeypatch.setenv(routing.DISABLE_ENV, "true")
    _call(name, args, neuron=True)
    assert launches == {"interpreter": [], "device": []}


@pytest.mark.parametrize("name", [n for n in OPS if REGISTRY[n].autograd is not None])
def test_switch_covers_the_backward_pass(name, launches, monkeypatch):
    args = [
        a.clone().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a
        for a in _probe_args(name)
    ]
    monkeypatch.setenv(routing.DISABLE_ENV, "1")
    with cpu_mode("interpret"):
        out = getattr(torch.ops.neuron, name)(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        sum(o.float().sum() for o in outs if o.requires_grad).backward()
    assert launches["interpreter"] == []
    assert any(a.grad is not None for a in args if isinstance(a, torch.Tensor))


def test_bad_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(routing.DISABLE_ENV, "maybe")
    with pytest.raises(LimitError) as err:
        torch.ops.neuron.matmul(torch.zeros(2, 2), torch.zeros(2, 2))
    assert err.value.arg == routing.DISABLE_ENV and err.value.value == "maybe"


@pytest.mark.parametrize("value, on", [("1", True), ("TRUE", True), (" on ", True), ("0", False)])
def test_switch_values(value, on, monkeypatch):
    monkeypatch.setenv(routing.DISABLE_ENV, value)
    assert routing.kernels_disabled() is on
    monkeypatch.delenv(routing.DISABLE_ENV)
    assert routing.kernels_disabled() is False
