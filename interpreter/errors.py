"""Errors the interpreter raises: broken hardware limits and APIs it does not implement."""

from __future__ import annotations

from neuron_kernels.errors import LimitError

__all__ = ["NkiValidationError", "NotImplementedByInterpreter", "not_implemented"]


class NkiValidationError(LimitError, AssertionError):
    """Raised when a documented hardware constraint is violated (``nisa.NkiValidationError``).

    It is a :class:`~neuron_kernels.errors.LimitError` (fields ``op``, ``arg``, ``limit``,
    ``value``) and an ``AssertionError``, the type AWS's simulator raises for the same checks.
    """


class NotImplementedByInterpreter(NotImplementedError, AttributeError):
    """An NKI API the interpreter does not implement. Also an AttributeError so that
    ``hasattr(nisa, name)`` answers False instead of raising."""


def not_implemented(qualified_name: str, known: bool = True) -> NotImplementedByInterpreter:
    if known:
        from neuron_kernels.interpreter.unimplemented import reason

        why = reason(qualified_name)
        return NotImplementedByInterpreter(
            f"{qualified_name} is not implemented by the neuron-kernels interpreter"
            + (f": {why}" if why else "")
        )
    return NotImplementedByInterpreter(
        f"{qualified_name} is not implemented by the neuron-kernels interpreter (nor is it an NKI 0.6 API)"
    )
