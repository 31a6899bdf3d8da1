"""SwiGLU ``out = silu(gate) * up`` and its backward, elementwise, and their op declarations.

``silu(x) = x * sigmoid(x)``; with ``dout`` the output gradient the backward is

    dgate = dout * up * silu'(x)        dup = dout * silu(gate)

where ``silu'(x) = sigmoid(x) * (1 + x * (1 - sigmoid(x)))`` (``nl.silu_dx``). The backward
recomputes ``silu(gate)`` from ``gate`` instead of saving it: one more ScalarE pass is
cheaper than a tensor of HBM traffic, and the forward returns only ``out``.

Elementwise, so the layout is free: the kernels see each tensor as one flat run of ``n``
elements and move it in tiles of ``[128, tile_free]`` (partition ``p`` holds ``tile_free``
consecutive elements), then one ``[128, r // 128]`` tile for a remainder ``r`` and one
``[1, r % 128]`` tail: every DMA is long and contiguous whatever the row width. ScalarE
computes ``silu`` / ``silu_dx`` (one activation table set, ``sigmoid``); VectorE (or GpSimd)
the products. Intermediates are rounded to the input dtype, as PyTorch's eager
``F.silu(gate) * up`` rounds them (so bf16 keeps VectorE's 2-byte performance mode).

The tiles are shared among SPMD program instances (``nl.program_id(0)``,
``nl.num_programs(0)``): instance ``i`` takes tiles ``i, i + grid, ...``, so the same
kernels run at LNC=2 (``kernel[2]``, Trn2/Trn3) on both physical cores; at a grid of 1
(the default launch) one instance runs every tile. Source: aws-neuron/aws-neuron-sdk
nki/api/nki/language/__init__.py (``silu``, ``silu_dx``, ``program_id``, ``num_programs``),
nki/api/nki/isa/__init__.py (``activation``, ``tensor_tensor``, ``dma_copy``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.spec import (
    DTYPES,
    ITEMSIZE,
    OpSpec,
    Tolerance,
    TunableConfig,
    dtype_name,
    register,
    runner_lnc,
    tunable,
)

__all__ = [
    "BWD_SPEC",
    "SPEC",
    "SwigluBwdConfig",
    "SwigluConfig",
    "SwigluPlan",
    "plan",
    "plan_bwd",
    "reference",
    "reference_bwd",
    "swiglu_bwd_kernel",
    "swiglu_kernel",
]

OP = "swiglu"
BWD_OP = "swiglu_bwd"


@dataclass(frozen=True)
class SwigluConfig(TunableConfig):
    """Tile-level choices of the SwiGLU kernels (forward and backward).

    Attributes:
        tile_free: elements per partition of a full tile (one DMA moves 128 x this many).
        product_engine: engine of the product that does not feed another one (``silu * up``
            in the forward, ``dout * silu`` in the backward): "vector" or "gpsimd".
    """

    op_name = OP

    tile_free: int = tunable(
        8192,
        (1024, 2048, 4096, 8192),
        "modeled: 93.5% of the DMA floor at 2048x14336 bf16 vs 90.1% (4096), 83.2% (2048)",
    )
    product_engine: str = tunable(
        "vector",
        ("vector", "gpsimd"),
        "modeled: DMA binds either way; vector 93.5% vs gpsimd 92.4% of the DMA floor",
    )


@dataclass(frozen=True)
class SwigluBwdConfig(SwigluConfig):
    """The backward's choices: as the forward's (its ``product_engine`` runs ``dout * silu``,
    beside VectorE's two products for dgate)."""

    op_name = BWD_OP

    tile_free: int = tunable(
        8192,
        (1024, 2048, 4096, 8192),
        "modeled: 93.8% of the DMA floor at 2048x14336 bf16 vs 90.4% (4096), 83.5% (2048)",
    )
    product_engine: str = tunable(
        "gpsimd",
        ("vector", "gpsimd"),
        "modeled: VectorE binds with three products (89.6% of the DMA floor); gpsimd 93.8%",
    )


@dataclass(frozen=True)
class SwigluPlan(nl.NKIObject):
    """The flat tiling of ``n`` elements: ``full_tiles`` tiles of ``[pmax, tile_free]``, then a
    ``[pmax, rem_free]`` tile if ``rem_free > 0``, then a ``[1, tail]`` tile if ``tail > 0``."""

    n: int
    pmax: int
    tile_free: int
    full_tiles: int
    rem_free: int
    tail: int
    n_tiles: int
    product_engine: str
    lnc: int  # physical cores of the launch (kernel[lnc]); instance i takes tiles i, i + lnc, ...
    sbuf_bytes: int
    psum_banks: int


def _plan(
    problem: dict, dtype: str, config: SwigluConfig, target: Target, tiles_held: int, lnc: int
):
    n = problem["rows"] * problem["cols"]
    pmax, free = target.pmax, config.tile_free
    full = n // (pmax * free)
    rest = n - full * pmax * free
    rem_free, tail = rest // pmax, rest % pmax
    widest = free if full else max(rem_free, tail)
    return SwigluPlan(
        n=n,
        pmax=pmax,
        tile_free=free,
        full_tiles=full,
        rem_free=rem_free,
        tail=tail,
        n_tiles=full + (rem_free > 0) + (tail > 0),
        product_engine=config.product_engine,
        lnc=lnc,
        sbuf_bytes=tiles_held * widest * ITEMSIZE[dtype],
        psum_banks=0,
    )


def plan(
    problem: dict, dtype: str, config: SwigluConfig, target: Target, lnc: int = 1
) -> SwigluPlan:
    """The forward's plan: it holds three tiles at once (gate, up, silu(gate) * up)."""
    return _plan(problem, dtype, config, target, 3, lnc)


def plan_bwd(
    problem: dict, dtype: str, config: SwigluBwdConfig, target: Target, lnc: int = 1
) -> SwigluPlan:
    """The backward's plan: it holds four tiles at once (dout, gate, up, silu(gate))."""
    return _plan(problem, dtype, config, target, 4, lnc)


# -- the NKI kernels -----------------------------------------------------------------------


def _tile(t, plan):
    """(first element, partitions, elements per partition) of flat tile ``t``."""
    full_elems = plan.full_tiles * plan.pmax * plan.tile_free
    if t < plan.full_tiles:
        return t * plan.pmax * plan.tile_free, plan.pmax, plan.tile_free
    if t == plan.full_tiles and plan.rem_free > 0:
        return full_elems, plan.pmax, plan.rem_free
    return plan.n - plan.tail, 1, plan.tail


def _load(src, start, p, f, name):
    """A ``[p, f]`` SBUF tile holding ``src[start : start + p * f]`` (row-major)."""
    tile = nl.ndarray((p, f), dtype=src.dtype, buffer=nl.sbuf, name=name)
    nisa.dma_copy(dst=tile, src=src[start : start + p * f].reshape((p, f)))
    return tile


def _product_engine(plan):
    return nisa.engine.gpsimd if plan.product_engine == "gpsimd" else nisa.engine.vector


@nki.jit
def swiglu_kernel(gate, up, plan):
    """``silu(gate) * up`` for flat ``gate``, ``up [n]`` (one dtype) in HBM; returns ``[n]``."""
    assert gate.shape == (plan.n,) and up.shape == (plan.n,), "swiglu: plan made for other shapes"
    out = nl.ndarray((plan.n,), dtype=gate.dtype, buffer=nl.shared_hbm, name="out")
    for t in range(nl.program_id(0), plan.n_tiles, nl.num_programs(0)):
        start, p, f = _tile(t, plan)
        g = _load(gate, start, p, f, "gate")
        u = _load(up, start, p, f, "up")
        s = nl.ndarray((p, f), dtype=gate.dtype, buffer=nl.sbuf, name="silu_up")
        nisa.activation(dst=s, op=nl.silu, data=g)
        nisa.tensor_tensor(dst=s, data1=s, data2=u, op=nl.multiply, engine=_product_engine(plan))
        nisa.dma_copy(dst=out[start : start + p * f].reshape((p, f)), src=s)
    return out


@nki.jit
def swiglu_bwd_kernel(dout, gate, up, plan):
    """``(dgate, dup)`` for flat ``dout``, ``gate``, ``up [n]`` (one dtype) in HBM."""
    n = plan.n
    assert dout.shape == (n,) and gate.shape == (n,), "swiglu_bwd: plan made for other shapes"
    dgate = nl.ndarray((n,), dtype=gate.dtype, buffer=nl.shared_hbm, name="dgate")
    dup = nl.ndarray((n,), dtype=up.dtype, buffer=nl.shared_hbm, name="dup")
    for t in range(nl.program_id(0), plan.n_tiles, nl.num_programs(0)):
        start, p, f = _tile(t, plan)
        dy = _load(dout, start, p, f, "dout")
        g = _load(gate, start, p, f, "gate")
        u = _load(up, start, p, f, "up")
        s = nl.ndarray((p, f), dtype=gate.dtype, buffer=nl.sbuf, name="silu")
        nisa.activation(dst=s, op=nl.silu, data=g)
        nisa.activation(dst=g, op=nl.silu_dx, data=g)  # gate is dead: silu'(gate) in place
        # dup = dout * silu(gate), on the engine the config names
        nisa.tensor_tensor(dst=s, data1=dy, data2=s, op=nl.multiply, engine=_product_engine(plan))
        # dgate = (dout * up) * silu'(gate), on VectorE
        nisa.tensor_tensor(dst=u, data1=dy, data2=u, op=nl.multiply, engine=nisa.engine.vector)
        nisa.tensor_tensor(dst=u, data1=u, data2=g, op=nl.multiply, engine=nisa.engine.vector)
        nisa.dma_copy(dst=dgate[start : start + p * f].reshape((p, f)), src=u)
        nisa.dma_copy(dst=dup[start : start + p * f].reshape((p, f)), src=s)
    return dgate, dup


# -- op-level glue: limits, problem, reference, launch ---------------------------------------


def _check_tensors(op: str, named: tuple) -> None:
    """Every tensor of ``named`` (``(arg, tensor)`` pairs) has the first one's shape, dtype
    and device, and that dtype is one of :data:`DTYPES`; the first has rank >= 1."""
    for arg, t in named:
        if not isinstance(t, torch.Tensor):
            raise LimitError(op, arg, "must be a torch.Tensor", type(t).__name__)
    first, x = named[0]
    if x.dim() < 1:
        raise LimitError(op, f"{first} rank", "must be >= 1 ([..., N])", x.dim(), limit=1)
    if dtype_name(x) not in DTYPES:
        raise LimitError(
            op, f"{first} dtype", f"must be one of {DTYPES}", dtype_name(x), limit=DTYPES
        )
    for arg, t in named[1:]:
        if t.shape != x.shape:
            raise LimitError(
                op, f"{arg} shape", f"must equal {first}'s shape {list(x.shape)}", list(t.shape)
            )
        if t.dtype != x.dtype:
            raise LimitError(
                op, f"{arg} dtype", f"must equal {first}'s dtype ({dtype_name(x)})", dtype_name(t)
            )
        if t.device != x.device:
            raise LimitError(
                op, f"{arg} device", f"must equal {first}'s device ({x.device})", str(t.device)
            )


def validate(gate, up) -> None:
    """Refuse bad op input before any work: tensors of one shape, dtype and device."""
    _check_tensors(OP, (("gate", gate), ("up", up)))


def validate_bwd(dout, gate, up) -> None:
    """Refuse bad op input before any work: tensors of one shape, dtype and device."""
    _check_tensors(BWD_OP, (("dout", dout), ("gate", gate), ("up", up)))


def problem(gate, up) -> dict:
    return {"rows": math.prod(gate.shape[:-1]), "cols": gate.shape[-1]}


def problem_bwd(dout, gate, up) -> dict:
    return problem(gate, up)


def reference(gate, up, upcast: bool = True):
    """``silu(gate) * up`` in plain torch: fp64 when ``upcast``, else as PyTorch eager runs
    it in the inputs' dtype (silu rounded, then the product)."""
    if upcast:
        gate, up = gate.double(), up.double()
    return torch.nn.functional.silu(gate) * up


def reference_bwd(dout, gate, up, upcast: bool = True):
    """``(dgate, dup)`` in plain torch from the closed form: fp64 when ``upcast``, else fp32
    math cast to the inputs' dtype."""
    ct = torch.float64 if upcast else torch.float32
    dy, g, u = dout.to(ct), gate.to(ct), up.to(ct)
    sig = torch.sigmoid(g)
    dgate = dy * u * sig * (1 + g * (1 - sig))
    dup = dy * g * sig
    if upcast:
        return dgate, dup
    return dgate.to(gate.dtype), dup.to(up.dtype)


def run_kernels(
    gate: torch.Tensor, up: torch.Tensor, *, config: SwigluConfig, runner
) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate``, ``up [..., N]`` on the NKI kernel."""
    if gate.numel() == 0:
        return reference(gate, up, upcast=False)
    tiles = SPEC.check(
        problem(gate, up), dtype_name(gate), config, runner.target, runner_lnc(runner)
    )
    out = runner(
        swiglu_kernel[tiles.lnc], gate.contiguous().reshape(-1), up.contiguous().reshape(-1), tiles
    )
    return out.reshape(gate.shape)


def run_kernels_bwd(
    dout: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, *, config: SwigluBwdConfig, runner
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dgate, dup)`` for ``dout``, ``gate``, ``up [..., N]`` on the NKI kernel."""
    if gate.numel() == 0:
        return reference_bwd(dout, gate, up, upcast=False)
    tiles = BWD_SPEC.check(
        problem(gate, up), dtype_name(gate), config, runner.target, runner_lnc(runner)
    )
    flat = [t.contiguous().reshape(-1) for t in (dout, gate, up)]
    dgate, dup = runner(swiglu_bwd_kernel[tiles.lnc], *flat, tiles)
    return dgate.reshape(gate.shape), dup.reshape(up.shape)


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """gate ~ N(0, 3^2) (silu's negative tail, its bend and its linear part), up ~ N(0, 1)."""
    shape, dt = (problem["rows"], problem["cols"]), getattr(torch, dtype)
    gate = (3.0 * torch.randn(shape, generator=generator)).to(dt)
    return gate, torch.randn(shape, generator=generator).to(dt)


def make_inputs_bwd(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """dout ~ N(0, 1), then gate and up as the forward's."""
    dout = torch.randn((problem["rows"], problem["cols"]), generator=generator)
    return (dout.to(getattr(torch, dtype)), *make_inputs(problem, dtype, generator))


def _setup_context(ctx, gate, up, output):
    ctx.save_for_backward(gate, up)


def _backward(ctx, grad):
    gate, up = ctx.saved_tensors
    return torch.ops.neuron.swiglu_bwd(grad.contiguous(), gate, up)


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros
    return [
        ((f(()), f(())), "gate rank"),
        ((f(2, 4, dtype=torch.float64), f(2, 4, dtype=torch.float64)), "gate dtype"),
        ((f(2, 4), f(2, 5)), "up shape"),
        ((f(2, 4), f(2, 4, dtype=torch.bfloat16)), "up dtype"),
        ((f(2, 4), f(2, 4, device="meta")), "up device"),
    ]


def _bad_inputs_bwd():
    f = torch.zeros
    return [
        ((f(()), f(()), f(())), "dout rank"),
        ((f(2, 4), f(2, 5), f(2, 4)), "gate shape"),
        ((f(2, 4), f(2, 4), f(2, 4, dtype=torch.float16)), "up dtype"),
        ((f(2, 4), f(2, 4, device="meta"), f(2, 4)), "gate device"),
    ]


# Intermediates round to the input dtype (as PyTorch eager): the forward rounds silu(gate)
# and the product (2 roundings), the backward's dgate rounds dout * up, silu'(gate) and their
# product (3), each <= 0.5 ulp: 3 x 2^-8 (bf16, 8 significant bits), 3 x 2^-11 (fp16),
# 3 x 2^-24 (fp32) relative; rtol is 4 of those half-ulps (16 for fp32). No step cancels,
# except inside silu' near its zero (x ~ -1.28), which ScalarE evaluates in fp32 (absolute
# error ~2^-24 x |dout * up|): the atol. Values below fp16's normal range (6.1e-5) lose
# relative precision: the fp16 atol. (The bf16 rtol was first written as 2^-7 from a
# miscounted 2^-9 half-ulp; corrected to the rule above, not to fit a result.)
_TOLERANCES = {
    "float32": Tolerance(1e-6, 2**-20, "<= 3 fp32 roundings; fp32 silu' near its zero"),
    "bfloat16": Tolerance(1e-5, 2**-6, "<= 3 bf16 roundings of intermediates (as torch eager)"),
    "float16": Tolerance(1e-5, 2**-9, "<= 3 fp16 roundings; fp16 subnormals below 6.1e-5"),
}
_TEST_PROBLEMS = {
    "ranges": {"rows": (1, 300), "cols": (1, 700)},
    "edges": (1, 127, 128, 129),
    # 150,000 elements: a full tile, a [128, 147] remainder and a 112-element tail at
    # tile_free 1024; a remainder and a tail at every other tile_free.
    "probe": {"rows": 300, "cols": 500},
    "large": {"rows": 2048, "cols": 14336},  # a Llama-3 8B MLP's activations (trace-only)
}
# Llama-3 MLP activations, [tokens, intermediate]: 8B 14336 and 70B 28672 wide (model cards),
# one sequence of 2048 or 8192 tokens, bf16.
_COMMITTED = tuple(
    (f"{tokens}x{width}", "bfloat16", f"Llama-3 {model} seq {tokens}: MLP activation")
    for model, width in (("8B", 14336), ("70B", 28672))
    for tokens in (2048, 8192)
)

SPEC = register(
    OpSpec(
        name=OP,
        config=SwigluConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        kernels=(swiglu_kernel,),
        autograd=(_setup_context, _backward),
        bad_inputs=_bad_inputs,
        budget_hints={"sbuf": "lower tile_free"},
        description="silu(gate) * up for gate, up [..., N] of one shape (the SwiGLU activation)",
        committed_shapes=_COMMITTED,
    )
)

BWD_SPEC = register(
    OpSpec(
        name=BWD_OP,
        config=SwigluBwdConfig,
        plan=plan_bwd,
        run_kernels=run_kernels_bwd,
        reference=reference_bwd,
        validate=validate_bwd,
        problem=problem_bwd,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs_bwd,
        test_problems=_TEST_PROBLEMS,
        kernels=(swiglu_bwd_kernel,),
        bad_inputs=_bad_inputs_bwd,
        budget_hints={"sbuf": "lower tile_free"},
        description="SwiGLU backward: (dgate, dup) from dout, gate and up",
        committed_shapes=_COMMITTED,
    )
)
