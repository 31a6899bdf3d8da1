"""The ``flash_attention_bwd`` op declaration: validation of the saved forward outputs, the
problem keys, the fp64 reference, the host wrapper (``run_kernels``), inputs and bad inputs.
The kernel is :mod:`.flash_attention_bwd_kernel`, its plan :mod:`.flash_attention_bwd_plan`.
"""

from __future__ import annotations

import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.kernels.attention_contract import (
    apply_attn_mask,
    attention_reference,
    bad_mask_dropout_inputs,
    draw_features,
    draw_mask_dropout,
    dropout_keep,
    feature_shape_parser,
    feature_suffix,
    kernel_mask,
    kernel_row_keys,
    mask_problem,
    resolve_scale,
    validate_attention,
    visible,
    window_bounds,
)
from neuron_kernels.kernels.flash_attention_bwd_kernel import flash_attention_bwd_kernel
from neuron_kernels.kernels.flash_attention_bwd_plan import OP, FlashAttentionBwdConfig, plan
from neuron_kernels.kernels.spec import (
    OpSpec,
    Tolerance,
    bucket_size,
    dtype_name,
    register,
    runner_lnc,
)

__all__ = [
    "SPEC",
    "kv_group_slice",
    "make_inputs",
    "problem",
    "reference",
    "run_kernels",
    "shape_bucket",
    "validate",
    "validate_saved",
]


def validate(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
) -> None:
    """Refuse bad op input before any work: the attention checks on (q, k, v) and the
    window, softcap, sinks, mask and dropout (the forward's seed required with
    ``dropout_p > 0``), then dout and out shaped, typed and placed as q, and lse
    ``[B, H, Sq]`` float32 on q's device."""
    validate_attention(
        OP, q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed,
    )  # fmt: skip
    validate_saved(OP, q, dout, out, lse, tuple(q.shape[:3]), "[B, H, Sq]")


def validate_saved(op, q, dout, out, lse, lse_shape: tuple, lse_layout: str) -> None:
    """The backward's checks on what the forward saved and the incoming gradient: ``dout``
    and ``out`` shaped, typed and placed as ``q``, ``lse`` of ``lse_shape`` (named
    ``lse_layout`` in the error) float32 on q's device (the BHSD and the varlen ops)."""
    for arg, t in (("dout", dout), ("out", out), ("lse", lse)):
        if not isinstance(t, torch.Tensor):
            raise LimitError(op, arg, "must be a torch.Tensor", type(t).__name__)
    for arg, t in (("dout", dout), ("out", out)):
        if tuple(t.shape) != tuple(q.shape):
            raise LimitError(
                op, f"{arg} shape", f"must equal q's shape {tuple(q.shape)}", tuple(t.shape)
            )
        if t.dtype != q.dtype:
            raise LimitError(
                op, f"{arg} dtype", f"must equal q's dtype ({dtype_name(q)})", dtype_name(t)
            )
    if tuple(lse.shape) != lse_shape:
        raise LimitError(op, "lse shape", f"must be {lse_layout} = {lse_shape}", tuple(lse.shape))
    if lse.dtype != torch.float32:
        raise LimitError(op, "lse dtype", "must be float32", dtype_name(lse))
    for arg, t in (("dout", dout), ("out", out), ("lse", lse)):
        if t.device != q.device:
            raise LimitError(
                op, f"{arg} device", f"must equal q's device ({q.device})", str(t.device)
            )


def problem(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
) -> dict:
    """Sizes (shape syntax ``BxHKVxGROUPSxSQxSKxD``), ``causal``, then the window's sides,
    ``softcap``, whether there are ``sinks``, the mask and dropout (as the forward's
    :func:`problem`)."""
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = h // hkv if hkv else 0
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return {
        "b": b,
        "hkv": hkv,
        "groups": groups,
        "sq": sq,
        "sk": sk,
        "d": d,
        "causal": causal,
        "window_left": left,
        "window_right": right,
        "softcap": float(softcap),
        "sinks": sinks is not None,
        **mask_problem(attn_mask, dropout_p),
    }


