"""Flash attention on trn2, modeled: forward and forward+backward latency and TensorE
utilization at B=1, H=32, Hkv=8, Sq=Sk=4096, D=128, bf16, causal and non-causal.

Every number is *modeled* (interpreter trace, trace-only, scheduled by the cost model);
none is a measurement. Run it by hand::

    python benchmarks/flash_attention.py [--seq 4096] [--groups 1] [--skip-backward]
    python benchmarks/flash_attention.py --lnc 1 --seq 8192 --window 1024 0
    python benchmarks/flash_attention.py --lnc 1 --seq 4096 --softcap 50 --sinks
    python benchmarks/flash_attention.py --lnc 1 --seq 4096 --padding-mask
    python benchmarks/flash_attention.py --lnc 1 --seq 4096 --dropout 0.1

With ``--window``, ``--softcap``, ``--sinks``, ``--padding-mask`` (a bool ``[B, 1, 1, Sk]``
mask, the last eighth of the keys padding) or ``--dropout P`` it runs causal attention
twice, without and with those features, and prints the forward+backward latency of each
and their ratio (modeled, per logical core at the LNC given; at ``--lnc 1``, one physical
core). Each side runs the configs the ops would run at the full shape: their tuned
entries in ``perf_results/trn2`` where the shape's bucket has one (the features have their
own buckets: ``:window=L,R``, ``:softcap=X``, ``:sinks`` in the shape syntax), else the
defaults; the masks and dropout, which have no shape syntax, take the causal ones. The
issue's bars: a causal window (1024, 0) at S=8192 costs at most 1.25 x 2 x 1024 / 8192 of
full causal; softcap and sinks add at most 10% at S=4096.

Head subsampling: the kernels loop over (batch, KV head) groups that share nothing but
the core, so one KV group (Hkv=1 with its H/Hkv query heads: the full GQA reuse of K/V)
is traced and its modeled latency is multiplied by the number of groups (B * Hkv). This
drops only the overlap between one group's tail and the next group's head, so the full
shape's latency is slightly overestimated and its utilization slightly underestimated.
At LNC=k (``--lnc``, default the target's launch LNC) k groups are traced, one per core of
the ``kernel[k]`` launch, and the rounds of k groups are multiplied up; utilization is
then per logical core (its k TensorEs' peak).
Utilization is useful matmul FLOPs (QK^T and P V; dS, dQ, dK, dV, and the recomputed
QK^T and P in backward) over the BF16 TensorE peak times the latency; TensorE transposes
are not counted as useful.
"""

from __future__ import annotations

import argparse
import time

import torch

from neuron_kernels import tuned_configs
from neuron_kernels.autotune.objective import make_point
from neuron_kernels.cost_model.profiler import Profiler
from neuron_kernels.hardware import launch_lnc
from neuron_kernels.kernels import REGISTRY

FWD, BWD = "flash_attention_fwd", "flash_attention_bwd"


def _inputs(b, h, hkv, s, d):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, s, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, s, d, generator=g).bfloat16()
    v = torch.randn(b, hkv, s, d, generator=g).bfloat16()
    return q, k, v


def _attention_flops(h, s, d, causal, backward):
    """Useful matmul FLOPs of one KV group: 2 matmuls forward, 5 backward (recomputed QK^T,
    dP = dO V^T, dV, dQ, dK), each 2*S*S*D per head; causal keeps the visible half."""
    per_matmul = 2.0 * s * s * d * h * (0.5 if causal else 1.0)
    return per_matmul * (5 if backward else 2)


def _profile(op, args, lnc=1, config=None, **kw):
    spec = REGISTRY[op]
    profiler = Profiler("trn2", compute=False)
    profiler.lnc = lnc  # the LNC the op's run_kernels launches at (spec.runner_lnc)
    t0 = time.perf_counter()
    config = config or spec.config.default()
    outs = spec.run_kernels(*args, config=config, runner=profiler, **kw)
    return profiler.report(), outs, time.perf_counter() - t0


def _op_config(op, shape, lnc):
    """The config the op itself runs for the full launch's ``shape`` (its syntax, bf16) at
    ``lnc``: its tuned entry (shipped or the user's), else the default; and where from."""
    spec = REGISTRY[op]
    point = make_point(spec, shape, "bfloat16", lnc)
    choice = tuned_configs.lookup(spec, point.problem, "bfloat16", "trn2", lnc=lnc)
    return choice.config, choice.source


