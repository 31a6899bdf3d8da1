"""The ``flash_attention`` and ``flash_attention_fwd`` op declarations: their problem keys,
host wrappers (``run_kernels``), references, inputs, shape syntax and autograd. The kernel
is :mod:`.flash_attention_kernel`, its plan :mod:`.flash_attention_plan`, and what both
directions accept and compute :mod:`.attention_contract`.
"""

from __future__ import annotations

import torch

from neuron_kernels.kernels.attention_contract import (
    OP,
    attention_reference,
    bad_mask_dropout_inputs,
    draw_features,
    draw_mask_dropout,
    feature_shape_parser,
    feature_suffix,
    kernel_mask,
    kernel_row_keys,
    mask_problem,
    refuse_mask_grad,
    validate_attention,
)
from neuron_kernels.kernels.flash_attention_kernel import flash_attention_fwd_kernel
from neuron_kernels.kernels.flash_attention_plan import FlashAttentionConfig, plan
from neuron_kernels.kernels.spec import (
    OpSpec,
    Tolerance,
    bucket_size,
    dtype_name,
    register,
    runner_lnc,
)

__all__ = [
    "FWD_OP",
    "FWD_SPEC",
    "REGISTRY_BY_NAME",
    "SHAPE_DIMS",
    "SPEC",
    "composite",
    "kv_group_slice",
    "make_inputs",
    "problem",
    "reference",
    "reference_fwd",
    "run_kernels",
    "run_kernels_fwd",
    "shape_bucket",
]


def problem(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
) -> dict:
    """The sizes that select configs and limits (shape syntax ``BxHxHKVxSQxSKxD``), plus
    ``causal``, the softmax ``scale`` in use (``None``: 1/sqrt(D)), the window's sides
    (``window_left``, ``window_right``; -1 unbounded), ``softcap`` (0: off), whether
    there are ``sinks``, and the mask and dropout (:func:`mask_problem`)."""
    b, h, sq, d = q.shape
    left, right = (-1, -1) if window is None else (int(window[0]), int(window[1]))
    return {
        "b": b,
        "h": h,
        "hkv": k.shape[1],
        "sq": sq,
        "sk": k.shape[2],
        "d": d,
        "causal": bool(causal),
        "scale": softmax_scale,
        "window_left": left,
        "window_right": right,
        "softcap": float(softcap),
        "sinks": sinks is not None,
        **mask_problem(attn_mask, dropout_p),
    }


def _forward_kernels(
    q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, op
):
    """``(out, lse)`` through the forward kernel; empty shapes and Sk = 0 (every row masked)
    never launch it. ``features`` = (attn_mask, dropout_p, dropout_seed)."""
    attn_mask, dropout_p, dropout_seed = features
    b, h, sq, d = q.shape
    sk = k.shape[2]
    if b == 0 or h == 0 or sq == 0 or sk == 0:
        out = torch.zeros((b, h, sq, d), dtype=q.dtype, device=q.device)
        lse = torch.full((b, h, sq), float("-inf"), dtype=torch.float32, device=q.device)
        if sinks is not None:  # a row that sees no key: lse = its head's sink
            lse = sinks.float().reshape(1, h, 1).expand(b, h, sq).contiguous()
        return out, lse
    spec = REGISTRY_BY_NAME[op]
    tiles = spec.check(
        problem(q, k, v, causal, softmax_scale, window, softcap, sinks, *features),
        dtype_name(q),
        config,
        runner.target,
        runner_lnc(runner),
    )
    sink_rows = None
    if sinks is not None:  # each head's sink on every partition row: [H, 128, 1] fp32
        sink_rows = sinks.float().reshape(h, 1, 1).expand(h, tiles.q_tile, 1).contiguous()
    args = (q.contiguous(), k.contiguous(), v.contiguous(), sink_rows, tiles)
    if attn_mask is not None or dropout_p:  # plain attention launches as it always did
        mask, keys = kernel_mask(attn_mask), kernel_row_keys(dropout_p, dropout_seed, b, h, sq)
        args += (None, mask, keys)  # (no kv_bounds)
    out, lse = runner(flash_attention_fwd_kernel[tiles.lnc], *args)
    return out, lse.reshape(b, h, sq)


