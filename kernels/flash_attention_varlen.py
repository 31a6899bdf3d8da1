"""Variable-length (packed) flash attention, FlashAttention's ``flash_attn_varlen_func``:
the ``flash_attention_varlen`` / ``flash_attention_varlen_fwd`` / ``flash_attention_varlen_bwd``
op declarations over the BHSD kernels of :mod:`.flash_attention_kernel` and
:mod:`.flash_attention_bwd_kernel` (no kernel of its own).

Layout: a batch of sequences packed row after row, q ``[total_q, H, D]``, k and v
``[total_k, Hkv, D]`` (GQA as the BHSD op: ``H % Hkv == 0``), sequence ``s`` at rows
``cu_seqlens_q[s] .. cu_seqlens_q[s + 1]`` of q and ``cu_seqlens_k[s] .. cu_seqlens_k[s + 1]``
of k and v (int32 ``[n + 1]``, 0 first, non-decreasing, the last entry the total), with
``max_seqlen_q`` / ``max_seqlen_k`` at least the longest. The contract:

    - No attention across sequences. ``causal`` is bottom-right within each sequence: query
      ``t`` of a sequence of lengths ``(Lq, Lk)`` sees its keys ``<= t + Lk - Lq``
      (FlashAttention 2, and our BHSD op). A query that sees no key (``Lk = 0``, or causal
      with ``Lq > Lk``) gives ``out = 0`` and ``lse = -inf``.
    - ``lse`` is FlashAttention's varlen layout, ``[H, total_q]`` float32 (the BHSD
      kernel's ``[B=1, H, Sq]`` of the packed batch, as it is).
    - ``softmax_scale=None`` means ``1 / sqrt(D)``.

The boundaries are device data. No host read and no re-trace per packing: the glue computes
each query row's visible keys ``[lo, hi)`` in the packed key axis with torch ops that never
synchronize (:func:`row_key_bounds`: the row's sequence by ``searchsorted``, its key range
from ``cu_seqlens_k``, the causal diagonal), lays them out per query tile and hands them to
the kernels as a small fp32 tensor; the kernels view the packed batch as one sequence
(``B = 1``: q ``[1, total_q, H, D]`` read through a BHSD view with a row stride of ``H * D``,
no copy: ``plan.packed``) and mask every score tile at run time against those bounds
(``plan.runtime_bounds``: ``nisa.range_select`` on NeuronCore-v3+, an ``iota`` compare on
v2). The plan, and so the traced kernel, depends only on the sizes, ``max_seqlen_*``,
``causal`` and whether ``cu_seqlens_q`` *is* ``cu_seqlens_k``: two packings with the same
totals and maxima run one kernel.

Trace-time skipping: when ``cu_seqlens_q is cu_seqlens_k`` (self-attention packing, an
identity check, no sync) a query ``i`` sees only keys within ``(i - m, i + m)``, ``m`` the
smaller max_seqlen, causal ``(i - m, i]``: the kernels run under that band as a sliding
window (the BHSD op's ``key_bounds``/``tile_visibility``), so tiles outside it issue
nothing. Other packings trace every tile (masked at run time).

Run-time skipping is not done: NKI 0.6's run-time loops (``nl.fori_loop`` /
``nl.while_loop`` with trip counts in registers loaded from tensors, ``nisa.register_load``;
the interpreter runs them) could bound each query tile's key loop by its rows'
``[min lo, max hi)``, so a packing would issue only the tiles its sequences span (about the
cost of running them one by one: 8 x 1024 causal at 8192 issues 7808 matmuls per KV group
that way against the band's 13680, ``benchmarks/flash_attention_varlen.py``). But the kernels' software
pipelines are unrolled over a trace-time list of (query tile, key tile) steps, each
engine's queue interleaving several steps; a run-time loop (one key tile per iteration,
its state in SBUF, nothing allocated in the body used after it) would drop that overlap.

Validation: shapes, dtypes, devices and argument types are checked on every device before
any work. The values of ``cu_seqlens_*`` (0 first, non-decreasing, last = total) and
``max_seqlen_* >= longest`` need a host read: they are checked when the tensors are on CPU
(the reference and interpret modes); on a Neuron device they are the caller's contract, as
in FlashAttention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target, usable_psum_banks
from neuron_kernels.kernels import attention_contract as attn_contract
from neuron_kernels.kernels import flash_attention as fa
from neuron_kernels.kernels import flash_attention_bwd as fab
from neuron_kernels.kernels import flash_attention_bwd_kernel as fab_kernel
from neuron_kernels.kernels import flash_attention_bwd_plan as fab_plan
from neuron_kernels.kernels import flash_attention_kernel as fa_kernel
from neuron_kernels.kernels import flash_attention_plan as fa_plan
from neuron_kernels.kernels.spec import (
    DTYPES,
    OpSpec,
    TunableConfig,
    bucket_size,
    dtype_name,
    register,
    runner_lnc,
    tunable,
)

__all__ = [
    "BWD_SPEC",
    "FWD_SPEC",
    "MAX_TOTAL_K",
    "SPEC",
    "FlashAttentionVarlenBwdConfig",
    "FlashAttentionVarlenConfig",
    "bhsd_problem",
    "reference_fwd",
    "reference_bwd",
    "row_key_bounds",
    "same_packing",
    "tile_bounds",
]

OP = "flash_attention_varlen"
FWD_OP = "flash_attention_varlen_fwd"
BWD_OP = "flash_attention_varlen_bwd"

# Key positions are compared in fp32 on the device (isa range_select: "range_start + free
# dimension index within 2^24"), exact below 2^24.
MAX_TOTAL_K = 2**24
# kv_block=0 when K/V do not fit resident: the BHSD forward's default block.
RESIDENT_FALLBACK = 4096


# -- configs: the BHSD kernels' tunables that move varlen most ------------------------------


def _bhsd_tunable(config_cls, name: str, choices: tuple):
    """A field of ``config_cls`` (the BHSD kernels' config) with its default and its reason
    (the same kernels run), offered with ``choices``."""
    (f,) = [f for f in fields(config_cls) if f.name == name]
    return tunable(f.default, choices, f.metadata["why"])


@dataclass(frozen=True)
class FlashAttentionVarlenConfig(TunableConfig):
    """The forward kernel's choices that change a packed run's schedule most (the rest at
    :class:`~.flash_attention.FlashAttentionConfig`'s defaults): a small space, so the
    contract suite's every-config battery and a tuning study stay short."""

    op_name = FWD_OP

    k_tile: int = _bhsd_tunable(fa_plan.FlashAttentionConfig, "k_tile", (128, 512))
    kv_block: int = tunable(
        0,
        (0, 512, 4096),
        "modeled: 0 (K/V resident when they fit, two-pass softmax over the band) at 8 x 1024 "
        "causal packed to 8192, H4 Hkv1 D128 bf16, LNC=1: 656 us vs 1018 us with 4096 (online)",
    )
    q_group: int = _bhsd_tunable(fa_plan.FlashAttentionConfig, "q_group", (1, 2, 4))
    softmax: str = _bhsd_tunable(fa_plan.FlashAttentionConfig, "softmax", ("two_pass", "online"))
    p_dma_tiles: int = tunable(
        1,
        (1, 3),
        "modeled: 8 x 1024 causal packed to 8192, H4 Hkv1 D128 bf16, LNC=1: 572 us vs 656 us "
        "with 3 (the BHSD default: DMA-bound here, the band's tiles leave TensorE idle) and "
        "592 us with 0",
    )

    def bhsd(self, kv_block: int | None = None) -> fa_plan.FlashAttentionConfig:
        """The BHSD forward's config with these fields (``kv_block`` instead of 0, which
        :func:`plan_fwd` resolves), its defaults elsewhere."""
        fields_ = self.to_dict()
        if kv_block is not None:
            fields_["kv_block"] = kv_block
        return fa_plan.FlashAttentionConfig(**fields_)


@dataclass(frozen=True)
class FlashAttentionVarlenBwdConfig(TunableConfig):
    """The backward kernel's choices that change a packed run's schedule most (the rest at
    :class:`~.flash_attention_bwd.FlashAttentionBwdConfig`'s defaults)."""

    op_name = BWD_OP

    tile_k: int = _bhsd_tunable(fab_plan.FlashAttentionBwdConfig, "tile_k", (64, 128))
    q_block: int = _bhsd_tunable(fab_plan.FlashAttentionBwdConfig, "q_block", (4, 16))
    loop_order: str = _bhsd_tunable(
        fab_plan.FlashAttentionBwdConfig, "loop_order", ("kv_outer", "q_outer")
    )

    def bhsd(self) -> fab_plan.FlashAttentionBwdConfig:
        """The BHSD backward's config with these fields, its defaults elsewhere."""
        return fab_plan.FlashAttentionBwdConfig(**self.to_dict())


# -- packing: identity, per-row key bounds, the BHSD problem --------------------------------


def same_packing(cu_seqlens_q, cu_seqlens_k) -> bool:
    """True when the two are one tensor (self-attention packing): an identity check (the
    same object, or the same memory, shape and strides), never a read of the values."""
    if cu_seqlens_q is cu_seqlens_k:
        return True
    a, b = cu_seqlens_q, cu_seqlens_k
    if any(
        type(t) is not torch.Tensor or torch._is_functional_tensor(t) or t.device.type == "meta"
        for t in (a, b)
    ):  # fake, functional (a compile trace) or meta tensors have no data pointer to compare
        return False
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and tuple(a.shape) == tuple(b.shape)
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
    )


def row_key_bounds(cu_seqlens_q, cu_seqlens_k, total_q: int, causal: bool):
    """``(lo, hi)`` int64 ``[total_q]`` on the tensors' device: packed query row ``i`` sees
    the packed keys ``lo[i] <= j < hi[i]`` (none when ``hi <= lo``). Torch ops only, no host
    read: the row's sequence ``s = searchsorted(cu_q[1:], i, right=True)`` (zero-length
    sequences are skipped over), ``lo = cu_k[s]``, ``hi = cu_k[s + 1]``, causal (bottom-right)
    ``hi = min(hi, i - cu_q[s + 1] + cu_k[s + 1] + 1)``."""
    cu_q, cu_k = cu_seqlens_q.long(), cu_seqlens_k.long()
    rows = torch.arange(total_q, device=cu_q.device, dtype=torch.long)
    seq = torch.searchsorted(cu_q[1:], rows, right=True)
    seq = seq.clamp(max=max(cu_q.shape[0] - 2, 0))  # rows past the last sequence: contract
    lo, hi = cu_k[seq], cu_k[seq + 1]
    if causal:
        hi = torch.minimum(hi, rows - cu_q[seq + 1] + hi + 1)
    return lo, hi


def tile_bounds(lo, hi, q_tile: int) -> torch.Tensor:
    """The kernels' ``kv_bounds``: ``[q_tile, query tiles, 2]`` float32, row ``p`` of tile
    ``t`` holding query ``t * q_tile + p``'s ``(lo, hi)`` (exact in fp32 below 2^24); rows
    past ``total_q`` see nothing (``lo = hi = 0``). One DMA puts it in SBUF."""
    total_q = lo.shape[0]
    tiles = -(-total_q // q_tile)
    both = torch.zeros(tiles * q_tile, 2, dtype=torch.float32, device=lo.device)
    both[:total_q, 0] = lo.float()
    both[:total_q, 1] = hi.float()
    return both.reshape(tiles, q_tile, 2).permute(1, 0, 2).contiguous()


def bhsd_problem(problem: dict) -> dict:
    """The BHSD kernels' problem for a varlen ``problem``: the packed batch as one sequence
    (``b = 1``, ``sq = total_q``, ``sk = total_k``, no causal flag: causality is in the
    run-time bounds), ``packed`` rows, ``runtime_bounds``, and under self-attention packing
    the band ``(m - 1, m - 1)`` (causal ``(m - 1, 0)``), ``m`` the smaller max_seqlen, as a
    sliding window: tiles outside it are skipped at trace time."""
    left = right = -1
    same = problem.get("same_packing") and problem["total_q"] == problem["total_k"]
    if same:
        m = min(problem["max_q"], problem["max_k"])
        left = max(m - 1, 0)
        right = 0 if problem.get("causal") else left
    out = {
        "b": 1,
        "sq": problem["total_q"],
        "sk": problem["total_k"],
        "d": problem["d"],
        "causal": False,
        "window_left": left,
        "window_right": right,
        "softcap": 0.0,
        "sinks": False,
        "packed": True,
        "runtime_bounds": True,
    }
    if "groups" in problem:  # the backward's
        return {**out, "hkv": problem["hkv"], "groups": problem["groups"]}
    return {**out, "h": problem["h"], "hkv": problem["hkv"], "scale": problem.get("scale")}


def _check_total_k(op: str, problem: dict) -> None:
    if problem["total_k"] >= MAX_TOTAL_K:
        raise LimitError(
            op,
            "total_k",
            f"must be < 2^24 = {MAX_TOTAL_K} (key positions compared in fp32 on the device)",
            problem["total_k"],
            limit=MAX_TOTAL_K,
        )


def plan_fwd(problem: dict, dtype: str, config, target: Target, lnc: int = 1):
    """The BHSD forward's plan for the packed batch (:func:`bhsd_problem`). ``kv_block=0``:
    every key resident (one block: the two-pass softmax runs) when that plan fits one
    core's SBUF and PSUM, else blocks of 4096 keys (the BHSD default)."""
    _check_total_k(FWD_OP, problem)
    bhsd = bhsd_problem(problem)
    if config.kv_block == 0:
        resident = fa_plan.plan(bhsd, dtype, config.bhsd(bhsd["sk"]), target, lnc)
        fits = resident.sbuf_bytes <= target.sbuf_usable_bytes
        if fits and resident.psum_banks <= usable_psum_banks(target):
            return resident
        return fa_plan.plan(bhsd, dtype, config.bhsd(RESIDENT_FALLBACK), target, lnc)
    return fa_plan.plan(bhsd, dtype, config.bhsd(), target, lnc)


def plan_bwd(problem: dict, dtype: str, config, target: Target, lnc: int = 1):
    """The BHSD backward's plan for the packed batch (:func:`bhsd_problem`)."""
    _check_total_k(BWD_OP, problem)
    return fab_plan.plan(bhsd_problem(problem), dtype, config.bhsd(), target, lnc)


# -- validation --------------------------------------------------------------------------


def _is_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _concrete_cpu(t) -> bool:
    """A plain CPU tensor whose values can be read: not a fake, functional or traced tensor
    of a ``torch.compile``/export trace (no fake, proxy or functional mode active)."""
    if t.device.type != "cpu" or type(t) is not torch.Tensor:
        return False
    if torch._is_functional_tensor(t):
        return False
    modes = torch._C._TorchDispatchModeKey
    return all(torch._C._get_dispatch_mode(m) is None for m in (modes.FAKE, modes.PROXY))


def validate_varlen(
    op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale
) -> None:
    """Refuse bad varlen input before any work, naming the argument and the value.

    Checks: q, k, v tensors of rank 3 (``[total, heads, D]``), the head dim agreeing and
    within ``[1, MAX_HEAD_DIM]``, k and v agreeing on ``(total_k, Hkv)``, ``H % Hkv == 0``,
    dtypes (one of :data:`DTYPES`, all equal), one device; ``cu_seqlens_q``/``_k`` int32
    tensors of rank 1 with at least one entry, of equal length, on q's device;
    ``max_seqlen_*`` ints >= 0; ``causal`` a bool; ``softmax_scale`` None or finite. On CPU
    also the values: each ``cu_seqlens`` starts at 0, never decreases and ends at its total,
    and ``max_seqlen_*`` is at least the longest sequence (a host read; on a Neuron device
    these are the caller's contract).

    Raises:
        LimitError: with ``op`` and ``arg`` naming the argument at fault.
    """
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(op, arg, "must be a torch.Tensor", type(t).__name__)
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise LimitError(
                op, f"{arg} rank", "must be 3 ([total, heads, D], packed rows)", t.dim(), limit=3
            )
    d = q.shape[2]
    for arg, t in (("k", k), ("v", v)):
        if t.shape[2] != d:
            raise LimitError(
                op, f"{arg}.shape[2]", f"must equal q's head dim ({d})", t.shape[2], limit=d
            )
    if not 1 <= d <= attn_contract.MAX_HEAD_DIM:
        raise LimitError(
            op,
            "head dim",
            f"must be in [1, {attn_contract.MAX_HEAD_DIM}]",
            d,
            limit=attn_contract.MAX_HEAD_DIM,
        )
    if v.shape[0] != k.shape[0]:
        raise LimitError(
            op, "v.shape[0]", f"must equal k's total ({k.shape[0]})", v.shape[0], limit=k.shape[0]
        )
    if v.shape[1] != k.shape[1]:
        raise LimitError(
            op,
            "v.shape[1]",
            f"must equal k's KV heads ({k.shape[1]})",
            v.shape[1],
            limit=k.shape[1],
        )
    h, hkv = q.shape[1], k.shape[1]
    if hkv == 0 or h % hkv:
        raise LimitError(
            op, "k.shape[1]", f"must divide q's heads ({h}): H % Hkv == 0", hkv, limit=h
        )
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if dtype_name(t) not in DTYPES:
            raise LimitError(
                op, f"{arg} dtype", f"must be one of {DTYPES}", dtype_name(t), limit=DTYPES
            )
    for arg, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise LimitError(op, f"{arg} dtype", f"must equal q's ({dtype_name(q)})", dtype_name(t))
        if t.device != q.device:
            raise LimitError(op, f"{arg} device", f"must equal q's ({q.device})", str(t.device))
    _validate_cu_seqlens(op, q, cu_seqlens_q, cu_seqlens_k)
    for arg, m in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if not _is_int(m) or m < 0:
            raise LimitError(op, arg, "must be an int >= 0", repr(m), limit=0)
    if not isinstance(causal, bool):
        raise LimitError(op, "causal", "must be a bool", repr(causal))
    if softmax_scale is not None and not (
        isinstance(softmax_scale, (int, float))
        and not isinstance(softmax_scale, bool)
        and math.isfinite(softmax_scale)
    ):
        raise LimitError(op, "softmax_scale", "must be None or a finite float", softmax_scale)
    _validate_values(op, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)


def _validate_cu_seqlens(op, q, cu_q, cu_k) -> None:
    for arg, t in (("cu_seqlens_q", cu_q), ("cu_seqlens_k", cu_k)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(op, arg, "must be a torch.Tensor", type(t).__name__)
        if t.dim() != 1:
            raise LimitError(op, f"{arg} rank", "must be 1 ([n + 1])", t.dim(), limit=1)
        if t.dtype != torch.int32:
            raise LimitError(op, f"{arg} dtype", "must be int32", dtype_name(t), limit="int32")
        if t.shape[0] < 1:
            raise LimitError(op, f"{arg} shape", "must have n + 1 >= 1 entries", tuple(t.shape))
        if t.device != q.device:
            raise LimitError(op, f"{arg} device", f"must equal q's ({q.device})", str(t.device))
    if cu_k.shape[0] != cu_q.shape[0]:
        raise LimitError(
            op,
            "cu_seqlens_k shape",
            f"must equal cu_seqlens_q's ({tuple(cu_q.shape)}): one entry per sequence + 1",
            tuple(cu_k.shape),
        )


def _validate_values(op, q, k, cu_q, cu_k, max_q, max_k) -> None:
    """The checks that read ``cu_seqlens`` values: CPU tensors only (no device sync)."""
    if not (_concrete_cpu(cu_q) and _concrete_cpu(cu_k)):
        return
    for arg, cu, total, m, m_arg in (
        ("cu_seqlens_q", cu_q, q.shape[0], max_q, "max_seqlen_q"),
        ("cu_seqlens_k", cu_k, k.shape[0], max_k, "max_seqlen_k"),
    ):
        values = cu.tolist()
        if values[0] != 0:
            raise LimitError(op, f"{arg} values", "must start at 0", values[0], limit=0)
        lengths = [b - a for a, b in zip(values, values[1:])]
        if any(n < 0 for n in lengths):
            raise LimitError(op, f"{arg} values", "must be non-decreasing", values)
        if values[-1] != total:
            raise LimitError(
                op,
                f"{arg} values",
                f"must end at the total rows ({total})",
                values[-1],
                limit=total,
            )
        longest = max(lengths, default=0)
        if _is_int(m) and m < longest:
            raise LimitError(
                op, m_arg, f"must be >= the longest sequence ({longest})", m, limit=longest
            )


# -- references -------------------------------------------------------------------------


def _sequences(cu_q, cu_k):
    """``[(q0, q1, k0, k1), ...]`` per sequence (a host read of the boundaries)."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    return [(cq[s], cq[s + 1], ck[s], ck[s + 1]) for s in range(len(cq) - 1)]


def _bhsd(x):
    """``[L, heads, D]`` rows -> ``[1, heads, L, D]``."""
    return x.transpose(0, 1).unsqueeze(0)


def reference_fwd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    softmax_scale=None,
    upcast=True,
):
    """``(out [total_q, H, D], lse [H, total_q])``: :func:`~.flash_attention.attention_reference`
    on each sequence (its own BHSD problem: causal bottom-right within it, a row that sees
    no key gives 0 and -inf). fp64 when ``upcast``, else out in q's dtype and fp32 lse.
    Rows outside every sequence (none, by the contract) stay 0 / -inf."""
    total_q, h, d = q.shape
    compute = torch.float64 if upcast else torch.float32
    outs, lses = [], []
    for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
        o, lse = attn_contract.attention_reference(
            _bhsd(q[q0:q1]), _bhsd(k[k0:k1]), _bhsd(v[k0:k1]), causal, softmax_scale, upcast=upcast
        )
        outs.append(o[0].transpose(0, 1))
        lses.append(lse[0])
    if not outs or sum(o.shape[0] for o in outs) != total_q:
        # zeros, differentiable in q, k and v (zero gradients), as a BHSD problem with no key
        out = q.to(compute) * 0.0 + (k.to(compute).sum() + v.to(compute).sum()) * 0.0
        lse = torch.full((h, total_q), float("-inf"), dtype=compute, device=q.device)
        if outs:
            out[: sum(o.shape[0] for o in outs)] = torch.cat(outs, 0).to(compute)
    else:
        out, lse = torch.cat(outs, 0), torch.cat(lses, 1)
    if not upcast:
        out, lse = out.to(q.dtype), lse.to(torch.float32)
    return out, lse


def reference(q, k, v, cu_q, cu_k, max_q, max_k, causal=False, softmax_scale=None, upcast=True):
    """``out``: the first output of :func:`reference_fwd`."""
    return reference_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, upcast)[0]


def reference_bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    softmax_scale=None,
    upcast=True,
):
    """``(dq, dk, dv)``: the BHSD backward's closed form
    (:func:`~.flash_attention_bwd.reference`) on each sequence, from the given out and lse.
    fp64 when ``upcast``, else in the inputs' dtypes."""
    compute = torch.float64 if upcast else torch.float32
    dq = torch.zeros(q.shape, dtype=compute, device=q.device)
    dk = torch.zeros(k.shape, dtype=compute, device=q.device)
    dv = torch.zeros(v.shape, dtype=compute, device=q.device)
    for q0, q1, k0, k1 in _sequences(cu_seqlens_q, cu_seqlens_k):
        if q1 == q0 or k1 == k0:
            continue
        g = fab.reference(
            _bhsd(dout[q0:q1]),
            _bhsd(q[q0:q1]),
            _bhsd(k[k0:k1]),
            _bhsd(v[k0:k1]),
            _bhsd(out[q0:q1]),
            lse[:, q0:q1].unsqueeze(0),
            causal,
            softmax_scale,
            upcast=True,
        )
        dq[q0:q1] = g[0][0].transpose(0, 1).to(compute)
        dk[k0:k1] = g[1][0].transpose(0, 1).to(compute)
        dv[k0:k1] = g[2][0].transpose(0, 1).to(compute)
    if not upcast:
        dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    return dq, dk, dv


# -- op glue: problems, launches ----------------------------------------------------------


def problem_fwd(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    softmax_scale=None,
) -> dict:
    """Sizes (shape syntax ``NxTOTALQxTOTALKxHxHKVxDxMAXQxMAXK``: sequences, packed rows,
    heads, head dim, max_seqlen), then ``causal``, ``same_packing`` (``cu_seqlens_q`` is
    ``cu_seqlens_k``: the band is skipped at trace time) and the softmax ``scale``."""
    total_q, h, d = q.shape
    return {
        "n": cu_seqlens_q.shape[0] - 1,
        "total_q": total_q,
        "total_k": k.shape[0],
        "h": h,
        "hkv": k.shape[1],
        "d": d,
        "max_q": int(max_seqlen_q),
        "max_k": int(max_seqlen_k),
        "causal": bool(causal),
        "same_packing": same_packing(cu_seqlens_q, cu_seqlens_k),
        "scale": softmax_scale,
    }


def problem_bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    softmax_scale=None,
) -> dict:
    """Sizes (``NxTOTALQxTOTALKxHKVxGROUPSxDxMAXQxMAXK``), ``causal``, ``same_packing``."""
    p = problem_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal)
    hkv = p["hkv"]
    return {
        "n": p["n"],
        "total_q": p["total_q"],
        "total_k": p["total_k"],
        "hkv": hkv,
        "groups": p["h"] // hkv if hkv else 0,
        "d": p["d"],
        "max_q": p["max_q"],
        "max_k": p["max_k"],
        "causal": p["causal"],
        "same_packing": p["same_packing"],
    }


def _bounds_for(cu_q, cu_k, total_q, causal, q_tile):
    """``(kv_bounds, live [total_q] bool)``: the kernels' bounds and the rows that see a key."""
    lo, hi = row_key_bounds(cu_q, cu_k, total_q, causal)
    return tile_bounds(lo, hi, q_tile), hi > lo


def _forward(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, config, runner):
    total_q, h, d = q.shape
    total_k = k.shape[0]
    if total_q == 0 or h == 0 or total_k == 0 or cu_q.shape[0] < 2:
        out = torch.zeros_like(q)
        lse = torch.full((h, total_q), float("-inf"), dtype=torch.float32, device=q.device)
        return out, lse
    prob = problem_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale)
    tiles = FWD_SPEC.check(prob, dtype_name(q), config, runner.target, runner_lnc(runner))
    kv_bounds, live = _bounds_for(cu_q, cu_k, total_q, causal, tiles.q_tile)
    out, lse = runner(
        fa_kernel.flash_attention_fwd_kernel[tiles.lnc],
        q.contiguous().unsqueeze(0),
        k.contiguous().unsqueeze(0),
        v.contiguous().unsqueeze(0),
        None,  # sinks
        tiles,
        kv_bounds,
    )
    # Rows that see no key: 0 and -inf (the kernel's max over only masked scores is the
    # fill, so its finite result there is replaced, on the device, without a sync).
    out = torch.where(live[:, None, None], out.reshape(total_q, h, d), 0.0).to(q.dtype)
    lse = torch.where(live[None, :], lse.reshape(h, total_q), float("-inf"))
    return out, lse


