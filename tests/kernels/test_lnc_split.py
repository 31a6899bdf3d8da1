"""How the kernels split their work over the cores of a logical NeuronCore (``kernel[lnc]``).

Proves, on the interpreter (which runs the LNC=2 program instances one after the other
over shared HBM): each op's plan gives every core a disjoint share that together is the
LNC=1 work in the LNC=1 order (the tiling helpers), an LNC=2 launch gives bitwise the
LNC=1 outputs wherever the split keeps every element on one core (every output but the
RMSNorm backward's dw, a sum over rows that the cores' fp32 partials and the op then add
in core order, checked bitwise against that definition), and a launch whose plan does
not split (both cores doing all the work) is refused by the two-core interpreter's race
check; the doubled work itself fails the output check where it is not idempotent
(AdamW's in-place update; a doubled matmul or RMSNorm forward share writes the same
bytes twice, which only the race check can see). What only a Trn2 run proves: that two
real cores, running concurrently, give the same bits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from neuron_kernels.errors import LimitError
from neuron_kernels.interpreter import NkiValidationError
from neuron_kernels.kernels import (
    REGISTRY,
    flash_attention,
    flash_attention_bwd,
    fused_adamw,
    matmul,
    rms_norm_bwd,
)
from neuron_kernels.kernels import flash_attention_plan as fa_plan
from neuron_kernels.kernels.tiling import core_share, split_work, tiled
from neuron_kernels.verification import assert_within_tolerance, copy_args, run_kernel

OPS = sorted(REGISTRY)


def test_tiled_covers_the_range_with_one_remainder():
    assert tiled(300, 128) == [(0, 128), (128, 128), (256, 44)]
    assert tiled(256, 128) == [(0, 128), (128, 128)]
    assert tiled(5, 128, start=2) == [(2, 3)]
    assert tiled(0, 128) == []


@pytest.mark.parametrize("costs", [[5] * 7, [1, 9, 3, 3, 8, 2], [4], [], [2, 2, 100]])
def test_split_work_partitions_in_order_and_balances(costs):
    assert split_work(costs, 1) == [list(range(len(costs)))]  # LNC=1: the old loop
    shares = split_work(costs, 2)
    assert sorted(i for share in shares for i in share) == list(range(len(costs)))
    assert all(share == sorted(share) for share in shares)
    loads = [sum(costs[i] for i in share) for share in shares]
    assert max(loads) - min(loads) <= max(costs, default=0)


def _items(plan, field):
    return [item for core in getattr(plan, field) for item in core]


def test_matmul_blocks_split_disjointly_and_cover_the_output():
    problem = {"m": 1000, "n": 1500, "k": 64}
    config = matmul.MatmulConfig(block_m=2, block_n=1)
    one = matmul.SPEC.check(problem, "bfloat16", config, "trn2")
    two = matmul.SPEC.check(problem, "bfloat16", config, "trn2", lnc=2)
    assert sorted(_items(two, "core_blocks")) == sorted(one.core_blocks[0])
    areas = [sum(ms * ns for _, ms, _, ns in core) for core in two.core_blocks]
    assert max(areas) - min(areas) <= config.block_m * 128 * config.block_n * 512


def test_causal_attention_with_one_group_balances_visible_keys():
    """B=1, Hkv=1 at LNC=2: the one (batch, KV head) group splits by query tiles, and the
    causal triangle is balanced by visible keys, not by tile count."""
    problem = {"b": 1, "h": 1, "hkv": 1, "sq": 2048, "sk": 2048, "d": 64, "causal": True}
    spec = flash_attention.FWD_SPEC
    config = spec.config.default()
    two = spec.check(problem, "bfloat16", config, "trn2", lnc=2)
    tiles, costs = fa_plan.query_tiles(1, 2048, 2048, 128, True)
    per_core = []
    for core in two.core_groups:
        assert [(b, kvh) for b, kvh, _ in core] == [(0, 0)]
        per_core.append([t for _, _, ts in core for t in ts])
    assert sorted(per_core[0] + per_core[1]) == sorted(tiles)
    work = [sum(costs[tiles.index(t)] for t in share) for share in per_core]
    assert abs(work[0] - work[1]) <= max(costs)
    assert core_share(tiles, costs, 0, 1) == tiles


def test_an_lnc_the_target_lacks_is_refused():
    with pytest.raises(LimitError) as err:
        matmul.SPEC.check({"m": 8, "n": 8, "k": 8}, "float32", matmul.MatmulConfig(), "trn1", 2)
    assert err.value.arg == "lnc" and "trn1" in err.value.rule


def _outputs(spec, args, lnc):
    ran = copy_args(args)
    out = run_kernel(spec, ran, target="trn2", lnc=lnc)
    if spec.mutates:
        return list(spec.mutated_tensors(ran))
    return list(out) if isinstance(out, (tuple, list)) else [out]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", OPS)
def test_lnc2_gives_the_lnc1_bits(name, dtype):
    """Every output element is computed on one core by the LNC=1 instruction sequence, so
    LNC=2 is bitwise LNC=1 (and so bitwise deterministic); dw of the RMSNorm backward, and
    dK/dV of an attention group split over the cores, are the cross-core sums (see the
    next tests)."""
    spec = REGISTRY[name]
    if dtype not in spec.dtypes:
        pytest.skip(f"{name} has no {dtype}")
    args = spec.make_inputs(spec.test_problems["probe"], dtype, torch.Generator().manual_seed(3))
    one, two = _outputs(spec, args, 1), _outputs(spec, args, 2)
    if name == "rms_norm_bwd":
        one, two = one[:1], two[:1]  # dx only
    # the probe's one KV group splits: dK/dV are sums (varlen: the same backward kernel)
    if name in ("flash_attention_bwd", "flash_attention_varlen_bwd"):
        one, two = one[:1], two[:1]  # dq only
    assert len(one) == len(two)
    for a, b in zip(one, two):
        assert torch.equal(a, b), f"{name} {dtype}: LNC=2 differs from LNC=1"


def test_rms_norm_bwd_dw_is_the_core_partials_added_in_core_order():
    """dw at LNC=2 is bitwise fl32(dw of core 0's rows + dw of core 1's rows): each core's
    partial is the LNC=1 sum over its own rows, and the op adds them in core order, so no
    timing can change a bit. fp32, so the LNC=1 runs' dw are the fp32 partial sums."""
    spec = rms_norm_bwd.SPEC
    problem = {"rows": 300, "h": 520}
    dy, x, w, rstd, offset, mode = spec.make_inputs(
        problem, "float32", torch.Generator().manual_seed(4)
    )
    plan = spec.check(problem, "float32", spec.config.default(), "trn2", lnc=2)
    partials = []
    for core in plan.core_tiles:
        rows = [r for r0, p, g in core for r in range(r0, r0 + p * g)]
        part = (dy[rows], x[rows], w, rstd[rows], offset, mode)
        partials.append(run_kernel(spec, part, target="trn2", lnc=1)[1])
    _, dw = run_kernel(spec, (dy, x, w, rstd, offset, mode), target="trn2", lnc=2)
    assert torch.equal(dw, partials[0] + partials[1])