def run_kernels_fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: list[int] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    *,
    config: FlashAttentionConfig,
    runner,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [B, H, Sq, D], lse [B, H, Sq] fp32)`` for BHSD q, k, v."""
    features = (attn_mask, dropout_p, dropout_seed)
    return _forward_kernels(
        q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, FWD_OP
    )


def run_kernels(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    softmax_scale: float | None = None,
    window: list[int] | None = None,
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    dropout_seed: torch.Tensor | None = None,
    *,
    config: FlashAttentionConfig,
    runner,
) -> torch.Tensor:
    """``out [B, H, Sq, D]`` for BHSD q, k, v."""
    features = (attn_mask, dropout_p, dropout_seed)
    return _forward_kernels(
        q, k, v, causal, softmax_scale, window, softcap, sinks, features, config, runner, OP
    )[0]


def reference_fwd(
    q,
    k,
    v,
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
    """``(out, lse)``: :func:`attention_reference`."""
    return attention_reference(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed, upcast,
    )  # fmt: skip


def reference(
    q,
    k,
    v,
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
    """``out``: the first output of :func:`attention_reference`."""
    return reference_fwd(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed, upcast,
    )[0]  # fmt: skip


def _validate(op):
    def validate(
        q,
        k,
        v,
        causal=False,
        softmax_scale=None,
        window=None,
        softcap=0.0,
        sinks=None,
        attn_mask=None,
        dropout_p=0.0,
        dropout_seed=None,
    ) -> None:
        validate_attention(
            op, q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
            dropout_seed, seed_required=op != OP,
        )  # fmt: skip

    validate.__doc__ = f"Refuse bad {op} input before any work (:func:`validate_attention`)."
    return validate


def make_inputs(problem: dict, dtype: str, generator: torch.Generator) -> tuple:
    """q, k, v ~ N(0, 1) in ``dtype`` (scores O(1) at the default scale), causal and scale
    from ``problem``, and its window, softcap and sinks (:func:`draw_features`). H is
    rounded down to a multiple of Hkv (at least Hkv), so that any drawn (H, Hkv) is a
    valid GQA problem."""
    b, hkv, sq, sk, d = (problem[x] for x in ("b", "hkv", "sq", "sk", "d"))
    h = max(hkv, problem["h"] - problem["h"] % hkv) if hkv else problem["h"]
    t = getattr(torch, dtype)
    q = torch.randn(b, h, sq, d, generator=generator).to(t)
    k = torch.randn(b, hkv, sk, d, generator=generator).to(t)
    v = torch.randn(b, hkv, sk, d, generator=generator).to(t)
    window, softcap, sinks = draw_features(problem, h, generator)
    causal = bool(problem.get("causal", False))
    extra = draw_mask_dropout(problem, b, h, sq, sk, t, generator)
    return q, k, v, causal, problem.get("scale"), window, softcap, sinks, *extra


def shape_bucket(problem: dict) -> str:
    """B, Sq and Sk as :func:`.spec.bucket_size` rounds them, exact H, Hkv and D (they
    fix the kernel's loops), causal, then :func:`feature_suffix`; the scale does not change
    the tiles."""

    return (
        f"b{bucket_size(problem['b'])}_h{problem['h']}_hkv{problem['hkv']}_sq{bucket_size(problem['sq'])}"
        f"_sk{bucket_size(problem['sk'])}_d{problem['d']}_causal{str(bool(problem.get('causal'))).lower()}"
        + feature_suffix(problem)
    )


def kv_group_slice(problem: dict, lnc: int = 1) -> tuple[dict, int]:
    """``lnc`` (batch, KV head) groups and how many such slices the launch runs: the kernel
    runs ``B * Hkv`` groups, each reading only its K/V head and its ``H / Hkv`` query heads;
    at LNC=k the cores take whole groups round robin (:func:`split_groups`), so a slice of
    k groups is one group per core. Where the groups do not divide over the cores (some
    are split by query tiles), the slice is the whole launch (the cost model's
    ``OpSpec.model_slice``)."""
    b, h, hkv = problem["b"], problem["h"], problem["hkv"]
    if (b * hkv) % lnc:
        return problem, 1
    return {**problem, "b": 1, "h": lnc * (h // hkv), "hkv": lnc}, b * hkv // lnc


def _bad_inputs(op):
    def bad_inputs():
        """One bad input per op-boundary limit: (args, the argument the error must name)."""
        f = torch.zeros
        q, kv = f(1, 4, 8, 16), f(1, 2, 8, 16)
        return [
            ((f(4, 8, 16), kv, kv), "q rank"),
            ((q, f(2, 8, 16), kv), "k rank"),
            ((q, kv, f(1, 2, 8)), "v rank"),
            ((q, f(1, 2, 8, 8), kv), "k.shape[3]"),
            ((q, kv, f(1, 2, 8, 8)), "v.shape[3]"),
            ((f(1, 4, 8, 300), f(1, 2, 8, 300), f(1, 2, 8, 300)), "head dim"),
            ((q, f(1, 3, 8, 16), f(1, 3, 8, 16)), "k.shape[1]"),
            ((q, f(2, 2, 8, 16), f(2, 2, 8, 16)), "k.shape[0]"),
            ((q, kv, f(1, 2, 9, 16)), "v.shape[2]"),
            ((q, kv, f(1, 1, 8, 16)), "v.shape[1]"),
            ((q.double(), kv.double(), kv.double()), "q dtype"),
            ((q, kv.bfloat16(), kv), "k dtype"),
            ((q, kv, kv.half()), "v dtype"),
            ((q, kv, f(1, 2, 8, 16, device="meta")), "v device"),
            ((q, kv, kv, False, float("nan")), "softmax_scale"),
            ((q, kv, kv, False, None, [4]), "window"),
            ((q, kv, kv, False, None, [4, 2, 1]), "window"),
            ((q, kv, kv, False, None, [-2, 3]), "window"),
            ((q, kv, kv, True, None, [3, -5]), "window"),
            ((q, kv, kv, False, None, None, -1.0), "softcap"),
            ((q, kv, kv, False, None, None, float("nan")), "softcap"),
            ((q, kv, kv, False, None, None, float("inf")), "softcap"),
            ((q, kv, kv, False, None, None, 0.0, f(3)), "sinks shape"),
            ((q, kv, kv, False, None, None, 0.0, f(4, 1)), "sinks shape"),
            ((q, kv, kv, False, None, None, 0.0, f(4, dtype=torch.bfloat16)), "sinks dtype"),
            ((q, kv, kv, False, None, None, 0.0, f(4, device="meta")), "sinks device"),
            *bad_mask_dropout_inputs((q, kv, kv, False, None, None, 0.0, None), q, 8, op),
        ]

    return bad_inputs


def composite(
    q,
    k,
    v,
    causal=False,
    softmax_scale=None,
    window=None,
    softcap=0.0,
    sinks=None,
    attn_mask=None,
    dropout_p=0.0,
    dropout_seed=None,
):
    """The public op as torch runs it: the forward's ``out``; autograd saves its ``lse``
    (and the mask and dropout seed). ``dropout_p > 0`` without a seed draws one on q's
    device from torch's default generator (no host sync; the backward replays it). A
    float ``attn_mask`` that requires grad is refused (:func:`refuse_mask_grad`)."""
    if torch.is_grad_enabled():
        refuse_mask_grad(OP, attn_mask)
    if dropout_p and dropout_seed is None:
        dropout_seed = torch.randint(0, 2**62, (2,), dtype=torch.int64, device=q.device)
    return torch.ops.neuron.flash_attention_fwd(
        q, k, v, causal, softmax_scale, window, softcap, sinks, attn_mask, dropout_p,
        dropout_seed,
    )[0]  # fmt: skip


def _setup_context(
    ctx,
    q,
    k,
    v,
    causal,
    softmax_scale,
    window,
    softcap,
    sinks,
    attn_mask,
    dropout_p,
    dropout_seed,
    output,
):
    refuse_mask_grad(FWD_OP, attn_mask)
    out, lse = output
    ctx.causal, ctx.softmax_scale = causal, softmax_scale
    ctx.window, ctx.softcap = window, softcap
    ctx.has_sinks = sinks is not None
    ctx.dropout_p = dropout_p
    ctx.save_for_backward(q, k, v, out, lse, sinks, attn_mask, dropout_seed)
    ctx.mark_non_differentiable(lse)


def _backward(ctx, grad_out, grad_lse):
    """dq, dk, dv and dsinks (in sinks' dtype) from the backward op, with the forward's
    saved out and lse (no recomputed forward). ``lse`` is marked non-differentiable."""
    q, k, v, out, lse, sinks, attn_mask, dropout_seed = ctx.saved_tensors
    if q.numel() == 0 or k.shape[2] == 0:  # nothing attended: every gradient is zero
        dsinks = torch.zeros_like(sinks) if ctx.has_sinks else None
        zeros = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return (*zeros, None, None, None, None, dsinks, None, None, None)
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsinks = torch.ops.neuron.flash_attention_bwd(
        grad_out.contiguous(),
        q,
        k,
        v,
        out,
        lse,
        ctx.causal,
        ctx.softmax_scale,
        ctx.window,
        ctx.softcap,
        sinks,
        attn_mask,
        ctx.dropout_p,
        dropout_seed,
    )
    dsinks = dsinks.to(sinks.dtype) if ctx.has_sinks else None
    return dq, dk, dv, None, None, None, None, dsinks, None, None, None


_TOLERANCES = {
    # Chosen before the kernel ran. fp32: exact inputs; fp32 sums of <= 256 products per
    # score, fp32 exp and online rescaling over up to a few thousand keys: ~1e-6 relative.
    "float32": Tolerance(2e-5, 2e-5, "fp32 scores, exp and rescaled sums over Sk keys"),
    # bf16/fp16: P is rounded to the input dtype for P V (0.5 ulp per weight, all of one
    # sign in the worst case: |v|max * 2^-9 ~ 4 * 2^-9 for N(0, 1) values), then one
    # rounding of out (0.5 ulp relative). lse stays fp32 and is held to the same bound.
    "bfloat16": Tolerance(1e-2, 2**-7, "P rounded to bf16 for P V, one bf16 rounding of out"),
    "float16": Tolerance(1.5e-3, 2**-10, "P rounded to fp16 for P V, one fp16 rounding of out"),
}


_TEST_PROBLEMS = {
    # causal: drawn as 0/1 and turned into a bool by make_inputs.
    "ranges": {
        "b": (1, 2),
        "h": (1, 4),
        "hkv": (1, 2),
        "sq": (1, 300),
        "sk": (1, 600),
        "d": (1, 256),
        "causal": (0, 1),
        # window sides, softcap and sinks: negative draws are off (-1 unbounded, 0 no cap),
        # so about half the draws leave each feature off.
        "window_left": (-300, 300),
        "window_right": (-300, 300),
        "softcap": (-60, 60),
        "sinks": (0, 1),
    },
    "edges": (1, 127, 128, 129, 513),
    # every config runs here: GQA, remainder tiles, causal with Sq < Sk, D not a power of two
    "probe": {"b": 1, "h": 2, "hkv": 1, "sq": 130, "sk": 260, "d": 72, "causal": True},
    # budgets bind here (trace-only): long K/V blocks of the widest head in SBUF
    "large": {"b": 1, "h": 1, "hkv": 1, "sq": 256, "sk": 8192, "d": 256, "causal": False},
    # empty sizes the op accepts (D = 0 is refused as a head dim; Hkv = 0 cannot divide H)
    "empty": [
        {"b": 0, "h": 2, "hkv": 1, "sq": 130, "sk": 260, "d": 72, "causal": True},
        {"b": 1, "h": 2, "hkv": 1, "sq": 0, "sk": 260, "d": 72, "causal": True},
        {"b": 1, "h": 2, "hkv": 1, "sq": 130, "sk": 0, "d": 72, "causal": False},
    ],
}


_BUDGET_HINTS = {"sbuf": "lower kv_block (K/V rows held in SBUF) or k_tile"}


FWD_OP = "flash_attention_fwd"


SHAPE_DIMS = ("b", "h", "hkv", "sq", "sk", "d")  # the shape syntax BxHxHKVxSQxSKxD


FWD_SPEC = register(
    OpSpec(
        name=FWD_OP,
        config=FlashAttentionConfig,
        plan=plan,
        run_kernels=run_kernels_fwd,
        reference=reference_fwd,
        validate=_validate(FWD_OP),
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        parse_shape=feature_shape_parser(FWD_OP, SHAPE_DIMS),
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice,
        kernels=(flash_attention_fwd_kernel,),
        autograd=(_setup_context, _backward),
        bad_inputs=_bad_inputs(FWD_OP),
        budget_hints=_BUDGET_HINTS,
        description="Flash attention forward, (out, lse); its autograd calls flash_attention_bwd",
    )
)


SPEC = register(
    OpSpec(
        name=OP,
        config=FlashAttentionConfig,
        plan=plan,
        run_kernels=run_kernels,
        reference=reference,
        validate=_validate(OP),
        problem=problem,
        tolerances=_TOLERANCES,
        make_inputs=make_inputs,
        test_problems=_TEST_PROBLEMS,
        parse_shape=feature_shape_parser(OP, SHAPE_DIMS),
        shape_bucket=shape_bucket,
        model_slice=kv_group_slice,
        kernels=(flash_attention_fwd_kernel,),
        composite=composite,
        bad_inputs=_bad_inputs(OP),
        budget_hints=_BUDGET_HINTS,
        description="Flash attention (BHSD, GQA, causal bottom-right), composite over "
        "flash_attention_fwd",
    )
)


REGISTRY_BY_NAME = {FWD_OP: FWD_SPEC, OP: SPEC}
