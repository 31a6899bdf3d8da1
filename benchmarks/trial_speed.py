"""Speed of one modeled tuner trial: interpreter trace (trace-only) and cost-model schedule.

Not a test: run it by hand after touching ``interpreter/`` or ``cost_model/``::

    python benchmarks/trial_speed.py [--repeat 3] [--only matmul] [--profile CASE]
    python benchmarks/trial_speed.py --record /tmp/golden.json   # before a change
    python benchmarks/trial_speed.py --check /tmp/golden.json    # after it: exit 1 on a diff

Each case is what the tuner's model backend does for one trial (``autotune/backends.py``):
the op's kernels run on the interpreter with ``compute=False`` at the full shape, then
``cost_model.model_trace`` schedules the trace. The two are timed apart (best of
``--repeat``, wall clock, so other processes' load shows up: compare best-of-N). Every
latency printed is *modeled*, none is measured.

``--record`` writes every modeled number of every case (``Profile.to_dict()``: latency,
per-engine busy, DMA, critical path, FLOPs, memory, instruction counts) with ``repr`` of
each float, plus digests of the whole trace (every instruction's operands and attributes)
and of the whole timeline (every instruction's start, end, unit and occupancy);
``--check`` compares them exactly (bitwise float equality), so a speed-up that changes
any modeled number, or the trace it is computed from, is caught.

Before/after (best of 3 s per case, trn2, 2 shared cores under the other agents' load):
see the table at the end of this docstring, filled in by the session that made the change.

Issue 32 item 13 (trial memory), ``--repeat 1`` before (``--record``) and after (``--check``:
every modeled number identical). Wall seconds on 2 cores shared with five other sessions
(load average 8-12), so the two columns ran under different load; the paired single-trial
times below ran side by side::

    case                      before total s  after total s  instr
    matmul-default                12.29          29.50       19328
    matmul-stationary-b           28.11          62.21       45376
    matmul-psum                   12.60          27.82       19328
    matmul-dma-transpose           7.46          16.89       10048
    matmul-transpose-pe-fp32       1.95           5.07        2400
    flash-fwd                     16.17          42.47       19328
    flash-fwd-causal               9.76          25.00       11104
    rms_norm_bwd                   6.19          14.02        4072
    fused_adamw_                   3.14           6.95        1531

Peak RSS of one modeled trial (``ModelBackend.measure``, matmul 8192x28672x8192 bf16,
default config, LNC=1, 535,808 traced instructions; ``/usr/bin/time -v``):
before 5.47 GB, 5.23 GB of it at the end of the trace (of which the dead PSUM tiles'
accumulation state: 3.76 GB, 1 byte per element of 28,672 [128, 512] and 114,688 [128, 128]
fp32 tiles; and two copies of the all-zero 8192x28672 output, ~0.9 GB estimated); after 1.40 GB
(1.11 GB at the end of the trace). Modeled latency 60,138.954 us both times (bit-identical).
One trial at matmul 4096^3 bf16 default config, before and after run side by side under the
same load: 62.11 s and 61.14 s wall (trace 51.03 / 50.06 s, schedule 11.00 / 11.05 s), peak RSS
0.514 GB and 0.352 GB: the memory change does not change the speed. ``neuron-kernels autotune
matmul --shape 4096x4096x4096 --trials 6 --jobs 2 --no-write --no-warm-start`` (own SQLite
storage each), before and after started together: 7 trials in 460 s and in 385 s wall (0.9 and
1.1 trials/min under that load; the 60/min goal assumes ~2 s per trial on idle cores).

Issue 32 item 13 (trial speed). Changes: ``NkiTensor.__getitem__`` caches the resulting
(shape, strides, offset) of a plain int/slice/``nl.ds`` index by everything its checks read
(a hit repeats an index that passed every check with identical inputs; errors are never
cached); ``_access`` caches the storage-independent Access fields by pattern and storage
geometry, and equal views of one storage share one Access; the schedule computes each
operand's region bounds once per instruction and tests overlap inline in its dependency
scan. One trial at matmul 4096^3 bf16 default config (19,328 instructions), CPU seconds
(``time.process_time``, best of 2 trials per process), before and after run in turn 6 times
each (A B A B ...); every modeled number of the five matmul cases identical (``--check``)::

    phase        before s (median)  after s (median)  ratio
    trace              2.69              1.87          1.44x
    schedule           1.05              1.01          1.03x
    total              3.73              2.88          1.30x (median of the paired ratios)

Whole process (imports, inputs and 2 trials): CPU after/before 0.844 (median of 5 pairs).
At ~2.4 s per trial on idle cores before, 1.30x gives ~1.85 s: ~65 modeled trials/min
with ``--jobs 2`` instead of ~50 (the trial is the tuner's per-trial work; wall time on
the shared machine depends on the other sessions' load).

Issue 32 item 13 (trial speed, second pass). Trace: Python's cyclic GC paused for a
launch and, in ``ModelBackend.measure``, for the whole trial (a launch leaves almost no
cyclic garbage; ``run()``'s argument conversion no longer forms a cycle holding the
trace); a PSUM tile whose elements share one accumulation state keeps it as one number
(whole-tile matmuls/transposes never touch the per-element array, allocated only when a
partial view needs it); trace-only ``tensor_copy``/``tensor_tensor`` make the reads'
refusals but no arithmetic on zeros; ``engine_operand``'s pattern checks are remembered
per launch for combinations that passed (failures always re-run; NeuronCore-v2 always
re-checks); merged free dims cached by (shape, strides); attrs handed to the trace
without keyword re-packing; usable PSUM read once per launch. Schedule: a read's
overlapping live writes cached until its storage's write table changes (same order, so
the same producer on ties); edge and cover rules inlined; appends at the end of a
timeline skip the bisects; the PSUM allocator's fit loop inlined (same candidates, same
set order); VectorE cycle rules build their operand sets only when read; TensorE costs
memoised per trace by everything ``tensor_cost`` reads. Every modeled
number identical (``--check`` against a recording made before; 13 more
``ModelBackend.measure`` latencies of matmul, rms_norm fwd/bwd, flash attention fwd/bwd,
fused_adamw_ and swiglu fwd/bwd equal as floats). matmul 4096^3 bf16 default config, CPU
seconds (``time.process_time``), base and new processes alternated, median; load average
4-6 on 2 cores::

    phase                                   before s  after s  ratio
    trace (run, compute=False)                1.078    0.599   0.56x
    schedule (model_trace)                    0.659    0.507   0.77x
    trace + schedule                          1.737    1.106   0.64x
    ModelBackend.measure (one tuner trial)    1.78     1.05    0.59x

Other matmul configs, ``ModelBackend.measure`` CPU: psum 2x2 1.65 -> 0.98 s, DMA
transpose 8x4 0.87 -> 0.47 s, B stationary 4.49 -> 2.65 s. One trial at 8192x28672x8192
bf16 (535,808 instructions): peak RSS 1.15 -> 1.13 GB (``/usr/bin/time -v``), CPU
58.9 -> 42.6 s, modeled latency 60,138.954 us both times.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import sys
import time

import torch

from neuron_kernels.cost_model.params import params_for
from neuron_kernels.cost_model.profiler import LaunchProfile, Profile
from neuron_kernels.cost_model.schedule import model_trace
from neuron_kernels.hardware import target_from_name
from neuron_kernels.interpreter.execution import run
from neuron_kernels.interpreter.kernel import Kernel
from neuron_kernels.kernels import REGISTRY

TARGET = "trn2"

# (case name, op, shape in the op's syntax, dtype, config overrides of the op's default)
CASES = [
    ("matmul-default", "matmul", "4096x4096x4096", "bfloat16", {}),
    ("matmul-stationary-b", "matmul", "4096x4096x4096", "bfloat16", {"stationary": "b"}),
    (
        "matmul-psum",
        "matmul",
        "4096x4096x4096",
        "bfloat16",
        {"accumulate": "psum", "block_m": 2, "block_n": 2},
    ),
    (
        "matmul-dma-transpose",
        "matmul",
        "4096x4096x4096",
        "bfloat16",
        {"transpose": "dma", "block_m": 8, "block_n": 4},
    ),
    ("matmul-transpose-pe-fp32", "matmul", "2048x2048x2048", "float32", {"transpose": "pe"}),
    ("flash-fwd", "flash_attention_fwd", "1x4x1x4096x4096x128", "bfloat16", {}),
    ("flash-fwd-causal", "flash_attention_fwd", "1x4x1x4096x4096x128", "bfloat16", {}),
    ("rms_norm_bwd", "rms_norm_bwd", "8192x8192", "bfloat16", {}),
    ("fused_adamw_", "fused_adamw_", "8x4194304", "bfloat16", {}),
]
CAUSAL_CASES = {"flash-fwd-causal"}


class _TimedProfiler:
    """A runner like :class:`~neuron_kernels.cost_model.profiler.Profiler` (trace-only),
    timing the trace and the schedule of each launch apart."""

    def __init__(self, target) -> None:
        self.target = target
        self.params = params_for(target.name)
        self.launches: list[LaunchProfile] = []
        self.trace_s = 0.0
        self.schedule_s = 0.0

    def __call__(self, kernel, *args, **kwargs):
        t0 = time.perf_counter()
        result = run(kernel, args, kwargs, target=self.target, compute=False)
        t1 = time.perf_counter()
        timeline = model_trace(result.trace, self.target, params=self.params)
        t2 = time.perf_counter()
        self.trace_s += t1 - t0
        self.schedule_s += t2 - t1
        fn = kernel.fn if isinstance(kernel, Kernel) else kernel
        self.launches.append(LaunchProfile(getattr(fn, "__name__", str(fn)), result, timeline))
        return result.outputs

    def report(self) -> Profile:
        return Profile(self.target.name, self.params, list(self.launches))


def _inputs(case):
    name, op, shape, dtype, overrides = case
    spec = REGISTRY[op]
    problem = spec.parse_shape(shape)
    if name in CAUSAL_CASES:
        problem = {**problem, "causal": True}
    config = spec.config.from_dict({**spec.config.default().__dict__, **overrides})
    args = spec.make_inputs(problem, dtype, torch.Generator().manual_seed(0))
    return spec, config, args


def _run_case(case, target):
    spec, config, args = _inputs(case)
    profiler = _TimedProfiler(target)
    spec.run_kernels(*args, config=config, runner=profiler)
    return profiler


def _digest(items) -> str:
    h = hashlib.sha256()
    for item in items:
        h.update(repr(item).encode())
        h.update(b"\n")
    return h.hexdigest()


def _floats_as_repr(obj):
    """``obj`` with every float replaced by its ``repr`` (exact, round-trips bitwise)."""
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, dict):
        return {str(k): _floats_as_repr(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_floats_as_repr(v) for v in obj]
    return obj


def modeled_numbers(profiler: _TimedProfiler) -> dict:
    """Every modeled number of one case, floats as ``repr``, trace and timeline digested."""
    report = profiler.report()
    trace_items, timeline_items = [], []
    for lp in report.launches:
        for ins in lp.run.trace.instructions:
            trace_items.append(
                (
                    ins.index,
                    ins.api,
                    ins.engine,
                    ins.reads,
                    ins.writes,
                    ins.program_id,
                    sorted(ins.attrs.items(), key=lambda kv: kv[0]),
                    ins.depends_on,
                    ins.name,
                )
            )
        tl = lp.timeline
        timeline_items += [
            tl.latency_ns,
            tl.start,
            tl.end,
            tl.unit,
            tl.occupancy,
            tl.busy_ns,
            tl.dma_engine_busy_ns,
            tl.dma_active_ns,
            sorted(tl.dma_queue.items()),
            sorted(tl.dma_bytes.items()),
            tl.dma_hbm_bytes,
            tl.flops,
            tl.critical_path,
            tl.critical_unit,
            tl.alloc_fallbacks,
            sorted(tl.dma_trigger.items()),
        ]
    return {
        "report": _floats_as_repr(report.to_dict()),
        "trace_sha256": _digest(trace_items),
        "timeline_sha256": _digest(timeline_items),
    }


def _diff(a, b, path=""):
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'recorded' if k in a else 'now'}")
            else:
                out += _diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: recorded {a!r}, now {b!r}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs per case")
    parser.add_argument("--only", action="append", help="run only cases whose name contains this")
    parser.add_argument("--record", metavar="FILE", help="write every modeled number to FILE")
    parser.add_argument("--check", metavar="FILE", help="compare every modeled number with FILE")
    parser.add_argument("--profile", metavar="CASE", help="cProfile one run of CASE (top 30)")
    args = parser.parse_args(argv)
    target = target_from_name(TARGET)

    if args.profile:
        (case,) = [c for c in CASES if c[0] == args.profile]
        prof = cProfile.Profile()
        prof.enable()
        _run_case(case, target)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return 0

    cases = [c for c in CASES if not args.only or any(s in c[0] for s in args.only)]
    recorded = {}
    if args.check:
        with open(args.check) as f:
            recorded = json.load(f)
    numbers, failures = {}, []
    print(
        f"{'case':<26}{'trace s':>9}{'schedule s':>12}{'total s':>9}{'instr':>9}  modeled latency"
    )
    for case in cases:
        best_trace = best_schedule = float("inf")
        for _ in range(max(1, args.repeat)):
            profiler = _run_case(case, target)
            best_trace = min(best_trace, profiler.trace_s)
            best_schedule = min(best_schedule, profiler.schedule_s)
        numbers[case[0]] = modeled_numbers(profiler)
        report = profiler.report()
        n_ins = sum(len(lp.run.trace) for lp in report.launches)
        print(
            f"{case[0]:<26}{best_trace:>9.2f}{best_schedule:>12.2f}"
            f"{best_trace + best_schedule:>9.2f}{n_ins:>9}  {report.latency_ns / 1e3:,.1f} us"
        )
        if args.check:
            if case[0] not in recorded:
                failures.append(f"{case[0]}: not in {args.check}")
            else:
                failures += [f"{case[0]}{d}" for d in _diff(recorded[case[0]], numbers[case[0]])]
    if args.record:
        with open(args.record, "w") as f:
            json.dump(numbers, f, indent=1, sort_keys=True)
        print(f"recorded {len(numbers)} cases to {args.record}")
    if args.check:
        if failures:
            print(f"CHECK FAILED: {len(failures)} modeled numbers differ", file=sys.stderr)
            for line in failures[:40]:
                print("  " + line, file=sys.stderr)
            return 1
        print(f"check: every modeled number of {len(numbers)} cases is identical to {args.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
