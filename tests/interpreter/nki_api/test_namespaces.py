"""The interpreter's ``nki``, ``nki.language`` and ``nki.isa`` against the official API stubs.

Expected signatures below are data transcribed from aws-neuron/aws-neuron-sdk
nki/api/nki/__init__.py, nki/api/nki/isa/__init__.py and nki/api/nki/language/__init__.py
(NKI 0.6, snapshot 81ce03ae): parameter names and defaults only. For every stub name the
interpreter either provides an object with that exact signature, or raises
NotImplementedError naming the API (on attribute access or on call).
"""

from __future__ import annotations

import ast
import inspect

import pytest

from neuron_kernels.interpreter import nki
from neuron_kernels.interpreter.operators import Operator

nl, nisa = nki.language, nki.isa

# fmt: off
ISA = {
    "get_nc_sub_version": "",
    "get_nc_version": "",
    "dma_copy": (
        "dst, src, priority=None, oob_mode=oob_mode.error, dge_mode=dge_mode.unknown, "
        "engine=engine.unknown, name=None"
    ),
    "tensor_copy": "dst, src, engine=engine.unknown, name=None",
    "memset": "dst, value, engine=engine.unknown, name=None",
    "tensor_copy_predicated": "dst, src, predicate, reverse_pred=False, name=None",
    "nc_matmul": (
        "dst, stationary, moving, is_stationary_onezero=False, is_moving_onezero=False, "
        "is_transpose=False, accumulate=None, tile_position=(), tile_size=(), "
        "perf_mode=matmul_perf_mode.none, name=None"
    ),
    "nc_matmul_mx": (
        "dst, stationary, moving, stationary_scale, moving_scale, tile_position=None, "
        "tile_size=None, accumulate=None, name=None"
    ),
    "nc_transpose": "dst, data, engine=engine.unknown, name=None",
    "dma_transpose": (
        "dst, src, axes=None, priority=None, dge_mode=dge_mode.unknown, "
        "oob_mode=oob_mode.error, name=None"
    ),
    "tensor_tensor": "dst, data1, data2, op, engine=engine.unknown, name=None",
    "tensor_scalar": (
        "dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, "
        "engine=engine.unknown, name=None"
    ),
    "tensor_reduce": "dst, op, data, axis, negate=False, keepdims=False, name=None",
    "tensor_partition_reduce": "dst, op, data, name=None",
    "tensor_scalar_cumulative": (
        "dst, src, op0, op1, imm0, imm1=None, reduce_cmd=reduce_cmd.reset_reduce, name=None"
    ),
    "activation": (
        "dst, op, data, bias=None, scale=1.0, reduce_op=None, reduce_res=None, "
        "reduce_cmd=reduce_cmd.idle, name=None"
    ),
    "activation_reduce": "dst, op, data, reduce_op, reduce_res, bias=None, scale=1.0, name=None",
    "activate2": (
        "dst, op, data, imm0, imm1, op0, op1, relu_param=0.0, reverse0=False, "
        "reverse1=False, reduce_op=None, reduce_res=None, reduce_cmd=reduce_cmd.idle, "
        "name=None"
    ),
    "iota": "dst, pattern, offset=0, channel_multiplier=0, name=None",
    "affine_select": (
        "dst, pattern, channel_multiplier, on_true_tile, on_false_value, cmp_op=equal, "
        "offset=0, name=None"
    ),
    "local_gather": "dst, src_buffer, index, num_elem_per_idx=1, num_valid_indices=None, name=None",
    "nc_n_gather": "dst, data, indices, name=None",
    "bn_stats": "dst, data, name=None",
    "bn_aggr": "dst, data, name=None",
    "tensor_tensor_scan": (
        "dst, data0, data1, initial, op0, op1, reverse0=False, reverse1=False, name=None"
    ),
    "nc_stream_shuffle": "dst, src, shuffle_mask, name=None",
    "rng": "dst, engine=engine.vector, name=None",
    "dropout": "dst, data, prob, name=None",
    "set_rng_seed": "src_seeds, name=None",
    "rand_set_state": "src_seeds, engine=engine.gpsimd, name=None",
    "rand_get_state": "dst, engine=engine.gpsimd, name=None",
    "rand2": "dst, min, max, name=None",
    "exponential": (
        "dst, src, max_value=0.0, reduce_res=None, reduce_cmd=reduce_cmd.idle, "
        "reduce_init=0.0, name=None"
    ),
    "reciprocal": "dst, data, name=None",
    "max8": "dst, src, name=None",
    "sequence_bounds": "dst, segment_ids, name=None",
    "scalar_tensor_tensor": (
        "dst, data, op0, operand0, op1, operand1, reverse0=False, reverse1=False, name=None"
    ),
    "tensor_scalar_reduce": (
        "dst, data, op0, operand0, reduce_op, reduce_res=None, reverse0=False, "
        "reduce_cmd=reduce_cmd.reset_reduce, reduce_init=None, reduce_res_negate=False, "
        "name=None"
    ),
    "core_barrier": "data, cores, engine=engine.gpsimd, name=None",
    "dma_compute": (
        "dst, srcs, reduce_op, scales=None, unique_indices=True, oob_mode=oob_mode.error, "
        "name=None"
    ),
    "quantize_mx": "dst, src, dst_scale, name=None",
    "range_select": (
        "dst, on_true_tile, comp_op0, comp_op1, bound0, bound1, "
        "reduce_cmd=reduce_cmd.reset_reduce, reduce_res=None, reduce_op=maximum, "
        "range_start=0, on_false_value=..., name=None"
    ),
    "select_reduce": (
        "dst, predicate, on_true, on_false, reduce_res=None, reduce_cmd=reduce_cmd.idle, "
        "reduce_op=maximum, reverse_pred=False, name=None"
    ),
    "sendrecv": (
        "src, dst, send_to_rank, recv_from_rank, pipe_id, dma_engine=dma_engine.dma, "
        "name=None"
    ),
    "register_alloc": "x=None",
    "register_move": "dst, src",
    "register_load": "dst, src",
    "register_store": "dst, src",
    "nc_find_index8": "dst, data, vals, name=None",
    "nc_match_replace8": "dst, data, vals, imm, dst_idx=None, name=None",
    "nonzero_with_count": "dst, src, index_offset=0, padding_val=-1, name=None",
    "topk": "val_dst, idx_dst, src, n, name=None",
}