def test_split_attention_group_dk_dv_are_the_core_partials_added_in_core_order():
    """One KV group with two query heads at LNC=2: each core runs one head's passes and
    writes its fp32 dK/dV partial; the op adds them in core order, so dK and dV are bitwise
    the sums of the one-head LNC=1 runs (fp32: those runs' outputs are the partials)."""
    spec = flash_attention_bwd.SPEC
    problem = dict(spec.test_problems["probe"])
    args = spec.make_inputs(problem, "float32", torch.Generator().manual_seed(6))
    plan = spec.check(problem, "float32", spec.config.default(), "trn2", lnc=2)
    assert plan.split_groups == 1
    heads = [[g for _, _, passes, _ in core for g, _, _ in passes] for core in plan.core_groups]
    assert heads == [[0], [1]]
    dout, q, k, v, out, lse, causal, scale = args[:8]  # no window, softcap, sinks, mask, dropout
    part = []
    for h in range(2):
        one_head = (dout[:, h : h + 1], q[:, h : h + 1], k, v, out[:, h : h + 1])
        part.append(run_kernel(spec, (*one_head, lse[:, h : h + 1], causal, scale), lnc=1))
    dq, dk, dv, _ = run_kernel(spec, args, target="trn2", lnc=2)
    assert torch.equal(dk, part[0][1] + part[1][1]) and torch.equal(dv, part[0][2] + part[1][2])
    assert torch.equal(dq, torch.cat([part[0][0], part[1][0]], dim=1))


def _unsplit(module, spec, field, monkeypatch):
    """Make ``module.SPEC``'s plan give every core all of the LNC=1 work."""

    def unsplit_plan(problem, dtype, config, target, lnc=1):
        whole = spec.plan(problem, dtype, config, target, 1)
        return dataclasses.replace(whole, lnc=lnc, **{field: getattr(whole, field) * lnc})

    monkeypatch.setattr(module, "SPEC", dataclasses.replace(spec, plan=unsplit_plan))


@pytest.mark.parametrize(
    "module,field",
    [(fused_adamw, "core_waves"), (rms_norm_bwd, "core_tiles"), (matmul, "core_blocks")],
    ids=["fused_adamw", "rms_norm_bwd", "matmul"],
)
def test_an_unsplit_lnc2_launch_is_refused_as_a_race(module, field, monkeypatch):
    """Both cores doing all the work write the same HBM bytes with no barrier between: the
    two-core interpreter's race check refuses the launch, naming a tensor the op writes."""
    spec = module.SPEC
    args = spec.make_inputs(
        spec.test_problems["probe"], "float32", torch.Generator().manual_seed(5)
    )
    run_kernel(spec, copy_args(args), target="trn2", lnc=2)  # split: no race
    _unsplit(module, spec, field, monkeypatch)
    with pytest.raises(NkiValidationError, match="both cores"):
        run_kernel(module.SPEC, copy_args(args), target="trn2", lnc=2)


def test_the_work_of_an_unsplit_fused_adamw_fails_the_output_check():
    """What two unsplit cores would do to AdamW's state, the whole update applied twice
    (in sequence: the race check refuses it at [2]), fails the output check, which the
    split launch passes: the check can see a doubled share where the work is not
    idempotent."""
    spec = fused_adamw.SPEC
    args = spec.make_inputs(
        spec.test_problems["probe"], "float32", torch.Generator().manual_seed(5)
    )
    tol = spec.tolerances["float32"]
    ref = copy_args(args, torch.float64)
    spec.reference(*ref, upcast=True)
    want = spec.mutated_tensors(ref)
    split = copy_args(args)
    run_kernel(spec, split, target="trn2", lnc=2)
    for g, w in zip(spec.mutated_tensors(split), want):
        assert_within_tolerance(g, w, tol, "split")
    doubled = copy_args(args)
    run_kernel(spec, doubled, target="trn2", lnc=1)
    run_kernel(spec, doubled, target="trn2", lnc=1)
    with pytest.raises(AssertionError):
        for g, w in zip(spec.mutated_tensors(doubled), want):
            assert_within_tolerance(g, w, tol, "doubled")