def run_kernels_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    config: FlashAttentionVarlenConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [total_q, H, D], lse [H, total_q] fp32)`` for packed q, k, v."""
    return _forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        softmax_scale,
        config,
        runner,
    )


def run_kernels(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    config: FlashAttentionVarlenConfig,
    runner,
) -> torch.Tensor:
    """``out [total_q, H, D]`` for packed q, k, v."""
    return _forward(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal,
        softmax_scale,
        config,
        runner,
    )[0]


def run_kernels_bwd(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    softmax_scale: float | None = None,
    *,
    config: FlashAttentionVarlenBwdConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` in the packed layout; an empty size gives zeros without a launch."""
    total_q, h, d = q.shape
    total_k = k.shape[0]
    if total_q == 0 or h == 0 or total_k == 0 or cu_seqlens_q.shape[0] < 2:
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale)
    prob = problem_bwd(dout, q, k, v, out, lse, *args)
    tiles = BWD_SPEC.check(prob, dtype_name(q), config, runner.target, runner_lnc(runner))
    kv_bounds, live = _bounds_for(cu_seqlens_q, cu_seqlens_k, total_q, causal, tiles.tile_q)
    # A row that sees no key has lse = -inf: a finite stand-in makes its masked P exactly 0.
    lse_k = torch.where(live[None, :], lse, 0.0).unsqueeze(0).contiguous()
    outs = runner(
        fab_kernel.flash_attention_bwd_kernel[tiles.lnc],
        dout.contiguous().unsqueeze(0),
        q.contiguous().unsqueeze(0),
        k.contiguous().unsqueeze(0),
        v.contiguous().unsqueeze(0),
        out.contiguous().unsqueeze(0),
        lse_k,
        None,  # sinks
        attn_contract.resolve_scale(softmax_scale, d),
        tiles,
        kv_bounds,
    )
    dq, dk, dv = outs[0][0], outs[1][0], outs[2][0]
    if tiles.split_groups:  # KV heads split over the cores: their fp32 partials, added in
        # core order and rounded once (as the BHSD op does)
        split = [kvh for _, kvh, _, slot in tiles.core_groups[0] if slot >= 0]
        for slot, kvh in enumerate(split):
            dk_sum, dv_sum = outs[3][0, slot], outs[4][0, slot]
            for c in range(1, tiles.lnc):
                dk_sum, dv_sum = dk_sum + outs[3][c, slot], dv_sum + outs[4][c, slot]
            dk[:, kvh] = dk_sum.to(dk.dtype)
            dv[:, kvh] = dv_sum.to(dv.dtype)
    return dq, dk, dv


