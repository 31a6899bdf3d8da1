"""The committed shapes each op is tuned at for the shipped ``perf_results/<target>/`` configs.

Where an op's shapes come from, first match wins: its ``OpSpec.committed_shapes`` (a new
op declares them there, in its own module: this file needs no edit), else its entry in
:data:`SHAPES` below (the ops written before that field), else its spec's
``test_problems["large"]`` (in bf16 where it takes bf16).

The shapes below are Llama-3 layer shapes (hidden size, attention heads, KV heads and MLP width from the model
cards: 8B: 4096 / 32 / 8 / 14336; 70B: 8192 / 64 / 8 / 28672; head dim 128), one sequence
of 2048 or 8192 tokens, bf16 activations. Matmul is ``tokens x out_features x in_features``
(M x N x K); attention is causal, as a decoder's is (plus a sliding-window and a softcap
point in those features' own shape buckets); AdamW updates one layer's parameters
(fp32, torch.optim.AdamW's defaults).

Each point's problem is the one the op computes from inputs of that shape
(:func:`~neuron_kernels.autotune.objective.make_point`), so the shipped entry sits under
the shape bucket a call of the op with such inputs looks up.
"""

from __future__ import annotations

from neuron_kernels.autotune.objective import Point, make_point

__all__ = ["LLAMA3", "SEQS", "SHAPES", "committed_shapes", "points_for"]

HEAD_DIM = 128
LLAMA3 = {  # model: (hidden, attention heads, kv heads, mlp width)
    "8b": (4096, 32, 8, 14336),
    "70b": (8192, 64, 8, 28672),
}
SEQS = (2048, 8192)
BF16 = "bfloat16"


def _llama_points():
    for model, (hidden, heads, kv, mlp) in LLAMA3.items():
        for seq in SEQS:
            yield model, seq, hidden, heads, kv, mlp, f"Llama-3 {model.upper()} seq {seq}"


def _matmul_shapes() -> list[tuple[str, str, str]]:
    shapes = [("4096x4096x4096", BF16, "square: the TensorE-peak reference")]
    for _, seq, hidden, heads, kv, mlp, where in _llama_points():
        qkv = (heads + 2 * kv) * HEAD_DIM
        shapes += [
            (f"{seq}x{qkv}x{hidden}", BF16, f"{where}: QKV projection"),
            (f"{seq}x{hidden}x{hidden}", BF16, f"{where}: attention output projection"),
            (f"{seq}x{mlp}x{hidden}", BF16, f"{where}: MLP gate / up projection"),
            (f"{seq}x{hidden}x{mlp}", BF16, f"{where}: MLP down projection"),
        ]
    return shapes


def _norm_shapes() -> list[tuple[str, str, str]]:
    """RMSNorm over one sequence of hidden states (``rows x h``), llama casting."""
    return [
        (f"{seq}x{hidden}", BF16, f"{where}: hidden states")
        for _, seq, hidden, *_, where in _llama_points()
    ]


def _attention_shapes(syntax: str) -> list[tuple[str, str, str]]:
    """Causal self-attention of one sequence (batch 1): ``BxHxHKVxSQxSKxD`` for the forward
    ops, ``BxHKVxGROUPSxSQxSKxD`` for the backward."""
    shapes = []
    for _, seq, _, heads, kv, _, where in _llama_points():
        if syntax == "bwd":
            shape = f"1x{kv}x{heads // kv}x{seq}x{seq}x{HEAD_DIM}:causal"
        else:
            shape = f"1x{heads}x{kv}x{seq}x{seq}x{HEAD_DIM}:causal"
        shapes.append((shape, BF16, f"{where}: causal self-attention"))
    # The features' own buckets (issue 33's bars, on the 8B heads): a causal sliding
    # window at 8192 tokens (Mistral's and Gemma's local layers), Gemma 2's softcap at 4096.
    _, heads, kv, _ = LLAMA3["8b"]
    lead = f"1x{kv}x{heads // kv}" if syntax == "bwd" else f"1x{heads}x{kv}"
    shapes += [
        (
            f"{lead}x8192x8192x{HEAD_DIM}:causal:window=1024,0",
            BF16,
            "Llama-3 8B heads seq 8192: causal sliding window (1024, 0)",
        ),
        (
            f"{lead}x4096x4096x{HEAD_DIM}:causal:softcap=50",
            BF16,
            "Llama-3 8B heads seq 4096: causal with Gemma 2's logit softcap 50",
        ),
    ]
    return shapes


def _adamw_shapes() -> list[tuple[str, str, str]]:
    """One decoder layer's parameters: 9 tensors (q, k, v, o, gate, up, down, two norm
    weights), the largest the MLP weight (mlp x hidden); ``make_inputs`` draws the other
    sizes below it. fp32 params and state."""
    return [
        (f"9x{mlp * hidden}", "float32", f"Llama-3 {model.upper()}: one layer's parameters")
        for model, (hidden, _, _, mlp) in LLAMA3.items()
    ]


# op -> [(shape in the op's syntax, dtype, what it is)]
SHAPES: dict[str, list[tuple[str, str, str]]] = {
    "matmul": _matmul_shapes(),
    "rms_norm": _norm_shapes(),
    "rms_norm_fwd": _norm_shapes(),
    "rms_norm_bwd": _norm_shapes(),
    "flash_attention": _attention_shapes("fwd"),
    "flash_attention_fwd": _attention_shapes("fwd"),
    "flash_attention_bwd": _attention_shapes("bwd"),
    "fused_adamw_": _adamw_shapes(),
}


def committed_shapes(spec) -> list[tuple[str, str, str]]:
    """``[(shape, dtype, what)]`` of ``spec``: its own ``committed_shapes``, else its
    :data:`SHAPES` entry, else ``[]`` (then :func:`points_for` takes its ``"large"`` problem)."""
    return list(spec.committed_shapes or SHAPES.get(spec.name, ()))


def points_for(spec) -> list[Point]:
    """The committed points of ``spec`` (its ``test_problems["large"]`` when it has none)."""
    shapes = committed_shapes(spec)
    if shapes:
        return [make_point(spec, s, dtype) for s, dtype, _ in shapes]
    large = spec.test_problems["large"]
    shape = "x".join(str(large[d]) for d in spec.dims)
    shape += "".join(f":{k}" for k, v in large.items() if v is True)  # shape_parser's flags
    dtype = BF16 if BF16 in spec.dtypes else spec.dtypes[0]
    return [make_point(spec, shape, dtype)]