def shape_bucket(problem: dict) -> str:
    """As the forward's: B, Sq and Sk as :func:`.spec.bucket_size` rounds them, exact Hkv,
    groups and D (they fix the kernel's loops), causal, then
    :func:`feature_suffix`. (Hkv and groups used to be rounded up to 128 too, so every
    head count shared one bucket.)"""

    return (
        f"b{bucket_size(problem['b'])}_hkv{problem['hkv']}_groups{problem['groups']}"
        f"_sq{bucket_size(problem['sq'])}_sk{bucket_size(problem['sk'])}_d{problem['d']}"
        f"_causal{str(bool(problem.get('causal'))).lower()}" + feature_suffix(problem)
    )


def reference(
    dout,
    q,
    k,
    v,
    out,
    lse,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
    upcast=True,
):
    """``(dq, dk, dv, dsinks)`` in plain torch from the given ``out`` and ``lse`` (closed
    form): with ``C = softcap * tanh(scale * QK^T / softcap)`` (``scale * QK^T`` without a
    softcap), ``P = exp(C - lse)`` (0 where masked), ``dV = P^T dO``,
    ``dC = P * (dO V^T - D)`` with ``D = rowsum(dO * O)``, ``dS = dC * (1 - tanh^2)`` (``dC``
    without a softcap), ``dQ = scale * dS K``, ``dK = scale * dS^T Q``, dK and dV summed over
    the query heads of each KV head; ``dsinks_h = -sum_{b,i} exp(sink_h - lse) D`` (a row
    with ``lse = -inf`` adds 0: it sees nothing, its out and D are 0), in sinks' dtype, and
    an empty float32 tensor without sinks. ``attn_mask`` makes ``P`` 0 where it masks (and
    on rows it leaves with no key) and adds a float one to ``C``; dropout (the forward's
    keep mask ``Z = keep / (1 - p)``, :func:`dropout_keep`) gives ``dV = (P Z)^T dO`` and
    ``dC = P * (Z dO V^T - D)``.

    fp64 when ``upcast`` (fp64 outputs), else fp32 math with outputs in the inputs' dtype.
    """
    b, h, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    groups = h // hkv if hkv else 1
    scale = resolve_scale(softmax_scale, d)
    compute = torch.float64 if upcast else torch.float32
    qc = q.to(compute).reshape(b, hkv, groups, sq, d)
    doc = dout.to(compute).reshape(b, hkv, groups, sq, d)
    oc = out.to(compute).reshape(b, hkv, groups, sq, d)
    lsec = lse.to(compute).reshape(b, hkv, groups, sq, 1)
    kc = k.to(compute).unsqueeze(2)  # [B, Hkv, 1, Sk, D]: broadcast over the group
    vc = v.to(compute).unsqueeze(2)
    logits = torch.matmul(qc, kc.transpose(-1, -2)) * scale  # [B, Hkv, G, Sq, Sk]
    if softcap:
        capped = torch.tanh(logits / softcap)
        logits = softcap * capped
    # Fully masked rows (lse = -inf) see no key: any finite shift leaves their P at 0.
    shift = torch.where(torch.isinf(lsec), torch.zeros_like(lsec), lsec)
    left, right = window_bounds(causal, window)
    if attn_mask is None:
        p = torch.exp(logits - shift)
        if left >= 0 or right >= 0:
            p = p.masked_fill(~visible(sq, sk, causal, window, q.device), 0.0)
    else:  # -inf where masked (window, mask, rows left with no key): P = 0 there
        scores = logits
        if left >= 0 or right >= 0:
            scores = scores.masked_fill(~visible(sq, sk, causal, window, q.device), float("-inf"))
        p = torch.exp(apply_attn_mask(scores, attn_mask, b, hkv, groups, sq, sk) - shift)
    pz = p
    dp = torch.matmul(doc, vc.transpose(-1, -2))
    if dropout_p > 0:
        keep = dropout_keep(dropout_seed, dropout_p, b, h, sq, sk).reshape(p.shape)
        z = keep.to(compute) * (1.0 / (1.0 - dropout_p))
        pz, dp = p * z, dp * z
    dv = torch.matmul(pz.transpose(-1, -2), doc).sum(dim=2)
    dvec = (doc * oc).sum(dim=-1, keepdim=True)
    ds = p * (dp - dvec)
    if softcap:
        ds = ds * (1 - capped * capped)
    dq = (torch.matmul(ds, kc) * scale).reshape(b, h, sq, d)
    dk = (torch.matmul(ds.transpose(-1, -2), qc) * scale).sum(dim=2)
    if sinks is None:
        dsinks = torch.zeros(0, dtype=compute if upcast else torch.float32, device=q.device)
    else:
        sink = sinks.to(compute).reshape(1, hkv, groups, 1, 1)
        w = torch.where(torch.isinf(lsec), torch.zeros_like(lsec), torch.exp(sink - shift))
        dsinks = -(w * dvec).sum(dim=(0, 3, 4)).reshape(h)
        if not upcast:
            dsinks = dsinks.to(sinks.dtype)
    if not upcast:
        dq, dk, dv = dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    return dq, dk, dv, dsinks


