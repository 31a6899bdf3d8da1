"""Ops in interpret mode refuse a problem whose estimated interpreter footprint exceeds the
memory available at call time, in one LimitError line before any work (issue 32 item 3:
an expanded ``[1, 1, 10**6, 16]`` attention grew to 24 GB and was OOM-killed). The
available figure is monkeypatched, so the refusal does not depend on this machine."""

from __future__ import annotations

import time
import tracemalloc

import pytest
import torch

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import footprint
from neuron_kernels.torch_ops import cpu_mode, routing

GIB = 2**30


def _no_interpreter(*args, **kwargs):
    raise AssertionError("the interpreter ran a kernel on a refused problem")


def test_a_million_token_attention_is_refused_in_one_line_before_any_work(monkeypatch):
    monkeypatch.setattr(footprint, "host_memory_bytes", lambda: 16 * GIB)
    monkeypatch.setattr(routing, "interpreter_runner", _no_interpreter)
    q = torch.zeros(1, 1, 1, 16).expand(1, 1, 10**6, 16)  # 64 bytes of storage
    with cpu_mode("interpret"), pytest.raises(LimitError):  # the first call's one-time
        torch.ops.neuron.flash_attention(q, q, q)  # imports (torch's meta refs) not counted
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with cpu_mode("interpret"), pytest.raises(LimitError) as info:
            torch.ops.neuron.flash_attention(q, q, q)
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("flash_attention_fwd: problem needs about ")
    assert "GiB of host memory in interpret mode" in message
    assert "16.0 GiB available" in message
    assert "1x1x1x1000000x1000000x16" in message
    # no interpreter arrays and no trace: far below q's 64 MB if it were materialised
    assert peak < 4 * 2**20, peak
    assert seconds < 30, seconds  # a refusal, not a run (generous: a shared 2-core machine)


def test_the_check_holds_only_in_interpret_mode(monkeypatch):
    monkeypatch.setattr(footprint, "host_memory_bytes", lambda: 16 * GIB)
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    with cpu_mode("reference"):
        torch.ops.neuron.matmul(a, b)  # no footprint check outside interpret mode
    monkeypatch.setattr(footprint, "host_memory_bytes", lambda: 1)
    with cpu_mode("interpret"), pytest.raises(LimitError, match="^matmul: problem needs"):
        torch.ops.neuron.matmul(a, b)
    with cpu_mode("reference"):
        torch.testing.assert_close(torch.ops.neuron.matmul(a, b), a @ b)


def test_a_small_call_still_runs_in_interpret_mode():
    a, b = torch.randn(130, 260), torch.randn(260, 520)
    with cpu_mode("interpret"):
        out = torch.ops.neuron.matmul(a, b)
    # fp32 tolerance of the op's own spec (kernels/matmul.py), chosen there before results
    torch.testing.assert_close(out, a @ b, atol=1e-3, rtol=1e-3)
