"""``OpSpec.model_slice``: the model backend traces one independent piece of a problem and
multiplies by the piece count; at LNC=k a piece holds one group per core (the cores take
whole groups round robin), two for the attention backward, which overlaps a group's start
with the previous group's end. The pieces run one after another on each core, so the sum
drops only the overlap of one piece's tail with the next one's head: it may overestimate
the full trace, never underestimate it, and the overestimate is small once each piece
is long.

The bound, chosen before measuring: at 1024 tokens per piece the dropped overlap is one
pipeline fill/drain per piece boundary against a piece of many key/query tiles; 10% is
well above that and well below the config-to-config spread the tuner ranks on (the
shipped configs differ from the defaults by 10-30%), so a slice cannot reorder configs
by more than the ranking already tolerates."""

from __future__ import annotations

import dataclasses

import pytest

from neuron_kernels.autotune.backends import ModelBackend
from neuron_kernels.autotune.objective import make_point
from neuron_kernels.kernels import REGISTRY

OVERESTIMATE_BOUND = 1.10  # see the module docstring

SLICED_SHAPES = [  # two batches x two KV heads: four pieces, GQA groups of four
    ("flash_attention_fwd", "2x8x2x1024x1024x128:causal"),
    ("flash_attention_fwd", "2x8x2x1024x1024x128"),
    ("flash_attention", "2x8x2x1024x1024x128:causal"),
    ("flash_attention_bwd", "2x2x4x1024x1024x128:causal"),
    # varlen: the packed batch is one BHSD batch of four KV heads (4 sequences of 256 packed
    # to 1024, self-attention packing), its groups the pieces
    ("flash_attention_varlen_fwd", "4x1024x1024x16x4x128x256x256:causal:same_packing"),
    ("flash_attention_varlen", "4x1024x1024x16x4x128x256x256:causal:same_packing"),
    ("flash_attention_varlen_bwd", "4x1024x1024x4x4x128x256x256:causal:same_packing"),
]


def test_exactly_the_attention_ops_declare_a_slice():
    assert sorted(n for n, s in REGISTRY.items() if s.model_slice) == sorted(
        {n for n, _ in SLICED_SHAPES}
    )


@pytest.mark.parametrize("lnc", [1, 2])
@pytest.mark.parametrize("name,shape", SLICED_SHAPES)
def test_slice_times_copies_bounds_the_full_trace_from_above(name, shape, lnc):
    spec = REGISTRY[name]
    point = make_point(spec, shape, "bfloat16")
    traced, copies = spec.model_slice(point.problem, lnc)
    batch = point.problem.get("b", 1)  # varlen problems have none: one packed batch
    groups = batch * point.problem["hkv"]
    # the backward's slice: two groups per core unless that is the whole launch
    per_core = 2 if name == "flash_attention_bwd" and 4 // (2 * lnc) >= 2 else 1
    assert copies == groups // (per_core * lnc) == 4 // (per_core * lnc)
    assert traced.get("b", 1) == 1 and traced["hkv"] == per_core * lnc
    backend = ModelBackend("trn2", lnc=lnc)
    config = spec.config.default()
    sliced = backend.measure(spec, point.problem, "bfloat16", config)
    full = backend.measure(
        dataclasses.replace(spec, model_slice=None), point.problem, "bfloat16", config
    )
    ratio = sliced.latency_us / full.latency_us
    assert 1.0 <= ratio <= OVERESTIMATE_BOUND, (
        f"{name} {shape} LNC={lnc}: slice x {copies} / full = {ratio:.4f}"
    )
    # Same floor either way: the slice's TensorE floor times the copies is the full one.
    assert sliced.floor_us == pytest.approx(full.floor_us, rel=1e-9)
    assert sliced.floor_engine == full.floor_engine
    assert sliced.extra == {
        "traced_problem": ",".join(f"{k}={v}" for k, v in traced.items()),
        "copies": copies,
    }
    assert full.extra == {}


def test_groups_that_do_not_divide_over_the_cores_trace_the_whole_launch():
    """Three groups at LNC=2: one is split by query tiles, so no slice repeats exactly."""
    for name, shape in (
        ("flash_attention_fwd", "1x12x3x512x512x128"),
        ("flash_attention_bwd", "1x3x4x512x512x128"),
    ):
        problem = make_point(REGISTRY[name], shape, "bfloat16").problem
        assert REGISTRY[name].model_slice(problem, 2) == (problem, 1)
        traced, copies = REGISTRY[name].model_slice(problem, 1)
        assert copies == 3 and traced["hkv"] == 1


def test_a_slice_keeps_every_non_size_key():
    spec = REGISTRY["flash_attention_bwd"]
    problem = make_point(spec, "1x8x4x2048x2048x128:causal", "bfloat16").problem
    traced, copies = spec.model_slice(problem, 1)
    assert copies == 4 and traced == {**problem, "b": 1, "hkv": 2}  # two groups per core
    assert traced["causal"] is True