def output_shapes_fwd(q, k, v, *rest) -> list:
    """``out`` as q, ``lse [H, total_q]`` float32 (no host read: fake impls use it)."""
    return [(tuple(q.shape), q.dtype), ((q.shape[1], q.shape[0]), torch.float32)]


def output_shapes(q, k, v, *rest) -> list:
    return output_shapes_fwd(q, k, v)[:1]


def output_shapes_bwd(dout, q, k, v, *rest) -> list:
    return [(tuple(t.shape), t.dtype) for t in (q, k, v)]


# -- inputs, tolerances, test problems ---------------------------------------------------


def _draw_lengths(n: int, total: int, longest: int, generator) -> tuple[list, int]:
    """``n`` lengths summing to ``total``, each at most ``max(longest, ceil(total / n))``
    (the bound returned), drawn by ``n - 1`` uniform cuts of ``[0, total]`` (so zero-length
    and one-row sequences occur), then the excess of a too-long one moved on to the next
    sequences with room. Host ints (drawn on CPU even under ``torch.device("meta")``)."""
    if n == 0:
        return [], longest
    bound = max(longest, -(-total // n))
    cuts = torch.randint(0, total + 1, (n - 1,), generator=generator, device="cpu")
    edges = [0, *sorted(cuts.tolist()), total]
    lengths = [b - a for a, b in zip(edges, edges[1:])]
    excess = 0
    for _ in range(2):  # one more lap carries what the last sequences could not take
        for i in range(n):
            lengths[i] += excess
            excess = max(0, lengths[i] - bound)
            lengths[i] -= excess
    return lengths, bound


def _cu(lengths) -> torch.Tensor:
    edges = [0]
    for n in lengths:
        edges.append(edges[-1] + n)
    return torch.tensor(edges, dtype=torch.int32)


def draw_packing(problem: dict, generator) -> tuple:
    """``(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)`` for ``problem``: ``n``
    sequences (at least one when a total is positive) of lengths summing to ``total_q`` /
    ``total_k``, none above ``max_q`` / ``max_k`` (raised to ``ceil(total / n)`` when the
    problem's maximum cannot hold the total). With ``same_packing``, k shares q's packing:
    the same tensor (``total_k = total_q``)."""
    n, tq, tk = problem["n"], problem["total_q"], problem["total_k"]
    same = bool(problem.get("same_packing"))
    if same:
        tk = tq
    if n == 0 and (tq or tk):
        n = 1
    lq, max_q = _draw_lengths(n, tq, problem["max_q"], generator)
    cu_q = _cu(lq)
    if same:
        return cu_q, cu_q, max_q, max(max_q, problem["max_k"])
    lk, max_k = _draw_lengths(n, tk, problem["max_k"], generator)
    return cu_q, _cu(lk), max_q, max_k


def make_inputs_fwd(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """q, k, v ~ N(0, 1) in ``dtype`` (packed rows), a packing (:func:`draw_packing`),
    causal; H rounded down to a multiple of Hkv (at least Hkv)."""
    cu_q, cu_k, max_q, max_k = draw_packing(problem, generator)
    tq = problem["total_q"]
    tk = tq if problem.get("same_packing") else problem["total_k"]
    hkv, d = problem["hkv"], problem["d"]
    h = max(hkv, problem["h"] - problem["h"] % hkv) if hkv else problem["h"]
    t = getattr(torch, dtype)
    q = torch.randn(tq, h, d, generator=generator).to(t)
    k = torch.randn(tk, hkv, d, generator=generator).to(t)
    v = torch.randn(tk, hkv, d, generator=generator).to(t)
    causal = bool(problem.get("causal", False))
    return q, k, v, cu_q, cu_k, max_q, max_k, causal, problem.get("scale")


def make_inputs_bwd(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """``(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, None)``: as the forward's
    inputs, dout ~ N(0, 1), out and lse from the fp64 reference (out rounded to ``dtype``)."""
    fwd = {**problem, "h": problem["hkv"] * problem["groups"]}
    q, k, v, cu_q, cu_k, max_q, max_k, causal, _ = make_inputs_fwd(fwd, dtype, generator)
    dout = torch.randn(q.shape, generator=generator).to(q.dtype)
    if q.device.type == "meta":
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32)
    else:
        o, lse = reference_fwd(q, k, v, cu_q, cu_k, max_q, max_k, causal, None, upcast=True)
    return dout, q, k, v, o.to(q.dtype), lse.float(), cu_q, cu_k, max_q, max_k, causal, None


def shape_bucket(problem: dict) -> str:
    """Totals and maxima as :func:`.spec.bucket_size` rounds them, exact H, Hkv and D
    (they fix the kernels' loops), causal and same_packing (they fix which tiles are
    traced); the number of sequences and the scale change no tile."""

    dims = [f"tq{bucket_size(problem['total_q'])}", f"tk{bucket_size(problem['total_k'])}"]
    if "groups" in problem:
        dims += [f"hkv{problem['hkv']}", f"groups{problem['groups']}"]
    else:
        dims += [f"h{problem['h']}", f"hkv{problem['hkv']}"]
    dims += [
        f"d{problem['d']}",
        f"mq{bucket_size(problem['max_q'])}",
        f"mk{bucket_size(problem['max_k'])}",
    ]
    flags = f"causal{str(bool(problem.get('causal'))).lower()}"
    flags += f"_same{str(bool(problem.get('same_packing'))).lower()}"
    return "_".join(dims) + "_" + flags


def kv_group_slice_fwd(problem: dict, lnc: int = 1) -> tuple[dict, int]:
    """``lnc`` KV groups (one per core) and how many such slices the launch runs: the packed
    batch is one BHSD batch, so its ``Hkv`` groups share nothing but the cores (as
    :func:`~.flash_attention.kv_group_slice` at B = 1)."""
    h, hkv = problem["h"], problem["hkv"]
    if hkv % lnc:
        return problem, 1
    return {**problem, "h": lnc * (h // hkv), "hkv": lnc}, hkv // lnc


def kv_group_slice_bwd(problem: dict, lnc: int = 1) -> tuple[dict, int]:
    """As :func:`kv_group_slice_fwd` for the backward's problem (Hkv groups of ``groups``)."""
    if problem["hkv"] % lnc:
        return problem, 1
    return {**problem, "hkv": lnc}, problem["hkv"] // lnc


def _validator(op):
    def validate(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
        softmax_scale=None,
    ) -> None:  # fmt: skip
        validate_varlen(
            op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
            softmax_scale,
        )  # fmt: skip

    validate.__doc__ = f"Refuse bad {op} input before any work (:func:`validate_varlen`)."
    return validate


def validate_bwd(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal=False,
    softmax_scale=None,
) -> None:
    """The forward's checks on (q, k, v, packing), then dout and out shaped, typed and
    placed as q, and lse ``[H, total_q]`` float32 on q's device."""
    validate_varlen(
        BWD_OP, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
        softmax_scale,
    )  # fmt: skip
    fab.validate_saved(BWD_OP, q, dout, out, lse, (q.shape[1], q.shape[0]), "[H, total_q]")


def _bad_inputs(op):
    def bad_inputs():
        """One bad input per op-boundary limit: (args, the argument the error must name)."""
        f = torch.zeros
        q, kv = f(7, 4, 16), f(5, 2, 16)
        cq, ck = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 0, 5]).int()

        def a(**over):
            base = {"q": q, "k": kv, "v": kv, "cu_q": cq, "cu_k": ck, "max_q": 4, "max_k": 5}
            base.update(over)
            return tuple(base.values())

        return [
            (a(q=f(1, 7, 4, 16)), "q rank"),
            (a(k=f(5, 32)), "k rank"),
            (a(v=f(1, 5, 2, 16)), "v rank"),
            (a(k=f(5, 2, 8)), "k.shape[2]"),
            (a(v=f(5, 2, 8)), "v.shape[2]"),
            (a(q=f(7, 4, 300), k=f(5, 2, 300), v=f(5, 2, 300)), "head dim"),
            (a(v=f(6, 2, 16)), "v.shape[0]"),
            (a(v=f(5, 1, 16)), "v.shape[1]"),
            (a(k=f(5, 3, 16), v=f(5, 3, 16)), "k.shape[1]"),
            (a(q=q.double(), k=kv.double(), v=kv.double()), "q dtype"),
            (a(k=kv.bfloat16()), "k dtype"),
            (a(v=kv.half()), "v dtype"),
            (a(v=f(5, 2, 16, device="meta")), "v device"),
            (a(cu_q=cq.reshape(1, 3)), "cu_seqlens_q rank"),
            (a(cu_k=ck.long()), "cu_seqlens_k dtype"),
            (a(cu_q=cq[:0], cu_k=ck[:0]), "cu_seqlens_q shape"),
            (a(cu_k=torch.tensor([0, 5], dtype=torch.int32)), "cu_seqlens_k shape"),
            (a(cu_q=cq.to("meta")), "cu_seqlens_q device"),
            (a(max_q=-1), "max_seqlen_q"),
            (a(max_k=-3), "max_seqlen_k"),
            (a(max_q=True), "max_seqlen_q"),
            ((*a(), False, float("inf")), "softmax_scale"),
            (a(cu_q=torch.tensor([1, 3, 7], dtype=torch.int32)), "cu_seqlens_q values"),
            (a(cu_k=torch.tensor([0, 5, 4], dtype=torch.int32)), "cu_seqlens_k values"),
            (a(cu_q=torch.tensor([0, 3, 6], dtype=torch.int32)), "cu_seqlens_q values"),
            (a(max_q=3), "max_seqlen_q"),
            (a(max_k=4), "max_seqlen_k"),
        ]

    return bad_inputs


def _bad_inputs_bwd():
    """The forward's cases (with a valid dout, out, lse), then the backward's own."""
    f = torch.zeros
    cases = []
    for args, arg in _bad_inputs(BWD_OP)():
        q = args[0]
        heads = q.shape[1] if q.dim() == 3 else 4
        grads = (f(q.shape, dtype=q.dtype), q, *args[1:3], f(q.shape, dtype=q.dtype))
        lse = f(heads, q.shape[0])
        cases.append(((*grads, lse, *args[3:]), arg))
    q, kv = f(7, 4, 16), f(5, 2, 16)
    cq, ck = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 0, 5]).int()
    rest = (cq, ck, 4, 5)

    def b(dout=None, out=None, lse=None):
        dout = f(7, 4, 16) if dout is None else dout
        out = f(7, 4, 16) if out is None else out
        lse = f(4, 7) if lse is None else lse
        return (dout, q, kv, kv, out, lse, *rest)

    cases += [
        (b(dout=f(7, 4, 8)), "dout shape"),
        (b(out=f(7, 4, 16, dtype=torch.bfloat16)), "out dtype"),
        (b(lse=f(7, 4)), "lse shape"),
        (b(lse=f(4, 7, dtype=torch.bfloat16)), "lse dtype"),
        (b(lse=f(4, 7, device="meta")), "lse device"),
    ]
    return cases


def composite(
    q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
    softmax_scale=None,
):  # fmt: skip
    """The public op as torch runs it: the forward's ``out``; autograd saves its ``lse``."""
    return torch.ops.neuron.flash_attention_varlen_fwd(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, softmax_scale
    )[0]


def _setup_context(
    ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
    softmax_scale, output,
):  # fmt: skip
    out, lse = output
    ctx.same = same_packing(cu_seqlens_q, cu_seqlens_k)  # kept: unpacking may not keep identity
    ctx.max_seqlen = (max_seqlen_q, max_seqlen_k)
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    """dq, dk, dv from the backward op with the forward's saved out and lse (``lse`` is
    non-differentiable); the packing passed on as one tensor when it was one."""
    q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
    nothing = (None,) * 6
    if q.numel() == 0 or k.numel() == 0:
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), *nothing)
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv = torch.ops.neuron.flash_attention_varlen_bwd(
        grad_out.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        cu_q,
        cu_q if ctx.same else cu_k,
        *ctx.max_seqlen,
        ctx.causal,
        ctx.softmax_scale,
    )
    return (dq, dk, dv, *nothing)


