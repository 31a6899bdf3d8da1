"""One declaration per op: :class:`OpSpec`, tunable configs, tile plans and the op registry.

A kernel module states everything about its op once: the NKI entry points, the tunable
config (frozen data, each field with its choices and a reasoned default), the tile plan
(derived once from problem, dtype, config and target, read by the kernel and by the
budget check), the plain-torch reference and the per-dtype tolerances. ``torch_ops``,
``autotune``, the profiler and the contract tests all read that one object; what every op
would otherwise write again (shape parsing, shape buckets, budget checks, fake shapes,
dtype names) has its default here.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from neuron_kernels.errors import LimitError
from neuron_kernels.hardware import Target, target_from_name, usable_psum_banks

__all__ = [
    "DTYPES",
    "ITEMSIZE",
    "MEASURE_SEED",
    "measure_generator",
    "FunctionRunner",
    "REGISTRY",
    "OpSpec",
    "Runner",
    "TilePlan",
    "Tolerance",
    "TunableConfig",
    "bucket_size",
    "ceil_div",
    "check_lnc",
    "dtype_name",
    "get_spec",
    "register",
    "runner_lnc",
    "shape_parser",
    "tunable",
]

# The floating dtypes an op accepts unless it says otherwise, and their element sizes.
DTYPES = ("float32", "bfloat16", "float16")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int8": 1, "uint8": 1}
# The seed of the inputs a problem is measured on (tuner, profile) and whose bytes its floor
# and host memory count: one seed, so an op that draws sizes is counted as it is measured.
MEASURE_SEED = 0


def measure_generator():
    """A ``torch.Generator`` seeded with :data:`MEASURE_SEED`."""
    import torch

    return torch.Generator().manual_seed(MEASURE_SEED)


def dtype_name(t) -> str:
    """``torch.bfloat16`` (or a tensor of it) -> ``"bfloat16"``, the name NKI uses."""
    return str(getattr(t, "dtype", t)).removeprefix("torch.")


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


class Runner(Protocol):
    """Runs one NKI kernel: ``runner(kernel, *args, **kwargs) -> outputs``.

    The interpreter runner simulates on CPU, the profiler also keeps the instruction trace,
    the device runner calls the jitted kernel on ``neuron`` tensors. ``target`` is the
    NeuronCore generation the kernel runs on (or is modeled for): the tile plan is derived
    for it. ``lnc`` is the logical NeuronCore size the op launches at: the op's
    ``run_kernels`` plans the split for it and launches ``kernel[lnc]`` (NKI 0.6
    ``nki/api/nki/__init__.py``, ``jit``: the launch's LNC must match the runtime's).
    """

    target: Target
    lnc: int

    def __call__(self, kernel, *args, **kwargs) -> Any: ...


@dataclass(frozen=True)
class FunctionRunner:
    """A plain ``fn(kernel, *args, **kwargs)`` as a :class:`Runner` for ``target``."""

    fn: Callable[..., Any]
    target: Target
    lnc: int = 1

    def __call__(self, kernel, *args, **kwargs) -> Any:
        return self.fn(kernel, *args, **kwargs)


class TilePlan(Protocol):
    """What a tile plan must expose for the budget check; each op's plan is a frozen
    ``nl.NKIObject`` dataclass (so the kernel can take it as a compile-time argument)
    carrying whatever else its kernel reads."""

    lnc: int  # physical cores the launch splits its work over (kernel[lnc])
    sbuf_bytes: int  # peak SBUF bytes per partition one core's share holds
    psum_banks: int  # PSUM banks (2 KiB per partition each) one core holds at once


def tunable(default: Any, choices: tuple, why: str) -> Any:
    """A tunable field: its default, the choices the tuner may take, and a one-line reason
    for the default labelled "modeled" (cost model), "hardware" (a Trn2 run) or
    "correctness"."""
    if default not in choices:
        raise ValueError(f"default {default!r} is not among the choices {choices!r}")
    if not why.startswith(("modeled", "hardware", "correctness")):
        raise ValueError(
            f"the reason for a default must start with 'modeled', 'hardware' or 'correctness': {why!r}"
        )
    return field(default=default, metadata={"choices": tuple(choices), "why": why})


def _same_choice(value: Any, choice: Any) -> bool:
    # Types must match too: True == 1 and 4.0 == 4, but neither is the int choice 1 or 4.
    return type(value) is type(choice) and value == choice


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
        """Build a config from a mapping, refusing unknown fields and values off the grid
        (by type as well as value)."""
        if not isinstance(values, Mapping):
            raise LimitError(
                cls.op_name, "config", "must be an object of field values", type(values).__name__
            )
        space = cls.space()
        unknown = set(values) - set(space)
        if unknown:
            raise LimitError(
                cls.op_name,
                "config",
                f"must only name the fields {sorted(space)}",
                sorted(unknown, key=str),
            )
        for name, value in values.items():
            if not any(_same_choice(value, c) for c in space[name]):
                raise LimitError(
                    cls.op_name,
                    f"config {name}",
                    f"must be one of {space[name]}",
                    repr(value),
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

    What the op must declare (its own shapes, tiles, reference and tolerances):
        name: snake_case op name: ``torch.ops.neuron.<name>``, ``perf_results/<target>/<name>.json``.
        config: the op's :class:`TunableConfig` subclass.
        plan: ``plan(problem, dtype, config, target, lnc) -> TilePlan``: the tile plan the
            kernel runs at LNC ``lnc`` (each core's share of the work) and the budgets one
            physical core holds; raises :class:`LimitError` for a config that cannot
            run the problem at all (a missing feature of the target, a bad dtype pairing).
            :meth:`check` adds the SBUF/PSUM capacity comparison, in one place for every op.
        run_kernels: ``run_kernels(*op_args, config, runner)``: runs the NKI kernel(s) for
            op-level torch inputs (any batch layout) through ``runner`` and returns the op's
            outputs; it derives the plan with ``spec.check(..., runner.target, runner_lnc(runner))``
            and launches ``kernel[plan.lnc]``. Its type
            hints, minus ``config`` and ``runner``, are the op's schema.
        reference: ``reference(*op_args, upcast=True)``: plain torch; fp64 when ``upcast``,
            the inputs' dtype otherwise (the fast path for non-neuron devices).
        validate: ``validate(*op_args)``: raises :class:`LimitError` for bad op input (ranks,
            dtypes, mismatched sizes, mixed devices) before any work.
        problem: ``problem(*op_args) -> dict``: the sizes that select configs and limits. Its
            keys, in order, are the op's shape syntax (``"MxNxK"`` for m, n, k).
        tolerances: per NKI dtype name, the :class:`Tolerance` tests hold the kernel to.
        make_inputs: ``make_inputs(problem, dtype, generator) -> tuple`` of op args.
        test_problems: sizes the contract tests use: ``"ranges"`` ``{dim: (low, high)}`` to
            draw from, ``"edges"`` values to favour, a small ``"probe"`` problem every config
            runs on, a ``"large"`` one where SBUF/PSUM budgets bind, and optionally
            ``"empty"``: problems with a zero-size dimension the op accepts (default: the
            probe with each dim in turn set to 0), on which the op and its gradients must
            return empty (or zero) results as the reference does.

    Defaults an op overrides only when it must:
        dtypes: torch dtype names the op accepts (:data:`DTYPES`).
        output_shapes: ``output_shapes(*op_args) -> [(shape, dtype)]`` for fake impls;
            default: the reference run on meta tensors.
        parse_shape: ``parse_shape("4096x4096x4096") -> problem``; default: positive ints
            joined by ``x`` in the order of ``test_problems["probe"]``, then ``:<flag>`` for
            each boolean entry of the probe to set (``"1x32x8x4096x4096x128:causal"``); the
            flags not named are False. ``shape_parser(op, dims, flags)`` builds one with
            other flags.
        shape_bucket: ``shape_bucket(problem) -> str``, the key tuned configs are stored
            under; default: each dim rounded up to a power of two (at least 128).
        kernels: the NKI kernels the op runs (their code is part of a tuned config's key).
        autograd: ``(setup_context, backward)``; ``setup_context(ctx, *op_args, output)``
            receives the inputs by name, ``backward(ctx, *grads)`` returns one grad per input.
        bad_inputs: ``bad_inputs() -> [(op_args, arg_name), ...]``: one bad input per
            op-boundary limit, with the argument the error must name.
        budget_hints: ``{"sbuf": ..., "psum": ...}``: how to fix a config over budget.
        composite: ``composite(*op_args)``: set when the op, as torch runs it, is a
            composition of other ``torch.ops.neuron`` ops (CompositeImplicitAutograd, as
            torch's ``rms_norm`` over ``_fused_rms_norm``): autograd, fake shapes and device
            routing then come from the ops it calls, so it can save what they return
            without returning it itself. ``run_kernels`` still runs its kernels for tests.
        mutates: names of the (tensor or tensor-list) arguments the op updates in place.
            Such an op returns None; its reference updates the same arguments (the
            contract tests compare them), and ``torch_ops`` declares them as mutated.
        model_slice: ``model_slice(problem, lnc) -> (slice_problem, copies)``: set when
            the kernels launched at LNC ``lnc`` run ``copies`` independent, identical pieces
            of ``slice_problem`` one after another on every core (attention's (batch, KV
            head) groups, ``lnc`` of them per piece: one per core), sharing nothing but the
            cores. The tuner's model backend then traces one piece and multiplies its
            modeled latency by ``copies`` (dropping only the overlap of one piece's tail
            with the next one's head: a slight overestimate, tested in ``tests/autotune``);
            ``copies == 1`` traces the whole launch.
        committed_shapes: ``((shape, dtype, what), ...)``: the shapes the shipped
            ``perf_results/`` configs are tuned at (``autotune --committed``), in the op's shape
            syntax; default: the op's entry in ``autotune/shapes.py`` if it has one, else
            its ``test_problems["large"]``.
    """

    name: str
    config: type[TunableConfig]
    plan: Callable[[dict, str, TunableConfig, Target], TilePlan]
    run_kernels: Callable[..., Any]
    reference: Callable[..., Any]
    validate: Callable[..., None]
    problem: Callable[..., dict]
    tolerances: Mapping[str, Tolerance]
    make_inputs: Callable[..., tuple]
    test_problems: Mapping[str, Any]
    dtypes: tuple[str, ...] = DTYPES
    output_shapes: Callable[..., list] | None = None
    parse_shape: Callable[[str], dict] | None = None
    shape_bucket: Callable[[dict], str] | None = None
    kernels: tuple = ()
    autograd: tuple[Callable, Callable] | None = None
    bad_inputs: Callable[[], list] | None = None
    budget_hints: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    composite: Callable[..., Any] | None = None
    mutates: tuple[str, ...] = ()
    model_slice: Callable[[dict, int], tuple[dict, int]] | None = None
    committed_shapes: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.parse_shape is None:
            flags = tuple(k for k, v in self.test_problems["probe"].items() if isinstance(v, bool))
            object.__setattr__(self, "parse_shape", shape_parser(self.name, self.dims, flags))
        if self.shape_bucket is None:
            object.__setattr__(self, "shape_bucket", _pow2_bucket)
        if self.output_shapes is None:
            object.__setattr__(self, "output_shapes", _meta_output_shapes(self.reference))

    @property
    def dims(self) -> tuple[str, ...]:
        """The problem's size dimensions (its int entries), in shape-syntax order."""
        return _size_dims(self.test_problems["probe"])

    def check(
        self, problem: dict, dtype: str, config: TunableConfig, target, lnc: int = 1
    ) -> TilePlan:
        """The tile plan for ``problem`` in ``dtype`` with ``config`` on ``target``, its work
        split over ``lnc`` physical cores; the SBUF and PSUM budgets are per physical core.

        Raises:
            LimitError: the LNC is not one the target has, the dtype is not the op's, the
                config cannot run the problem, or its plan holds more SBUF bytes per
                partition or PSUM banks than one physical core has.
        """
        tg = target_from_name(target)
        check_lnc(self.name, lnc, tg)
        if dtype not in self.dtypes:
            raise LimitError(
                self.name, "dtype", f"must be one of {self.dtypes}", dtype, limit=self.dtypes
            )
        for dim in self.dims:
            if not isinstance(problem.get(dim), int) or problem[dim] < 1:
                raise LimitError(self.name, dim, "must be an int >= 1", problem.get(dim), limit=1)
        plan = self.plan(problem, dtype, config, tg, lnc)
        banks = usable_psum_banks(tg)
        if plan.psum_banks > banks:
            raise LimitError(
                self.name,
                "PSUM banks",
                f"must be <= {banks} ({tg.name})",
                plan.psum_banks,
                limit=banks,
                hint=self.budget_hints.get("psum", "choose smaller blocks"),
            )
        if plan.sbuf_bytes > tg.sbuf_usable_bytes:
            raise LimitError(
                self.name,
                "SBUF bytes per partition",
                f"must be <= {tg.sbuf_usable_bytes} ({tg.name})",
                plan.sbuf_bytes,
                limit=tg.sbuf_usable_bytes,
                hint=self.budget_hints.get("sbuf", "choose smaller tiles or blocks"),
            )
        return plan

    def host_bytes(self, problem: dict, dtype: str) -> int:
        """Bytes of host memory the op's inputs and outputs take at ``problem``: what a run
        must allocate before any kernel starts (computed on meta tensors, allocating none).
        The inputs are those of seed :data:`MEASURE_SEED`, the ones the tuner and ``profile``
        measure (an op may draw its sizes, as AdamW draws its tensor list)."""
        return self._host_bytes(self._meta_inputs(problem, dtype))

    def _meta_inputs(self, problem: dict, dtype: str) -> tuple:
        """The :data:`MEASURE_SEED` inputs at ``problem`` on the meta device (nothing allocated)."""
        import torch

        with torch.device("meta"):
            return self.make_inputs(problem, dtype, measure_generator())

    def _host_bytes(self, args) -> int:
        """Bytes of the tensors in ``args`` (also inside tensor lists) and of the outputs."""
        import torch

        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        tensors += [a for a in args if isinstance(a, (list, tuple)) for a in a]  # tensor lists
        total = sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
        for shape, out_dtype in self.output_shapes(*args):
            total += math.prod(shape) * torch.empty((), dtype=out_dtype).element_size()
        return total

    def interpreter_bytes(self, args) -> int:
        """Estimated peak host bytes of running the op's kernels on the interpreter for the
        op arguments ``args`` (sizes only; see :mod:`neuron_kernels.kernels.footprint`, where
        each op's instruction estimate and the bytes per instruction live)."""
        from neuron_kernels.kernels import footprint

        return footprint.interpreter_bytes(self, args)

    def mutated_tensors(self, args) -> list:
        """The tensors among ``args`` (``run_kernels``' positional arguments) that the op
        updates in place (its ``mutates`` arguments), flattened."""
        import inspect

        names = [
            n
            for n in inspect.signature(self.run_kernels).parameters
            if n not in ("config", "runner")
        ]
        out = []
        for name in self.mutates:
            value = args[names.index(name)]
            out.extend(value if isinstance(value, (list, tuple)) else [value])
        return out

    def min_traffic_bytes(self, problem: dict, dtype: str) -> int:
        """The least HBM traffic a run at ``problem`` can have, the DMA floor's bytes: every
        input read once, every output written once, and every tensor updated in place
        (``mutates``) read and written back once (inputs of seed :data:`MEASURE_SEED`)."""
        args = self._meta_inputs(problem, dtype)
        written_back = sum(t.numel() * t.element_size() for t in self.mutated_tensors(args))
        return self._host_bytes(args) + written_back

    def is_valid(
        self, problem: dict, dtype: str, config: TunableConfig, target, lnc: int = 1
    ) -> bool:
        try:
            self.check(problem, dtype, config, target, lnc)
        except LimitError:
            return False
        return True


