"""The committed tuning points and the shape syntax they are written in."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from neuron_kernels.autotune.objective import make_point
from neuron_kernels.autotune.shapes import SHAPES, points_for
from neuron_kernels.errors import LimitError
from neuron_kernels.kernels import REGISTRY
from neuron_kernels.kernels.spec import shape_parser


def test_the_table_names_only_registered_ops_and_never_one_that_declares_its_own():
    """A new op declares ``committed_shapes`` on its spec; the table is not a required edit,
    and an op has one source of shapes, never two."""
    assert set(SHAPES) <= set(REGISTRY), sorted(set(SHAPES) - set(REGISTRY))
    both = sorted(n for n in SHAPES if REGISTRY[n].committed_shapes)
    assert not both, f"{both}: committed shapes on the OpSpec and in autotune/shapes.py"


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_op_has_committed_points(name):
    assert points_for(REGISTRY[name]), name


def test_a_spec_s_committed_shapes_win_then_the_table_then_its_large_problem():
    matmul = REGISTRY["matmul"]
    own = dataclasses.replace(matmul, committed_shapes=(("64x32x16", "float32", "mine"),))
    assert [(p.shape, p.dtype) for p in points_for(own)] == [("64x32x16", "float32")]
    assert [p.shape for p in points_for(matmul)] == [s for s, _, _ in SHAPES["matmul"]]
    unlisted = dataclasses.replace(matmul, name="matmul_unlisted")
    large = matmul.test_problems["large"]
    assert [p.problem for p in points_for(unlisted)] == [large]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_point_is_stored_under_the_bucket_a_call_looks_up(name):
    """The regression behind dead shipped entries: the tuner keyed on the parsed shape while
    a call keys on ``spec.problem(*args)``, which also holds casting mode, amsgrad, causal."""
    spec = REGISTRY[name]
    for point in points_for(spec):
        with torch.device("meta"):
            args = spec.make_inputs(spec.parse_shape(point.shape), point.dtype, torch.Generator())
        assert spec.shape_bucket(point.problem) == spec.shape_bucket(spec.problem(*args))
        assert set(point.problem) == set(spec.problem(*args)), point.shape


def test_attention_points_are_causal_and_norm_points_use_llama_casting():
    for name in ("flash_attention", "flash_attention_fwd", "flash_attention_bwd"):
        assert all(p.problem["causal"] is True for p in points_for(REGISTRY[name])), name
    for name in ("rms_norm", "rms_norm_fwd", "rms_norm_bwd"):
        assert {p.problem["casting_mode"] for p in points_for(REGISTRY[name])} == {"llama"}


def test_shape_flags_are_false_unless_named():
    parse = shape_parser("op", ("b", "s"), ("causal",))
    assert parse("2x128") == {"b": 2, "s": 128, "causal": False}
    assert parse("2x128:causal") == {"b": 2, "s": 128, "causal": True}
    assert parse("2x128:CAUSAL") == {"b": 2, "s": 128, "causal": True}


def test_an_unknown_flag_names_it_and_the_ones_allowed():
    parse = shape_parser("op", ("b", "s"), ("causal",))
    with pytest.raises(LimitError, match=r"shape flag.*\['causal'\].*casual"):
        parse("2x128:casual")
    with pytest.raises(LimitError, match=r"BxS\[:causal\]"):
        parse("2x128x4:causal")


def test_the_attention_parser_takes_causal_and_the_features():
    """The attention ops' shape syntax (flash_attention.feature_shape_parser): causal as a
    flag, then window=L,R / softcap=X / sinks, which put a point in its features' own
    shape bucket (so the tuner can ship configs for windowed and capped calls)."""
    spec = REGISTRY["flash_attention_fwd"]
    assert spec.parse_shape("1x4x2x256x256x64:causal")["causal"] is True
    assert spec.parse_shape("1x4x2x256x256x64")["causal"] is False
    parsed = spec.parse_shape("1x4x2x256x256x64:causal:window=64,0:softcap=30:sinks")
    assert parsed["window_left"] == 64 and parsed["window_right"] == 0
    assert parsed["softcap"] == 30.0 and parsed["sinks"] is True
    plain = make_point(spec, "1x4x2x256x256x64:causal", "bfloat16").problem
    windowed = make_point(spec, "1x4x2x256x256x64:causal:window=64,0", "bfloat16").problem
    assert spec.shape_bucket(windowed) == spec.shape_bucket(plain) + "_wl64_wr0"


@pytest.mark.parametrize(
    "shape", ["1x4x2x256x256x64:window=-2,0", "1x4x2x256x256x64:window=64", "1x4x2x8x8x8:softcap=0"]
)
def test_a_bad_attention_feature_names_the_shape_flag(shape):
    with pytest.raises(LimitError, match="shape flag"):
        REGISTRY["flash_attention"].parse_shape(shape)