_PROBE = {
    "n": 3,
    "total_q": 200,
    "total_k": 200,
    "h": 2,
    "hkv": 1,
    "d": 40,
    "max_q": 100,
    "max_k": 100,
    "causal": True,
    "same_packing": True,
}

_TEST_PROBLEMS = {
    # causal and same_packing drawn as 0/1 (make_inputs takes their truth); a packing is
    # drawn per example (draw_packing), zero-length sequences included
    "ranges": {
        "n": (1, 4),
        "total_q": (1, 300),
        "total_k": (1, 300),
        "h": (1, 4),
        "hkv": (1, 2),
        "d": (1, 136),
        "max_q": (1, 160),
        "max_k": (1, 160),
        "causal": (0, 1),
        "same_packing": (0, 1),
    },
    "edges": (1, 2, 127, 128, 129),
    # every config runs here: GQA, the trace-time band (same packing, causal), remainder
    # tiles, D not a power of two
    "probe": _PROBE,
    # budgets bind here (trace-only): a long packed key axis at the widest head (no band)
    "large": {
        **_PROBE,
        "n": 2,
        "total_q": 256,
        "total_k": 8192,
        "d": 256,
        "max_q": 128,
        "max_k": 4096,
        "causal": False,
        "same_packing": False,
    },
    # empty sizes the op accepts: no sequence, no query row, no key row
    "empty": [
        {**_PROBE, "n": 0, "total_q": 0, "total_k": 0, "same_packing": False},
        {**_PROBE, "total_q": 0, "same_packing": False},
        {**_PROBE, "total_k": 0, "causal": False, "same_packing": False},
    ],
}

