"""Cost-model parameters are range-checked where they are defined: no override can make a
modeled latency negative or divide by zero, and the error names the unit and the source."""

from __future__ import annotations

import pytest

from neuron_kernels.cost_model.params import PARAMS, params_for
from neuron_kernels.errors import LimitError


@pytest.mark.parametrize(
    "name,value,rule",
    [
        ("dma_core_gbps", 0, "must be > 0 GB/s"),
        ("dma_core_gbps", -1.0, "must be > 0 GB/s"),
        ("dma_core_gbps", "-5", "must be > 0 GB/s"),  # command-line text
        ("dma_core_gbps", "fast", "must be a number in GB/s"),
        ("pe_ghz", 0.0, "must be > 0 GHz"),
        ("sync_ns", -3, "must be >= 0 ns"),
        ("dma_latency_ns", float("nan"), "must be a number in ns"),
        ("mm_min_cycles", -1, "must be >= 0 PE cycles"),
        ("dve_perf_mode", "maybe", "must be true or false"),
        ("sbuf_allocator", "fifo", "must be one of"),
        ("default_dge", "dma", "must be one of"),
    ],
)
def test_out_of_range_override_is_refused_with_unit_and_source(name, value, rule):
    with pytest.raises(LimitError) as err:
        params_for("trn2", **{name: value})
    assert err.value.arg == f"parameter {name}" and err.value.rule.startswith(rule), str(err.value)
    unit = PARAMS["trn2"][name].unit
    assert f"unit {unit}" in str(err.value) and "source:" in str(err.value)


def test_unknown_parameter_names_the_known_ones():
    with pytest.raises(LimitError) as err:
        params_for("trn2", bogus=1)
    assert err.value.arg == "parameter" and "dma_core_gbps" in str(err.value)


@pytest.mark.parametrize("text,value", [("0", False), ("FALSE", False), ("on", True), ("1", True)])
def test_boolean_overrides_read_the_spellings_users_type(text, value):
    assert params_for("trn2", dve_perf_mode=text).dve_perf_mode is value


def test_zero_duration_is_allowed_and_in_range_values_pass():
    p = params_for("trn2", launch_ns=0, dma_core_gbps="512", sbuf_allocator="lru")
    assert (p.launch_ns, p.dma_core_gbps, p.sbuf_allocator) == (0.0, 512.0, "lru")
