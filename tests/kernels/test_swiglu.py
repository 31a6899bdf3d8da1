"""SwiGLU's own tests, beyond the contract suite (which runs both ``swiglu`` and
``swiglu_bwd`` by their registration): every tile kind at every ``tile_free``, the flat
tiling covering each element once, the SPMD split over program instances, bf16 gradients
through the op, the plans' SBUF budgets at the committed shapes, and the modeled fraction
of the DMA floor.

What this proves: the kernels' arithmetic and tiling on the interpreter (which enforces
NKI's documented limits) and their modeled cost. What only a Trn2 run can show: ScalarE's
table accuracy for ``silu`` / ``silu_dx`` (the interpreter evaluates them exactly in fp64
before the store rounds), real DMA rates, and two physical cores at LNC=2 (the interpreter
runs the program instances one after another).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import neuron_kernels  # noqa: F401  (registers torch.ops.neuron.*)
from neuron_kernels.autotune.backends import ModelBackend
from neuron_kernels.autotune.shapes import points_for
from neuron_kernels.hardware import target_from_name
from neuron_kernels.interpreter import run
from neuron_kernels.kernels import swiglu
from neuron_kernels.kernels.swiglu import BWD_SPEC, SPEC, _tile
from neuron_kernels.torch_ops import cpu_mode
from neuron_kernels.verification import assert_within_tolerance, run_kernel

DTYPES = ("float32", "bfloat16", "float16")
TILE_FREES = SPEC.config.space()["tile_free"]


def _flat_inputs(spec, n: int, dtype: str, seed: int = 0) -> tuple:
    return spec.make_inputs({"rows": 1, "cols": n}, dtype, torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", [SPEC, BWD_SPEC], ids=lambda s: s.name)
def test_full_remainder_and_tail_tiles_match_the_reference(spec, dtype):
    """Two full tiles, a [128, 37] remainder and a 5-element tail at tile_free 1024."""
    n = 2 * 128 * 1024 + 128 * 37 + 5
    args = _flat_inputs(spec, n, dtype)
    config = spec.config(tile_free=1024, product_engine="vector")
    plan = spec.check({"rows": 1, "cols": n}, dtype, config, "trn2")
    assert (plan.full_tiles, plan.rem_free, plan.tail) == (2, 37, 5)
    out = run_kernel(spec, args, config, target="trn2")
    assert_within_tolerance(out, spec.reference(*args), spec.tolerances[dtype], spec.name)


@pytest.mark.parametrize("tile_free", TILE_FREES)
@pytest.mark.parametrize("engine", ["vector", "gpsimd"])
def test_every_config_at_a_shape_with_every_tile_kind(tile_free, engine):
    n = 128 * tile_free + 128 * 3 + 1  # one full tile, a [128, 3] remainder, a 1-element tail
    for spec in (SPEC, BWD_SPEC):
        args = _flat_inputs(spec, n, "bfloat16", seed=tile_free)
        config = spec.config(tile_free=tile_free, product_engine=engine)
        out = run_kernel(spec, args, config, target="trn2")
        assert_within_tolerance(out, spec.reference(*args), spec.tolerances["bfloat16"], spec.name)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 5 * 128 * 1024), tile_free=st.sampled_from(TILE_FREES))
def test_the_flat_tiles_cover_every_element_once(n, tile_free):
    plan = swiglu.plan(
        {"rows": 1, "cols": n}, "bfloat16", SPEC.config(tile_free=tile_free), _trn2()
    )
    covered = 0
    for t in range(plan.n_tiles):
        start, p, f = _tile(t, plan)
        assert start == covered and p >= 1 and f >= 1 and f <= tile_free, (t, start, p, f)
        covered += p * f
    assert covered == n


@pytest.mark.parametrize("spec", [SPEC, BWD_SPEC], ids=lambda s: s.name)
def test_program_instances_share_the_tiles(spec):
    """At LNC=2 (``kernel[2]``) each core runs every other tile; together they write each
    output element once (an element no core wrote keeps the NaN sentinel and fails), and the
    result equals the grid-1 launch bit for bit, with no more DMA transfers in all (no core
    repeats the other's tiles); the interpreter's race check finds no overlap."""
    n = 5 * 128 * 1024 + 128 * 9 + 3  # seven tiles at tile_free 1024
    args = [a.reshape(-1) for a in _flat_inputs(spec, n, "float32")]
    config = spec.config(tile_free=1024, product_engine="vector")
    plan = spec.check({"rows": 1, "cols": n}, "float32", config, "trn2")
    kernel = spec.kernels[0]
    one_run = run(kernel, (*args, plan), {}, target="trn2")
    many_run = run(kernel[2], (*args, plan), {}, target="trn2")
    loads_and_stores = {"swiglu": 2 + 1, "swiglu_bwd": 3 + 2}[spec.name]
    assert (
        _dmas(many_run) == _dmas(one_run) == plan.n_tiles * loads_and_stores == 7 * loads_and_stores
    )
    one, many = one_run.outputs, many_run.outputs
    one = one if isinstance(one, tuple) else (one,)
    many = many if isinstance(many, tuple) else (many,)
    for a, b in zip(one, many):
        torch.testing.assert_close(torch.as_tensor(b), torch.as_tensor(a), rtol=0, atol=0)


def test_bf16_gradients_through_the_op_match_fp64_autograd():
    gate, up = _flat_inputs(SPEC, 3000, "bfloat16", seed=3)
    gate, up = gate.reshape(30, 100), up.reshape(30, 100)
    leaves = [gate.clone().requires_grad_(True), up.clone().requires_grad_(True)]
    refs = [gate.double().requires_grad_(True), up.double().requires_grad_(True)]
    weight = torch.randn(30, 100, generator=torch.Generator().manual_seed(4))
    with cpu_mode("interpret"):
        (torch.ops.neuron.swiglu(*leaves) * weight.bfloat16()).sum().backward()
    (swiglu.reference(*refs) * weight.bfloat16().double()).sum().backward()
    for got, want in zip(leaves, refs):
        assert_within_tolerance(got.grad, want.grad, SPEC.tolerances["bfloat16"], "bf16 grad")


def test_the_plans_hold_three_and_four_tiles_and_fit_every_target_at_committed_shapes():
    for spec, tiles in ((SPEC, 3), (BWD_SPEC, 4)):
        for point in points_for(spec):
            for target in ("trn1", "trn2", "trn3"):
                for dtype in DTYPES:
                    for config in spec.config.all_configs():
                        plan = spec.check(point.problem, dtype, config, target)
                        item = 4 if dtype == "float32" else 2
                        assert plan.sbuf_bytes == tiles * config.tile_free * item
                        assert plan.psum_banks == 0


def test_committed_shapes_are_the_llama3_mlp_activations():
    shapes = {p.shape for p in points_for(SPEC)}
    assert shapes == {f"{t}x{w}" for t in (2048, 8192) for w in (14336, 28672)}
    assert {p.shape for p in points_for(BWD_SPEC)} == shapes


@pytest.mark.parametrize("spec", [SPEC, BWD_SPEC], ids=lambda s: s.name)
def test_default_config_reaches_85_percent_of_the_modeled_dma_floor(spec):
    """Modeled on trn2 (cost model, trace-only), bf16, at a Llama-3 8B MLP width and 512
    tokens (a quarter of the smallest committed shape, to keep the test short)."""
    m = ModelBackend("trn2").measure(
        spec, {"rows": 512, "cols": 14336}, "bfloat16", spec.config.default()
    )
    assert m.floor_engine == "DMA"
    assert m.floor_us / m.latency_us >= 0.85, (m.latency_us, m.floor_us, m.binding_engine)


def test_the_readme_row_is_the_one_generated_from_the_spec():
    """``python benchmarks/op.py swiglu --readme-row`` wrote it; a spec change must rewrite it."""
    root = Path(__file__).resolve().parents[2]
    loader = importlib.util.spec_from_file_location("benchmark_op", root / "benchmarks" / "op.py")
    bench = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(bench)
    row = bench.readme_row(SPEC)
    assert row.startswith("| `swiglu` | `swiglu(gate, up) -> Tensor`: silu(gate) * up"), row
    assert row in (root / "README.md").read_text().splitlines()


def _dmas(result) -> int:
    return sum(1 for ins in result.trace.instructions if ins.engine == "dma")


def _trn2():
    return target_from_name("trn2")
