"""The one table of NKI 0.6 APIs the interpreter does not implement, and why.

Every API of the official stubs (aws-neuron/aws-neuron-sdk nki/api/nki/__init__.py,
isa/__init__.py, language/__init__.py, collectives/__init__.py, snapshot 81ce03ae) that the
interpreter refuses is listed here with its reason; errors for these names quote the reason,
and the README's "Where the interpreter differs from AWS's simulator" section is generated
from this table (:func:`readme_section`; tests/interpreter/test_unimplemented.py checks both
and that the table matches what the namespaces refuse).
"""

from __future__ import annotations

__all__ = ["UNIMPLEMENTED", "reason", "readme_section"]

_NOT_WRITTEN = "not written yet: no kernel of this library needs it"
_RNG = (
    "the docs name the generator (XORWOW, 6 uint32 state words per GpSimd lane, 24 per "
    "Vector lane) but not the order of the state words, how a lane's elements draw from its "
    "stream, nor how random bits become floats; values would not match the device"
)
_NL_REMOVED = (
    "an experimental nki.language wrapper the interpreter has not written; kernels write "
    "the nki.isa instructions instead"
)
_NL_NO_HW = (
    "a known issue of NKI 0.3-0.5 (release-notes/components/nki.rst): not supported on "
    "hardware, so the interpreter refuses it as the device would"
)
_COLLECTIVES = "multi-device collectives: this library's kernels run on one device"
_PRELU_SLOPE = (
    "nl.prelu's stub (nki/api/nki/language/__init__.py) names nisa.activation as a user and "
    "says 'The slope for negative inputs is controlled by the relu_param argument', but "
    "nisa.activation's and nisa.activation_reduce's stubs have no relu_param: the slope they "
    "would apply is undocumented; nisa.activate2(op=nl.prelu, relu_param=...) is implemented"
)

# qualified name -> reason. Sorted by namespace, then name.
UNIMPLEMENTED: dict[str, str] = {
    "nki.isa.activation(op=nl.prelu)": _PRELU_SLOPE,
    "nki.isa.activation_reduce(op=nl.prelu)": _PRELU_SLOPE,
    "nki.isa.dma_compute": _NOT_WRITTEN,
    "nki.isa.local_gather": _NOT_WRITTEN,
    "nki.isa.nc_match_replace8": _NOT_WRITTEN,
    "nki.isa.nc_n_gather": _NOT_WRITTEN,
    "nki.isa.sequence_bounds": _NOT_WRITTEN,
    "nki.isa.topk": _NOT_WRITTEN,
    "nki.isa.dropout": _RNG,
    "nki.isa.rand2": _RNG,
    "nki.isa.rand_get_state": _RNG,
    "nki.isa.rand_set_state": _RNG,
    "nki.isa.rng": _RNG,
    "nki.isa.set_rng_seed": _RNG,
    "nki.language.dropout": _RNG,
    "nki.language.rand": _RNG,
    "nki.language.random_seed": _RNG,
    "nki.language.divide": _NL_NO_HW,
    "nki.language.fmod": _NL_NO_HW,
    "nki.language.mod": _NL_NO_HW,
    "nki.language.all": _NL_REMOVED,
    "nki.language.ceil": _NL_REMOVED,
    "nki.language.expand_dims": _NL_REMOVED,
    "nki.language.floor": _NL_REMOVED,
    "nki.language.gather_flattened": _NL_REMOVED,
    "nki.language.rms_norm": _NL_REMOVED,
    "nki.language.softmax": _NL_REMOVED,
    "nki.language.trunc": _NL_REMOVED,
    "nki.language.var": _NL_REMOVED,
    "nki.language.where": _NL_REMOVED,
    "nki.language.NkiTensor.indirect": _NOT_WRITTEN,
    "nki.language.NkiTensor.__getitem__ with a tensor index (dynamic select)": (
        f"{_NOT_WRITTEN}; .select(dim, index) and .ap(scalar_offset=) do the same"
    ),
    "nki.collectives": _COLLECTIVES,
}


def reason(qualified_name: str) -> str | None:
    """Why ``qualified_name`` (``nki.isa.rng``, ``nl.divide``, ...) is not implemented."""
    if qualified_name in UNIMPLEMENTED:
        return UNIMPLEMENTED[qualified_name]
    name = qualified_name.split(" (")[0]
    if name.startswith("nl."):
        name = "nki.language." + name[3:]
    elif name.startswith("nisa."):
        name = "nki.isa." + name[5:]
    elif name.startswith("NkiTensor."):
        name = "nki.language." + name
    if name in UNIMPLEMENTED:
        return UNIMPLEMENTED[name]
    head = name.split(".")
    return UNIMPLEMENTED.get(".".join(head[:2])) if len(head) > 2 else None


_PREAMBLE = """\
Both run the kernel body eagerly in Python against NumPy, fill fresh memory with NaN
sentinels and round low-precision stores through `ml_dtypes`. The interpreter in addition:

- checks SBUF/PSUM capacity and PSUM bank use (AWS's simulator allocates every tensor
  independently and checks no capacity), and records an instruction trace for the cost model;
- defaults to `trn2`, not the detected chip or `trn3`;
- accepts the launch grids NKI 0.6 allows (`kernel[1]`; `kernel[2]` on trn2/trn3) and runs
  `kernel[2]` as two physical cores in lock-step (each its own SBUF and PSUM, checked per
  core; shared HBM), with `nisa.core_barrier` and `nisa.sendrecv`; it refuses a race between
  the cores on the same HBM bytes (ordered by barriers, naming both instructions) and
  dynamic control flow that differs between the cores;
- refuses Python the NKI language does not have (generators, comprehensions, `nonlocal`,
  `try`, `with`, ...; `interpreter/python_subset.py`) in the kernel and every function it
  reaches (nested functions are accepted, closing over the kernel's names as the stub's
  `nl.fori_loop` example does; only rebinding those names with `nonlocal` is refused),
  and builds `NKIObject` classes and 32-bit values as the language guide says
  (`interpreter/classes.py`, `interpreter/values.py`); a non-string dict key is refused
  where the source fixes it (`{1: x}`, `d[1] = x` on a dict the function builds), not when
  it is computed at run time (`d[i] = x`) or stored into a dict received from elsewhere;
- raises `NotImplementedError` naming any `nki.*` API it does not implement. The official
  NKI 0.6 APIs it does not implement, and why (generated from
  `interpreter/unimplemented.py`; a test keeps this list equal to the code):
"""

_EPILOGUE = """
Details: the module docstrings in `interpreter/` and the tests in `tests/interpreter/`.
"""


def readme_section() -> str:
    """The body of the README section "Where the interpreter differs from AWS's simulator"."""
    by_reason: dict[str, list[str]] = {}
    for name, why in UNIMPLEMENTED.items():
        by_reason.setdefault(why, []).append(name)
    lines = [_PREAMBLE]
    for why, names in by_reason.items():
        listed = ", ".join(f"`{n}`" for n in names)
        lines.append(f"  - {listed}: {why}.\n")
    lines.append(_EPILOGUE)
    return "".join(lines)
