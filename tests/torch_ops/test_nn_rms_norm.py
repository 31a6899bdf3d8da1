"""``neuron_kernels.torch_ops.nn.RMSNorm`` as a drop-in for ``torch.nn.RMSNorm``: a small
model whose torch RMSNorm layers are swapped for ours gives the same outputs and gradients,
with the kernels (forward and backward) running on the interpreter."""

from __future__ import annotations

import copy

import pytest
import torch

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.kernels.spec import Tolerance
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.torch_ops.nn import RMSNorm
from neuron_kernels.verification import assert_within_tolerance

# fp32: ours vs torch's in fp32 differ only in summation order and rsqrt (a few ulp,
# amplified a little by the following Linear layers): 1e-5. bf16: torch's own bf16 autograd
# rounds at every step, so both are held to the fp64 model instead: our worst error may be
# at most twice torch's, plus 2^-8 (one bf16 ulp at 1) for where torch is exact by luck.
FP32 = Tolerance(1e-5, 1e-5, "fp32 vs fp32: summation order, rsqrt ulps")


class TinyBlock(torch.nn.Module):
    """Two pre-norm residual sub-blocks, Llama-style, over [batch, seq, 40]."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = torch.nn.Linear(24, 40)
        self.norm1 = torch.nn.RMSNorm(40, eps=1e-6)
        self.mlp = torch.nn.Linear(40, 40)
        self.norm2 = torch.nn.RMSNorm((40,))  # eps=None, whatever torch means by it
        self.head = torch.nn.Linear(40, 8)

    def forward(self, x):
        h = self.proj_in(x)
        h = h + torch.nn.functional.silu(self.mlp(self.norm1(h)))
        return self.head(self.norm2(h))


def swap_rms_norm(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with every torch.nn.RMSNorm replaced by ours (same state_dict)."""
    model = copy.deepcopy(model)
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.RMSNorm):
            ours = RMSNorm(child.normalized_shape, child.eps, child.elementwise_affine)
            ours.load_state_dict(child.state_dict())
            setattr(model, name, ours.to(child.weight.dtype))
        else:
            swap_rms_norm(child)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5), (2, 70)])  # 15 rows; 140 rows: a remainder tile
def test_swapped_model_same_outputs_and_grads(dtype, shape):
    torch.manual_seed(0)
    theirs = TinyBlock().to(dtype)
    with torch.no_grad():  # non-trivial weights, so a wrong weight path cannot hide
        theirs.norm1.weight.uniform_(0.5, 1.5)
        theirs.norm2.weight.uniform_(0.5, 1.5)
    ours = swap_rms_norm(theirs)
    assert isinstance(ours.norm1, RMSNorm) and isinstance(ours.norm2, RMSNorm)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    x = torch.randn(*shape, 24, dtype=dtype)
    with cpu_mode("interpret"):
        ours_out, ours_grads = _run(ours, x)
    torch_out, torch_grads = _run(theirs, x)
    if dtype == torch.float32:
        assert_within_tolerance(ours_out, torch_out, FP32, "[model output]")
        for name, g in torch_grads.items():
            assert_within_tolerance(ours_grads[name], g, FP32, f"[{name} grad]")
        return
    exact_out, exact_grads = _run(copy.deepcopy(theirs).double(), x.double())
    pairs = [("output", ours_out, torch_out, exact_out)]
    pairs += [(n, ours_grads[n], torch_grads[n], exact_grads[n]) for n in torch_grads]
    for name, got, torch_got, exact in pairs:
        ours_err = (got.double() - exact).abs().max().item()
        torch_err = (torch_got.double() - exact).abs().max().item()
        assert ours_err <= 2 * torch_err + 2**-8 * exact.abs().max().item(), (
            name,
            ours_err,
            torch_err,
        )


def _run(model, x):
    """Output and every gradient (input's under "x") of ``model`` for loss sum(out^2)."""
    x = x.clone().requires_grad_()
    out = model(x)
    out.double().pow(2).sum().backward()
    grads = {name: p.grad for name, p in model.named_parameters()}
    grads["x"] = x.grad
    return out.detach(), grads


def test_constructor_and_state_dict_match_torch():
    ours, theirs = RMSNorm((4, 6), eps=1e-5), torch.nn.RMSNorm((4, 6), eps=1e-5)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert ours.weight.shape == theirs.weight.shape == (4, 6)
    ours.load_state_dict(theirs.state_dict())
    no_affine = RMSNorm(6, elementwise_affine=False)
    assert no_affine.weight is None and list(no_affine.state_dict()) == []
    x = torch.randn(3, 4, 6)  # normalized over the last two dims, as torch does
    torch.testing.assert_close(ours(x), theirs(x))
    torch.testing.assert_close(no_affine(x[0]), torch.nn.RMSNorm(6, elementwise_affine=False)(x[0]))


def test_eps_none_means_what_torch_means_and_float64_runs_torch():
    # Rows ~1e-2: bf16's own eps (2^-7) would change them by 2x; torch uses fp32's.
    x = torch.randn(5, 16, dtype=torch.bfloat16) * 1e-2
    torch.testing.assert_close(RMSNorm(16)(x), torch.nn.RMSNorm(16)(x), rtol=2**-7, atol=0)
    x64 = torch.randn(5, 16, dtype=torch.float64)
    torch.testing.assert_close(RMSNorm(16).double()(x64), torch.nn.RMSNorm(16).double()(x64))


def test_gemma_offset_starts_at_the_identity_scale():
    norm = RMSNorm(8, casting_mode="gemma", offset=1.0)
    assert torch.all(norm.weight == 0)  # Gemma stores w - 1
    x = torch.randn(4, 8)
    torch.testing.assert_close(norm(x), torch.nn.RMSNorm(8)(x))
