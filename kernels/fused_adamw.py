"""A fused multi-tensor AdamW step and its op declaration.

The kernel takes one ``[rows, cols]`` HBM buffer per argument (params, grads, exp_avgs,
exp_avg_sqs, max_exp_avg_sqs), a per-row coefficient table and its plan, and returns the
new params and state; the op copies them into its tensors (``copy_``, the tensors it
declares in ``mutates_args``). No tensor lists and no writes in place: torch-neuronx's
``wrap_nki`` carries only top-level tensors as kernel operands (``torch_neuronx/nki_hop.py``)
and NKI 0.6 kernels return their outputs, with no operand aliasing
(``tests/nki/test_nki_v2.py``), so under ``torch.compile(backend="neuron")`` each launch is
one kernel-wrapper node whose outputs the graph copies back: a compiled step cannot
silently do nothing. The interpreter (``cpu_mode("interpret")``) runs the same kernel.

Each launch's buffers are one of two kinds (:func:`launches`). A tensor of at least one
full chunk has its whole ``tile_free``-wide rows updated by a launch of its own, on the
tensor itself (a zero-copy view). Everything else (small tensors, large tensors' last
``numel % tile_free`` elements) is packed, ``tensors_per_launch`` segments per launch,
each zero-padded to whole rows of a width chosen to pad at most 1/8 more, into one new
buffer per argument. Chunks are up to 128 whole rows (``[rows, cols]`` tiles, each DMA
row one contiguous run of HBM), so small tensors share full tiles instead of each paying
a tile and a tail; every row belongs to one tensor, and its coefficients come from the
row's entry in the table. Why this hybrid (all modeled, trn2, LNC=1, per physical core,
microseconds; copy costs at the DMA floor): the fixed-arity alternative (today's
per-tensor chunks, one top-level argument per tensor) would cost 317.5 + 1.1 (copy back)
for 64 tensors of 300 elements vs 18.9 + 1.5 (pack) + 1.1 here, 164.1 + 14.5 vs
40.9 + 19.3 + 14.5 for 64 of 4096, and for a Llama-3-8B layer 7119 + 5552 vs
7341 + 0.6 + 5552 (+1.8%: each large tensor's launch fills and drains its own
pipeline); packing everything would add 7402 of copies to that layer. It also needs no
kernel with hundreds of parameters.

Semantics are ``torch.optim.AdamW``'s (decoupled weight decay, bias corrections from the
step count, amsgrad, maximize, eps added outside the sqrt) with ``grad_scale`` and
``found_inf`` as in ``torch._fused_adamw_``:

    g = grad / grad_scale, negated when maximize
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g^2;   vmax = max(vmax, v) with amsgrad (then v := vmax)
    p = p * (1 - lr * weight_decay) - lr / bc1 * m / (sqrt(v / bc2) + eps)
    bc1 = 1 - beta1^step, bc2 = 1 - beta2^step

Everything that changes between steps (lr, step counts, bias corrections, 1/grad_scale,
found_inf) reaches the kernel as one fp32 HBM table of per-tensor coefficients computed
on the tensors' device, so a scheduler's new lr or the next step never means a new
kernel build; only beta1/beta2's roles, not their values, are compile-time. When
``found_inf`` is set the coefficients turn every update into the identity (beta -> 1,
gradient terms -> 0, decay factor -> 1) and the gradient's bits are masked to zero first,
so inf/NaN gradients cannot leak in: params and state keep their bits (one exception,
documented in ``reference``: a -0.0 can come back as +0.0). The step count itself is the
caller's: like ``torch._fused_adamw_``, the kernel reads ``state_steps`` already
incremented for this step and never writes them; ``FusedAdamW`` increments before the
call and subtracts ``found_inf`` after it, as ``torch.optim.AdamW(fused=True)`` does.

bf16 params are rounded to nearest even, or, given ``stochastic_rounding_seed``,
stochastically: 16 bits from a counter-based hash of (element index, a per-tensor key
mixing the seed and the step) are added below the bf16 mantissa of the fp32 result, which
is then truncated. The interpreter has no RNG instruction and needs none: the hash is
int32 multiplies (GpSimdE's exact wrapping arithmetic), xors and logical shifts, so
every backend, and the torch reference, draws the same bits for a seed. The other
opt-in for bf16 training, fp32 master weights, lives in ``FusedAdamW``: the kernel then
updates the fp32 copy from the bf16 gradient (lower-precision grads are accepted with
fp32 params).

ScalarE's ``sqrt`` is valid on [2^-116, 2^118] and its ``reciprocal`` on +-[2^-42, 2^42]
(nki.api.shared.rst, activation functions): the kernel takes ``sqrt(v / bc2 + 2^-84)``,
which is >= 2^-42 and differs from ``sqrt(v / bc2)`` by at most 2^-42 (< 3e-13, far
below any usable eps), so both inputs stay in range for every v >= 0 and eps >= 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from neuron_kernels.backend import nisa, nki, nl
from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target
from neuron_kernels.kernels.counter_hash import (
    HASH_M1,
    HASH_M2,
    KEY_SEED,
    KEY_STEP,
    KEY_TENSOR,
    rounding_bits,
)
from neuron_kernels.kernels.spec import (
    ITEMSIZE,
    OpSpec,
    Tolerance,
    TunableConfig,
    dtype_name,
    register,
    runner_lnc,
    shape_parser,
    tunable,
)
from neuron_kernels.kernels.tiling import core_share, tiled

__all__ = [
    "SPEC",
    "FusedAdamwConfig",
    "FusedAdamwPlan",
    "Launch",
    "Segment",
    "coefficients",
    "fused_adamw_kernel",
    "launches",
    "plan",
    "reference",
    "run_kernels",
]

OP = "fused_adamw_"
PARAM_DTYPES = ("float32", "bfloat16")
GRAD_DTYPES = ("float32", "bfloat16", "float16")  # lower than fp32 only with fp32 (master) params
ENGINE_CHOICES = ("vector", "vector_scalar", "spread")

# Columns of the per-row coefficient table (fp32; MASK, SEED, ROW_INDEX hold int32 bits).
(
    MASK,  # all ones, or 0 on a skipped step: ANDed into the gradient's bits
    C_G1,  # (1 - beta1) / grad_scale, negated for maximize: m's gradient term
    C_B1,  # beta1 (1 on a skipped step)
    C_G2,  # sqrt(1 - beta2) / grad_scale: squared on ScalarE
    C_G2SQ,  # (1 - beta2) / grad_scale^2: the VectorE form of the same term
    C_B2,  # beta2 (1 on a skipped step)
    INV_BC2,  # 1 / (1 - beta2^step)
    TINY,  # 2^-84: keeps sqrt >= 2^-42, in ScalarE's sqrt and reciprocal ranges
    EPS,  # eps
    NEG_STEP,  # -lr / (1 - beta1^step) (0 on a skipped step)
    WDF,  # 1 - lr * weight_decay (1 on a skipped step)
    ZERO,  # an explicit zero bias for ScalarE (nki-library passes one: runtime issue without)
    SEED,  # int32 bits: this tensor's stochastic-rounding key for this step
    ROW_INDEX,  # int32 bits: the index in its tensor of the row's first element
) = range(14)
N_COEFFICIENTS = 14
SQRT_FLOOR = 2.0**-84

# Stochastic rounding of bf16 params: 16 random bits per element from a counter-based hash
# of (element index, per-tensor per-step key) made of int32 multiplies (GpSimdE's exact
# wrapping integer arithmetic), xors and logical shifts, so the interpreter, the hardware
# and the torch reference (``rounding_bits``) draw the same bits; no RNG instruction. The
# constants and the torch mirror live in :mod:`.counter_hash` (flash attention's dropout
# draws with them too).


@dataclass(frozen=True)
class FusedAdamwConfig(TunableConfig):
    """Tile-level choices of the fused AdamW kernel.

    Attributes:
        tile_free: elements per partition of a full tile (a chunk is 128 x tile_free).
        in_flight: chunks whose instruction chains are interleaved in program order. The
            engines run their instructions in order, so one chunk at a time leaves each
            engine idle while the others finish their part of the chain; k chunks give
            each engine k independent instructions per step (and hold k + 1 chunks'
            tiles: k computing, one loading).
        tensors_per_launch: segments one packed launch updates (small tensors and large
            tensors' tails; more: fewer launches; fewer: a smaller unrolled kernel to
            compile). A large tensor's whole rows are always a launch of their own.
        engines: who runs the elementwise chain. "vector": VectorE alone (sqrt and
            reciprocal as ALU ops); "vector_scalar": ScalarE takes every one-input scaling
            and the sqrt, VectorE the two-tile ops; "spread": as vector_scalar, with GpSimdE
            taking the plain two-tile add and multiply and the amsgrad max.
    """

    op_name = OP

    tile_free: int = tunable(
        2048,
        (512, 1024, 2048, 4096),
        "modeled: trn2 LNC=1, Llama-3-8B layer mix, spread, 2 in flight: 88.2% of the DMA "
        "floor at 2048 vs 81.1% at 1024 (a DMA engine's fixed cost per 32 KiB); 4096 fits "
        "only 1 in flight (80.5%)",
    )
    in_flight: int = tunable(
        2,
        (1, 2, 3, 4),
        "modeled: trn2 LNC=1, 1 chunk at a time reaches 74.1% of the DMA floor, 2 reach "
        "88.2%, 3 gain 0.2 points for another chunk of SBUF",
    )
    tensors_per_launch: int = tunable(
        64,
        (8, 64, 256),
        "modeled: a layer's small tensors and large tensors' tails share one packed launch "
        "(64 tensors of 300 fp32 elements: 18.9 us, trn2 LNC=1)",
    )
    engines: str = tunable(
        "spread",
        ENGINE_CHOICES,
        "modeled: trn2 LNC=1, DMA-bound at 88.2% of the floor; vector_scalar binds on "
        "VectorE at 76.6%, vector at 47.9%",
    )


# -- the launches and the tile plan ------------------------------------------------------


@dataclass(frozen=True)
class Segment(nl.NKIObject):
    """Elements ``[start, start + length)`` of tensor ``tensor`` (its position among the
    op's non-empty tensors) in one launch's buffers, at row ``row0`` of them, as
    ``ceil(length / cols)`` whole rows (the last one padded)."""

    tensor: int
    start: int
    length: int
    row0: int


@dataclass(frozen=True)
class Launch(nl.NKIObject):
    """One kernel launch: its segments and the row width of its ``[rows, cols]`` buffers.
    ``packed``: the buffers are new tensors the op packs; else they are the one segment's
    tensor itself (a zero-copy view, ``start`` 0, ``length`` a multiple of ``cols``)."""

    segments: tuple
    cols: int
    rows: int
    packed: bool


def _padded(sizes, cols: int) -> int:
    return sum(-(-n // cols) * cols for n in sizes)


def row_width(sizes, tile_free: int) -> int:
    """The row width of a packed launch: ``tile_free``, halved while padding each segment
    to whole rows would add more than 1/8 of its elements (small tensors get narrow rows)."""
    cols, total = tile_free, sum(sizes)
    while cols > 1 and _padded(sizes, cols) * 8 > total * 9:
        cols //= 2
    return cols


def launches(sizes, config: FusedAdamwConfig, partitions: int) -> tuple:
    """The op's launches for tensors of ``sizes`` (all non-empty), in two kinds.

    A tensor of at least one full chunk (``partitions x tile_free``) has its whole rows of
    ``tile_free`` updated by a launch of its own, on the tensor itself: no copy in. What is
    left (its last ``numel % tile_free`` elements, or all of a smaller tensor) is a segment
    of a packed launch: up to ``tensors_per_launch`` segments packed into one buffer per
    argument, each padded to whole rows of :func:`row_width`, so the small tensors' elements
    fill full tiles together instead of one tile (and one tail) each.
    """
    tile, out, rest = config.tile_free, [], []
    for i, n in enumerate(sizes):
        whole = (n // tile) * tile if n >= partitions * tile else 0
        if whole:
            out.append(Launch((Segment(i, 0, whole, 0),), tile, whole // tile, False))
        if n > whole:
            rest.append((i, whole, n - whole))
    for first, count in tiled(len(rest), config.tensors_per_launch):
        group = rest[first : first + count]
        cols = row_width([length for _, _, length in group], tile)
        segments, row = [], 0
        for i, start, length in group:
            segments.append(Segment(i, start, length, row))
            row += -(-length // cols)
        out.append(Launch(tuple(segments), cols, row, True))
    return tuple(out)


@dataclass(frozen=True)
class FusedAdamwPlan(nl.NKIObject):
    """Tiles of one launch over its ``[rows, cols]`` buffers: its chunks ``(row0, rows)``
    (rows ``[row0, row0 + rows)``, at most ``partitions``) in waves of ``in_flight``, per
    core, and the budgets. Derived once by :func:`plan`; the kernel reads only this."""

    partitions: int
    tile_free: int
    rows: int
    cols: int
    lnc: int  # physical cores of the launch (kernel[lnc])
    core_waves: tuple  # per core, its waves: ((row0, rows), ...) per wave
    amsgrad: bool
    masked: bool  # found_inf given: the gradient's bits are masked
    rounding: bool  # stochastic rounding of the bf16 param (else round to nearest even)
    engines: str
    hwdge: bool  # DMAs on the hardware DGE (NeuronCore-v3+), triggered from SyncE/ScalarE
    n_coefficients: int
    sbuf_bytes: int
    psum_banks: int


def _chunk_bytes(cols: int, dtype: str, grad_dtype: str, amsgrad: bool) -> int:
    """SBUF bytes per partition of one chunk's tiles: its coefficient row, p, g, m, v,
    (vmax), two fp32 temporaries (each reused once), and for a 2-byte param an fp32
    decayed copy."""
    fp32_tiles = 2 + int(amsgrad) + 2 + int(ITEMSIZE[dtype] != 4)
    return cols * (ITEMSIZE[dtype] + ITEMSIZE[grad_dtype] + 4 * fp32_tiles) + 4 * N_COEFFICIENTS


def _rounding_allowed(dtype: str, rounding: bool) -> None:
    if rounding and dtype != "bfloat16":
        raise LimitError(
            OP, "stochastic_rounding_seed", "must be None for float32 params (nothing to round)",
            dtype,
        )  # fmt: skip


def plan(
    problem: dict, dtype: str, config: FusedAdamwConfig, target: Target, lnc: int = 1
) -> FusedAdamwPlan:
    """The tile plan of ``config`` for one launch: its ``rows`` x ``cols`` buffers cut into
    chunks of up to ``partitions`` whole rows, the chunks split over ``lnc`` cores by
    element count (every chunk is independent: each core writes only its own rows).

    ``problem`` gives ``tensors`` and ``numel`` (the largest tensor) and, for a real
    launch, ``rows`` and ``cols`` (its :class:`Launch`). Without them (the budget check) it
    plans the worst launch the op can make of ``tensors`` tensors of up to ``numel``
    elements: the widest rows :func:`launches` can give them, every chunk on one core. Budget: ``in_flight + 1`` chunks' tiles (the
    interleaved ones and the next one loading) with their coefficient rows.
    """
    pmax = target.pmax
    amsgrad = bool(problem.get("amsgrad", True))
    if problem.get("rows"):
        rows, cols = problem["rows"], problem["cols"]
    else:
        numel, n = max(1, problem["numel"]), max(1, problem["tensors"])
        cols = config.tile_free  # the widest rows any launch of tensors <= numel can get:
        while cols > 1 and cols * 8 > numel * 9:  # row_width pads at most 1/8 more
            cols //= 2
        rows = n * -(-numel // cols)
    work = tiled(rows, pmax)
    k = config.in_flight
    shares = [core_share(work, [r * cols for _, r in work], c, lnc) for c in range(lnc)]
    core_waves = tuple(
        tuple(tuple(share[w : w + m]) for w, m in tiled(len(share), k)) for share in shares
    )
    most = max(len(share) for share in shares)
    if not problem.get("rows"):
        most = len(work)  # the budget check: as if one core had every chunk
    grad_dtype = problem.get("grad_dtype", dtype)
    chunk = _chunk_bytes(cols, dtype, grad_dtype, amsgrad)
    rounding = bool(problem.get("rounding", False))
    _rounding_allowed(dtype, rounding)
    in_flight = min(k, most) + (most > k)
    return FusedAdamwPlan(
        partitions=pmax,
        tile_free=config.tile_free,
        rows=rows,
        cols=cols,
        lnc=lnc,
        core_waves=core_waves,
        amsgrad=amsgrad,
        masked=bool(problem.get("masked", True)),
        rounding=rounding,
        engines=config.engines,
        hwdge=target.has_hwdge,
        n_coefficients=N_COEFFICIENTS,
        sbuf_bytes=in_flight * chunk + 8 * rounding,
        psum_banks=0,
    )


# -- the NKI kernel ----------------------------------------------------------------------


def _load(dst, src, plan):
    """HBM -> SBUF; on the hardware DGE from SyncE where the target has one (the default
    software DGE is triggered from GpSimdE, which also computes here)."""
    if plan.hwdge:
        nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.sync)
    else:
        nisa.dma_copy(dst=dst, src=src)


def _store(dst, src, plan):
    """SBUF -> HBM; hardware-DGE stores are triggered from ScalarE, a second DGE queue."""
    if plan.hwdge:
        nisa.dma_copy(dst=dst, src=src, dge_mode=nisa.dge_mode.hwdge, engine=nisa.engine.scalar)
    else:
        nisa.dma_copy(dst=dst, src=src)


def _scale(dst, src, col, zero, plan):
    """``dst = src * col`` (col a ``(P, 1)`` fp32 tile) on ScalarE, or VectorE alone."""
    if plan.engines == "vector":
        nisa.tensor_scalar(dst=dst, data=src, op0=nl.multiply, operand0=col)
    else:
        nisa.activation(dst=dst, op=nl.copy, data=src, scale=col, bias=zero)


def _two_tile_engine(plan):
    """The engine of the plain two-tile ops (m + g1, m * r, amsgrad's max)."""
    return nisa.engine.gpsimd if plan.engines == "spread" else nisa.engine.vector


def _open_chunk(ins, outs, coefficients, row0, rows, plan):
    """Allocate one chunk's tiles and load its coefficient rows and p, g, m, v (, vmax):
    a dict of its tiles, and of the output rows they are stored to."""
    fp32, cols = nl.float32, plan.cols
    t = {"rows": rows, "cols": cols}
    t["coef"] = nl.ndarray((rows, plan.n_coefficients), dtype=fp32, buffer=nl.sbuf, name="coef")
    _load(t["coef"], coefficients[row0 : row0 + rows, 0 : plan.n_coefficients], plan)
    t["hbm"] = {}
    for name in ("g", "m", "v", "p", "vmax"):
        if name == "vmax" and not plan.amsgrad:
            continue
        src = ins[name][row0 : row0 + rows, 0:cols]
        dtype = src.dtype if name in ("p", "g") else fp32
        t[name] = nl.ndarray((rows, cols), dtype=dtype, buffer=nl.sbuf, name=name)
        if name != "g":
            t["hbm"][name] = outs[name][row0 : row0 + rows, 0:cols]
        _load(t[name], src, plan)
    t["a"] = nl.ndarray((rows, cols), dtype=fp32, buffer=nl.sbuf, name="g1_then_u")
    t["b"] = nl.ndarray((rows, cols), dtype=fp32, buffer=nl.sbuf, name="g2_then_r")
    if t["p"].itemsize == 4:
        t["pw"] = t["p"]  # fp32 params decay in place
    else:
        t["pw"] = nl.ndarray((rows, cols), dtype=fp32, buffer=nl.sbuf, name="p_decayed")
    return t


def _col(t, j):
    return t["coef"][:, j : j + 1]


def _step_mask(t, plan):
    """A skipped step: AND the gradient's bits with 0, so inf/NaN cannot leak in."""
    if plan.masked:
        bits = t["g"].view(nl.int32 if t["g"].itemsize == 4 else nl.int16)
        mask = _col(t, MASK).view(nl.int32)
        if plan.engines == "spread":  # GpSimdE takes it, against the column broadcast
            wide = mask.broadcast(1, t["cols"])
            nisa.tensor_tensor(
                dst=bits, data1=bits, data2=wide, op=nl.bitwise_and, engine=nisa.engine.gpsimd
            )
        else:
            nisa.tensor_scalar(dst=bits, data=bits, op0=nl.bitwise_and, operand0=mask)


def _step_gradient_terms(t, plan):
    """a = c1 * g (m's term), b = (1 - beta2) g^2 / scale^2 (v's term)."""
    zero = _col(t, ZERO)
    _scale(t["a"], t["g"], _col(t, C_G1), zero, plan)
    if plan.engines == "vector":
        nisa.scalar_tensor_tensor(
            dst=t["b"], data=t["g"], op0=nl.multiply, operand0=_col(t, C_G2SQ),
            op1=nl.multiply, operand1=t["g"],
        )  # fmt: skip
    else:
        nisa.activation(dst=t["b"], op=nl.square, data=t["g"], scale=_col(t, C_G2), bias=zero)


def _step_decay(t, plan):
    """pw = p * (1 - lr * wd): depends only on the load, so it fills engine gaps early."""
    _scale(t["pw"], t["p"], _col(t, WDF), _col(t, ZERO), plan)


def _step_moments(t, plan):
    """m = beta1 * m + a; v = beta2 * v + b; vmax = max(vmax, v)."""
    if plan.engines == "spread":
        _scale(t["m"], t["m"], _col(t, C_B1), _col(t, ZERO), plan)
        nisa.tensor_tensor(
            dst=t["m"], data1=t["m"], data2=t["a"], op=nl.add, engine=nisa.engine.gpsimd
        )
    else:
        nisa.scalar_tensor_tensor(
            dst=t["m"], data=t["m"], op0=nl.multiply, operand0=_col(t, C_B1), op1=nl.add,
            operand1=t["a"],
        )  # fmt: skip
    nisa.scalar_tensor_tensor(
        dst=t["v"], data=t["v"], op0=nl.multiply, operand0=_col(t, C_B2), op1=nl.add,
        operand1=t["b"],
    )  # fmt: skip
    if plan.amsgrad:
        nisa.tensor_tensor(
            dst=t["vmax"], data1=t["vmax"], data2=t["v"], op=nl.maximum,
            engine=_two_tile_engine(plan),
        )  # fmt: skip


def _step_denominator(t, plan):
    """b = 1 / (sqrt(v / bc2 + 2^-84) + eps) (b's g^2 term is dead)."""
    v = t["vmax"] if plan.amsgrad else t["v"]
    r = t["b"]
    if plan.engines == "vector":  # sqrt(x) as reciprocal(rsqrt(x)): two unary ALU ops in one pass
        nisa.tensor_scalar(
            dst=r, data=v, op0=nl.multiply, operand0=_col(t, INV_BC2), op1=nl.add,
            operand1=_col(t, TINY),
        )  # fmt: skip
        nisa.tensor_scalar(dst=r, data=r, op0=nl.rsqrt, operand0=None, op1=nl.reciprocal)
    else:
        nisa.activation(dst=r, op=nl.sqrt, data=v, scale=_col(t, INV_BC2), bias=_col(t, TINY))
    # + eps and 1/x on VectorE: NeuronCore-v2's ScalarE reciprocal takes no bias, and
    # VectorE's ALU reciprocal is the more precise one.
    nisa.tensor_scalar(dst=r, data=r, op0=nl.add, operand0=_col(t, EPS), op1=nl.reciprocal)


def _step_update(t, plan):
    """a = m * r (a's gradient term is dead); p = a * (-lr / bc1) + pw (into the fp32 pw
    first when it is to be rounded stochastically)."""
    nisa.tensor_tensor(
        dst=t["a"], data1=t["m"], data2=t["b"], op=nl.multiply, engine=_two_tile_engine(plan)
    )
    nisa.scalar_tensor_tensor(
        dst=t["pw"] if plan.rounding else t["p"], data=t["a"], op0=nl.multiply,
        operand0=_col(t, NEG_STEP), op1=nl.add, operand1=t["pw"],
    )  # fmt: skip


def _step_round(t, hash_m1, hash_m2, plan):
    """Stochastic rounding to bf16: add 16 hashed bits below the bf16 mantissa of the fp32
    result and truncate (rounds up with probability = the dropped fraction). GpSimdE does
    the iota and the exact int32 multiplies/adds, VectorE the xors, shifts and masks."""
    if not plan.rounding:
        return
    rows, cols = t["rows"], t["cols"]
    x, y = t["a"].view(nl.int32), t["b"].view(nl.int32)  # both dead after the update
    bits = t["pw"].view(nl.int32)
    m1, m2 = hash_m1[0:rows, :].broadcast(1, cols), hash_m2[0:rows, :].broadcast(1, cols)
    i32, gpsimd = nl.int32, nisa.engine.gpsimd
    # x = element index in the tensor: the row's first element's (a coefficient column,
    # rows of one chunk can come from different tensors) + column, exact on GpSimdE
    nisa.iota(dst=x, pattern=[[1, cols]], offset=0, channel_multiplier=0)
    first = _col(t, ROW_INDEX).view(i32).broadcast(1, cols)
    nisa.tensor_tensor(dst=x, data1=x, data2=first, op=nl.add, engine=gpsimd)
    nisa.tensor_scalar(dst=x, data=x, op0=nl.bitwise_xor, operand0=_col(t, SEED).view(i32))
    nisa.tensor_tensor(dst=x, data1=x, data2=m1, op=nl.multiply, engine=gpsimd)
    nisa.tensor_scalar(dst=y, data=x, op0=nl.right_shift, operand0=15)
    nisa.tensor_tensor(dst=x, data1=x, data2=y, op=nl.bitwise_xor, engine=gpsimd)
    nisa.tensor_tensor(dst=x, data1=x, data2=m2, op=nl.multiply, engine=gpsimd)
    nisa.tensor_scalar(dst=x, data=x, op0=nl.right_shift, operand0=16)
    nisa.tensor_tensor(dst=bits, data1=bits, data2=x, op=nl.add, engine=gpsimd)
    nisa.tensor_scalar(dst=bits, data=bits, op0=nl.bitwise_and, operand0=-65536)
    # now exactly a bf16 value: the conversion is exact
    nisa.activation(dst=t["p"], op=nl.copy, data=t["pw"], scale=1.0, bias=_col(t, ZERO))


def _close_chunk(t, plan):
    """Store p, m, v (, vmax) to the kernel's outputs."""
    for name in ("p", "m", "v", "vmax"):
        if name in t["hbm"]:
            _store(t["hbm"][name], t[name], plan)


@nki.jit
def fused_adamw_kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, coefficients, plan):
    """One AdamW step over one launch's ``[rows, cols]`` HBM buffers; returns the new
    ``(params, exp_avgs, exp_avg_sqs)``, and ``max_exp_avg_sqs`` last with amsgrad.

    ``params`` fp32/bf16, ``grads`` the params' dtype (or lower with fp32 params),
    ``exp_avgs``/``exp_avg_sqs``/``max_exp_avg_sqs`` fp32 (the last None without amsgrad);
    ``coefficients`` ``[rows, 14]`` fp32, each row's tensor's coefficients (the column list
    at the top of the module). Every argument is one top-level tensor, never a list, and
    nothing is written in place: ``torch_neuronx.wrap_nki`` passes only top-level tensors
    as operands, and NKI 0.6 kernels return their outputs (no operand aliasing there), so
    the op copies the results into its tensors (see :func:`launches` for why the buffers
    are packed small tensors or a large tensor itself).

    The chunks of a wave go through each step of the chain together (see ``in_flight``).
    Launched as ``fused_adamw_kernel[plan.lnc]``: each physical core updates its own chunks,
    ``plan.core_waves[nl.program_id(0)]``, and writes only their rows of the outputs.
    """
    assert params.shape == (plan.rows, plan.cols), "adamw: the plan was made for other buffers"
    assert nl.num_programs(0) == plan.lnc, "adamw: launch fused_adamw_kernel[plan.lnc]"
    shape, fp32 = (plan.rows, plan.cols), nl.float32
    new_p = nl.ndarray(shape, dtype=params.dtype, buffer=nl.shared_hbm, name="new_params")
    new_m = nl.ndarray(shape, dtype=fp32, buffer=nl.shared_hbm, name="new_exp_avgs")
    new_v = nl.ndarray(shape, dtype=fp32, buffer=nl.shared_hbm, name="new_exp_avg_sqs")
    outs = {"p": new_p, "m": new_m, "v": new_v}
    result = (new_p, new_m, new_v)
    if plan.amsgrad:
        outs["vmax"] = nl.ndarray(shape, dtype=fp32, buffer=nl.shared_hbm, name="new_max_sqs")
        result = (new_p, new_m, new_v, outs["vmax"])
    my_waves = plan.core_waves[nl.program_id(0)]
    if len(my_waves) == 0:  # fewer chunks than cores: nothing to update on this core
        return result
    P = plan.partitions
    ins = {"p": params, "g": grads, "m": exp_avgs, "v": exp_avg_sqs, "vmax": max_exp_avg_sqs}
    hash_m1 = hash_m2 = None
    if plan.rounding:  # the hash's multipliers as int32 columns (GpSimdE multiplies tiles:
        # each is read as a stride-0 broadcast along the free dim)
        hash_m1 = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf, name="hash_m1")
        hash_m2 = nl.ndarray((P, 1), dtype=nl.int32, buffer=nl.sbuf, name="hash_m2")
        nisa.iota(dst=hash_m1, pattern=[[0, 1]], offset=HASH_M1)
        nisa.iota(dst=hash_m2, pattern=[[0, 1]], offset=HASH_M2)
    for wave in my_waves:
        tiles = []
        for row0, rows in wave:
            tiles.append(_open_chunk(ins, outs, coefficients, row0, rows, plan))
        for t in tiles:
            _step_mask(t, plan)
        for t in tiles:
            _step_gradient_terms(t, plan)
        for t in tiles:
            _step_decay(t, plan)
        for t in tiles:
            _step_moments(t, plan)
        for t in tiles:
            _step_denominator(t, plan)
        for t in tiles:
            _step_update(t, plan)
        for t in tiles:
            _step_round(t, hash_m1, hash_m2, plan)
        for t in tiles:
            _close_chunk(t, plan)
    return result