LANGUAGE = {
    "is_hbm": "buffer",
    "is_on_chip": "buffer",
    "is_psum": "buffer",
    "is_sbuf": "buffer",
    "add": "x, y, dtype=None",
    "subtract": "x, y, dtype=None",
    "multiply": "x, y, dtype=None",
    "divide": "x, y, dtype=None",
    "maximum": "x, y, dtype=None",
    "minimum": "x, y, dtype=None",
    "abs_max": "x, y, dtype=None",
    "abs_min": "x, y, dtype=None",
    "abs": "x, dtype=None",
    "square": "x, dtype=None",
    "power": "x, y, dtype=None",
    "equal": "x, y, dtype=None",
    "not_equal": "x, y, dtype=None",
    "less": "x, y, dtype=None",
    "less_equal": "x, y, dtype=None",
    "greater": "x, y, dtype=None",
    "greater_equal": "x, y, dtype=None",
    "bitwise_and": "x, y, dtype=None",
    "bitwise_or": "x, y, dtype=None",
    "bitwise_xor": "x, y, dtype=None",
    "invert": "x, dtype=None",
    "left_shift": "x, y, dtype=None",
    "right_shift": "x, y, dtype=None",
    "logical_and": "x, y, dtype=None",
    "logical_or": "x, y, dtype=None",
    "logical_xor": "x, y, dtype=None",
    "logical_not": "x, dtype=None",
    "exp": "x, dtype=None",
    "log": "x, dtype=None",
    "sqrt": "x, dtype=None",
    "rsqrt": "x, dtype=None",
    "tanh": "x, dtype=None",
    "sigmoid": "x, dtype=None",
    "relu": "x, dtype=None",
    "gelu": "x, dtype=None",
    "gelu_apprx_sigmoid": "x, dtype=None",
    "gelu_apprx_tanh": "x, dtype=None",
    "gelu_dx": "x, dtype=None",
    "gelu_apprx_sigmoid_dx": "x, dtype=None",
    "silu": "x, dtype=None",
    "silu_dx": "x, dtype=None",
    "softplus": "x, dtype=None",
    "mish": "x, dtype=None",
    "erf": "x, dtype=None",
    "erf_dx": "x, dtype=None",
    "reciprocal": "x, dtype=None",
    "copy": "x, dtype=None",
    "sin": "x, dtype=None",
    "cos": "x, dtype=None",
    "tan": "x, dtype=None",
    "arctan": "x, dtype=None",
    "ceil": "x, dtype=None",
    "floor": "x, dtype=None",
    "trunc": "x, dtype=None",
    "negative": "x, dtype=None",
    "sign": "x, dtype=None",
    "fmod": "x, y, dtype=None",
    "mod": "x, y, dtype=None",
    "sum": "x, axis, dtype=None, keepdims=False",
    "max": "x, axis, dtype=None, keepdims=False",
    "min": "x, axis, dtype=None, keepdims=False",
    "mean": "x, axis, dtype=None, keepdims=False",
    "prod": "x, axis, dtype=None, keepdims=False",
    "var": "x, axis, dtype=None, keepdims=False",
    "all": "x, axis, dtype=None",
    "softmax": "x, axis=-1, dtype=None",
    "rms_norm": "x, w, axis, n, epsilon=1e-06, dtype=None, compute_dtype=None",
    "where": "condition, x, y, dtype=None",
    "dropout": "x, rate, dtype=None",
    "ones": "shape, dtype, buffer=sbuf, name=''",
    "full": "shape, fill_value, dtype, buffer=sbuf, name=''",
    "zeros_like": "x, dtype=None, buffer=None, name=''",
    "empty_like": "x, dtype=None, buffer=None, name=''",
    "random_seed": "seed",
    "expand_dims": "x, axis",
    "broadcast_to": "x, shape, dtype=None",
    "transpose": "x, dtype=None",
    "matmul": "x, y, transpose_x=False",
    "no_reorder": "",
    "load_transpose2d": "src, dtype=None",
    "gather_flattened": "data, indices, axis=0, dtype=None",
    "ds": "start, size",
    "affine_range": "start, stop=None, step=1",
    "sequential_range": "start, stop=None, step=1",
    "static_range": "start, stop=None, step=1",
    "dynamic_range": "start, stop=None, step=1",
    "fori_loop": "lower, upper, body_fun, step=1",
    "while_loop": "init, body_fun",
    "ndarray": "shape, dtype, buffer=sbuf, name='', address=None",
    "zeros": "shape, dtype, buffer=sbuf, name=''",
    "load": "src, dtype=None",
    "store": "dst, value",
    "program_id": "axis=0",
    "num_programs": "axes=0",
    "program_ndim": "",
    "shared_constant": "constant",
    "shared_identity_matrix": "n, dtype=uint8, dst=None",
    "device_print": "print_prefix, tensor",
    "rand": "shape, dtype, buffer=sbuf, name=''",
}

