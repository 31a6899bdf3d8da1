"""Matmul's own tests, beyond the contract suite: every code path of the kernel on every
target, budgets against the interpreter's measured peaks, and its limits."""

from __future__ import annotations

import pytest
import torch

import neuron_kernels.torch_ops  # noqa: F401
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import matmul
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import assert_within_tolerance, interpreter_runner_for, run_kernel

SPEC = matmul.SPEC
Config = matmul.MatmulConfig


def _inputs(m, n, k, dtype="float32", seed=0):
    return SPEC.make_inputs({"m": m, "n": n, "k": k}, dtype, torch.Generator().manual_seed(seed))


PATHS = [
    Config(stationary=s, accumulate=acc, transpose=t, block_m=bm, block_n=bn, block_k=bk)
    for s, acc, t, bm, bn, bk in [
        ("a", "sbuf", "pe", 2, 1, 1),
        ("a", "psum", "pe", 2, 2, 1),
        ("a", "sbuf", "strided", 1, 2, 2),
        ("a", "psum", "dma", 1, 1, 2),
        ("b", "sbuf", "pe", 1, 2, 1),
        ("b", "psum", "strided", 1, 1, 1),
        ("b", "sbuf", "dma", 2, 1, 1),
    ]
]


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("config", PATHS, ids=str)
def test_code_paths_on_every_target(config, dtype, target):
    """Remainders in every dim and several K blocks, so each path meets partial tiles."""
    problem = {"m": 300, "n": 600, "k": 300}
    if not SPEC.is_valid(problem, dtype, config, target):
        with pytest.raises(LimitError):
            SPEC.check(problem, dtype, config, target)
        assert config.transpose == "dma"  # the only path refused at this size
        return
    args = _inputs(**problem, dtype=dtype)
    out = run_kernel(SPEC, args, config, target=target)
    assert out.dtype == args[0].dtype
    assert_within_tolerance(
        out, SPEC.reference(*args), SPEC.tolerances[dtype], f"[{config} {target}]"
    )


@pytest.mark.parametrize(
    "m,n,k", [(1, 1, 1), (1, 513, 129), (127, 1, 128), (129, 512, 1), (513, 3, 257)]
)
def test_edge_shapes(m, n, k):
    args = _inputs(m, n, k, "bfloat16")
    out = run_kernel(SPEC, args, Config(block_m=1, block_n=1, block_k=1))
    assert_within_tolerance(
        out, SPEC.reference(*args), SPEC.tolerances["bfloat16"], f"[{m}x{n}x{k}]"
    )


def test_batched_and_noncontiguous_inputs_through_the_op():
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 3, 40, 70, generator=g)
    b = torch.randn(90, 70, generator=g).t()  # a non-contiguous [K, N] view
    with cpu_mode("interpret"):
        out = torch.ops.neuron.matmul(a, b)
    assert out.shape == (2, 3, 40, 90)
    assert_within_tolerance(out, matmul.reference(a, b), SPEC.tolerances["float32"], "[batched]")


def test_empty_dims_return_without_a_kernel():
    with cpu_mode("interpret"):
        assert torch.ops.neuron.matmul(torch.zeros(0, 5), torch.zeros(5, 3)).shape == (0, 3)
        out = torch.ops.neuron.matmul(torch.zeros(4, 0), torch.zeros(0, 3))
    assert out.shape == (4, 3) and not out.any()


@pytest.mark.parametrize(
    "config",
    [
        Config(block_m=8, block_n=1, block_k=8, accumulate="sbuf"),
        Config(block_m=2, block_n=2, block_k=4, accumulate="psum"),
        Config(block_m=4, block_n=2, block_k=4, accumulate="psum", transpose="dma"),
        Config(
            block_m=16, block_n=1, block_k=8, stationary="b", accumulate="psum", transpose="dma"
        ),
        Config(
            block_m=2, block_n=4, block_k=2, stationary="b", accumulate="sbuf", transpose="strided"
        ),
    ],
    ids=str,
)
def test_declared_budgets_bound_the_measured_peaks(config):
    """The plan's budgets (what spec.check enforces) never under-state what the kernel holds."""
    problem = {"m": 2048, "n": 2048, "k": 1024}
    tiles = SPEC.check(problem, "bfloat16", config, "trn2")
    runs = []
    args = _inputs(**problem, dtype="bfloat16")
    SPEC.run_kernels(
        *args, config=config, runner=interpreter_runner_for("trn2", compute=False, runs=runs)
    )
    peak = runs[0].memory[0]
    assert peak.sbuf_bytes <= tiles.sbuf_bytes
    assert peak.psum_banks <= tiles.psum_banks
    assert peak.sbuf_bytes > 0 and peak.psum_banks > 0


def test_check_refuses_each_limit():
    big = {"m": 4096, "n": 4096, "k": 4096}
    cases = {
        "dma transpose of fp32": (
            big,
            "float32",
            Config(transpose="dma"),
            "trn2",
            "config transpose",
        ),
        "dma transpose on trn1": (
            big,
            "bfloat16",
            Config(transpose="dma"),
            "trn1",
            "config transpose",
        ),
        "PSUM banks": (
            big,
            "bfloat16",
            Config(block_m=8, block_n=2, accumulate="psum"),
            "trn2",
            "PSUM banks",
        ),
        "SBUF": (
            big,
            "float32",
            Config(block_m=16, block_n=4, block_k=8, stationary="b"),
            "trn2",
            "SBUF bytes per partition",
        ),
        "dtype": (big, "float64", Config(), "trn2", "dtype"),
        "empty": ({"m": 0, "n": 4, "k": 4}, "float32", Config(), "trn2", "m"),
    }
    for what, (problem, dtype, config, target, arg) in cases.items():
        with pytest.raises(LimitError) as err:
            SPEC.check(problem, dtype, config, target)
        assert err.value.arg == arg and err.value.op == "matmul", (what, str(err.value))


def test_shape_helpers():
    assert SPEC.parse_shape("4096x1024x512") == {"m": 4096, "n": 1024, "k": 512}
    with pytest.raises(LimitError):
        SPEC.parse_shape("4096x1024")
    assert SPEC.shape_bucket({"m": 1000, "n": 1, "k": 4097}) == "m1024_n128_k8192"
    assert SPEC.problem(torch.zeros(2, 3, 5), torch.zeros(5, 7)) == {"m": 6, "n": 7, "k": 5}
