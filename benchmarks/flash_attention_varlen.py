"""Varlen (packed) flash attention on trn2, modeled: forward+backward latency of a packed
batch against full causal attention over the same total length and against the sum of its
sequences run one by one.

Every number is *modeled* (interpreter trace, trace-only, scheduled by the cost model), per
one physical core at LNC=1; none is a measurement. Run it by hand::

    python benchmarks/flash_attention_varlen.py [--total 8192] [--heads 32 --kv-heads 8]
    python benchmarks/flash_attention_varlen.py --lengths 1024x8 --lengths 3000,2000,1024,1024,500,400,200,44

Each ``--lengths`` is one packing (``LxN`` for N sequences of L, or a comma list) summing to
``--total``; it runs causal and as self-attention packing (``cu_seqlens_q is
cu_seqlens_k``), so the band ``(i - max_seqlen, i]`` is all that is traced. The issue's bar:
the packed batch costs at most full causal attention at the total length.

Head subsampling as ``benchmarks/flash_attention.py``: one KV group (Hkv=1 with its H/Hkv
query heads) is traced and its latency multiplied by Hkv (the groups share nothing but the
core; the overlap of one group's tail with the next one's head is dropped, a slight
overestimate).
"""

from __future__ import annotations

import argparse
import time

import torch

from neuron_kernels.cost_model.profiler import Profiler
from neuron_kernels.kernels import REGISTRY

FWD, BWD = "flash_attention_fwd", "flash_attention_bwd"
VFWD, VBWD = "flash_attention_varlen_fwd", "flash_attention_varlen_bwd"


def _profile(op, args):
    """Modeled latency (ns) of ``op``'s kernels at LNC=1, trace-only, default config."""
    spec = REGISTRY[op]
    profiler = Profiler("trn2", compute=False)
    profiler.lnc = 1
    outs = spec.run_kernels(*args, config=spec.config.default(), runner=profiler)
    report = profiler.report()
    return report.latency_ns, report, outs


def _matmuls(*reports) -> int:
    return sum(r.launches[0].run.trace.count_by_api().get("nisa.nc_matmul", 0) for r in reports)


def _bhsd(h, s, d, causal):
    """Forward and backward latency (ns) and matmul count of one BHSD KV group: B=1,
    Hkv=1, Sq=Sk=s."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, h, s, d, generator=g).bfloat16()
    k = torch.randn(1, 1, s, d, generator=g).bfloat16()
    v = torch.randn(1, 1, s, d, generator=g).bfloat16()
    lat_f, fwd, (out, lse) = _profile(FWD, (q, k, v, causal, None))
    lat_b, bwd, _ = _profile(BWD, (torch.zeros_like(q), q, k, v, out, lse, causal, None))
    return lat_f, lat_b, _matmuls(fwd, bwd)


def _varlen(h, lengths, d):
    """Forward and backward latency (ns) and matmul counts of one packed KV group."""
    total = sum(lengths)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(total, h, d, generator=g).bfloat16()
    k = torch.randn(total, 1, d, generator=g).bfloat16()
    v = torch.randn(total, 1, d, generator=g).bfloat16()
    edges = [0]
    for n in lengths:
        edges.append(edges[-1] + n)
    cu = torch.tensor(edges, dtype=torch.int32)
    m = max(lengths)
    lat_f, fwd, (out, lse) = _profile(VFWD, (q, k, v, cu, cu, m, m, True, None))
    args = (torch.zeros_like(q), q, k, v, out, lse, cu, cu, m, m, True, None)
    lat_b, bwd, _ = _profile(VBWD, args)
    return lat_f, lat_b, _matmuls(fwd, bwd)


def _parse_lengths(text: str) -> list[int]:
    if "x" in text:
        length, count = text.split("x")
        return [int(length)] * int(count)
    return [int(x) for x in text.split(",")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--lengths", action="append", default=None)
    parser.add_argument(
        "--skip-separate", action="store_true", help="skip the sum of the separate sequences"
    )
    args = parser.parse_args(argv)
    h, hkv, d, total = args.heads, args.kv_heads, args.head_dim, args.total
    if h % hkv:
        parser.error(f"--heads must be a multiple of --kv-heads, got {h} and {hkv}")
    packings = [_parse_lengths(t) for t in (args.lengths or ["1024x8"])]
    for lengths in packings:
        if sum(lengths) != total:
            parser.error(f"--lengths must sum to --total ({total}), got {sum(lengths)}")
    group = h // hkv
    print(
        f"varlen flash attention, trn2, LNC=1 (one physical core), bf16, H={h} Hkv={hkv} D={d}, "
        f"causal, total {total} (modeled; one KV group of {group} query heads traced, x{hkv})"
    )
    t0 = time.perf_counter()
    full_f, full_b, full_mm = _bhsd(group, total, d, True)
    full = (full_f + full_b) * hkv
    print(
        f"  full causal S={total}: forward {full_f * hkv / 1e3:9.1f} us  backward "
        f"{full_b * hkv / 1e3:9.1f} us  fwd+bwd {full / 1e3:9.1f} us  "
        f"[{full_mm} matmuls traced per group]"
    )
    separate_cache: dict[int, tuple[float, int]] = {}
    for lengths in packings:
        var_f, var_b, matmuls = _varlen(group, lengths, d)
        packed = (var_f + var_b) * hkv
        name = ",".join(map(str, lengths))
        verdict = "PASS" if packed <= full else "FAIL"
        print(
            f"  packed [{name}]: forward {var_f * hkv / 1e3:9.1f} us  backward "
            f"{var_b * hkv / 1e3:9.1f} us  fwd+bwd {packed / 1e3:9.1f} us  "
            f"= {packed / full:.3f} x full causal ({verdict}: <= 1)  "
            f"[{matmuls} matmuls traced per group]"
        )
        if args.skip_separate:
            continue
        separate, separate_mm = 0.0, 0
        for n in lengths:
            if n and n not in separate_cache:
                f, b, mm = _bhsd(group, n, d, True)
                separate_cache[n] = ((f + b) * hkv, mm)
            separate += separate_cache.get(n, (0.0, 0))[0]
            separate_mm += separate_cache.get(n, (0.0, 0))[1]
        print(
            f"    sum of the {len(lengths)} sequences run separately (BHSD, causal): "
            f"{separate / 1e3:9.1f} us [{separate_mm} matmuls per group]; "
            f"packed / separate = {packed / separate:.3f}"
        )
    print(f"  (trace + model wall time {time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
