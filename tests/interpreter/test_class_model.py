"""NKI's class model (interpreter/classes.py) against the language guide.

Each test quotes aws-neuron/aws-neuron-sdk nki/get-started/nki-language-guide.rst (snapshot
81ce03ae), "Class Support" and "Enumerations". What this proves: classes behave in the
interpreter as the guide says the compiler builds them. What only the NKI compiler can
prove: the parameter order it picks for classes mixing annotated and unannotated attributes
(the guide leaves it open; classes.py documents the choice).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import pytest

from neuron_kernels.interpreter import nki, run
from neuron_kernels.interpreter.errors import NkiValidationError

nl, nisa = nki.language, nki.isa

X = np.arange(8, dtype=np.float32).reshape(2, 4)


@dataclass
class SectionParams(nl.NKIObject):
    """The shape of nki-library core/attention/attention_cte.py ``SectionParams``: a
    @dataclass whose attributes have defaults and no annotations, built with keywords."""

    section_idx = None
    section_offset = None
    contains_prefix = False


def test_dataclass_with_unannotated_defaults_takes_keywords():
    """Guide line 590: "The @dataclass decorator is optional; classes with and without the
    @dataclass decorator will be compiled in the same way". Python's dataclass makes these
    no fields (SectionParams(section_idx=1) is a TypeError there)."""
    sp = SectionParams(section_idx=1, section_offset=512)
    assert (sp.section_idx, sp.section_offset, sp.contains_prefix) == (1, 512, False)
    assert SectionParams(2).section_idx == 2


class Plain(nl.NKIObject):
    x: int
    y: bool = False


@dataclass
class Decorated(nl.NKIObject):
    x: int
    y: bool = False


@pytest.mark.parametrize("cls", [Plain, Decorated])
def test_generated_init_is_the_guides(cls):
    """Guide: "For the class above, the default initializers are: def __init__(self, x =
    None, y = False)" -- x has no default yet may be omitted."""
    c = cls()
    assert (c.x, c.y) == (None, False)
    c = cls(1, y=True)
    assert (c.x, c.y) == (1, True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'z'"):
        cls(1, z=2)


class WithPostInit(nl.NKIObject):
    scale: float = 2.0

    def __post_init__(self):
        self.doubled = self.scale * 2


@dataclass(frozen=True)
class FrozenWithPostInit(nl.NKIObject):
    scale: float = 2.0
    rows = 4  # unannotated attribute of a frozen record


def test_post_init_runs_after_the_generated_init():
    """Guide: the generated ``__init__`` ends with ``self.__post_init__()``, and "The
    compiler will create the initializer functions __init__ and __post_init__, if they are
    not provided by the user" (the default ``__post_init__`` does nothing)."""
    assert WithPostInit(3.0).doubled == 6.0
    frozen = FrozenWithPostInit(rows=8)
    assert (frozen.scale, frozen.rows) == (2.0, 8)


class UserInit(nl.NKIObject):
    x: int = 1

    def __init__(self, x):
        self.x = x * 10


def test_a_user_init_is_kept():
    """Guide's class A: "x : int = 1 / def __init__(self, x): self.x = x"."""
    assert UserInit(2).x == 20


@dataclass
class WithFactory(nl.NKIObject):
    items: list = field(default_factory=list)


def test_dataclass_default_factory_gives_a_fresh_value():
    a, b = WithFactory(), WithFactory()
    a.items.append(1)
    assert b.items == []


def test_equality_is_structural():
    """Guide line 661: "Equality in NKI is structural"."""
    assert Plain(1, True) == Plain(1, True)
    assert Plain(1, True) != Plain(1, False)
    assert Plain(1) != Decorated(1)  # another class: never equal
    assert SectionParams(section_idx=3) == SectionParams(section_idx=3)


class Tracker(nl.NKIObject):
    calls: int = 0

    def __init__(self, calls):
        self.calls = calls + 1  # would count again if the kernel side re-ran __init__


def read_calls(x, tracker):
    assert tracker.calls == 1
    tracker.calls = 99  # the kernel's copy, not the caller's object
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_arguments_are_rebuilt_from_their_dict():
    """Guide lines 604, 627: "convert the Python class instance to a NKI instance using the
    objects dictionary ... nki_a.__dict__ = python_a.__dict__": no __init__ runs again, and
    the kernel works on its own instance."""
    tracker = Tracker(0)
    run(read_calls, (X, tracker))
    assert tracker.calls == 1


class Slotted(nl.NKIObject):
    __slots__ = ("hidden",)

    def __init__(self):
        self.hidden = 1


def reads_slot(x, obj):
    assert not hasattr(obj, "hidden")
    return read_calls(x, Tracker(0))


def test_slots_are_not_carried_over():
    """Guide line 604: "NKI does not look at slots or other object features, only the
    object dictionary"."""
    run(reads_slot, (X, Slotted()))


class Mixed(nl.NKIObject, dict):
    pass


def test_an_argument_class_with_other_bases_is_refused():
    """Guide line 572: "the class must inherit from NKIObject and no other classes"."""
    with pytest.raises(NkiValidationError, match="must derive from NKIObject only") as info:
        run(read_calls, (X, Mixed()))
    assert info.value.value == "base dict"


class Color(enum.Enum):
    red = 1
    blue = 2


class Level(enum.IntEnum):
    low = 1


class Access(enum.Flag):
    read = 1


def pick(x, color):
    if color == Color.red:
        return read_calls(x, Tracker(0))
    return read_calls(x, Tracker(0))


def test_enum_members_compare_structurally():
    """Guide, "Enumerations": ``if e == E.x: ...``; "no additional code is needed to
    replicate the behavior of == and !="."""
    np.testing.assert_array_equal(run(pick, (X, Color.red)).outputs, X)
    assert Color.red != Color.blue


def test_enums_that_allow_arithmetic_are_refused():
    """Guide line 661 ("Enumerations"): "No other binary operators on enum values are
    supported"; an IntEnum member would let ``level + 1`` through, a Flag member
    ``access | other``."""
    for member, base in ((Level.low, "IntEnum"), (Access.read, "Flag")):
        with pytest.raises(NkiValidationError, match="No other binary operators") as info:
            run(pick, (X, member))
        assert info.value.arg == "argument 'color'"
        assert info.value.value == f"{type(member).__name__}.{member.name} ({base})"
