"""What one compute instruction costs on its engine: the rule per traced instruction
(:data:`COST_RULES`), TensorE's initiation interval and FLOPs (:func:`tensor_cost`), and the
VectorE / ScalarE / GpSimdE cycle rules (:func:`compute_cost`), from the
:class:`~neuron_kernels.cost_model.params.CostParams` values (sources cited by key as there).
Every time here is *modeled*."""

from __future__ import annotations

from neuron_kernels.cost_model.params import CostParams
from neuron_kernels.interpreter.trace import Instruction

__all__ = ["COST_RULES", "ON_CHIP", "compute_cost", "tensor_cost"]

# Every instruction the interpreter traces and the rule that prices it. A new instruction is
# added here with its rule (tests/cost_model/test_instruction_costs.py walks nki.isa and
# fails on a missing entry), so nothing falls back to a default cost unnoticed. "one pass": the
# operand's free size in cycles, the one-input rule ([arch-v2]; [isa-old]; [arch-v3]) [U].
COST_RULES = {
    **dict.fromkeys(("dma_copy", "dma_transpose"), "DMA: bytes over queues and engines"),
    **dict.fromkeys(("nc_matmul", "nc_transpose"), "TensorE: tensor_cost"),
    # MX: the nc_matmul cycle rule with K = 4 x partitions, so 4x the bf16 FLOP rate
    # (aws-neuron-sdk nki/deep-dives/mxfp-matmul.rst: "4x throughput compared to BF16/FP16").
    "nc_matmul_mx": "TensorE: tensor_cost, contraction 4x the partitions",
    # VectorE, one pass over the src free size: the deep dive's "Matmul-MX produces data at
    # double the rate that Quantize-MX can consume it" with TensorE at twice VectorE's clock
    # puts it at one element per partition per VectorE cycle [estimate].
    "quantize_mx": "one pass over the src free size (estimate)",
    **dict.fromkeys(
        ("tensor_copy", "tensor_scalar", "iota", "memset", "activation"),
        "free size; 2x/4x DVE perf mode for 2-byte copies and tensor_scalar",
    ),
    "tensor_tensor": "2N, N with a PSUM input or the 2-byte perf mode",
    "tensor_reduce": "source free size, half for 2-byte add/max",
    "tensor_scalar_reduce": "N + MIN_II",
    **dict.fromkeys(("scalar_tensor_tensor", "tensor_tensor_scan"), "2N"),
    "reciprocal": "8N",
    "bn_stats": "source free size",
    "bn_aggr": "13/3 of the source free size",
    "tensor_copy_predicated": "2N with two SBUF inputs, else N",
    "exponential": "N/4 (NC-v4)",
    "activation_reduce": "ScalarE: free size + reduce cycles, table switches",
    "activate2": "ScalarE: as activation (free size, reduce cycles, table switches)",
    **dict.fromkeys(
        (
            "range_select",
            "max8",
            "select_reduce",
            "tensor_scalar_cumulative",
            "affine_select",
            "tensor_partition_reduce",
            "nc_find_index8",
            "nonzero_with_count",
            # a VectorE copy across partitions within quadrants: one pass over the free size,
            # as tensor_copy; the docs give it no 2-byte performance mode
            "nc_stream_shuffle",
        ),
        "one pass",
    ),
    **dict.fromkeys(("register_load", "register_store"), "sync engine: one minimal instruction"),
    "core_barrier": "both cores wait for the later, then core_barrier_ns (LNC=2)",
    "sendrecv": "after both arrive: DMA latency + per-engine transfers, SBUF to SBUF (LNC=2)",
}
_FP32 = {"float32"}
_TWO_BYTE_FLOAT = {"bfloat16", "float16"}
ON_CHIP = ("sbuf", "psum")
_FP8 = {"float8_e4m3", "float8_e5m2", "float8_e4m3fn"}