# -- op-level glue: coefficients, limits, reference -----------------------------------------


def rounding_keys(seed: int, state_steps, device) -> torch.Tensor:
    """Per-tensor int64 keys in [0, 2^31) for this step: a hash of (seed, step, position)."""
    step = torch.stack([s.reshape(()).to(device) for s in state_steps]).to(torch.int64)
    position = torch.arange(step.numel(), dtype=torch.int64, device=device)
    key = ((seed * KEY_SEED) & 0xFFFFFFFF) + step * KEY_STEP + position * KEY_TENSOR
    key = key & 0xFFFFFFFF
    return (key ^ (key >> 16)) & 0x7FFFFFFF


def round_stochastically(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """fp32 ``x`` to bf16 by adding ``bits`` below the bf16 mantissa and truncating."""
    raw = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64).reshape(-1)
    raw = ((raw + bits) & 0xFFFF0000) & 0xFFFFFFFF
    raw = torch.where(raw >= 2**31, raw - 2**32, raw).to(torch.int32)
    return raw.view(torch.float32).reshape(x.shape).to(torch.bfloat16)


def coefficients(
    state_steps, lr, beta1, beta2, weight_decay, eps, maximize, grad_scale, found_inf, device,
    rounding_keys=None,
) -> torch.Tensor:  # fmt: skip
    """The ``[n, 14]`` fp32 per-tensor coefficient table, computed on ``device`` without a
    host sync (fp64 arithmetic where the device has it, then rounded once to fp32);
    ``ROW_INDEX`` is 0 here (each launch's rows set their own, :func:`row_coefficients`)."""
    wide = torch.float64 if device.type == "cpu" else torch.float32
    step = torch.stack([s.reshape(()).to(device=device, dtype=wide) for s in state_steps])
    n = step.numel()
    inv_scale = torch.ones((), dtype=wide, device=device)
    if grad_scale is not None:
        inv_scale = 1.0 / grad_scale.reshape(()).to(device=device, dtype=wide)
    keep = torch.ones((), dtype=torch.bool, device=device)
    if found_inf is not None:
        keep = found_inf.reshape(()).to(device) == 0
    sign = -1.0 if maximize else 1.0
    bc1 = 1.0 - torch.pow(torch.tensor(beta1, dtype=wide, device=device), step)
    bc2 = 1.0 - torch.pow(torch.tensor(beta2, dtype=wide, device=device), step)

    def gated(value, identity):
        return torch.where(keep, value, torch.as_tensor(identity, dtype=wide, device=device))

    cols = [None] * N_COEFFICIENTS
    full = torch.ones(n, dtype=wide, device=device)
    cols[MASK] = full * 0  # written as int32 bits below
    cols[C_G1] = full * gated((1.0 - beta1) * sign * inv_scale, -0.0)
    cols[C_B1] = full * gated(torch.as_tensor(beta1, dtype=wide, device=device), 1.0)
    cols[C_G2] = full * gated(math.sqrt(1.0 - beta2) * inv_scale, 0.0)
    cols[C_G2SQ] = full * gated((1.0 - beta2) * inv_scale * inv_scale, 0.0)
    cols[C_B2] = full * gated(torch.as_tensor(beta2, dtype=wide, device=device), 1.0)
    # Gated too: at state_steps == 0 (possible on a skipped step) bc2 is 0, and v * inf = NaN
    # would reach the params through m * r * 0 (torch leaves every tensor untouched when
    # found_inf is set, whatever the step; issue 32 item 8).
    cols[INV_BC2] = full * gated(1.0 / bc2, 1.0)
    cols[TINY] = full * SQRT_FLOOR
    cols[EPS] = full * eps
    cols[NEG_STEP] = gated(-lr / bc1, 0.0) * full
    cols[WDF] = full * gated(
        torch.as_tensor(1.0 - lr * weight_decay, dtype=wide, device=device), 1.0
    )
    cols[ZERO] = full * 0
    cols[SEED] = full * 0  # int32 bits below
    cols[ROW_INDEX] = full * 0  # int32 bits, per row of a launch
    table = torch.stack(cols, dim=1).to(torch.float32).contiguous()
    mask = torch.where(keep, -1, 0).to(device=device, dtype=torch.int32)
    table.view(torch.int32)[:, MASK] = mask
    if rounding_keys is not None:
        table.view(torch.int32)[:, SEED] = rounding_keys.to(device=device, dtype=torch.int32)
    return table


