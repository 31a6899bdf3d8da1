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