# Activation functions grouped into table sets; "copy"-like ops need no table. Which function
# shares a table with which is unpublished [U]; these groups follow the set names in the
# runtime docs (natural_log_exp_and_others, gelu_and_others, ...).
_NO_TABLE = {"copy", "identity", "bypass"}
_TABLE_SET = {
    "exp": "exp_log",
    "log": "exp_log",
    "softplus": "exp_log",
    "mish": "exp_log",
    "gelu": "gelu",
    "gelu_dx": "gelu",
    "gelu_apprx_tanh": "gelu",
    "gelu_apprx_sigmoid": "gelu",
    "gelu_apprx_sigmoid_dx": "gelu",
    "erf": "gelu",
    "erf_dx": "gelu",
    "sigmoid": "sigmoid",
    "silu": "sigmoid",
    "silu_dx": "sigmoid",
    "tanh": "sigmoid",
}


def _stride_factor(p: CostParams, accesses) -> float:
    threshold = p.stride_threshold_bytes
    for a in accesses:
        if a.inner_stride_bytes > threshold and a.buffer in ON_CHIP:  # (Access.on_chip)
            return p.stride_penalty
    return 1.0


def _n_free(accesses) -> int:
    """The largest free size of ``accesses`` (1 for none)."""
    n = 0
    for a in accesses:
        e = a.elems_per_partition
        if e > n:
            n = e
    return n if accesses else 1


def _data_operands(ops, n: int) -> list:
    """Data operands only: a [P, 1] scalar-operand tile does not decide the performance
    mode (the operands of the largest free size ``n``; all of them if none is)."""
    return [a for a in ops if a.elems_per_partition == n] or list(ops)


def _all_two_byte(data) -> bool:
    """Every operand is BF16/FP16 (and there is one)."""
    for a in data:
        if a.dtype not in _TWO_BYTE_FLOAT:
            return False
    return bool(data)


def _vector_cycles(api: str, ins: Instruction, p: CostParams, perf_mode: bool) -> float:
    """VectorE (or GpSimd, perf_mode=False) cycles excluding MIN_II ([arch-v2]; [isa-old]; [arch-v3])."""
    ops = (*ins.reads, *ins.writes)
    n = _n_free(ops)
    if api in ("tensor_copy", "tensor_scalar", "activation", "iota", "memset"):
        cycles = float(n)
        if perf_mode and api in ("tensor_copy", "tensor_scalar"):
            data = _data_operands(ops, n)
            if _all_two_byte(data):
                any_psum, unit_stride = False, True
                for a in data:
                    if a.buffer == "psum":
                        any_psum = True
                    if a.inner_stride_bytes > a.itemsize:  # not a unit-stride operand
                        unit_stride = False
                cycles /= 4.0 if (not any_psum and unit_stride) else 2.0
        return cycles
    if api == "tensor_tensor":
        for a in ins.reads:
            if a.buffer == "psum":
                return float(n)  # one input streams from PSUM: N, not 2N ([isa-old])
        if perf_mode and _all_two_byte(_data_operands(ops, n)):
            return float(n)  # NC-v3: both SBUF, all BF16/FP16 -> 2x
        return 2.0 * n
    if api == "tensor_reduce":
        src = _n_free(ins.reads)
        op = ins.attrs.get("op")
        fast = {a.dtype for a in ins.reads} <= _TWO_BYTE_FLOAT and op in ("add", "maximum")
        return src / 2.0 if fast else float(src)
    if api == "tensor_scalar_reduce":
        return float(n) + p.min_ii_cycles
    if api in ("scalar_tensor_tensor", "tensor_tensor_scan"):
        return 2.0 * n
    if api == "reciprocal":
        return 8.0 * n
    if api == "bn_stats":
        return float(_n_free(ins.reads))
    if api == "bn_aggr":
        return 13.0 * _n_free(ins.reads) / 3.0
    if api == "tensor_copy_predicated":
        in_sbuf = sum(1 for a in ins.reads if a.buffer == "sbuf")
        return 2.0 * n if in_sbuf >= 2 else float(n)
    if api == "exponential":  # NC-v4: 4x ScalarE exp throughput ([arch-v2]; [isa-old]; [arch-v3])
        return n / 4.0
    # nc_transpose (32x32 blocks), range_select, max8, select_reduce, tensor_scalar_cumulative
    # and anything newer: one pass over the operand, the one-input rule ([arch-v2]; [isa-old]; [arch-v3]) [U].
    return float(n)


