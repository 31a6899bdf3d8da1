"""Every instruction the interpreter implements has a deliberate cost rule (issue 14 item 7):
a new ``nki.isa`` instruction without an entry in ``instruction_costs.COST_RULES`` fails here instead
of being priced silently by a fallback; and the new instructions schedule on their lanes."""

from __future__ import annotations

import types

import numpy as np

from neuron_kernels.cost_model.instruction_costs import COST_RULES
from neuron_kernels.cost_model.schedule import model_trace
from neuron_kernels.interpreter import nki, run

nisa, nl = nki.isa, nki.language

UNTRACED = {"register_alloc", "register_move", "get_nc_version", "get_nc_sub_version"}
REFUSED: set[str] = set()  # instructions the interpreter refuses never trace


def _traced_instructions() -> set[str]:
    names = set()
    for name in nisa.__all__:
        obj = getattr(nisa, name)
        if isinstance(obj, types.FunctionType) and name not in UNTRACED | REFUSED:
            names.add(name)
    return names


def test_every_implemented_instruction_has_a_cost_rule():
    missing = sorted(_traced_instructions() - set(COST_RULES))
    assert not missing, f"no cost rule in cost_model/instruction_costs.py COST_RULES for {missing}"
    stale = sorted(set(COST_RULES) - _traced_instructions())
    assert not stale, f"COST_RULES names instructions nki.isa lacks: {stale}"


def _new_instructions(x):
    t = nl.ndarray((16, 8), nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    y = nl.ndarray((16, 8), nl.float32, buffer=nl.sbuf)
    nisa.activate2(dst=y, op=nl.exp, data=t, imm0=1.0, imm1=0.0, op0=nl.multiply, op1=nl.add)
    idx = nl.ndarray((16, 8), nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=idx, data=t, vals=t)
    nz = nl.ndarray((16, 9), nl.int32, buffer=nl.sbuf)
    nisa.nonzero_with_count(dst=nz, src=t)
    one = nl.ones((1, 1), nl.int32)
    reg = nisa.register_alloc()
    nisa.register_load(reg, one)
    nisa.register_store(one, reg)


def test_new_instructions_schedule_on_their_engines():
    got = run(_new_instructions, (np.ones((16, 8), np.float32),), target="trn3")
    by_api = {i.api: i.engine for i in got.trace}
    assert by_api["nisa.activate2"] == "scalar"
    assert by_api["nisa.nc_find_index8"] == "vector"
    assert by_api["nisa.nonzero_with_count"] == "gpsimd"
    assert by_api["nisa.register_load"] == by_api["nisa.register_store"] == "sync"
    result = model_trace(got.trace)  # modeled, not measured
    assert result.latency_ns > 0 and result.busy_ns["sp"] > 0
