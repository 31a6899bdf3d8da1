"""The host memory an op needs when the interpreter runs it, and what this machine has.

An op called on CPU tensors in interpret mode runs its NKI kernels on the interpreter,
which holds host arrays for the inputs and outputs (torch -> NumPy copies and back, plus
HBM intermediates) and one trace record per executed instruction. Both grow with the
problem: an expanded ``[1, 1, 10**6, 16]`` attention implies ~(10**6/128)*(10**6/512) score
tiles and grew to 24 GB before the OOM killer took it. :func:`check_fits` refuses such a call
in one :class:`LimitError` line before any work; ``neuron-kernels`` reads the same
:func:`host_memory_bytes`.

The instruction counts below are estimates from each op's tile plan shape (tiles of 128
partitions by the op's free-size block, times instructions per tile read off the
interpreter's trace at small problems); they live here, not in the kernel modules, so the
kernels' hashes (``tuned_configs.kernel_hash``) do not depend on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from neuron_kernels.errors import LimitError

__all__ = [
    "INTERPRETER_BYTES_PER_INSTRUCTION",
    "INTERPRETER_HOST_COPIES",
    "check_fits",
    "host_memory_bytes",
    "interpreter_bytes",
    "interpreter_instructions",
]

# Host bytes the interpreter holds per executed instruction until the launch ends (its trace
# record and what the record keeps alive). Measured on this interpreter (tracemalloc peak,
# after the issue-32 trace shrink) as the marginal bytes per instruction of
# flash_attention_fwd f32 D=16 (Sq x Sk 1024x2048 -> 2048x4096: 688 -> 2528 instructions,
# 37.7 -> 144.6 MB, ~58 KB each) and flash_attention_bwd f32 1024x1024x64 (~45 KB each):
# rounded up to 64 KiB. Re-measure here when the trace changes (tests/kernels/test_footprint.py).
INTERPRETER_BYTES_PER_INSTRUCTION = 64 * 1024
# Copies of the op's input and output bytes the interpreter holds at its peak: the torch
# tensors, their NumPy HBM arrays, the output arrays and the torch outputs made from them.
# Measured peak / (input + output bytes) at 1-2k-row problems: rms_norm 3.0-3.1,
# rms_norm_bwd 4.1, swiglu 3.7, swiglu_bwd 3.8, fused_adamw_ 3.9, matmul 1024^3 4.0.
INTERPRETER_HOST_COPIES = 4


def _tiles(n: int, size: int) -> int:
    return max(1, -(-int(n) // size))


# op name -> problem -> estimated executed instructions (a little above the counts traced at
# small problems: the estimate should refuse late rather than refuse a call that fits).
_INSTRUCTIONS: dict[str, Callable[[dict], int]] = {
    # 4 per 128x512x128 block (traced: 2.4-5 per block at 256x512x256 .. 1024^3).
    "matmul": lambda p: 4 * _tiles(p["m"], 128) * _tiles(p["n"], 512) * _tiles(p["k"], 128) + 16,
    # 24 per (128-query, 512-key) score tile per head (traced: 20-28), causal or not.
    "flash_attention_fwd": lambda p: (
        24 * p["b"] * p["h"] * _tiles(p["sq"], 128) * _tiles(p["sk"], 512) + 16
    ),
    # 16 per (128-query, 128-key) tile per query head (traced: 13.4 at 1024x1024x64).
    "flash_attention_bwd": lambda p: (
        16 * p["b"] * p["hkv"] * p["groups"] * _tiles(p["sq"], 128) * _tiles(p["sk"], 128) + 16
    ),
    # Varlen: the BHSD kernels on the packed batch (B = 1) with every tile traced (no band)
    # and masked at run time: 28 per (128-query, 512-key) tile per head forward (24 + the
    # scaled copy and range_select), 20 per (128, 128) pair per query head backward.
    "flash_attention_varlen_fwd": lambda p: (
        28 * p["h"] * _tiles(p["total_q"], 128) * _tiles(p["total_k"], 512) + 16
    ),
    "flash_attention_varlen_bwd": lambda p: (
        20 * p["hkv"] * p["groups"] * _tiles(p["total_q"], 128) * _tiles(p["total_k"], 128) + 16
    ),
    # 4 / 6 per 128-row x 512-column chunk (traced: 2.5 / 4.6 at 1024x2048).
    "rms_norm_fwd": lambda p: 4 * _tiles(p["rows"], 128) * _tiles(p["h"], 512) + 16,
    "rms_norm_bwd": lambda p: 6 * _tiles(p["rows"], 128) * _tiles(p["h"], 512) + 16,
    # 4 per 128-row x 2048-column tile (traced: 1.25 fwd, 2.5 bwd at 1024x2048).
    "swiglu": lambda p: 4 * _tiles(p["rows"], 128) * _tiles(p["cols"], 2048) + 16,
    "swiglu_bwd": lambda p: 4 * _tiles(p["rows"], 128) * _tiles(p["cols"], 2048) + 16,
    # 12 per 128x512 chunk of each tensor, 8 per tensor (traced: 91 at 2 x 300000).
    "fused_adamw_": lambda p: p["tensors"] * (12 * _tiles(p["numel"], 128 * 512) + 8) + 16,
}


def interpreter_instructions(spec, problem: dict) -> int:
    """Estimated instructions the interpreter executes for ``spec`` at ``problem``.

    Raises:
        KeyError: the op has no estimate here (every registered kernel op must have one;
            ``tests/kernels/test_footprint.py`` checks it).
    """
    return int(_INSTRUCTIONS[spec.name](problem))


def interpreter_bytes(spec, args: tuple) -> int:
    """Estimated peak host bytes of running ``spec``'s kernels on the interpreter for the op
    arguments ``args`` (real or meta tensors: only their sizes are read)."""
    host = spec._host_bytes(args)
    instructions = interpreter_instructions(spec, spec.problem(*args))
    return INTERPRETER_HOST_COPIES * host + INTERPRETER_BYTES_PER_INSTRUCTION * instructions


def check_fits(spec, args: tuple) -> None:
    """Refuse, in one :class:`LimitError` line and before any work, a call whose estimated
    interpreter footprint exceeds the memory available now (:func:`host_memory_bytes`)."""
    need, have = spec.interpreter_bytes(args), host_memory_bytes()
    if need > have:
        problem = spec.problem(*args)
        shape = "x".join(str(problem[d]) for d in spec.dims)
        raise LimitError(
            spec.name,
            "problem",
            f"needs about {need / 2**30:.1f} GiB of host memory in interpret mode "
            f"(estimated: inputs, outputs and instruction trace), more than the "
            f"{have / 2**30:.1f} GiB available",
            shape,
            limit=have,
            hint="use reference mode (NEURON_KERNELS_CPU=reference) or a smaller problem",
        )


def host_memory_bytes() -> int:
    """Memory this machine can still give: ``MemAvailable`` from /proc/meminfo (Linux), else
    the physical memory (``os.sysconf``), else unknown (a figure that refuses nothing)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62  # unknown: do not refuse