def row_coefficients(table: torch.Tensor, launch: Launch) -> torch.Tensor:
    """The ``[rows, 14]`` table of one launch: each row its segment's tensor's coefficients
    (``table``'s row) with ``ROW_INDEX`` the index in that tensor of the row's first element.
    The indices are known from the shapes alone: no host sync."""
    tensors, first = [], []
    for s in launch.segments:
        n_rows = -(-s.length // launch.cols)
        tensors += [s.tensor] * n_rows
        first += range(s.start, s.start + n_rows * launch.cols, launch.cols)
    device = table.device
    rows = table[torch.tensor(tensors, dtype=torch.int64, device=device)]
    first = torch.tensor(first, dtype=torch.int32, device=device).view(torch.float32)
    return torch.cat([rows[:, :ROW_INDEX], first.reshape(-1, 1)], dim=1).contiguous()


def _tensor_list(arg: str, value) -> list:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in value):
        raise LimitError(OP, arg, "must be a list of torch.Tensor", type(value).__name__)
    return list(value)


def _number(arg: str, value, lo: float, hi: float | None = None, hi_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and value >= lo and (hi is None or (value < hi if hi_open else value <= hi))
    if not ok:
        rule = f"must be a finite number >= {lo}" if hi is None else f"must be in [{lo}, {hi})"
        raise LimitError(OP, arg, rule, value, limit=lo if hi is None else (lo, hi))


def _one_element(arg: str, t, device) -> None:
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.numel() != 1:
        raise LimitError(OP, arg, "must be a one-element tensor or None", getattr(t, "shape", t))
    if not t.dtype.is_floating_point:
        raise LimitError(OP, f"{arg} dtype", "must be floating point", dtype_name(t))
    if device is not None and t.device != device:
        raise LimitError(
            OP, f"{arg} device", f"must equal params' device ({device})", str(t.device)
        )


def validate(
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
    weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None,
    stochastic_rounding_seed=None,
) -> None:  # fmt: skip
    """Refuse bad input before any tensor is touched: list lengths, shapes, dtypes,
    devices, layouts, hyperparameter ranges."""
    seed = stochastic_rounding_seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise LimitError(OP, "stochastic_rounding_seed", "must be None or an int >= 0", seed)
    lists = {
        "params": _tensor_list("params", params),
        "grads": _tensor_list("grads", grads),
        "exp_avgs": _tensor_list("exp_avgs", exp_avgs),
        "exp_avg_sqs": _tensor_list("exp_avg_sqs", exp_avg_sqs),
        "max_exp_avg_sqs": _tensor_list("max_exp_avg_sqs", max_exp_avg_sqs),
        "state_steps": _tensor_list("state_steps", state_steps),
    }
    n = len(lists["params"])
    for name, ts in lists.items():
        want = n if (name != "max_exp_avg_sqs" or amsgrad) else (0, n)
        if len(ts) not in ((want,) if isinstance(want, int) else want):
            raise LimitError(
                OP, f"{name} length", f"must equal len(params) ({n})", len(ts), limit=n
            )
    _number("lr", lr, 0.0)
    _number("eps", eps, 0.0)
    _number("weight_decay", weight_decay, 0.0)
    _number("beta1", beta1, 0.0, 1.0, hi_open=True)
    _number("beta2", beta2, 0.0, 1.0, hi_open=True)
    for arg, flag in (("amsgrad", amsgrad), ("maximize", maximize)):
        if not isinstance(flag, bool):
            raise LimitError(OP, arg, "must be a bool", type(flag).__name__)
    device = lists["params"][0].device if n else None
    _one_element("grad_scale", grad_scale, device)
    _one_element("found_inf", found_inf, device)
    if not n:
        return
    p_dtype = dtype_name(lists["params"][0])
    if p_dtype not in PARAM_DTYPES:
        raise LimitError(OP, "params[0] dtype", f"must be one of {PARAM_DTYPES}", p_dtype)
    _rounding_allowed(p_dtype, seed is not None)
    for i, p in enumerate(lists["params"]):
        if dtype_name(p) != p_dtype:
            raise LimitError(
                OP, f"params[{i}] dtype", f"must equal params[0]'s ({p_dtype})", dtype_name(p)
            )
        g = lists["grads"][i]
        g_ok = dtype_name(g) == p_dtype or (p_dtype == "float32" and dtype_name(g) in GRAD_DTYPES)
        if not g_ok:
            raise LimitError(
                OP, f"grads[{i}] dtype", f"must be params[{i}]'s ({p_dtype}) or lower with fp32 params",
                dtype_name(g),
            )  # fmt: skip
        state = [
            ("grads", g),
            ("exp_avgs", lists["exp_avgs"][i]),
            ("exp_avg_sqs", lists["exp_avg_sqs"][i]),
        ]
        if amsgrad:
            state.append(("max_exp_avg_sqs", lists["max_exp_avg_sqs"][i]))
        for name, t in [("params", p), *state]:
            if t.device != device:
                raise LimitError(
                    OP, f"{name}[{i}] device", f"must equal params[0]'s ({device})", str(t.device)
                )
            if t.shape != p.shape:
                raise LimitError(
                    OP,
                    f"{name}[{i}] shape",
                    f"must equal params[{i}]'s {tuple(p.shape)}",
                    tuple(t.shape),
                )
            if not t.is_contiguous() or t.is_sparse:
                raise LimitError(
                    OP, f"{name}[{i}] layout", "must be dense and contiguous", str(t.layout)
                )
            if name.startswith(("exp_avg", "max_exp")) and t.dtype != torch.float32:
                raise LimitError(
                    OP, f"{name}[{i}] dtype", "must be float32 (fp32 state)", dtype_name(t)
                )
        s = lists["state_steps"][i]
        if s.numel() != 1 or s.device != device:
            raise LimitError(
                OP, f"state_steps[{i}]", f"must be a one-element tensor on {device}",
                f"{tuple(s.shape)} on {s.device}",
            )  # fmt: skip


def problem(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *rest) -> dict:
    """Tensor count and largest tensor size select the config; amsgrad changes the kernel."""
    amsgrad = bool(rest[5]) if len(rest) > 5 else True
    return {
        "tensors": len(params),
        "numel": max((p.numel() for p in params), default=0),
        "amsgrad": amsgrad,
        "rounding": len(rest) > 9 and rest[9] is not None,
    }


def reference(
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr, beta1, beta2,
    weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None,
    stochastic_rounding_seed=None, upcast=True,
) -> None:  # fmt: skip
    """The same step in plain torch, in place: fp64 arithmetic when ``upcast``, else fp32,
    rounded once into each tensor's dtype. With ``found_inf`` set nothing changes (a
    select, so the bits are kept exactly; the kernel keeps them too, except that a -0.0
    param or state value can come back as +0.0, since it adds a zero update).

    With ``stochastic_rounding_seed`` the bf16 params are rounded from the fp32 result
    with the kernel's hashed bits (:func:`rounding_bits`): the same bits on every backend.
    """
    wide = torch.float64 if upcast else torch.float32
    skip = None if found_inf is None else (found_inf.reshape(()) != 0)
    keys = None
    if stochastic_rounding_seed is not None and params:
        keys = rounding_keys(stochastic_rounding_seed, state_steps, params[0].device)
    for i, p in enumerate(params):
        g = grads[i].to(wide)
        if grad_scale is not None:
            g = g / grad_scale.reshape(()).to(wide)
        if maximize:
            g = -g
        step = state_steps[i].reshape(()).to(torch.float64)
        bc1 = (1.0 - beta1**step).to(wide)
        bc2 = (1.0 - beta2**step).to(wide)
        m = exp_avgs[i].to(wide) * beta1 + g * (1.0 - beta1)
        v = exp_avg_sqs[i].to(wide) * beta2 + g * g * (1.0 - beta2)
        v_used = v
        if amsgrad:
            vmax = torch.maximum(max_exp_avg_sqs[i].to(wide), v)
            v_used = vmax
        denom = torch.sqrt(v_used / bc2) + eps
        new_p = p.to(wide) * (1.0 - lr * weight_decay) - (lr / bc1) * m / denom
        if keys is not None:
            bits = rounding_bits(p.numel(), keys[i], p.device)
            new_p = round_stochastically(new_p.to(torch.float32), bits).to(wide)
        updates = [(p, new_p), (exp_avgs[i], m), (exp_avg_sqs[i], v)]
        if amsgrad:
            updates.append((max_exp_avg_sqs[i], vmax))
        for dst, new in updates:
            if skip is not None:
                new = torch.where(skip, dst.to(wide), new)
            dst.copy_(new)


# -- launch from torch -----------------------------------------------------------------------


def _launch_buffer(tensors: list, launch: Launch, dtype=None) -> torch.Tensor:
    """One argument's ``[rows, cols]`` buffer of ``launch``: the tensor itself (a view) when
    the launch is not packed, else its segments packed, each zero-padded to whole rows."""
    if not launch.packed:
        s = launch.segments[0]
        return tensors[s.tensor].view(-1)[: s.length].view(launch.rows, launch.cols)
    parts = []
    for s in launch.segments:
        flat = tensors[s.tensor].view(-1)[s.start : s.start + s.length]
        pad = -(-s.length // launch.cols) * launch.cols - s.length
        parts.append(flat)
        if pad:
            parts.append(flat.new_zeros(pad))
    return torch.cat(parts).view(launch.rows, launch.cols)


def run_kernels(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    max_exp_avg_sqs: list[torch.Tensor],
    state_steps: list[torch.Tensor],
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    grad_scale: torch.Tensor | None = None,
    found_inf: torch.Tensor | None = None,
    stochastic_rounding_seed: int | None = None,
    *,
    config: FusedAdamwConfig,
    runner,
) -> None:
    """Update every tensor: the kernel launches of :func:`launches` (empty tensors are
    skipped; they have nothing to update), each one's results copied (``copy_``) into the
    op's tensors right after it. Every launch is planned and checked before the first runs,
    so a refusal leaves every tensor as it was."""
    live = [i for i, p in enumerate(params) if p.numel() > 0]
    if not live:
        return None
    device = params[live[0]].device
    keys = None
    if stochastic_rounding_seed is not None:  # keyed by position in the op's lists
        keys = rounding_keys(stochastic_rounding_seed, state_steps, device)[live]
    dtype = dtype_name(params[live[0]])
    # int(): a dynamic-shape trace specializes on the sizes (a kernel is built for its shapes)
    work = launches([int(params[i].numel()) for i in live], config, runner.target.pmax)
    plans = []
    for launch in work:
        sizes = tuple(s.length for s in launch.segments)
        problem = {
            "tensors": len(sizes),
            "numel": max(sizes),
            "amsgrad": amsgrad,
            "rows": launch.rows,
            "cols": launch.cols,
            "masked": found_inf is not None,
            "rounding": stochastic_rounding_seed is not None,
            "grad_dtype": dtype_name(grads[live[0]]),
        }
        plans.append(SPEC.check(problem, dtype, config, runner.target, runner_lnc(runner)))
    table = coefficients(
        [state_steps[i] for i in live], lr, beta1, beta2, weight_decay, eps, maximize,
        grad_scale, found_inf, device, keys,
    )  # fmt: skip
    lists = [[ts[i] for i in live] for ts in (params, grads, exp_avgs, exp_avg_sqs)]
    mutated = [lists[0], lists[2], lists[3]]
    if amsgrad:
        lists.append([max_exp_avg_sqs[i] for i in live])
        mutated.append(lists[4])
    for launch, tiles in zip(work, plans):
        buffers = [_launch_buffer(ts, launch) for ts in lists]
        vmax = buffers[4] if amsgrad else None
        coef = row_coefficients(table, launch)
        kernel = fused_adamw_kernel[tiles.lnc]
        new = runner(kernel, buffers[0], buffers[1], buffers[2], buffers[3], vmax, coef, tiles)
        for ts, out in zip(mutated, new):
            flat = out.reshape(-1)
            for s in launch.segments:
                at = s.row0 * launch.cols
                ts[s.tensor].view(-1)[s.start : s.start + s.length].copy_(flat[at : at + s.length])
    return None


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """``tensors`` tensors, the first of ``numel`` elements, the others of random sizes in
    [1, numel]; params/grads ~ N(0, 1), m ~ N(0, 0.01), v and vmax >= 0 of 1e-2 scale.
    The seed picks the flags (amsgrad, maximize, grad scaling), so seeded batteries cover
    them all; steps are 1..5."""
    n, numel = problem["tensors"], problem["numel"]
    seed = generator.initial_seed()
    amsgrad = bool(problem.get("amsgrad", seed % 2 == 0))
    maximize = bool(problem.get("maximize", (seed // 2) % 2 == 1))
    scaled = (seed // 4) % 2 == 0
    sizes = [numel] + [
        int(torch.randint(1, max(numel, 1) + 1, (1,), generator=generator, device="cpu"))
        for _ in range(n - 1)
    ]
    torch_dtype = getattr(torch, dtype)
    scale = 1024.0 if scaled else 1.0

    def randn(k, s=1.0):
        return torch.randn(k, generator=generator) * s

    params = [randn(k).to(torch_dtype) for k in sizes]
    grads = [(randn(k) * scale).to(torch_dtype) for k in sizes]
    exp_avgs = [randn(k, 0.1) for k in sizes]
    exp_avg_sqs = [randn(k, 0.1) ** 2 for k in sizes]
    max_sqs = [v + randn(v.numel(), 0.01) ** 2 for v in exp_avg_sqs] if amsgrad else []
    steps = [torch.tensor(float(1 + (seed + i) % 5)) for i in range(n)]
    grad_scale = torch.tensor(scale) if scaled else None
    found_inf = torch.tensor(0.0)
    return (
        params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps,
        1e-3, 0.9, 0.999, 0.01, 1e-8, amsgrad, maximize, grad_scale, found_inf,
    )  # fmt: skip


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""

    def args(**change):
        base = dict(
            params=[torch.zeros(4), torch.zeros(3)],
            grads=[torch.zeros(4), torch.zeros(3)],
            exp_avgs=[torch.zeros(4), torch.zeros(3)],
            exp_avg_sqs=[torch.zeros(4), torch.zeros(3)],
            max_exp_avg_sqs=[],
            state_steps=[torch.tensor(1.0), torch.tensor(1.0)],
            lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
            amsgrad=False, maximize=False, grad_scale=None, found_inf=None,
            stochastic_rounding_seed=None,
        )  # fmt: skip
        base.update(change)
        return tuple(base.values())

    z, bf16 = torch.zeros, torch.bfloat16
    return [
        (args(grads=[z(4)]), "grads length"),
        (args(exp_avgs=[z(4), z(5)]), "exp_avgs[1] shape"),
        (args(exp_avg_sqs=[z(4), z(3, dtype=torch.bfloat16)]), "exp_avg_sqs[1] dtype"),
        (
            args(params=[z(4, dtype=bf16), z(3, dtype=bf16)], grads=[z(4, dtype=bf16), z(3)]),
            "grads[1] dtype",
        ),
        (args(params=[z(4, dtype=torch.float64), z(3, dtype=torch.float64)]), "params[0] dtype"),
        (args(exp_avgs=[z(4), z(3, device="meta")]), "exp_avgs[1] device"),
        (args(grads=[z(4), z(6)[::2]]), "grads[1] layout"),
        (args(amsgrad=True), "max_exp_avg_sqs length"),
        (args(state_steps=[torch.tensor(1.0), z(2)]), "state_steps[1]"),
        (args(lr=-1.0), "lr"),
        (args(eps=-1e-8), "eps"),
        (args(beta1=1.0), "beta1"),
        (args(beta2=-0.1), "beta2"),
        (args(weight_decay=float("nan")), "weight_decay"),
        (args(grad_scale=z(2)), "grad_scale"),
        (args(stochastic_rounding_seed=-1), "stochastic_rounding_seed"),
        (args(stochastic_rounding_seed=7), "stochastic_rounding_seed"),  # fp32: nothing to round
    ]


SPEC = register(
    OpSpec(
        name=OP,
        config=FusedAdamwConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances={
            # fp32: about ten fp32 roundings along the chain (each <= 2^-24 relative),
            # against an fp64 reference; absolute floor for values that cancel to ~0
            # (m and p differences of O(1) terms: a few ulps of 1).
            "float32": Tolerance(1e-6, 2**-20, "a chain of ~10 fp32 roundings vs fp64"),
            # bf16 params: the fp32 result is rounded once to bf16 (0.5 ulp = 2^-9
            # relative); 2x margin. State stays fp32, well inside this.
            "bfloat16": Tolerance(1e-6, 2**-8, "one bf16 rounding of the fp32 param update"),
        },
        make_inputs=make_inputs,
        test_problems={
            "ranges": {"tensors": (1, 4), "numel": (1, 700)},
            "edges": (1, 2, 127, 128, 129, 256, 300),
            "probe": {"tensors": 3, "numel": 300},
            "large": {"tensors": 2, "numel": 128 * 4096 + 1},  # full 4096-wide tiles + tail
            "empty": [],
        },
        dtypes=PARAM_DTYPES,
        # "TENSORSxNUMEL[:amsgrad]": torch.optim.AdamW's default (amsgrad=False) unless named
        parse_shape=shape_parser(OP, ("tensors", "numel"), ("amsgrad",)),
        output_shapes=lambda *args: [],
        kernels=(fused_adamw_kernel,),
        mutates=("params", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs"),
        bad_inputs=_bad_inputs,
        budget_hints={"sbuf": "lower tile_free (or use fewer working tiles: engines)"},
        description="one AdamW step, in place, over lists of tensors (torch._fused_adamw_'s contract)",
    )
)
