"""One declaration per op: :class:`OpSpec`, tunable configs and the op registry.

A kernel module states everything about its op once: the NKI entry points, the tunable
config (frozen data, each field with its choices and a reasoned default), the limits
check, the plain-torch reference, output shapes and per-dtype tolerances. ``torch_ops``,
``autotune``, the profiler and the contract tests all read that one object.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from neuron_kernels.errors import LimitError

__all__ = [
    "OpSpec",
    "TunableConfig",
    "Tolerance",
    "tunable",
    "Runner",
    "REGISTRY",
    "register",
    "get_spec",
]

# A runner executes one NKI kernel: ``runner(kernel, *args, **kwargs) -> outputs``.
# The interpreter runner simulates on CPU, the device runner calls the jitted kernel on
# ``neuron`` tensors, the profiling runner also keeps the instruction trace.
Runner = Callable[..., Any]


def tunable(default: Any, choices: tuple, why: str) -> Any:
    """A tunable field: its default, the choices the tuner may take, and a one-line reason
    for the default labelled "modeled" (cost model) or "hardware" (a Trn2 run)."""
    if default not in choices:
        raise ValueError(f"default {default!r} is not among the choices {choices!r}")
    if not (
        why.startswith("modeled") or why.startswith("hardware") or why.startswith("correctness")
    ):
        raise ValueError(
            f"the reason for a default must start with 'modeled', 'hardware' or 'correctness': {why!r}"
        )
    return field(default=default, metadata={"choices": tuple(choices), "why": why})


@dataclass(frozen=True)
class TunableConfig:
    """Base of every op's config: a frozen dataclass whose fields are all :func:`tunable`."""

    op_name: ClassVar[str] = "op"

    @classmethod
    def default(cls) -> TunableConfig:
        return cls()

    @classmethod
    def space(cls) -> dict[str, tuple]:
        """Field name -> the choices the autotuner may take."""
        return {f.name: f.metadata["choices"] for f in dataclasses.fields(cls)}

    @classmethod
    def reasons(cls) -> dict[str, str]:
        return {f.name: f.metadata["why"] for f in dataclasses.fields(cls)}

    @classmethod
    def all_configs(cls) -> Iterator[TunableConfig]:
        space = cls.space()
        for values in itertools.product(*space.values()):
            yield cls(**dict(zip(space, values)))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TunableConfig:
        """Build a config from a mapping, refusing unknown fields and values off the grid."""
        space = cls.space()
        unknown = set(values) - set(space)
        if unknown:
            raise LimitError(
                cls.op_name, "config", f"must only name the fields {sorted(space)}", sorted(unknown)
            )
        for name, value in values.items():
            if value not in space[name]:
                raise LimitError(
                    cls.op_name,
                    f"config {name}",
                    f"must be one of {space[name]}",
                    value,
                    limit=space[name],
                )
        return cls(**dict(values))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Tolerance:
    """``|out - ref| <= atol + rtol * |ref|`` elementwise, with the reason the bound was chosen."""

    atol: float
    rtol: float
    reason: str


@dataclass(frozen=True)
class OpSpec:
    """Everything about one op, declared once in its kernel module.

    Attributes:
        name: snake_case op name: ``torch.ops.neuron.<name>``, ``perf_results/<target>/<name>.json``.
        config: the op's :class:`TunableConfig` subclass.
        launch: ``launch(*op_args, config, runner)``: runs the NKI kernel(s) for op-level
            torch inputs (any batch layout) and returns the op's outputs. Its type hints,
            minus ``config`` and ``runner``, are the op's schema.
        reference: ``reference(*op_args, upcast=True)``: plain torch; fp64 when ``upcast``,
            the inputs' dtype otherwise (the fast path for non-neuron devices).
        validate: ``validate(*op_args)``: raises :class:`LimitError` for bad op input (ranks,
            dtypes, mismatched sizes, mixed devices) before any work.
        problem: ``problem(*op_args) -> dict``: the sizes that select configs and limits.
        check: ``check(problem, dtype, config, target)``: raises :class:`LimitError` when the
            config cannot run that problem on that target (tile, SBUF and PSUM budgets).
        output_shapes: ``output_shapes(*op_args) -> list[(shape, dtype)]`` for fake impls.
        tolerances: per NKI dtype name, the :class:`Tolerance` tests hold the kernel to.
        make_inputs: ``make_inputs(problem, dtype, generator) -> tuple`` of op args.
        parse_shape: ``parse_shape("4096x4096x4096") -> problem`` for the CLIs.
        shape_bucket: ``shape_bucket(problem) -> str``: the key tuned configs are stored under.
        test_problems: sizes the contract tests use: ``"ranges"`` ``{dim: (low, high)}`` to
            draw from, ``"edges"`` values to favour, a small ``"probe"`` problem every config
            runs on, and a ``"large"`` one where SBUF/PSUM budgets bind.
        dtypes: torch dtype names the op accepts.
        kernels: the NKI kernels the op runs (their source is part of a tuned config's key).
        autograd: ``(setup_context, backward)``; ``setup_context(ctx, *op_args, output)``
            receives the inputs by name, ``backward(ctx, *grads)`` returns one grad per input.
        bad_inputs: ``bad_inputs() -> [(op_args, arg_name), ...]``: one bad input per
            op-boundary limit, with the argument the error must name.
    """

    name: str
    config: type[TunableConfig]
    launch: Callable[..., Any]
    reference: Callable[..., Any]
    validate: Callable[..., None]
    problem: Callable[..., dict]
    check: Callable[[dict, str, TunableConfig, str], None]
    output_shapes: Callable[..., list]
    tolerances: Mapping[str, Tolerance]
    make_inputs: Callable[..., tuple]
    parse_shape: Callable[[str], dict]
    shape_bucket: Callable[[dict], str]
    test_problems: Mapping[str, Any]
    dtypes: tuple[str, ...]
    kernels: tuple = ()
    autograd: tuple[Callable, Callable] | None = None
    bad_inputs: Callable[[], list] | None = None
    description: str = ""

    def is_valid(self, problem: dict, dtype: str, config: TunableConfig, target: str) -> bool:
        try:
            self.check(problem, dtype, config, target)
        except LimitError:
            return False
        return True


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.name in REGISTRY and REGISTRY[spec.name] is not spec:
        raise ValueError(f"op {spec.name!r} is registered twice")
    REGISTRY[spec.name] = spec
    return spec


def get_spec(name: str) -> OpSpec:
    from neuron_kernels import kernels  # noqa: F401  (imports every kernel module, which registers)

    if name not in REGISTRY:
        raise LimitError("neuron-kernels", "op", f"must be one of {sorted(REGISTRY)}", name)
    return REGISTRY[name]