def _describe(name, report, scale, flops, peak):
    latency = report.latency_ns * scale
    util = flops * scale / (peak * latency * 1e-9)
    busy = report.utilization()
    lanes = {u: busy[u] for u in ("pe", "dve", "act", "pool")}
    binding, _ = report.critical()
    counts = report.launches[0].run.trace.count_by_api()
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:4]
    print(
        f"  {name:<16} {latency / 1e3:>9.1f} us  TensorE useful {util:6.1%}  "
        f"HFU(all matmuls) {report.tensor_utilization()['hfu']:6.1%}  critical: {binding}"
    )
    print(
        "  "
        + " " * 16
        + " busy "
        + "  ".join(f"{u} {v:5.1%}" for u, v in lanes.items())
        + f"  dma {busy['dma']:5.1%}"
    )
    print("  " + " " * 16 + " most issued: " + ", ".join(f"{a.split('.')[-1]} {n}" for a, n in top))
    return latency, util


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--skip-backward", action="store_true")
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="launch LNC (default: NEURON_LOGICAL_NC_CONFIG, else the target's: trn2 2)",
    )
    parser.add_argument(
        "--window",
        type=int,
        nargs=2,
        metavar=("LEFT", "RIGHT"),
        default=None,
        help="compare causal attention with this window (-1: unbounded side) against none",
    )
    parser.add_argument("--softcap", type=float, default=0.0, help="compare with this softcap")
    parser.add_argument("--sinks", action="store_true", help="compare with attention sinks")
    parser.add_argument(
        "--padding-mask",
        action="store_true",
        help="compare with a bool [B, 1, 1, Sk] attn_mask (the last eighth of the keys masked)",
    )
    parser.add_argument("--dropout", type=float, default=0.0, help="compare with this dropout_p")
    args = parser.parse_args(argv)
    b, h, hkv, s, d = args.batch, args.heads, args.kv_heads, args.seq, args.head_dim
    if h % hkv:
        parser.error(f"--heads must be a multiple of --kv-heads, got {h} and {hkv}")
    lnc = args.lnc if args.lnc is not None else launch_lnc("trn2")
    groups = b * hkv
    if groups % lnc:
        parser.error(f"--batch x --kv-heads must be a multiple of the LNC ({lnc}), got {groups}")
    group = h // hkv
    # Traced: one (batch, KV head) group per core, every core's share on the two-core
    # schedule (kernel[lnc]); the launch is that many rounds of such groups.
    scale = groups // lnc
    print(
        f"flash attention, trn2 at LNC={lnc} (per logical core), bf16, B={b} H={h} Hkv={hkv} "
        f"Sq=Sk={s} D={d} (modeled; {lnc} KV group(s) of {group} query heads traced, one per "
        f"core, latency x{scale})"
    )
    traced_heads = group * lnc  # query heads in the trace: useful FLOPs are counted on them
    q, k, v = _inputs(1, traced_heads, lnc, s, d)
    if args.window is not None or args.softcap or args.sinks or args.padding_mask or args.dropout:
        _compare_features(args, q, k, v, lnc, scale)
        return
    for causal in (False, True):
        print(f"causal={causal}")
        fwd, (out, lse), wall_f = _profile(FWD, (q, k, v, causal, None), lnc)
        peak = fwd.peak_flops_per_s
        lat_f, util_f = _describe(
            "forward", fwd, scale, _attention_flops(traced_heads, s, d, causal, False), peak
        )
        if args.skip_backward:
            continue
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
        bwd, _, wall_b = _profile(BWD, (dout, q, k, v, out, lse, causal, None), lnc)
        lat_b, _ = _describe(
            "backward", bwd, scale, _attention_flops(traced_heads, s, d, causal, True), peak
        )
        total_flops = _attention_flops(traced_heads, s, d, causal, False) + _attention_flops(
            traced_heads, s, d, causal, True
        )
        util_fb = total_flops * scale / (peak * (lat_f + lat_b) * 1e-9)
        print(
            f"  {'forward+backward':<16} {(lat_f + lat_b) / 1e3:>9.1f} us  "
            f"TensorE useful {util_fb:6.1%}  (aims at LNC=1, non-causal: forward >= 50%, "
            "backward >= 57%, fwd+bwd >= 55%)"
        )
        print(f"  (trace + model wall time: forward {wall_f:.0f} s, backward {wall_b:.0f} s)")


