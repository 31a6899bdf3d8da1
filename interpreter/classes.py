"""NKI's class model: ``NKIObject``, its generated initializers, equality, and arguments.

aws-neuron/aws-neuron-sdk nki/get-started/nki-language-guide.rst (snapshot 81ce03ae),
"Class Support" and "Enumerations":

- "the class must inherit from NKIObject and no other classes" (line 572);
- "The @dataclass decorator is optional; classes with and without the @dataclass decorator
  will be compiled in the same way by the NKI compiler. The compiler will create the
  initializer functions __init__ and __post_init__, if they are not provided by the user"
  (line 590), with ``def __init__(self, x = None, y = False)`` for ``x : int`` and
  ``y : bool = False``: one parameter per class attribute, its class value as the default,
  None without one. nki-library's attention_cte.py (``SectionParams``,
  ``AttnInternalBuffers``) declares ``@dataclass`` records whose attributes have defaults but
  no annotations and builds them with keywords, so unannotated class attributes are
  parameters too; Python's dataclass would make them no fields at all;
- instances passed to a kernel are rebuilt from "the objects dictionary. Currently, NKI does
  not look at slots or other object features, only the object dictionary" (line 604);
- "Equality in NKI is structural" (line 661);
- enums become ``NKIObject`` classes with ``name`` and ``value``; "No other binary operators on
  enum values are supported" (line 661). An ``Enum`` whose members allow one anyway (an
  ``IntEnum``/``StrEnum`` or other int/str/float mixin, a ``Flag``, an enum defining ``__lt__``)
  is refused: as an argument here, and reached from a kernel in python_subset.py.

What the guide leaves open, and the choice made here: the order of the parameters when a
class mixes annotated and unannotated attributes (annotated ones first, in annotation order,
then unannotated ones in definition order, base classes before subclasses); whether values
nested in an argument's dictionary are rebuilt too (they are, recursively, for NKIObjects).
"""

from __future__ import annotations

import dataclasses
import enum
import sys
import types
from typing import Any

from neuron_kernels.interpreter.errors import NkiValidationError

__all__ = [
    "NKIObject",
    "class_attributes",
    "enum_operators",
    "nki_object_bases",
    "rebuilt_argument",
]

GUIDE = "nki/get-started/nki-language-guide.rst"
_ONLY_NKIOBJECT = (
    f"the class must inherit from NKIObject and no other classes ({GUIDE}, 'Class Support')"
)
_NO_ENUM_OPERATORS = (
    "No other binary operators on enum values are supported"
    f" ({GUIDE}, 'Enumerations'): an enum mixing in int/str/float, a Flag, or one defining"
    " operators would allow them"
)
# Python's binary operators other than == and !=, as (dunder, symbol).
_BINARY_OPERATORS = tuple(
    (f"__{r}{name}__", symbol)
    for r in ("", "r")
    for name, symbol in (
        ("add", "+"), ("sub", "-"), ("mul", "*"), ("matmul", "@"), ("truediv", "/"),
        ("floordiv", "//"), ("mod", "%"), ("pow", "**"), ("lshift", "<<"), ("rshift", ">>"),
        ("and", "&"), ("or", "|"), ("xor", "^"),
    )
) + (("__lt__", "<"), ("__le__", "<="), ("__gt__", ">"), ("__ge__", ">="))  # fmt: skip


def _class_member(cls: type, name: str) -> Any:
    """``name`` as the class's MRO defines it (not the metaclass's: ``type.__or__``)."""
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None


def enum_operators(cls: type) -> list[str]:
    """The binary operators other than == and != that members of the Enum class ``cls``
    allow: none for a plain ``Enum``; an int/str/float mixin's, a ``Flag``'s, or the class's
    own otherwise. The guide's enums allow none ('Enumerations', line 661)."""
    out: list[str] = []
    for dunder, symbol in _BINARY_OPERATORS:
        if _class_member(cls, dunder) is not _class_member(enum.Enum, dunder):
            if symbol not in out:
                out.append(symbol)
    return out


def _is_interpreter_class(cls: type) -> bool:
    return cls.__module__.startswith("neuron_kernels.interpreter")


class NKIObject:
    """Base class of every NKI class (``nl.NKIObject``).

    A subclass that defines no ``__init__`` gets the initializer the language guide
    describes (see the module docstring), also under ``@dataclass``, whose own generated
    ``__init__`` it replaces; equality is structural (same class, equal ``__dict__``).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if _is_interpreter_class(cls):
            return  # NkiTensor, VirtualRegister, nl.tile_size: the API's own classes
        # Set before @dataclass runs: dataclasses never replaces a method the class
        # defines itself (dataclasses._set_new_attribute), so these stay.
        if "__init__" not in cls.__dict__ and getattr(cls.__init__, "_nki_generated", False):
            cls.__init__ = _generated_init
        if "__eq__" not in cls.__dict__:
            cls.__eq__ = _structural_eq
            cls.__hash__ = _structural_hash
        if "__repr__" not in cls.__dict__:
            cls.__repr__ = _repr

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _generated_init(self, *args, **kwargs)

    __init__._nki_generated = True  # type: ignore[attr-defined]

    def __post_init__(self) -> None:
        """The guide's default ``__post_init__``: nothing."""