def tensor_cost(ins: Instruction, p: CostParams) -> tuple[float, float, float, float]:
    """(II ns, latency ns, raw FLOPs, bf16-equivalent FLOPs) of a TensorE instruction."""
    a = ins.attrs
    k = int(a.get("K", ins.reads[0].partitions if ins.reads else 128))
    m = int(a.get("M", 128))
    n = int(a.get("N", 128))
    dt = {a.get("stationary_dtype"), a.get("moving_dtype")}
    transpose = bool(a.get("is_transpose")) or ins.api.endswith("nc_transpose")
    mm = max(min(p.mm_min_cycles, m), n)  # isa-old: max(min(64, N_stationary), N_moving)
    ls = m / p.ls_speedup  # background LoadStationary of this matmul's stationary
    cycles = max(mm, ls)
    if dt & _FP32:
        cycles *= p.fp32_transpose_factor if transpose else p.fp32_mm_factor
    tiling = a.get("tiling")
    if tiling:  # PE tiling: a row x column quadrant; several tiles share the array [U]
        rows, cols = tiling[0], tiling[1]
        cycles *= (rows * cols) / (128.0 * 128.0)
    ii = cycles / p.pe_ghz
    raw = 2.0 * k * m * n
    if a.get("mx"):  # nc_matmul_mx: 4x bf16's rate (deep dives/mxfp-matmul.rst)
        equiv = raw * 0.25
    elif dt & _FP32:
        equiv = raw * 4.0
    elif dt <= _FP8 and len(dt) > 0:
        equiv = raw * 0.5
    else:
        equiv = raw
    return ii, ii + p.pe_fill_cycles / p.pe_ghz, raw, equiv


def compute_cost(ins: Instruction, p: CostParams, act_state: dict) -> tuple[float, float]:
    """(II ns, end latency ns) of a compute-engine instruction."""
    api = ins.api.rsplit(".", 1)[-1]
    eng = ins.engine
    ops = (*ins.reads, *ins.writes)
    if eng == "vector":
        cycles = _vector_cycles(api, ins, p, bool(p.dve_perf_mode))
        cycles = max(p.min_ii_cycles, cycles) * _stride_factor(p, ops)
        ii = cycles / p.dve_ghz
        return ii, ii + p.engine_latency_cycles / p.dve_ghz
    if eng == "scalar":
        n = _n_free(ops)
        cycles = float(n)
        if api == "tensor_copy" or (api == "activation" and ins.attrs.get("op") == "copy"):
            dtypes = {a.dtype for a in ops}
            if p.act_fast_bf16 and dtypes and dtypes <= _TWO_BYTE_FLOAT:
                cycles /= 2.0
        cycles = max(p.min_ii_cycles, cycles)
        reduce_cmd = ins.attrs.get("reduce_cmd")
        if (
            api == "activation_reduce"
            or reduce_cmd in ("reduce", "reset_reduce")
            or ins.attrs.get("reads_out")
        ):
            cycles += p.act_reduce_cycles
        cycles *= _stride_factor(p, ops)
        ii = cycles / p.act_ghz
        op = ins.attrs.get("op")
        if op is not None and op not in _NO_TABLE:
            table = _TABLE_SET.get(op, op)
            if act_state.get("table") not in (None, table):
                ii += p.act_table_switch_ns
            act_state["table"] = table
        return ii, ii + p.engine_latency_cycles / p.act_ghz
    if eng == "gpsimd":
        cycles = p.pool_start_cycles + _vector_cycles(api, ins, p, False)
        cycles *= _stride_factor(p, ops)
        ii = cycles / p.pool_ghz
        return ii, ii + p.engine_latency_cycles / p.pool_ghz
    # sync or an engine this model does not know: one minimal instruction
    ii = p.min_ii_cycles / p.act_ghz
    return ii, ii