def _fwd_bwd_latency(q, k, v, lnc, scale, features, configs=(None, None)):
    """Modeled forward and backward latency (ns, scaled to the launch) of causal attention
    with ``features`` = (window, softcap, sinks[, attn_mask, dropout_p, dropout_seed]),
    under ``configs`` (forward's, backward's; None: the default)."""
    fwd, (out, lse), _ = _profile(FWD, (q, k, v, True, None, *features), lnc, configs[0])
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).bfloat16()
    bwd, _, _ = _profile(BWD, (dout, q, k, v, out, lse, True, None, *features), lnc, configs[1])
    return fwd.latency_ns * scale, bwd.latency_ns * scale


def _feature_configs(args, window, lnc):
    """The forward's and backward's configs the ops run at the full shape, without and
    with the features that have shape syntax (window, softcap, sinks): their tuned
    entries where the shape's bucket has one (``perf_results/trn2``), else the defaults.
    Printed with where each came from."""
    b, h, hkv, s, d = args.batch, args.heads, args.kv_heads, args.seq, args.head_dim
    tail = ""
    if window is not None:
        tail += f":window={window[0]},{window[1]}"
    if args.softcap:
        tail += f":softcap={args.softcap}"
    if args.sinks:
        tail += ":sinks"
    shapes = {
        FWD: f"{b}x{h}x{hkv}x{s}x{s}x{d}:causal",
        BWD: f"{b}x{hkv}x{h // hkv}x{s}x{s}x{d}:causal",
    }
    out = []
    for suffix in ("", tail):
        pair = []
        for op in (FWD, BWD):
            config, source = _op_config(op, shapes[op] + suffix, lnc)
            print(f"  config of {op} at {shapes[op] + suffix}: {source}")
            pair.append(config)
        out.append(tuple(pair))
    return out


def _compare_features(args, q, k, v, lnc, scale):
    """Causal attention without and with the requested window / softcap / sinks: the
    forward, backward and forward+backward latency of each and their ratio (modeled)."""
    sinks = None
    if args.sinks:
        sinks = torch.randn(q.shape[1], generator=torch.Generator().manual_seed(2))
    window = None if args.window is None else tuple(args.window)
    mask = seed = None
    if args.padding_mask:
        s = q.shape[2]
        mask = torch.ones(1, 1, 1, s, dtype=torch.bool)
        mask[..., s - s // 8 :] = False
    if args.dropout:
        seed = torch.tensor([1234, 0])
    features = (window, args.softcap, sinks, mask, args.dropout, seed)
    named = [f"window={window}"] if window is not None else []
    named += [f"softcap={args.softcap}"] if args.softcap else []
    named += ["sinks"] if args.sinks else []
    named += ["[B, 1, 1, Sk] padding mask"] if args.padding_mask else []
    named += [f"dropout_p={args.dropout}"] if args.dropout else []
    unit = "one physical core" if lnc == 1 else f"one logical core ({lnc} physical)"
    print(f"modeled, per {unit} at LNC={lnc}: causal vs causal + {', '.join(named)}")
    base_configs, feat_configs = _feature_configs(args, window, lnc)
    base = _fwd_bwd_latency(q, k, v, lnc, scale, (None, 0.0, None), base_configs)
    feat = _fwd_bwd_latency(q, k, v, lnc, scale, features, feat_configs)
    for name, a, b in (
        ("forward", base[0], feat[0]),
        ("backward", base[1], feat[1]),
        ("forward+backward", sum(base), sum(feat)),
    ):
        print(
            f"  {name:<16} causal {a / 1e3:>9.1f} us   with features {b / 1e3:>9.1f} us   "
            f"ratio {b / a:.3f} (modeled)"
        )
    if window is not None and window[1] == 0 and window[0] > 0:
        bar = 1.25 * 2 * window[0] / args.seq
        verdict = "PASS" if sum(feat) / sum(base) <= bar else "FAIL"
        print(f"  window bar: ratio <= 1.25 x 2 x {window[0]} / {args.seq} = {bar:.3f}: {verdict}")
    elif window is None and mask is None and not args.dropout:
        verdict = "PASS" if sum(feat) / sum(base) <= 1.10 else "FAIL"
        print(f"  softcap/sinks bar: ratio <= 1.10: {verdict}")


if __name__ == "__main__":
    main()