_BWD_PROBE = {**{k: v for k, v in _PROBE.items() if k != "h"}, "groups": 2}
_BWD_TEST_PROBLEMS = {
    "ranges": {
        **{k: v for k, v in _TEST_PROBLEMS["ranges"].items() if k != "h"},
        "groups": (1, 3),
    },
    "edges": _TEST_PROBLEMS["edges"],
    "probe": {
        "n": 3,
        "total_q": 200,
        "total_k": 200,
        "hkv": 1,
        "groups": 2,
        "d": 40,
        "max_q": 100,
        "max_k": 100,
        "causal": True,
        "same_packing": True,
    },
    # budgets bind here (trace-only): a long packed query axis (q_block passes) at D = 256
    "large": {
        **_BWD_PROBE,
        "n": 2,
        "total_q": 8192,
        "total_k": 256,
        "groups": 1,
        "d": 256,
        "max_q": 4096,
        "max_k": 128,
        "causal": False,
        "same_packing": False,
    },
}

_COMMITTED = (
    (
        "8x8192x8192x32x8x128x1024x1024:causal:same_packing",
        "bfloat16",
        "8 sequences of up to 1024 tokens packed to 8192, Llama-3-8B attention",
    ),
)
_COMMITTED_BWD = (
    (
        "8x8192x8192x8x4x128x1024x1024:causal:same_packing",
        "bfloat16",
        "8 sequences of up to 1024 tokens packed to 8192, Llama-3-8B attention",
    ),
)