NKI = {
    "jit": "fn=None, **kwargs",
    "simulate": "kernel",
}

TENSOR = {
    "is_contiguous": "",
    "get_pattern": "",
    "is_indirect": "",
    "permute": "dims",
    "broadcast": "dim, size",
    "expand_dim": "dim",
    "squeeze_dim": "dim",
    "reshape_dim": "dim, shape",
    "flatten_dims": "start_dim, end_dim",
    "reshape": "shape",
    "rearrange": "src_pattern, dst_pattern, fixed_sizes=None",
    "slice": "dim, start, end, step=1",
    "select": "dim, index",
    "vector_select": "dim, vector_offset",
    "ap": (
        "pattern, offset=None, scalar_offset=None, vector_offset=None, indirect_dim=0, "
        "dtype=None"
    ),
    "view": "dtype",
    "indirect": "index, num_elem=None",
}
# fmt: on

TENSOR["__init__"] = "shape, dtype, storage, buffer=sbuf, name=''"

# Names the stubs define that are not functions: classes, enums, constants.
ISA_OTHER = [
    "tensor_engine",
    "vector_engine",
    "scalar_engine",
    "gpsimd_engine",
    "unknown_engine",
    "engine",
    "reduce_cmd",
    "dge_mode",
    "oob_mode",
    "matmul_perf_mode",
    "nc_version",
    "dma_engine",
    "NkiInstruction",
    "NkiValidationError",
    "VirtualRegister",
]
LANGUAGE_OTHER = [
    "DType",
    "bool_",
    "int8",
    "int16",
    "int32",
    "uint8",
    "uint16",
    "uint32",
    "float16",
    "float32",
    "bfloat16",
    "tfloat32",
    "float8_e4m3",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e5m2_x4",
    "float8_e4m3fn_x4",
    "float8_e8m0fnu",
    "float4_e2m1fn_x4",
    "sbuf",
    "psum",
    "hbm",
    "private_hbm",
    "shared_hbm",
    "tile_size",
    "average",
    "prelu",
    "bypass",
    "MemoryRegion",
    "NKIObject",
    "NkiTensor",
]