def run_kernels(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: list[int] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    *,
    config: FlashAttentionBwdConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the backward kernel: ``(dq, dk, dv, dsinks)``, dsinks ``[H]`` in sinks' dtype, or
    an empty float32 tensor without sinks; an empty dimension gives zero gradients without
    a launch."""
    if sinks is None:
        dsinks = torch.zeros(0, dtype=torch.float32, device=q.device)
    else:
        dsinks = torch.zeros_like(sinks)
    if 0 in (*q.shape, k.shape[1], k.shape[2]):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), dsinks
    features = (attn_mask, dropout_p, dropout_seed)
    tiles = SPEC.check(
        problem(dout, q, k, v, out, lse, causal, softmax_scale, window, softcap, sinks, *features),
        dtype_name(q),
        config,
        runner.target,
        runner_lnc(runner),
    )
    scale = resolve_scale(softmax_scale, q.shape[3])
    extra = ()
    if attn_mask is not None or dropout_p:  # plain attention launches as it always did
        b, h, sq, _ = q.shape
        extra = (None, kernel_mask(attn_mask), kernel_row_keys(dropout_p, dropout_seed, b, h, sq))
    sink_rows = None
    if sinks is not None:  # each head's sink on every partition row: [H, 128, 1] fp32
        h = q.shape[1]
        sink_rows = sinks.float().reshape(h, 1, 1).expand(h, tiles.tile_q, 1).contiguous()
    outs = runner(
        flash_attention_bwd_kernel[tiles.lnc],
        dout.contiguous(),
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        out.contiguous(),
        lse.contiguous(),
        sink_rows,
        scale,
        tiles,
        *extra,
    )
    dq, dk, dv = outs[:3]
    if sinks is not None:  # the kernel's per-row parts, summed over batch and rows
        dsinks = outs[-1].sum(dim=(0, 2, 3)).to(sinks.dtype)
    if tiles.split_groups:  # groups split over the cores: their fp32 dK/dV partials, added
        # in core order and rounded once (deterministic: the same order every run)
        dk_part, dv_part = outs[3], outs[4]
        split = [(b, kvh) for b, kvh, _, slot in tiles.core_groups[0] if slot >= 0]
        for slot, (b, kvh) in enumerate(split):
            dk_sum, dv_sum = dk_part[0, slot], dv_part[0, slot]
            for c in range(1, tiles.lnc):
                dk_sum, dv_sum = dk_sum + dk_part[c, slot], dv_sum + dv_part[c, slot]
            dk[b, kvh] = dk_sum.to(dk.dtype)
            dv[b, kvh] = dv_sum.to(dv.dtype)
    return dq, dk, dv, dsinks


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """``(dout, q, k, v, out, lse, causal, None, window, softcap, sinks, attn_mask,
    dropout_p, dropout_seed)``: q, k, v, dout ~ N(0, 1) in ``dtype``, the window, softcap
    and sinks of ``problem`` (the forward's :func:`draw_features`), its mask and dropout
    (:func:`draw_mask_dropout`), out and lse from the fp64 reference forward (out rounded
    to ``dtype``, lse fp32)."""
    b, hkv, groups = problem["b"], problem["hkv"], problem["groups"]
    sq, sk, d = problem["sq"], problem["sk"], problem["d"]
    causal = bool(problem.get("causal", False))
    tdt = getattr(torch, dtype)
    h = hkv * groups
    q = torch.randn(b, h, sq, d, generator=generator).to(tdt)
    k = torch.randn(b, hkv, sk, d, generator=generator).to(tdt)
    v = torch.randn(b, hkv, sk, d, generator=generator).to(tdt)
    dout = torch.randn(b, h, sq, d, generator=generator).to(tdt)
    window, softcap, sinks = draw_features(problem, h, generator)
    extra = draw_mask_dropout(problem, b, h, sq, sk, tdt, generator)
    o, lse = attention_reference(q, k, v, causal, None, window, softcap, sinks, *extra, upcast=True)
    return (
        dout, q, k, v, o.to(tdt), lse.to(torch.float32), causal, None, window, softcap, sinks,
        *extra,
    )  # fmt: skip


def kv_group_slice(problem: dict, lnc: int = 1) -> tuple[dict, int]:
    """Two groups per core where the groups allow, and how many such slices the launch runs:
    the kernel runs ``B * Hkv`` (batch, KV head) groups, each with its own dK/dV
    accumulation over its query heads; at LNC=k the cores take whole groups while they
    divide evenly (``split_groups`` is 0). A slice holds two groups per core, not one,
    because the kernel prepares a group's first query pass during the previous group's
    last: a one-group slice would drop that overlap at every boundary (modeled 11% over the
    full trace at 1024 tokens per group, LNC=1), a two-group slice keeps half of them. One
    group per core where two do not divide the groups or would be the whole launch; where
    the groups do not divide over the cores, the whole launch (the cost model's
    ``OpSpec.model_slice``)."""
    b, hkv = problem["b"], problem["hkv"]
    groups = b * hkv
    if groups % lnc:
        return problem, 1
    per_core = 2 if groups % (2 * lnc) == 0 and groups // (2 * lnc) >= 2 else 1
    return {**problem, "b": 1, "hkv": per_core * lnc}, groups // (per_core * lnc)


def _bad_inputs():
    """One bad input per op-boundary limit: (args, the argument the error must name)."""
    f = torch.zeros

    def args(**over):
        base = {
            "dout": f(1, 2, 3, 8),
            "q": f(1, 2, 3, 8),
            "k": f(1, 1, 5, 8),
            "v": f(1, 1, 5, 8),
            "out": f(1, 2, 3, 8),
            "lse": f(1, 2, 3),
        }
        base.update(over)
        return tuple(base.values())

    return [
        (args(q=f(2, 3, 8), dout=f(2, 3, 8), out=f(2, 3, 8)), "q rank"),
        (args(k=f(1, 1, 5, 4)), "k.shape[3]"),
        (args(k=f(1, 3, 5, 8), v=f(1, 3, 5, 8)), "k.shape[1]"),
        (args(v=f(1, 1, 6, 8)), "v.shape[2]"),
        (args(k=f(2, 1, 5, 8), v=f(2, 1, 5, 8)), "k.shape[0]"),
        (args(v=f(1, 1, 5, 8, dtype=torch.bfloat16)), "v dtype"),
        (args(dout=f(1, 2, 4, 8)), "dout shape"),
        (args(out=f(1, 2, 3, 8, dtype=torch.bfloat16)), "out dtype"),
        (args(lse=f(1, 2, 4)), "lse shape"),
        (args(lse=f(1, 2, 3, dtype=torch.bfloat16)), "lse dtype"),
        (args(lse=f(1, 2, 3, device="meta")), "lse device"),
        (args(q=f(1, 2, 3, 300), k=f(1, 1, 5, 300), v=f(1, 1, 5, 300)), "head dim"),
        ((*args(), False, None, [1]), "window"),
        ((*args(), False, None, [-3, 0]), "window"),
        ((*args(), False, None, None, -2.0), "softcap"),
        ((*args(), False, None, None, float("inf")), "softcap"),
        ((*args(), False, None, None, 0.0, f(3)), "sinks shape"),
        ((*args(), False, None, None, 0.0, f(2, dtype=torch.float16)), "sinks dtype"),
        ((*args(), False, None, None, 0.0, f(2, device="meta")), "sinks device"),
        *bad_mask_dropout_inputs((*args(), False, None, None, 0.0, None), f(1, 2, 3, 8), 5, OP),
    ]


SPEC = register(
    OpSpec(
        name=OP,
        config=FlashAttentionBwdConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=validate,
        problem=problem,
        tolerances={
            # The reference is the closed form in fp64 from the same (rounded) inputs, out
            # and lse, so only the kernel's arithmetic counts. fp32: fp32 matmuls and exp,
            # PSUM/SBUF sums over <= a few hundred O(1) terms: ~1e-6 relative, 100x slack.
            "float32": Tolerance(1e-4, 1e-4, "fp32 matmuls, exp and sums over the tiles"),
            # 2-byte dtypes: P and dS are rounded to the input dtype before their matmuls
            # (TensorE takes them so), then each gradient is rounded once. The rows of dS sum
            # to 0, so a dK/dQ entry is a heavily cancelling sum of up to ~160 terms (the
            # contract's sizes) of magnitude ~0.5, each off by up to 2^-9 (bf16) / 2^-12
            # (fp16) relative: ~sqrt(160) * 0.5 * 2^-9 = 0.012 (bf16) absolute, x2.5 slack.
            # (First set to 5e-3 / 1e-3 without the cancellation; raised once after the first
            # contract run, where the kernel's error matched PyTorch's own bf16 SDPA's.)
            "bfloat16": Tolerance(
                3e-2, 2**-6, "bf16 P and dS into the matmuls, cancelling sums, bf16 output"
            ),
            "float16": Tolerance(
                4e-3, 2**-8, "fp16 P and dS into the matmuls, cancelling sums, fp16 output"
            ),
        },
        make_inputs=make_inputs,
        parse_shape=feature_shape_parser(OP, ("b", "hkv", "groups", "sq", "sk", "d")),
        test_problems={
            "ranges": {
                "b": (1, 2),
                "hkv": (1, 2),
                "groups": (1, 3),
                "sq": (1, 160),
                "sk": (1, 160),
                "d": (1, 136),
                "causal": (0, 1),
                # as the forward's: negative draws leave the window side / softcap off
                "window_left": (-160, 160),
                "window_right": (-160, 160),
                "softcap": (-60, 60),
                "sinks": (0, 1),
            },
            "edges": (1, 2, 3, 64, 127, 128, 129),
            # every config runs here, checked: causal with Sq > Sk (fully masked rows),
            # GQA, remainder tiles on both sequence axes
            "probe": {"b": 1, "hkv": 1, "groups": 2, "sq": 130, "sk": 70, "d": 40, "causal": True},
            # budgets bind here (trace-only runs): long query passes at the largest head dim
            "large": {"b": 1, "hkv": 1, "groups": 1, "sq": 8192, "sk": 256, "d": 256},
        },
        kernels=(flash_attention_bwd_kernel,),
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice,
        bad_inputs=_bad_inputs,
        budget_hints={
            "psum": "choose transpose='dma' or 'vector' to free PSUM banks",
            "sbuf": "lower q_block (kv_outer), or leave q_outer, which holds every K/V tile",
        },
        description="(dq, dk, dv) of attention from (dout, q, k, v, out, lse), FlashAttention-2 style",
    )
)