def nki_object_bases() -> tuple[type, ...]:
    """The ``NKIObject`` classes a kernel's classes may derive from: ours, and AWS's
    ``nki.language.NKIObject`` when that package is loaded (the kernels then define their
    plans against it, and our interpreter still models them)."""
    language = sys.modules.get("nki.language")
    official = getattr(language, "NKIObject", None)
    if isinstance(official, type) and official is not NKIObject:
        return (NKIObject, official)
    return (NKIObject,)


def _skipped_attribute(name: str, value: Any) -> bool:
    """Class members that are not instance attributes: methods, properties, dunders."""
    if name.startswith("__") and name.endswith("__"):
        return True
    return (
        isinstance(value, (types.FunctionType, staticmethod, classmethod, property, type))
        or callable(getattr(value, "__get__", None))
        and not isinstance(value, dataclasses.Field)
    )


def class_attributes(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of the generated initializer's parameters, in parameter order."""
    cached = cls.__dict__.get("_nki_attributes_cache")
    if cached is not None and cached[0] is cls:
        return cached[1]
    dc_fields = (
        {f.name: f for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else {}
    )
    names: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is object or klass is NKIObject or not issubclass(klass, NKIObject):
            continue
        annotations = klass.__dict__.get("__annotations__", {})
        for name, hint in annotations.items():
            if "ClassVar" in str(hint) or (name.startswith("__") and name.endswith("__")):
                continue
            names[name] = klass.__dict__.get(name, names.get(name))
        for name, value in klass.__dict__.items():
            if name in annotations or name == "_nki_attributes_cache":
                continue
            if not _skipped_attribute(name, value):
                names[name] = value
    out = []
    for name, default in names.items():
        field = dc_fields.get(name)
        if field is not None and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory
            out.append((name, _Factory(default)))
            continue
        if field is not None and field.default is not dataclasses.MISSING:
            default = field.default
        if isinstance(default, dataclasses.Field):
            default = None if default.default is dataclasses.MISSING else default.default
        out.append((name, default))
    type.__setattr__(cls, "_nki_attributes_cache", (cls, out))
    return out


class _Factory:
    __slots__ = ("make",)

    def __init__(self, make) -> None:
        self.make = make


def _generated_init(self, *args: Any, **kwargs: Any) -> None:
    """``__init__(self, a=<default of a>, b=..., ...)`` then ``self.__post_init__()``."""
    cls = type(self)
    attributes = class_attributes(cls)
    names = [name for name, _ in attributes]
    if len(args) > len(names):
        raise TypeError(
            f"{cls.__name__}() takes {len(names)} positional arguments (its attributes "
            f"{names}) but {len(args)} were given"
        )
    given = dict(zip(names, args))
    for key, value in kwargs.items():
        if key in given:
            raise TypeError(f"{cls.__name__}() got multiple values for argument {key!r}")
        if key not in names:
            raise TypeError(
                f"{cls.__name__}() got an unexpected keyword argument {key!r} (the generated "
                f"__init__ takes the class's attributes {names}, {GUIDE} 'Class Support')"
            )
        given[key] = value
    for name, default in attributes:
        if name not in given:
            given[name] = default.make() if isinstance(default, _Factory) else default
    for name in names:  # object.__setattr__: also for @dataclass(frozen=True) records
        object.__setattr__(self, name, given[name])
    self.__post_init__()


def _structural_eq(self, other: Any) -> bool:
    if type(other) is not type(self):
        return NotImplemented
    return vars(self) == vars(other)


def _structural_hash(self) -> int:
    return hash((type(self), tuple(sorted(vars(self).items(), key=lambda kv: kv[0]))))


def _repr(self) -> str:
    items = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
    return f"{type(self).__name__}({items})"


def _check_bases(cls: type) -> None:
    for klass in cls.__mro__[1:]:
        if klass is object or issubclass(klass, NKIObject) or klass.__module__ == "typing":
            continue
        raise NkiValidationError(
            "nki.jit",
            f"class {cls.__qualname__}",
            f"must derive from NKIObject only: {_ONLY_NKIOBJECT}",
            f"base {klass.__qualname__}",
        )


def rebuilt_argument(value: Any, name: str = "argument") -> Any:
    """A kernel argument as NKI sees it: NKIObject instances rebuilt from their ``__dict__``
    (no ``__init__``, no slots), recursively through tuples, dicts and attributes; enum
    members of a class that allows other binary operators than == and != refused."""
    if isinstance(value, NKIObject) and not _is_interpreter_class(type(value)):
        cls = type(value)
        _check_bases(cls)
        copy = object.__new__(cls)
        for key, item in vars(value).items():
            copy.__dict__[key] = rebuilt_argument(item, f"{name}.{key}")
        return copy
    if isinstance(value, enum.Enum) and not _is_interpreter_class(type(value)):
        if not (type(value).__module__ or "").startswith("nki") and enum_operators(type(value)):
            raise NkiValidationError(
                "nki.jit",
                f"argument {name!r}",
                f"must be a plain Enum member: {_NO_ENUM_OPERATORS}",
                f"{type(value).__name__}.{value.name} ({type(value).__mro__[1].__name__})",
            )
        return value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(rebuilt_argument(v, f"{name}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {k: rebuilt_argument(v, f"{name}[{k!r}]") for k, v in value.items()}
    return value