ENUMS = {  # member values of the stub enums
    "engine": {
        "tensor": 1,
        "vector": 5,
        "scalar": 2,
        "gpsimd": 3,
        "dma": 4,
        "sync": 6,
        "unknown": 0,
    },
    "reduce_cmd": {"idle": 0, "reset": 1, "reduce": 2, "reset_reduce": 3, "load_reduce": 4},
    "dge_mode": {"unknown": 0, "swdge": 1, "hwdge": 2, "none": 3},
    "oob_mode": {"error": 0, "skip": 1},
    "matmul_perf_mode": {"none": "none", "double_row": "double_row"},
    "nc_version": {"gen2": 2, "gen3": 3, "gen4": 4},
    "dma_engine": {"dma": 1, "gpsimd_dma": 2},
}

DEFAULT_NAMES = {
    **{name: getattr(nisa, name) for name in ENUMS},
    "sbuf": nl.sbuf,
    "uint8": nl.uint8,
    "equal": nl.equal,
    "maximum": nl.maximum,
}


def _expected(sig: str):
    """[(name, default or inspect.Parameter.empty)] of a stub parameter list."""
    args = ast.parse(f"def f({sig}): pass").body[0].args
    pos = args.args
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    out = []
    for a, d in zip(pos, defaults):
        out.append(
            (
                a.arg,
                inspect.Parameter.empty
                if d is None
                else eval(compile(ast.Expression(d), "<stub>", "eval"), dict(DEFAULT_NAMES)),
            )
        )
    if args.vararg:
        out.append(("*" + args.vararg.arg, inspect.Parameter.empty))
    if args.kwarg:
        out.append(("**" + args.kwarg.arg, inspect.Parameter.empty))
    return out


def _actual(fn):
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.name == "self":
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        out.append((prefix + p.name, p.default))
    return out


def _same_default(got, want) -> bool:
    if want is Ellipsis:  # range_select's on_false_value: a stub placeholder
        return True
    return got is want or (type(got) is type(want) and got == want)


CASES = (
    [("nisa", n, s) for n, s in ISA.items()]
    + [("nl", n, s) for n, s in LANGUAGE.items()]
    + [("nki", n, s) for n, s in NKI.items()]
    + [("NkiTensor", n, s) for n, s in TENSOR.items()]
)
MODULES = {"nisa": nisa, "nl": nl, "nki": nki, "NkiTensor": nl.NkiTensor}


@pytest.mark.parametrize("where, name, sig", CASES, ids=[f"{w}.{n}" for w, n, _ in CASES])
def test_signature_matches_stub_or_not_implemented(where, name, sig):
    try:
        obj = getattr(MODULES[where], name)
    except NotImplementedError as err:
        assert name in str(err) and "not implemented" in str(err)
        return
    if isinstance(obj, Operator):  # nl.add & co: an operator object whose call is the wrapper
        if obj.nl_impl is None:
            with pytest.raises(NotImplementedError, match=name):
                obj()
            return
        obj = obj.nl_impl
    actual = _actual(obj)
    if [n for n, _ in actual] == ["*args", "**kwargs"]:  # a stub that refuses every call
        with pytest.raises(NotImplementedError, match=name):
            obj()
        return
    expected = _expected(sig)
    assert [n for n, _ in actual] == [n for n, _ in expected], f"{where}.{name} parameter names"
    for (n, got), (_, want) in zip(actual, expected):
        assert _same_default(got, want), f"{where}.{name}({n}=...) default {got!r} != {want!r}"


