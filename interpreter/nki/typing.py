"""``nki.typing`` on the interpreter: annotations for kernel tensor parameters.

The NKI 0.3.0 migration guide (aws-neuron/aws-neuron-sdk nki/migration/index.rst, "nki.typing
module") introduces ``nt.tensor[shape]`` "for type-annotating kernel tensor parameters", and
AWS's examples annotate with bare ``tensor`` too (nki/examples/average_pool2d). The docs say
the annotation declares the expected shape but not that the compiler checks it, so the
interpreter accepts and records it (``nt.tensor[128, 512].shape``) and checks nothing: a
check there would be stricter than AWS's toolchain is documented to be.
"""

from __future__ import annotations

from neuron_kernels.interpreter.errors import NkiValidationError
from neuron_kernels.interpreter.errors import not_implemented as _not_implemented
from neuron_kernels.interpreter.tensor import NkiTensor

__all__ = ["tensor"]


class _ShapedTensor:
    """``nt.tensor[d0, d1, ...]``: an annotation that records the declared shape."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape

    def __repr__(self) -> str:
        return f"nki.typing.tensor[{', '.join(map(repr, self.shape))}]"

    def __eq__(self, other) -> bool:
        return isinstance(other, _ShapedTensor) and other.shape == self.shape

    def __hash__(self) -> int:
        return hash(self.shape)


class tensor(NkiTensor):  # noqa: N801 (the API's name)
    """``nt.tensor`` (any tensor) or ``nt.tensor[shape]`` (a tensor of that declared shape)."""

    def __init__(self, *args, **kwargs) -> None:
        raise TypeError("nki.typing.tensor is an annotation; allocate with nl.ndarray")

    def __class_getitem__(cls, shape) -> _ShapedTensor:
        shape = shape if isinstance(shape, tuple) else (shape,)
        for d in shape:
            if (
                isinstance(d, bool)
                or not isinstance(d, (int, str))
                or (isinstance(d, int) and d < 1)
            ):
                raise NkiValidationError(
                    "nki.typing.tensor", "shape", "must be positive ints (or names)", shape
                )
        return _ShapedTensor(shape)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    raise _not_implemented(f"nki.typing.{name}", known=False)
