"""Calling convention of nki.simulate / nki.jit on the interpreter (simulator/launch.py).

Source: aws-neuron/aws-neuron-sdk nki/guides/nki_simulator.rst ("How It Works"),
nki/api/nki/__init__.py, nki/get-started/nki-language-guide.rst (rejected Python),
release-notes/components/nki.rst (bool outputs, shared_hbm outputs).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

from neuron_kernels.interpreter import NkiValidationError, nki, run

nl, nisa = nki.language, nki.isa


@nki.jit
def double(x):
    """out = 2 * x through SBUF."""
    t = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=2.0)
    out = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


@nki.jit
def add_into(x, acc):
    """acc += x in place (an output passed as an argument); returns nothing."""
    a = nl.ndarray(acc.shape, acc.dtype, buffer=nl.sbuf)
    b = nl.ndarray(x.shape, x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=a, src=acc)
    nisa.dma_copy(dst=b, src=x)
    nisa.tensor_tensor(dst=a, data1=a, data2=b, op=nl.add)
    nisa.dma_copy(dst=acc, src=a)


def test_numpy_in_numpy_out():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = nki.simulate(double)(x)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, 2 * x)
    b = x.astype(ml_dtypes.bfloat16)
    out = double(b)  # calling a jit kernel on this backend runs the interpreter
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(out.astype(np.float32), 2 * x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int32])
def test_torch_in_torch_out(dtype):
    x = torch.arange(12).reshape(3, 4).to(dtype)
    out = nki.simulate(double)(x)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.device.type == "cpu"
    torch.testing.assert_close(out, 2 * x)


def test_bool_tensors_stay_bool():
    @nki.jit
    def copy_bool(x):
        t = nl.ndarray(x.shape, nl.bool_, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)
        out = nl.ndarray(x.shape, nl.bool_, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=t)
        return out

    x = np.array([[True, False, True]])
    out = copy_bool(x)
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, x)
    tout = copy_bool(torch.from_numpy(x))
    assert tout.dtype == torch.bool and torch.equal(tout, torch.from_numpy(x))


def test_written_inputs_update_in_place():
    x = np.ones((4, 8), np.float32)
    acc = np.arange(64, dtype=np.float32).reshape(8, 8).T[:4]  # non-contiguous view
    base = acc.base
    before = acc.copy()
    x_before = x.copy()
    assert add_into(x, acc) is None
    np.testing.assert_array_equal(acc, before + 1)
    assert acc.base is base  # the caller's own array, not a copy
    np.testing.assert_array_equal(x, x_before)  # unwritten inputs are untouched
    tacc = torch.zeros(4, 8, dtype=torch.bfloat16)
    add_into(torch.full((4, 8), 0.5, dtype=torch.bfloat16), tacc)
    assert tacc.dtype == torch.bfloat16 and bool((tacc == 0.5).all())


def test_the_same_array_twice_is_one_hbm_tensor():
    x = np.ones((2, 4), np.float32)
    add_into(x, x)  # acc and x alias: reads see the same storage, the write lands once
    np.testing.assert_array_equal(x, 2.0)


def test_tuple_outputs_are_preserved():
    @nki.jit
    def two(x):
        a = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray(x.shape, x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=a, src=x)
        nisa.dma_copy(dst=b, src=x)
        return a, b

    out = two(np.ones((2, 2), np.float32))
    assert isinstance(out, tuple) and len(out) == 2
    assert all(isinstance(o, np.ndarray) for o in out)


def grid_kernel(x):
    """Each program writes its own (program_id, grid info) row of a shared output."""
    n = nl.num_programs(0) * (nl.num_programs(1) if nl.program_ndim() == 2 else 1)
    out = nl.ndarray((n, 5), nl.int32, buffer=nl.shared_hbm)
    pid0 = nl.program_id(0)
    pid1 = nl.program_id(1) if nl.program_ndim() == 2 else 0
    row = pid0 * (nl.num_programs(1) if nl.program_ndim() == 2 else 1) + pid1
    t = nl.ndarray((1, 5), nl.int32, buffer=nl.sbuf)
    for j, v in enumerate(
        (
            pid0,
            pid1,
            nl.num_programs(0),
            nl.program_ndim(),
            nl.num_programs((0, 1)) if nl.program_ndim() == 2 else -1,
        )
    ):
        nisa.memset(dst=t[:, j : j + 1], value=int(v))
    nisa.dma_copy(dst=out[row : row + 1, :], src=t)
    return out


def test_grid_2_like_lnc2():
    x = np.zeros((1, 1), np.float32)
    out = nki.simulate(nki.jit(grid_kernel)[2])(x)
    np.testing.assert_array_equal(out, [[0, 0, 2, 1, -1], [1, 0, 2, 1, -1]])


@pytest.mark.parametrize("grid", [(2, 3), (1, 1)])
def test_grid_must_be_one_int_the_lnc(grid):
    """NKI 0.6: "The bracket syntax must contain only one number" (nki/get-started/about/lnc.rst)."""
    with pytest.raises(NkiValidationError) as info:
        nki.jit(grid_kernel)[grid]
    assert (info.value.op, info.value.arg, info.value.value) == ("nki.jit", "launch grid", grid)


@pytest.mark.parametrize(("target", "lnc"), [("trn2", 4), ("trn3", 3), ("trn1", 2)])
def test_lnc_the_target_lacks_is_refused(target, lnc):
    """kernel[8] is an error on current hardware (lnc.rst); trn1 has no LNC=2
    (logical-neuroncore-config.rst: LNC applies only to Trn2 and Trn3)."""
    with pytest.raises(NkiValidationError) as info:
        run(nki.jit(grid_kernel)[lnc], (np.zeros((1, 1), np.float32),), target=target)
    err = info.value
    assert (err.op, err.arg, err.value) == ("nki.jit", "launch grid (LNC)", (lnc,))
    assert target in err.rule


def test_lnc1_bracket_is_one_program():
    out = nki.simulate(nki.jit(grid_kernel)[1])(np.zeros((1, 1), np.float32))
    np.testing.assert_array_equal(out, [[0, 0, 1, 1, -1]])


def test_no_grid_spmd_queries():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((1, 3), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 3), nl.int32, buffer=nl.sbuf)
        for j, v in enumerate((nl.program_id(0), nl.num_programs(), nl.program_ndim())):
            nisa.memset(dst=t[:, j : j + 1], value=v)
        nisa.dma_copy(dst=out, src=t)
        return out

    np.testing.assert_array_equal(kernel(np.zeros((1, 1), np.float32)), [[0, 1, 0]])


def test_grid_inputs_are_shared_hbm_and_private_hbm_is_per_program():
    seen = []

    @nki.jit
    def kernel(x):
        seen.append((x.buffer, nl.program_id(0)))
        scratch = nl.ndarray((1, 1), nl.float32, buffer=nl.hbm)  # private to this program
        t = nl.ndarray((1, 1), nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=float(nl.program_id(0) + 1))
        nisa.dma_copy(dst=scratch, src=t)
        out = nl.ndarray((2, 1), nl.float32, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=t, src=scratch)
        nisa.dma_copy(dst=out[nl.program_id(0) : nl.program_id(0) + 1, :], src=t)
        return out

    np.testing.assert_array_equal(kernel[2](np.zeros((1, 1), np.float32)), [[1.0], [2.0]])
    assert seen == [(nl.shared_hbm, 0), (nl.shared_hbm, 1)]
    kernel(np.zeros((1, 1), np.float32))
    assert seen[-1][0] == nl.private_hbm


@pytest.mark.parametrize("grid", [0, -1, True, 1.5, (2, 0)])
def test_grid_must_be_positive_ints(grid):
    with pytest.raises(NkiValidationError) as info:
        double[grid]
    assert (info.value.op, info.value.arg) == ("nki.jit", "launch grid")


@pytest.mark.parametrize("where", [nl.sbuf, nl.private_hbm, "input"])
def test_outputs_must_be_shared_hbm(where):
    def kernel(x):
        if where == "input":
            return x
        t = nl.ndarray(x.shape, x.dtype, buffer=where)
        nisa.dma_copy(dst=t, src=x)
        return t

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((2, 2), np.float32),))
    err = info.value
    assert err.op == "nki.jit" and err.arg.startswith("returned tensor 0 (")
    assert err.value == ("private_hbm" if where == "input" else where.value)
    assert "must be allocated in nl.shared_hbm" in str(err)


@pytest.mark.parametrize("arg", [[1, 2], (1, [2]), ((np.zeros(2, np.float32),), [3])])
def test_list_arguments_are_rejected(arg):
    def kernel(x, cfg):
        return None

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((1, 1), np.float32), arg))
    assert info.value.op == "nki.jit" and info.value.arg.startswith("argument 'cfg")
    assert "must not be a list" in str(info.value)


def test_tuple_and_scalar_arguments_pass_through():
    got = {}

    def kernel(x, shape, scale, flag, dtype):
        got.update(shape=shape, scale=scale, flag=flag, dtype=dtype, buffer=x.buffer)

    run(kernel, (np.zeros((1, 1), np.float32), (2, 3), 0.5, True, nl.bfloat16))
    assert got == {
        "shape": (2, 3),
        "scale": 0.5,
        "flag": True,
        "dtype": "bfloat16",
        "buffer": nl.private_hbm,
    }


def test_tuple_of_arrays_becomes_hbm_tensors_written_in_place():
    """A tuple of arrays (the NKI way to pass many tensors) arrives as a tuple of HBM
    tensors, and the ones the kernel writes are updated in place."""

    def kernel(xs):
        for x in xs:
            tile = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x)
            nisa.tensor_scalar(dst=tile, data=tile, op0=nl.add, operand0=1.0)
            nisa.dma_copy(dst=x, src=tile)

    a, b = np.zeros((2, 3), np.float32), np.ones((4, 1), np.float32)
    run(kernel, ((a, b),))
    assert (a == 1).all() and (b == 2).all()


def kw_only(x, *, scale=1.0):
    return None


def tensor_is_tensor(x):
    return None if x is x else None


@pytest.mark.parametrize(
    "fn, why", [(kw_only, "keyword-only separator"), (tensor_is_tensor, "'is' at ")]
)
def test_rejected_python(fn, why):
    with pytest.raises(NkiValidationError) as info:
        run(fn, (np.zeros((1, 1), np.float32),))
    assert info.value.op == "nki.jit" and why in str(info.value)


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 2)), np.zeros((2, 2), np.int64), torch.zeros(2, 2, dtype=torch.float64)]
)
def test_non_nki_dtypes_are_rejected(bad):
    with pytest.raises(NkiValidationError) as info:
        nki.simulate(double)(bad)
    assert info.value.op == "nki.simulate"


def test_jit_options():
    with pytest.raises(NkiValidationError) as info:
        nki.jit(platform_target="trn2")(double.fn)
    assert info.value.arg == "platform_target"
    k = nki.jit(mode="simulation")(double.fn)  # accepted and ignored
    np.testing.assert_array_equal(k(np.ones((1, 1), np.float32)), [[2.0]])
    plain = nki.simulate(double.fn)  # an undecorated function is wrapped
    np.testing.assert_array_equal(plain(np.ones((1, 1), np.float32)), [[2.0]])


@pytest.mark.parametrize("name, gen", [("trn1", 2), ("inf2", 2), ("gen3", 3), ("trn3", 4)])
def test_target_from_environment(monkeypatch, name, gen):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", name)

    def kernel(x):
        out = nl.ndarray((1, 1), nl.int32, buffer=nl.shared_hbm)
        t = nl.ndarray((1, 1), nl.int32, buffer=nl.sbuf)
        nisa.memset(dst=t, value=int(nisa.get_nc_version()))
        nisa.dma_copy(dst=out, src=t)
        return out

    assert nki.simulate(kernel)(np.zeros((1, 1), np.float32))[0, 0] == gen
    assert nisa.get_nc_version() >= nisa.nc_version.gen2


def test_unknown_target_is_rejected(monkeypatch):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9")
    with pytest.raises(NkiValidationError) as info:
        nki.simulate(double)(np.zeros((1, 1), np.float32))
    assert info.value.arg == "NEURON_PLATFORM_TARGET_OVERRIDE"


def test_compute_false_keeps_trace_checks_and_memory_but_no_values():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    acc = np.ones((2, 4), np.float32)
    full = run(add_into, (x, acc.copy()))
    acc_before = acc.copy()
    traced = run(add_into, (x, acc), compute=False)
    np.testing.assert_array_equal(acc, acc_before)  # no write-back of meaningless values
    assert [(i.api, i.engine, i.reads, i.writes, i.attrs) for i in traced.trace] == [
        (i.api, i.engine, i.reads, i.writes, i.attrs) for i in full.trace
    ]
    assert traced.memory == full.memory
    out = run(double, (x,), compute=False).outputs
    assert out.shape == x.shape and out.dtype == x.dtype and not out.any()

    def bad(x):
        t = nl.ndarray((4, 4), nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x)  # 8 elements into 16

    with pytest.raises(NkiValidationError):
        run(bad, (x,), compute=False)


def test_only_cpu_torch_tensors():
    with pytest.raises(NkiValidationError) as info:
        nki.simulate(double)(torch.zeros(2, 2, device="meta"))
    assert (info.value.op, info.value.arg, info.value.value) == (
        "nki.simulate",
        "argument 'x'",
        "meta",
    )


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: nl.program_id(3), "axis"),
        (lambda: nl.num_programs(1), "axes"),
        (lambda: nl.num_programs((0, 2)), "axes"),
        (lambda: nl.fori_loop(0, 4, lambda i: None, step=0), "step"),
    ],
)
def test_spmd_and_loop_argument_rules(call, arg):
    def kernel(x):
        call()

    with pytest.raises(NkiValidationError) as info:
        run(nki.jit(kernel)[2], (np.zeros((1, 1), np.float32),))
    assert info.value.arg == arg


# Kernel results: a container (tuple, list, dict) of outputs is returned as such; an
# on-chip tile inside one is refused naming its place in the container.


def _copy_to(x, buffer):
    t = nl.ndarray(x.shape, x.dtype, buffer=buffer)
    nisa.dma_copy(dst=t, src=x)
    return t


@pytest.mark.parametrize(
    "wrap,path",
    [
        (lambda t, o: (o, t), "1"),
        (lambda t, o: [o, [t]], "1[0]"),
        (lambda t, o: {"out": o, "tile": t}, "'tile'"),
    ],
    ids=["tuple", "nested-list", "dict"],
)
def test_a_container_holding_an_on_chip_tile_is_refused(wrap, path):
    def kernel(x):
        return wrap(_copy_to(x, nl.sbuf), _copy_to(x, nl.shared_hbm))

    with pytest.raises(NkiValidationError) as info:
        run(kernel, (np.zeros((2, 2), np.float32),))
    assert info.value.arg.startswith(f"returned tensor {path} (")
    assert info.value.value == "sbuf"


def test_containers_of_hbm_outputs_come_back_with_their_values():
    def kernel(x):
        return {"a": _copy_to(x, nl.shared_hbm), "b": [_copy_to(x, nl.shared_hbm)]}

    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    out = run(kernel, (x,)).outputs
    np.testing.assert_array_equal(out["a"], x)
    np.testing.assert_array_equal(out["b"][0], x)