def runner_lnc(runner) -> int:
    """The LNC ``runner`` launches at: its ``lnc``; a runner that names none (a plain
    function wrapped by a test, a profiler) launches at LNC=1, as NKI's ``jit`` does."""
    return getattr(runner, "lnc", 1)


def check_lnc(op: str, lnc, target: Target) -> None:
    """Refuse an LNC ``target`` does not have (trn1: 1; trn2/trn3: 1 or 2).

    Raises:
        LimitError: ``<op>: lnc must be one of ...``.
    """
    if isinstance(lnc, bool) or lnc not in target.lnc_choices:
        raise LimitError(
            op,
            "lnc",
            f"must be one of {target.lnc_choices} on {target.name}",
            lnc,
            limit=target.lnc_choices,
        )


def _size_dims(problem: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(k for k, v in problem.items() if isinstance(v, int) and not isinstance(v, bool))


def shape_parser(
    op: str, dims: tuple[str, ...], flags: tuple[str, ...] = ()
) -> Callable[[str], dict]:
    syntax = "x".join(d.upper() for d in dims) + "".join(f"[:{f}]" for f in flags)

    def parse_shape(text: str) -> dict:
        """``"<d0>x<d1>...[:<flag>...]"`` -> problem dict (positive ints in the op's dimension
        order, then each boolean flag: True when named)."""
        sizes, *named = str(text).lower().split(":")
        parts = sizes.replace(",", "x").split("x")
        if len(parts) != len(dims) or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise LimitError(op, "shape", f"must be {syntax} ({len(dims)} positive ints)", text)
        unknown = [f for f in named if f.strip() not in flags]
        if unknown:
            raise LimitError(op, "shape flag", f"must be one of {list(flags)}", unknown[0])
        problem: dict[str, Any] = {d: int(p) for d, p in zip(dims, parts)}
        problem.update({f: f in {n.strip() for n in named} for f in flags})
        return problem

    parse_shape.syntax = syntax  # what `neuron-kernels autotune --list` shows
    return parse_shape


def bucket_size(x: int) -> int:
    """A size as shape buckets key it: rounded up to a power of two, at least 128."""
    return max(128, 1 << (max(1, x) - 1).bit_length())


def _pow2_bucket(problem: dict) -> str:
    """Each size rounded up to a power of two (at least 128), other entries as they are:
    configs transfer within a bucket."""

    def key(v: Any) -> str:
        if isinstance(v, bool) or not isinstance(v, int):
            return str(v).lower()
        return str(bucket_size(v))

    return "_".join(f"{d}{key(v)}" for d, v in problem.items())


def _meta_output_shapes(reference: Callable[..., Any]) -> Callable[..., list]:
    def output_shapes(*args) -> list:
        """Shapes and dtypes of the reference's outputs, computed on meta tensors."""
        import torch

        metas = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        out = reference(*metas, upcast=False)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        return [(tuple(o.shape), o.dtype) for o in outs]

    return output_shapes


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
