"""``nl.NKIObject`` subclasses with and without ``@dataclass`` (nki-language-guide.rst,
"Class Support"): positional and keyword construction, defaults, unannotated attributes,
``__post_init__``, methods called inside kernels, instances passed as kernel arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from neuron_kernels.interpreter import nki, run

nl, nisa = nki.language, nki.isa


@dataclass
class Toggle(nl.NKIObject):
    x: int
    y: bool = False

    def toggle(self):
        self.y = not self.y


class PlainToggle(nl.NKIObject):  # the guide: compiled the same way as the dataclass
    x: int
    y: bool = False

    def toggle(self):
        self.y = not self.y


class Scaled(PlainToggle):
    scale: float = 2.0
    LIMIT: ClassVar[int] = 4

    def __post_init__(self):
        self.doubled = self.scale * 2


@pytest.mark.parametrize("cls", [Toggle, PlainToggle])
def test_construction_like_the_language_guide(cls):
    c = cls(1)
    c.toggle()
    assert (c.x, c.y) == (1, True)
    k = cls(x=3, y=True)
    assert (k.x, k.y) == (3, True)


def test_plain_class_defaults_missing_fields_to_none():
    c = PlainToggle()  # the guide's generated __init__(self, x=None, y=False)
    assert (c.x, c.y) == (None, False)


def test_plain_subclass_inherits_fields_and_runs_post_init():
    s = Scaled(5, True, 3.0)
    assert (s.x, s.y, s.scale, s.doubled) == (5, True, 3.0, 6.0)
    assert Scaled(x=1).scale == 2.0 and Scaled(x=1).doubled == 4.0
    assert "LIMIT" not in vars(Scaled(1)) and Scaled.LIMIT == 4  # ClassVar: not a field


def test_undeclared_keywords_and_errors():
    """The generated ``__init__`` takes the class's attributes and nothing else (guide, "Class
    Support": ``def __init__(self, x = None, y = False)``)."""
    with pytest.raises(TypeError, match="unexpected keyword argument 'tile'"):
        PlainToggle(1, tile=128)
    p = PlainToggle(1)
    with pytest.raises(TypeError, match="positional"):
        PlainToggle(1, True, 3)
    with pytest.raises(TypeError, match="multiple values"):
        PlainToggle(1, x=2)
    assert "PlainToggle(x=1" in repr(p)


@dataclass(frozen=True)
class TilePlan(nl.NKIObject):
    rows: int
    scale: float = 1.0


class PlainPlan(nl.NKIObject):
    rows: int
    scale: float = 1.0


def scale_rows(x, plan):
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    for r in range(0, x.shape[0], plan.rows):
        tile = nl.ndarray((plan.rows, x.shape[1]), x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[r : r + plan.rows, :])
        nisa.tensor_scalar(dst=tile, data=tile, op0=nl.multiply, operand0=plan.scale)
        nisa.dma_copy(dst=out[r : r + plan.rows, :], src=tile)
    return out


@pytest.mark.parametrize("plan", [TilePlan(2, 3.0), PlainPlan(rows=2, scale=3.0)])
def test_objects_pass_as_kernel_arguments(plan):
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(run(scale_rows, (x, plan)).outputs, 3.0 * x)


# Kernels in aws-neuron/nki-library's style (written after reading its kernels and the nisa
# docstring examples, not copied): a frozen ``@dataclass`` NKIObject config as an optional argument
# (``is None``), an optional weight (``is not None``) broadcast across partitions with
# ``nl.broadcast_to``, and a helper in the same module. Tolerance, chosen before running: RMSNorm in
# fp32 is a 64-term fp32 sum of squares (about 64 * 2**-24 relative), one rsqrt and two products, so
# ``rtol=2e-5, atol=1e-6``.

RNG = np.random.default_rng(2026)


@dataclass(frozen=True)
class NormConfig(nl.NKIObject):
    eps: float = 1e-6
    rows_per_tile: int = 128


def _load(src, rows, cols, dtype):
    """A helper, as nki-library factors DMA loads out of its kernels."""
    tile = nl.ndarray((rows, cols), dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=src)
    return tile


@nki.jit
def rmsnorm_kernel(x, gamma=None, config=None):
    if config is None:
        config = NormConfig()
    n, h = x.shape
    out = nl.ndarray((n, h), x.dtype, buffer=nl.shared_hbm)
    g = None
    if gamma is not None:
        row = _load(gamma, 1, h, gamma.dtype)
        g = nl.broadcast_to(row, (config.rows_per_tile, h))
    for r in range(0, n, config.rows_per_tile):
        p = min(config.rows_per_tile, n - r)
        t = _load(x[r : r + p, :], p, h, nl.float32)
        sq = nl.ndarray((p, h), nl.float32, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=sq, data1=t, data2=t, op=nl.multiply)
        ms = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.tensor_reduce(dst=ms, op=nl.add, data=sq, axis=1, keepdims=True)
        nisa.tensor_scalar(
            dst=ms, data=ms, op0=nl.multiply, operand0=1.0 / h, op1=nl.add, operand1=config.eps
        )
        inv = nl.ndarray((p, 1), nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=inv, op=nl.rsqrt, data=ms)
        y = nl.ndarray((p, h), nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(dst=y, data=t, op0=nl.multiply, operand0=inv)
        if g is not None:
            nisa.tensor_tensor(dst=y, data1=y, data2=g[0:p, :], op=nl.multiply)
        nisa.dma_copy(dst=out[r : r + p, :], src=y)
    return out


def _rmsnorm_ref(x, gamma, eps):
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + eps)
    return y if gamma is None else y * gamma.astype(np.float64)


@pytest.mark.parametrize("with_gamma", [False, True])
@pytest.mark.parametrize("config", [None, NormConfig(eps=1e-3, rows_per_tile=64)])
def test_rmsnorm_optional_weight_and_config(with_gamma, config):
    x = RNG.standard_normal((200, 64)).astype(np.float32)
    gamma = RNG.standard_normal((1, 64)).astype(np.float32) if with_gamma else None
    got = rmsnorm_kernel(x, gamma, config)
    eps = (config or NormConfig()).eps
    np.testing.assert_allclose(got, _rmsnorm_ref(x, gamma, eps), rtol=2e-5, atol=1e-6)
