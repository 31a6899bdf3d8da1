"""Documented hardware facts per NeuronCore generation: the one table that the interpreter,
the kernels' tile plans, the ops and the cost model all read.

Dependency-free (standard library only), so a kernel module on a Trn node can read a tile
size without loading the interpreter or the cost model.

Sources are paths in aws-neuron/aws-neuron-sdk (snapshot 81ce03ae) unless noted:
  [isa]   nki/api/nki/isa/__init__.py          per-instruction limits
  [lang]  nki/api/nki/language/__init__.py     tile_size constants
  [ts]    nki/api/nki.language.tile_size.rst   psum_num_banks, PE-transpose DMA bank
  [v2]    nki/guides/architecture/trainium_inferentia2_arch.rst
  [v3]    nki/guides/architecture/trainium2_arch.rst
  [v4]    nki/guides/architecture/trainium3_arch.rst
  [nkipy] aws-neuron/nkipy nkigen/.../HardwareConstants.h (mirrors the nki wheel's target_info)
  [lnc]   about-neuron/arch/neuron-features/logical-neuroncore-config.rst
  [jit]   nki/api/nki/__init__.py                 jit: kernel[lnc](...), default 1
  [ptu]   torch-neuronx torch_neuronx/csrc/core/utils/PlatformUtils.cpp (public copy
          parmoham-aws/test-repo-parmoham): default logical cores per instance family
  [tnu]   torch-neuronx torch_neuronx/utils.py (same copy): get_platform_target(),
          get_logical_neuron_cores(); PlatformUtils.cpp maps each instance type onto a
          target (inf1 -> inf1, trn1/trn1n/inf2 -> trn1, trn2/trn2n/trn2u -> trn2, trn3 -> trn3)
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from neuron_kernels.errors import LimitError

__all__ = [
    "Target",
    "TARGETS",
    "TARGET_ENV",
    "PE_TRANSPOSE_DMA_ENV",
    "target_from_name",
    "default_target",
    "usable_psum_banks",
    "usable_psum_bytes",
    "LNC_ENV",
    "launch_lnc",
    "PLATFORM_QUERY",
]

TARGET_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
# [ts] With this set to "true" on NeuronCore-v3+, DMA transposes run as PE transposes and
# PSUM bank 7 is reserved for them: tile_size.psum_num_banks returns 7.
PE_TRANSPOSE_DMA_ENV = "NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE"
# [lnc] The runtime groups this many physical cores into one logical core; [jit] a kernel's
# launch LNC must match it ("Mismatching the two will cause a runtime error").
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
# [tnu] What TorchNeuron compiles for: the node's platform target, as torch-neuronx reports it.
PLATFORM_QUERY = "torch_neuronx.utils.get_platform_target()"


@dataclass(frozen=True)
class Target:
    """Limits of one NeuronCore generation (one physical core)."""

    name: str
    nc_version: int  # 2 = Trn1/Inf2, 3 = Trn2, 4 = Trn3

    # Partitions of SBUF/PSUM and of every on-chip operand. [lang] tile_size.pmax
    pmax: int = 128
    # PSUM: 16 KiB per partition in 8 banks of 2 KiB (512 fp32). [v2] "PSUM"; [lang]
    psum_partition_bytes: int = 16 * 1024
    psum_bank_bytes: int = 2048
    psum_num_banks: int = 8
    # SBUF bytes per partition: physical [v2]/[v3]/[v4] and usable by kernels
    # (tile_size.sbuf_fmax_bytes, values from [nkipy]).
    sbuf_partition_bytes: int = 192 * 1024
    sbuf_usable_bytes: int = 180224
    # nc_matmul: stationary free <= 128, moving free <= 512 (one PSUM bank) on v2/v3;
    # v4 up to 4096 (fp32 dst) / 8192 (bf16 dst). [isa] nc_matmul "Tile size"
    gemm_stationary_fmax: int = 128
    gemm_moving_fmax: int = 512
    matmul_moving_fmax_fp32_dst: int = 512
    matmul_moving_fmax_bf16_dst: int = 0  # 0: bf16 PSUM output not supported
    # bn_stats free size. [isa] bn_stats; [lang] bn_stats_fmax
    bn_stats_fmax: int = 512
    # Vector/Scalar/GpSimd free size per instruction: 64K elements from SBUF, 4K from
    # PSUM. [v2] "VectorE/ScalarE ... up to 64K elements ... 4K from PSUM"
    engine_sbuf_fmax: int = 64 * 1024
    engine_psum_fmax: int = 4 * 1024
    # Access pattern of one operand: up to 4 free dims, each count a uint16 and each
    # stride an int16 in elements. [v2] "Data streaming"
    ap_max_free_dims: int = 4
    ap_max_count: int = 65535
    ap_min_stride: int = -32768
    ap_max_stride: int = 32767
    # VectorE transpose handles [32, 32]. [isa] nc_transpose
    vector_transpose_max: int = 32
    # PSUM alignment of a free-dim address in bytes. [lang] psum_min_align (KLR value 4)
    psum_min_align: int = 4
    sbuf_min_align: int = 1
    # The start-partition rule (65-128 partitions start at 0, 33-64 at 0/64, 1-32 at
    # 0/32/64/96) is documented for NeuronCore-v2 only. [v2] "Data streaming"
    start_partition_rule: bool = False
    # Logical NeuronCore sizes (physical cores per launch) and the runtime's default. [lnc]
    # "LNC can only be set to 1 or 2 ... LNC applies only to Trn2 and Trn3"; [ptu] maps
    # trn1/inf2 to "1" and trn2/trn3 to "2". The two cores of an LNC=2 share one HBM stack.
    lnc_choices: tuple[int, ...] = (1,)
    default_lnc: int = 1

    @property
    def sbuf_fmax(self) -> int:
        """Usable SBUF per partition in fp32 elements."""
        return self.sbuf_usable_bytes // 4

    @property
    def psum_bank_fmax(self) -> int:
        return self.psum_bank_bytes // 4

    # Feature gates. Each names the generation the docs give for it.
    @property
    def has_transpose_mode(self) -> bool:  # nc_matmul is_transpose bit-accurate, v3+ [isa]
        return self.nc_version >= 3

    @property
    def has_scalar_bias(self) -> bool:  # activation bias may be a scalar, v3+ [isa]
        return self.nc_version >= 3

    @property
    def has_hwdge(self) -> bool:  # dge_mode.hwdge, v3+ [isa] dma_copy
        return self.nc_version >= 3

    @property
    def has_dma_transpose(self) -> bool:  # [v3] "DMA transpose"
        return self.nc_version >= 3

    @property
    def has_range_select(self) -> bool:  # nisa.range_select, v3+ [isa]
        return self.nc_version >= 3

    def check_dma_transpose(self, op: str, arg: str, dtype: str, itemsize: int) -> None:
        """Refuse a DMA transpose this target cannot run: none before NeuronCore-v3, and
        only of 2-byte elements. [v3] "DMA transpose"; [isa] dma_transpose.

        Raises:
            LimitError: ``<op>: <arg> must not be 'dma' ...``, naming the target or dtype.
        """
        if not self.has_dma_transpose:
            raise LimitError(
                op, arg, f"must not be 'dma' on {self.name} (DMA transpose needs trn2+)", "dma"
            )
        if itemsize != 2:
            raise LimitError(
                op,
                arg,
                "must not be 'dma' for a 4-byte dtype (DMA transpose is 2-byte)",
                f"dma with {dtype}",
            )

    @property
    def has_double_row(self) -> bool:  # FP8 double_row, v3/v4 [isa] nc_matmul
        return self.nc_version >= 3

    @property
    def has_fp8_e4m3fn(self) -> bool:  # OCP fp8 matmul input, v4 [isa] nc_matmul
        return self.nc_version >= 4

    @property
    def has_abs_max(self) -> bool:  # abs_max / abs_min ALU ops, v4 [nki.api.shared.rst]
        return self.nc_version >= 4

    @property
    def has_dma_priority(self) -> bool:  # dma_copy priority=, v4 [isa]
        return self.nc_version >= 4

    @property
    def has_psum_value_init_accumulate(self) -> bool:
        """v4 may accumulate a matmul onto PSUM written by memset/tensor_copy; v2/v3 is UB. [isa]"""
        return self.nc_version >= 4

    @property
    def min_pe_tile(self) -> int:  # PE row/column tiles of 64 (v2+) or 32 (v3+) [isa]
        return 32 if self.nc_version >= 3 else 64


TARGETS: dict[str, Target] = {
    "trn1": Target(
        name="trn1",
        nc_version=2,
        sbuf_partition_bytes=192 * 1024,
        sbuf_usable_bytes=180224,
        start_partition_rule=True,
    ),
    "trn2": Target(
        name="trn2",
        nc_version=3,
        sbuf_partition_bytes=224 * 1024,
        sbuf_usable_bytes=212984,
        lnc_choices=(1, 2),
        default_lnc=2,
    ),
    "trn3": Target(
        name="trn3",
        nc_version=4,
        sbuf_partition_bytes=256 * 1024,
        sbuf_usable_bytes=245752,
        matmul_moving_fmax_fp32_dst=4096,
        matmul_moving_fmax_bf16_dst=8192,
        lnc_choices=(1, 2),
        default_lnc=2,
    ),
}

_ALIASES = {"gen2": "trn1", "inf2": "trn1", "gen3": "trn2", "gen4": "trn3"}


def target_from_name(name: str | Target, setting: str = "target") -> Target:
    """The target for ``trn1|inf2|gen2``, ``trn2|gen3`` or ``trn3|gen4``.

    Raises:
        LimitError: naming ``setting`` (the flag or variable the user gave) for any other name.
    """
    if isinstance(name, Target):
        return name
    key = _ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in TARGETS:
        raise LimitError(
            "target", setting, "must be one of trn1|inf2|gen2, trn2|gen3, trn3|gen4", name
        )
    return TARGETS[key]


def _torch_neuronx_platform() -> str | None:
    """``torch_neuronx.utils.get_platform_target()`` [tnu] when torch-neuronx imports, else None."""
    try:
        from torch_neuronx.utils import get_platform_target
    except ImportError:
        return None
    return get_platform_target()


def default_target() -> Target:
    """The target kernels are planned for: ``NEURON_PLATFORM_TARGET_OVERRIDE`` when set, else
    the platform torch-neuronx reports on a TorchNeuron node [tnu], else trn2.

    Raises:
        LimitError: one line naming the variable (or the torch-neuronx query) and the value
            when it is not a target this project supports (torch-neuronx also reports inf1).
    """
    override = os.environ.get(TARGET_ENV)
    if override:
        return target_from_name(override, setting=TARGET_ENV)
    platform = _torch_neuronx_platform()
    if platform is not None:
        return target_from_name(platform, setting=PLATFORM_QUERY)
    return TARGETS["trn2"]


def usable_psum_banks(target: str | Target) -> int:
    """PSUM banks a kernel may use: all 8, but 7 on NeuronCore-v3+ when
    NKI_DMA_TRANSPOSE_AS_PE_TRANSPOSE=true reserves one for DMA transposes [ts]. Read at each
    call, as the compiler reads the variable at each compile."""
    tg = target_from_name(target)
    reserved = (
        os.environ.get(PE_TRANSPOSE_DMA_ENV, "").strip().lower() == "true" and tg.nc_version >= 3
    )
    return tg.psum_num_banks - (1 if reserved else 0)


def usable_psum_bytes(target: str | Target) -> int:
    """PSUM bytes per partition a kernel may use (its usable banks)."""
    tg = target_from_name(target)
    return usable_psum_banks(tg) * tg.psum_bank_bytes


def _torch_neuronx_lnc() -> str | None:
    """``torch_neuronx.utils.get_logical_neuron_cores()`` (a string: the variable, else the
    instance family's default [ptu]) when torch-neuronx is installed, else None."""
    try:
        from torch_neuronx.utils import get_logical_neuron_cores
    except ImportError:
        return None
    return get_logical_neuron_cores()


def launch_lnc(target: str | Target | None = None) -> int:
    """The LNC a kernel launch uses on ``target``: the one place that decides it.

    ``NEURON_LOGICAL_NC_CONFIG`` when set, else what torch-neuronx reports on a TorchNeuron
    node, else ``target.default_lnc`` (trn1 1, trn2/trn3 2). [jit] the launch's LNC must match
    the runtime's.

    Raises:
        LimitError: naming the variable (or torch-neuronx) and the value when it is not an
            LNC the target supports.
    """
    tg = default_target() if target is None else target_from_name(target)
    raw, source = os.environ.get(LNC_ENV), LNC_ENV
    if raw is None or not raw.strip():
        raw, source = _torch_neuronx_lnc(), "torch_neuronx.utils.get_logical_neuron_cores()"
    if raw is None:
        return tg.default_lnc
    try:
        lnc = int(str(raw).strip())
    except ValueError:
        lnc = None
    if lnc not in tg.lnc_choices:
        choices = "|".join(map(str, tg.lnc_choices))
        raise LimitError(
            "launch",
            source,
            f"must be an LNC {tg.name} supports ({choices})",
            raw,
            limit=tg.lnc_choices,
        )
    return lnc
