"""The one error type for broken limits: `<op>: <argument> <rule>, got <value>`."""

from __future__ import annotations

from typing import Any

__all__ = ["LimitError"]


class LimitError(ValueError):
    """A shape, dtype, buffer or configuration limit was broken.

    The fields are kept as attributes so tests and tools check data, not prose.

    Attributes:
        op: the operation or API that refused, e.g. ``"nisa.nc_matmul"`` or ``"matmul"``.
        arg: the argument (or quantity) at fault, e.g. ``"moving free size"``.
        rule: the rule it broke, e.g. ``"must be <= 512"``.
        limit: the bound of the rule when it has one (a number, a set, a dtype name).
        value: the offending value.
        hint: an optional sentence on how to fix it.
    """

    def __init__(
        self,
        op: str,
        arg: str,
        rule: str,
        value: Any,
        *,
        limit: Any = None,
        hint: str | None = None,
    ) -> None:
        self.op = op
        self.arg = arg
        self.rule = rule
        self.limit = limit
        self.value = value
        self.hint = hint
        message = f"{op}: {arg} {rule}, got {value}"
        if hint:
            message += f". {hint}"
        super().__init__(message)

    def __reduce__(self):  # keep the fields through pickling (multiprocessing, pytest-xdist)
        return (
            _rebuild,
            (type(self), self.op, self.arg, self.rule, self.value, self.limit, self.hint),
        )


def _rebuild(cls, op, arg, rule, value, limit, hint):
    return cls(op, arg, rule, value, limit=limit, hint=hint)
