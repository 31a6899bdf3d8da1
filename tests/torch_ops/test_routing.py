"""Device routing: reference math by default, the interpreted kernel on request, the
neuron-device kernel registered, and bad routing values refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import neuron_kernels.torch_ops  # noqa: F401
from neuron_kernels.errors import LimitError
from neuron_kernels.torch_ops import CPU_MODE_ENV, cpu_mode, current_cpu_mode


def test_cpu_defaults_to_reference(kernel_launches, monkeypatch):
    monkeypatch.delenv(CPU_MODE_ENV, raising=False)
    torch.ops.neuron.matmul(torch.randn(4, 5), torch.randn(5, 6))
    assert current_cpu_mode() == "reference" and kernel_launches == []


def test_env_var_is_read_at_each_call(kernel_launches, monkeypatch):
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    monkeypatch.setenv(CPU_MODE_ENV, "interpret")
    torch.ops.neuron.matmul(a, b)
    assert len(kernel_launches) == 1
    monkeypatch.setenv(CPU_MODE_ENV, "reference")
    torch.ops.neuron.matmul(a, b)
    assert len(kernel_launches) == 1


def test_context_manager_wins_and_restores(kernel_launches, monkeypatch):
    monkeypatch.setenv(CPU_MODE_ENV, "reference")
    with cpu_mode("interpret"):
        assert current_cpu_mode() == "interpret"
        torch.ops.neuron.matmul(torch.randn(4, 5), torch.randn(5, 6))
        with cpu_mode("reference"):
            torch.ops.neuron.matmul(torch.randn(4, 5), torch.randn(5, 6))
    assert current_cpu_mode() == "reference" and len(kernel_launches) == 1


def test_bad_mode_values_are_refused(monkeypatch):
    with pytest.raises(LimitError) as err:
        with cpu_mode("fast"):
            pass
    assert err.value.arg == "cpu_mode"
    monkeypatch.setenv(CPU_MODE_ENV, "gpu")
    with pytest.raises(LimitError) as err:
        torch.ops.neuron.matmul(torch.randn(2, 2), torch.randn(2, 2))
    assert err.value.arg == CPU_MODE_ENV and err.value.value == "gpu"


def test_other_devices_use_reference_shapes():
    """The meta device stands for "any other device": reference routing, right shapes."""
    out = torch.ops.neuron.matmul(
        torch.empty(3, 4, 5, device="meta"), torch.empty(5, 2, device="meta")
    )
    assert out.shape == (3, 4, 2) and out.device.type == "meta"


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        out = torch.ops.neuron.matmul(
            torch.empty(7, 3, 5, dtype=torch.bfloat16), torch.empty(5, 2, dtype=torch.bfloat16)
        )
    assert out.shape == (7, 3, 2) and out.dtype == torch.bfloat16


def test_neuron_kernel_is_registered_on_privateuse1():
    """Without TorchNeuron the key is named privateuseone; TorchNeuron renames it `neuron`.
    Rename in a fresh process and check the op still carries its neuron-device kernel."""
    assert torch._C._dispatch_has_kernel_for_dispatch_key("neuron::matmul", "PrivateUse1")
    code = (
        "import torch; torch.utils.rename_privateuse1_backend('neuron');"
        "import neuron_kernels.torch_ops as t;"
        "from neuron_kernels.torch_ops import neuron_device as d;"
        "assert d.device_key() == 'neuron', d.device_key();"
        "assert torch._C._dispatch_has_kernel_for_dispatch_key('neuron::matmul', 'PrivateUse1');"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_op_runners_launch_at_the_nodes_lnc(monkeypatch):
    """One place decides a launch's LNC (hardware.launch_lnc): NEURON_LOGICAL_NC_CONFIG when
    set, else (no torch-neuronx here) the target's default: trn2 2, trn1 1."""
    from neuron_kernels.hardware import LNC_ENV, TARGET_ENV
    from neuron_kernels.torch_ops import neuron_device, routing

    monkeypatch.delenv(LNC_ENV, raising=False)
    monkeypatch.setenv(TARGET_ENV, "trn2")
    assert routing.cpu_runner().lnc == 2 and neuron_device.device_runner().lnc == 2
    monkeypatch.setenv(LNC_ENV, "1")
    assert routing.cpu_runner().lnc == 1 and neuron_device.device_runner().lnc == 1
    monkeypatch.delenv(LNC_ENV)
    monkeypatch.setenv(TARGET_ENV, "trn1")
    assert routing.cpu_runner().lnc == 1