@pytest.mark.parametrize("name", ISA_OTHER)
def test_isa_classes_and_constants(name):
    try:
        obj = getattr(nisa, name)
    except NotImplementedError as err:
        assert name in str(err)
        return
    if name in ENUMS:
        assert {m.name: m.value for m in obj} == ENUMS[name]
    elif name.endswith("_engine"):
        assert obj is getattr(nisa.engine, name[: -len("_engine")])
    elif name == "NkiValidationError":
        assert issubclass(obj, Exception) and issubclass(obj, AssertionError)
    elif name == "NkiInstruction":
        assert callable(obj.depends_on)
    elif name == "VirtualRegister":
        assert issubclass(obj, nl.NKIObject)
        assert [n for n, _ in _actual(obj.__init__)] == ["state", "frozen"]
    else:
        pytest.fail(f"unexpected implemented name {name}")


@pytest.mark.parametrize("name", LANGUAGE_OTHER)
def test_language_classes_and_constants(name):
    try:
        obj = getattr(nl, name)
    except NotImplementedError as err:
        assert name in str(err)
        return
    if name in ("sbuf", "psum", "private_hbm", "shared_hbm"):
        assert obj is nl.MemoryRegion[name] and obj.value == name
    elif name == "hbm":
        assert obj is nl.private_hbm  # alias
    elif name == "MemoryRegion":
        assert {m.name: m.value for m in obj} == {
            "sbuf": "sbuf",
            "psum": "psum",
            "private_hbm": "private_hbm",
            "shared_hbm": "shared_hbm",
        }
    elif name in ("NKIObject", "NkiTensor"):
        assert isinstance(obj, type) and issubclass(nl.NkiTensor, nl.NKIObject)
    elif name in ("average", "prelu", "bypass"):
        assert isinstance(obj, Operator) and obj.name == name
    elif name == "DType":
        assert obj is str  # DType = str in the stub: dtypes are their names
    elif name == "tile_size":
        for attr, want in {
            "pmax": 128,
            "psum_fmax": 512,
            "psum_bank_fmax": 512,
            "psum_bank_fmax_bytes": 2048,
            "gemm_stationary_fmax": 128,
            "gemm_moving_fmax": 512,
            "bn_stats_fmax": 512,
            "psum_num_banks": 8,
            "sbuf_fmax_bytes": 212984,
            "total_available_sbuf_size": 212984,
            "sbuf_fmax": 53246,
            "psum_min_align": 4,
            "sbuf_min_align": 1,
        }.items():
            assert getattr(obj, attr) == want, attr  # trn2, the default target
        assert obj.sbuf_size_bytes > 0
    else:  # a dtype: DType = str, the value is its own name
        assert obj == name


def test_unknown_names_raise_not_implemented_naming_them():
    for mod, qual in ((nisa, "nki.isa"), (nl, "nki.language"), (nki, "nki")):
        with pytest.raises(NotImplementedError, match=f"{qual}.no_such_api") as info:
            mod.no_such_api  # noqa: B018 (the attribute access is what raises)
        assert "nor is it an NKI 0.6 API" in str(info.value)
        assert not hasattr(mod, "no_such_api")  # also an AttributeError, for hasattr()


# The ``nki`` package's submodules and ``nki.collectives``' names (aws-neuron/aws-neuron-sdk
# nki/api/nki/ at 81ce03ae: __init__.py defines jit and simulate, beside the packages
# collectives/, isa/ and language/; nki/api/nki.rst lists jit and simulate). Read by
# tests/test_nki_api_surface.py, which holds the whole package to these tables.
NKI_SUBMODULES = ["language", "isa", "collectives"]
COLLECTIVES = [
    "ReplicaGroup",
    "all_gather",
    "all_gather_v",
    "all_reduce",
    "all_to_all",
    "all_to_all_v",
    "collective_permute",
    "collective_permute_implicit",
    "collective_permute_implicit_current_processing_rank_id",
    "collective_permute_implicit_reduce",
    "rank_id",
    "reduce_scatter",
]
