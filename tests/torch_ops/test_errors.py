"""What a user sees when an op refuses its input (issue 32 item 11): the LimitError's one
line through ``torch.compile``, in the caller's terms (H for rms_norm, the param group and
index for FusedAdamW), the same in both CPU modes (sparse inputs), a LimitError from
``nn.RMSNorm``, and a refused optimizer step that leaves no state behind.

The compile behaviour is PyTorch 2.13's (it re-raises an IndexError from a fake-tensor run
unwrapped, ``torch/_dynamo/utils.py`` ``run_node``); on other versions the test says so."""

from __future__ import annotations

import pytest
import torch

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.errors import LimitError
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.torch_ops.nn import RMSNorm
from neuron_kernels.torch_ops.optim import FusedAdamW


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize(
    "call,args,first_line",
    [
        (
            lambda a, b: torch.ops.neuron.matmul(a, b),
            (torch.randn(3, 4), torch.randn(5, 6)),
            "matmul: b.shape[0] must equal a.shape[-1] (K = 4), got 5",
        ),
        (  # a composite op: validated while Dynamo decomposes it
            lambda x, w: torch.ops.neuron.rms_norm(x, w),
            (torch.randn(3, 4), torch.randn(5)),
            "rms_norm: weight shape must be [H] = [4], got [5]",
        ),
    ],
    ids=["matmul", "rms_norm"],
)
def test_a_limit_error_under_torch_compile_starts_with_its_one_line(
    call, args, first_line, fullgraph
):
    torch._dynamo.reset()
    compiled = torch.compile(call, fullgraph=fullgraph)
    with pytest.raises(LimitError) as info:
        compiled(*args)
    assert str(info.value).splitlines()[0] == first_line
    assert isinstance(info.value.__cause__, LimitError)
    assert str(info.value.__cause__) == first_line


def test_rms_norm_sbuf_refusal_names_h_and_its_limit():
    x = torch.randn(2, 200_000, dtype=torch.bfloat16)
    w = torch.ones(200_000, dtype=torch.bfloat16)
    with cpu_mode("interpret"), pytest.raises(LimitError) as info:
        torch.ops.neuron.rms_norm(x, w)
    message = str(info.value)
    # the README's "Largest H" for the default config
    assert "H (x.shape[-1]) must be <= 104942 for dtype bfloat16" in message, message
    assert "h_chunk" not in message and "rows_per_partition" not in message


@pytest.mark.parametrize("mode", ["reference", "interpret"])
def test_sparse_inputs_are_refused_alike_in_both_modes(mode):
    a = torch.randn(4, 8).to_sparse()
    with cpu_mode(mode), pytest.raises(LimitError, match="a must be a dense .strided. tensor"):
        torch.ops.neuron.matmul(a, torch.randn(8, 3))


def test_nn_rmsnorm_shape_error_is_a_limit_error():
    with pytest.raises(LimitError, match="normalized_shape \\[8\\], got \\[3, 7\\]") as info:
        RMSNorm(8)(torch.randn(3, 7))
    assert isinstance(info.value, ValueError)  # torch.nn.RMSNorm's callers catch ValueError


def test_fused_adamw_names_the_users_group_and_param_and_leaves_no_state():
    a = torch.nn.Parameter(torch.randn(4))
    b = torch.nn.Parameter(torch.randn(4, dtype=torch.bfloat16))
    c = torch.nn.Parameter(torch.randn(5, dtype=torch.bfloat16))
    opt = FusedAdamW([{"params": [a]}, {"params": [b, c]}], lr=1e-3)
    a.grad, b.grad = torch.randn(4), torch.randn(4, dtype=torch.bfloat16)
    c.grad = torch.randn(5, dtype=torch.bfloat16)
    c.grad.data = torch.randn(6, dtype=torch.bfloat16)  # a wrong-sized gradient
    with pytest.raises(LimitError) as info:
        opt.step()
    assert "param_groups[1]['params'][1]" in str(info.value), str(info.value)
    assert len(opt.state) == 0  # the refused step created no state entries