_BUDGET_HINTS = {"sbuf": "lower kv_block (K/V rows held in SBUF) or k_tile"}

FWD_SPEC = register(
    OpSpec(
        name=FWD_OP,
        config=FlashAttentionVarlenConfig,
        plan=plan_fwd,
        run_kernels=run_kernels_fwd,
        reference=reference_fwd,
        validate=_validator(FWD_OP),
        problem=problem_fwd,
        tolerances=fa.FWD_SPEC.tolerances,
        make_inputs=make_inputs_fwd,
        test_problems=_TEST_PROBLEMS,
        output_shapes=output_shapes_fwd,
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice_fwd,
        kernels=(fa_kernel.flash_attention_fwd_kernel,),
        autograd=(_setup_context, _backward),
        bad_inputs=_bad_inputs(FWD_OP),
        budget_hints=_BUDGET_HINTS,
        committed_shapes=_COMMITTED,
        description="Packed (varlen) flash attention forward, (out, lse [H, total_q]); its "
        "autograd calls flash_attention_varlen_bwd",
    )
)

SPEC = register(
    OpSpec(
        name=OP,
        config=FlashAttentionVarlenConfig,
        plan=plan_fwd,
        run_kernels=run_kernels,
        reference=reference,
        validate=_validator(OP),
        problem=problem_fwd,
        tolerances=fa.FWD_SPEC.tolerances,
        make_inputs=make_inputs_fwd,
        test_problems=_TEST_PROBLEMS,
        output_shapes=output_shapes,
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice_fwd,
        kernels=(fa_kernel.flash_attention_fwd_kernel,),
        composite=composite,
        bad_inputs=_bad_inputs(OP),
        budget_hints=_BUDGET_HINTS,
        committed_shapes=_COMMITTED,
        description="Packed (varlen) flash attention, FlashAttention's flash_attn_varlen_func: "
        "q [total_q, H, D], k/v [total_k, Hkv, D], cu_seqlens int32, causal per sequence; "
        "composite over flash_attention_varlen_fwd",
    )
)

BWD_SPEC = register(
    OpSpec(
        name=BWD_OP,
        config=FlashAttentionVarlenBwdConfig,
        plan=plan_bwd,
        run_kernels=run_kernels_bwd,
        reference=reference_bwd,
        validate=validate_bwd,
        problem=problem_bwd,
        tolerances=fab.SPEC.tolerances,
        make_inputs=make_inputs_bwd,
        test_problems=_BWD_TEST_PROBLEMS,
        output_shapes=output_shapes_bwd,
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice_bwd,
        kernels=(fab_kernel.flash_attention_bwd_kernel,),
        bad_inputs=_bad_inputs_bwd,
        budget_hints=fab.SPEC.budget_hints,
        committed_shapes=_COMMITTED_BWD,
        description="(dq, dk, dv) of packed (varlen) attention from (dout, q, k, v, out, lse "
        "[H, total_q]) and the packing",
    )
)
