"""``neuron-kernels parity``: does the loss curve on the kernels match the reference?

    neuron-kernels parity --steps 20 --compare 5,10,20 --tolerance 2e-3
    neuron-kernels parity --tolerance 1e-2 --compare 50,100 --script train.py -- --epochs 1

The same training runs twice with identical seed and data order: once on the reference
path, once on the kernel path. The loss of every step is recorded; at the steps named by
``--compare`` the gap ``|kernel - reference|`` must be within ``--tolerance`` (required:
the bound is written down before the run, never chosen after it). The report gives a
per-step table, the first step whose gap exceeds the tolerance, and whether the gap is
flat (floating-point ordering noise) or growing step over step (a real bug), from a
least-squares line fitted to the gap from the first divergent step on (every step when
none diverges). Exit code 0 when every compared step is within tolerance, 1 when not.

Built-in training: the Llama example (``examples/llama`` of the source tree): plain
PyTorch vs ``--kernels`` (the NKI kernels on the interpreter for CPU tensors, compiled on
the ``neuron`` device). ``--script PATH -- ARGS`` runs your own script twice instead, with
``NEURON_KERNELS_PARITY_RUN=reference|kernel`` and the rollback switch
``NEURON_KERNELS_DISABLE=1`` on the reference run (``NEURON_KERNELS_CPU=interpret`` on the
kernel run); it writes its losses as JSON (a list, or ``{"losses": [...]}``) to the path
in ``NEURON_KERNELS_PARITY_LOSSES`` (``{losses}`` in ARGS is replaced by that path too).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from neuron_kernels.cli import UsageError
from neuron_kernels.cli._inputs import output_path

__all__ = [
    "FORMAT",
    "LOSSES_ENV",
    "RUN_ENV",
    "Run",
    "Trend",
    "add_arguments",
    "compare",
    "fit_trend",
    "load_example",
    "main",
    "run_example",
]

FORMAT = "neuron-kernels/parity"
LOSSES_ENV = "NEURON_KERNELS_PARITY_LOSSES"  # where a --script writes its losses
RUN_ENV = "NEURON_KERNELS_PARITY_RUN"  # "reference" or "kernel": which run a --script is
EXAMPLE_PACKAGE = "neuron_kernels_llama_example"
# A gap is "growing" when the fitted line rises by more than this share of the tolerance
# over the fitted steps: ordering noise wanders far below the tolerance, a real bug's gap
# climbs toward (and past) it.
GROWING_RISE = 0.5
SCRIPT_TIMEOUT_S = 6 * 3600


@dataclass
class Run:
    """One training run's losses (step 1..n) and what ran it."""

    losses: list[float]
    description: str
    seconds: float
    pieces: dict = field(default_factory=dict)  # piece -> {"runs", "kernel", "why"}
    launches: dict = field(default_factory=dict)  # kernel name -> launches (interpreter)


@dataclass(frozen=True)
class Trend:
    """A least-squares line through ``|gap|`` over ``from_step..to_step``."""

    verdict: str  # "flat" or "growing"
    slope: float  # loss units per step
    rise: float  # slope * (to_step - from_step): what the line climbs over the window
    from_step: int
    to_step: int


def add_arguments(parser) -> None:
    parser.add_argument(
        "--tolerance",
        type=float,
        required=True,
        help="largest allowed |kernel - reference| loss gap at a compared step (required)",
    )
    parser.add_argument(
        "--relative",
        action="store_true",
        help="the tolerance bounds |kernel - reference| / |reference| instead",
    )
    parser.add_argument("--steps", default="20", help="training steps (built-in example)")
    parser.add_argument(
        "--compare", default=None, help="steps to check, e.g. 5,10,20 (default: every step)"
    )
    parser.add_argument("--seed", default="0", help="seed of both runs (built-in example)")
    parser.add_argument(
        "--device", default=None, help="torch device (default $TORCH_DEVICE, else cpu)"
    )
    parser.add_argument("--batch-size", default="2", help="sequences per step (built-in)")
    parser.add_argument("--seq-len", default="64", help="tokens per sequence (built-in)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the report as JSON")
    parser.add_argument(
        "--png",
        default=None,
        metavar="PATH",
        help="write a PNG of both curves and the gap (needs matplotlib: the [plot] extra)",
    )
    parser.add_argument(
        "--script", default=None, metavar="PATH", help="run this training script twice instead"
    )
    parser.add_argument(
        "script_args", nargs="*", metavar="-- ARGS", help="arguments for --script, after --"
    )


# -- comparing two curves -------------------------------------------------------------------


def _gap(kernel: float, reference: float, relative: bool) -> float:
    if not (math.isfinite(kernel) and math.isfinite(reference)):
        return math.inf  # a NaN or inf loss on either side is a divergence, never a pass
    gap = abs(kernel - reference)
    return gap / max(abs(reference), 1e-30) if relative else gap


def fit_trend(gaps: list[float], tolerance: float, first_step: int = 1) -> Trend:
    """Fit ``|gap| = a + slope * step`` over ``gaps`` (step ``first_step`` onward)."""
    steps = list(range(first_step, first_step + len(gaps)))
    finite = [(s, g) for s, g in zip(steps, gaps) if math.isfinite(g)]
    if len(finite) < len(gaps):  # a non-finite gap: the runs have come apart completely
        return Trend("growing", math.inf, math.inf, steps[0], steps[-1])
    if len(finite) < 2:
        return Trend("flat", 0.0, 0.0, steps[0], steps[-1])
    mean_s = sum(s for s, _ in finite) / len(finite)
    mean_g = sum(g for _, g in finite) / len(finite)
    var = sum((s - mean_s) ** 2 for s, _ in finite)
    slope = sum((s - mean_s) * (g - mean_g) for s, g in finite) / var
    rise = slope * (steps[-1] - steps[0])
    verdict = "growing" if rise > GROWING_RISE * tolerance else "flat"
    return Trend(verdict, slope, rise, steps[0], steps[-1])


def compare(
    reference: list[float],
    kernel: list[float],
    tolerance: float,
    compare_steps: list[int] | None = None,
    relative: bool = False,
) -> dict:
    """The verdict on two loss curves: checks at ``compare_steps`` (1-based; default every
    step), the first step (of all) whose gap exceeds ``tolerance``, and the gap's trend."""
    n = min(len(reference), len(kernel))
    steps = list(range(1, n + 1)) if compare_steps is None else list(compare_steps)
    gaps = [_gap(k, r, relative) for r, k in zip(reference[:n], kernel[:n])]
    checks = [
        {
            "step": s,
            "reference": reference[s - 1],
            "kernel": kernel[s - 1],
            "gap": gaps[s - 1],
            "within": gaps[s - 1] <= tolerance,
        }
        for s in steps
    ]
    first = next((i + 1 for i, g in enumerate(gaps) if not g <= tolerance), None)
    # The trend from the first divergence on (what happens after the curves part), with
    # at least 3 points; over every step when they never part.
    start = 1 if first is None else max(1, min(first, n - 2))
    trend = fit_trend(gaps[start - 1 :], tolerance, first_step=start)
    return {
        "passed": all(c["within"] for c in checks),
        "checks": checks,
        "gaps": gaps,
        "first_divergent_step": first,
        "trend": asdict(trend),
    }


# -- the two runs ---------------------------------------------------------------------------


def _example_dir() -> Path:
    """The Llama example of the source tree this package runs from."""
    import neuron_kernels

    return Path(neuron_kernels.__file__).resolve().parents[1] / "examples" / "llama"


def load_example(folder: Path | None = None):
    """Import the Llama example's ``train`` module (as a package, so nothing named
    ``model`` or ``data`` lands on ``sys.path``)."""
    folder = folder or _example_dir()
    init = folder / "__init__.py"
    if not init.is_file():
        raise UsageError(
            "parity",
            str(folder),
            "the built-in Llama example ships with the source tree, not with an installed "
            "package; run from a checkout or give your own --script",
        )
    if EXAMPLE_PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            EXAMPLE_PACKAGE, init, submodule_search_locations=[str(folder)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[EXAMPLE_PACKAGE] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{EXAMPLE_PACKAGE}.train")


def _kernel_name(kernel) -> str:
    fn = (  # AWS's jit object (.func), a kernel[lnc] of the interpreter (.fn), a wrapper
        getattr(kernel, "func", None)
        or getattr(kernel, "fn", None)
        or getattr(kernel, "__wrapped__", None)
        or kernel
    )
    module = getattr(fn, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{getattr(fn, '__name__', type(kernel).__name__)}"


def run_example(kernels: bool, steps: int, seed: int, device, batch_size: int, seq_len: int, **kw):
    """One in-process run of the Llama example; on the kernel path the NKI kernel launches
    on the interpreter are counted per kernel (the evidence that a piece ran a kernel)."""
    from neuron_kernels.torch_ops import routing

    train = load_example()
    launches: dict[str, int] = {}
    real = routing.interpreter_runner

    def counting(kernel, *args, **kwargs):
        name = _kernel_name(kernel)
        launches[name] = launches.get(name, 0) + 1
        return real(kernel, *args, **kwargs)

    start = time.perf_counter()
    routing.interpreter_runner = counting
    try:
        result = train.train(
            steps,
            kernels=kernels,
            device=device,
            seed=seed,
            batch_size=batch_size,
            seq_len=seq_len,
            **kw,
        )
    finally:
        routing.interpreter_runner = real
    return Run(
        result.losses, result.kernel_path, time.perf_counter() - start, result.pieces, launches
    )


def _read_losses(path: str, which: str, script: str = "") -> list[float]:
    """The losses the ``which`` run of ``script`` wrote: a non-empty JSON list of numbers, or
    ``{"losses": [...]}``; anything else is one line naming the script and the run."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(
            "--script", script, f"the {which} run wrote no losses to ${LOSSES_ENV}"
        ) from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(
            "--script", script, f"the {which} run's losses file is not JSON ({exc})"
        ) from None
    losses = doc.get("losses") if isinstance(doc, dict) else doc
    if not isinstance(losses, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in losses
    ):
        shown = json.dumps(losses)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UsageError(
            "--script",
            script,
            f'the {which} run must write a JSON list of numbers or {{"losses": [numbers]}}, '
            f"wrote {shown}",
        )
    if not losses:
        raise UsageError("--script", script, f"the {which} run wrote an empty list of losses")
    return [float(x) for x in losses]


def run_script(script: str, script_args: list[str], which: str, seed: int) -> Run:
    """Run the user's script once as the ``which`` run and read the losses it wrote."""
    from neuron_kernels.torch_ops.routing import CPU_MODE_ENV, DISABLE_ENV

    with tempfile.TemporaryDirectory(prefix="nk-parity-") as tmp:
        losses_path = os.path.join(tmp, f"{which}.json")
        env = {**os.environ, LOSSES_ENV: losses_path, RUN_ENV: which}
        env["NEURON_KERNELS_PARITY_SEED"] = str(seed)
        if which == "reference":
            env[DISABLE_ENV] = "1"
        else:
            env[DISABLE_ENV] = "0"
            env.setdefault(CPU_MODE_ENV, "interpret")
        args = [a.replace("{losses}", losses_path) for a in script_args]
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, script, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
            check=False,
        )
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            raise UsageError(
                "--script", script, f"{which} run exited with {done.returncode}:\n{tail}"
            )
        losses = _read_losses(losses_path, which, script)
    how = "rollback switch on (reference math)" if which == "reference" else "kernels on"
    return Run(losses, f"{script} ({how})", seconds)


# -- reading the command line ---------------------------------------------------------------


def _int(flag: str, text: str, low: int = 1) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise UsageError(flag, text, "must be a whole number") from None
    if value < low:
        raise UsageError(flag, text, f"must be >= {low}")
    return value


def _compare_steps(text: str | None, steps: int | None) -> list[int] | None:
    if text is None:
        return None
    out = []
    for part in text.split(","):
        step = _int("--compare", part.strip())
        if steps is not None and step > steps:
            raise UsageError("--compare", text, f"step {step} is past --steps {steps}")
        out.append(step)
    return sorted(set(out))


def _check_example_memory(train, batch: int, seq: int) -> None:
    """Refuse ``--seq-len`` / ``--batch-size`` whose training would not fit in host memory,
    before anything is allocated. An estimate of the fp32 activations one step keeps for
    backward: per layer the attention scores and probabilities ([B, heads, S, S], as the
    reference path holds them) and about 16 hidden-size and 4 FFN-size vectors per token,
    plus the logits (x3: logits, softmax, gradient)."""
    from neuron_kernels.cli._inputs import HOST_MEMORY_SHARE, host_memory_bytes

    cfg = train.LlamaConfig(max_seq_len=max(seq, 1))
    per_layer = 2 * cfg.n_heads * seq * seq + seq * (16 * cfg.dim + 4 * cfg.ffn_dim)
    need = 4 * batch * (cfg.n_layers * per_layer + 3 * seq * cfg.vocab_size)
    have = host_memory_bytes()
    if need > HOST_MEMORY_SHARE * have:
        raise UsageError(
            "--seq-len",
            str(seq),
            f"with --batch-size {batch} one training step needs about {need / 2**30:,.1f} GiB "
            f"of host memory, more than half of the {have / 2**30:.1f} GiB available here",
        )


def _check_png_support(path: str | None) -> None:
    if path is None:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise UsageError(
            "--png",
            path,
            "needs matplotlib, which is not installed: pip install 'neuron-kernels[plot]' "
            "(or drop --png; the table and --json need nothing extra)",
        )


# -- the report -----------------------------------------------------------------------------


def _table(report: dict, reference: Run, kernel: Run, compare_steps, tolerance) -> list[str]:
    checked = {c["step"] for c in report["checks"]}
    first = report["first_divergent_step"]
    lines = [f"{'step':>6}  {'reference':>12}  {'kernel':>12}  {'gap':>10}  check"]
    for i, (r, k) in enumerate(zip(reference.losses, kernel.losses), start=1):
        gap = report["gaps"][i - 1]
        mark = ""
        if i in checked:
            mark = "ok" if gap <= tolerance else "FAIL"
        if i == first:
            mark = (mark + " first divergent").strip()
        lines.append(f"{i:>6}  {r:>12.6f}  {k:>12.6f}  {gap:>10.3e}  {mark}".rstrip())
    return lines


def _write_png(path: str, reference: Run, kernel: Run, report: dict, tolerance: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(range(1, len(report["gaps"]) + 1))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    top.plot(steps, reference.losses[: len(steps)], label="reference", marker=".")
    top.plot(steps, kernel.losses[: len(steps)], label="kernel", marker=".", linestyle="--")
    top.set_ylabel("loss")
    top.legend()
    gaps = [g if math.isfinite(g) else float("nan") for g in report["gaps"]]
    bottom.plot(steps, gaps, color="tab:red", marker=".", label="|gap|")
    bottom.axhline(tolerance, color="gray", linestyle=":", label=f"tolerance {tolerance:g}")
    t = report["trend"]
    if math.isfinite(t["slope"]):
        mid = [g for s, g in zip(steps, gaps) if t["from_step"] <= s <= t["to_step"]]
        mean_s = (t["from_step"] + t["to_step"]) / 2
        mean_g = sum(mid) / len(mid)
        xs = [t["from_step"], t["to_step"]]
        bottom.plot(
            xs,
            [mean_g + t["slope"] * (x - mean_s) for x in xs],
            color="black",
            label=f"trend: {t['verdict']} ({t['slope']:.2e}/step)",
        )
    first = report["first_divergent_step"]
    if first is not None:
        bottom.axvline(first, color="tab:orange", linestyle="--", label=f"first divergent: {first}")
    bottom.set_xlabel("step")
    bottom.set_ylabel("|kernel - reference|")
    bottom.legend()
    fig.suptitle("loss parity: " + ("PASS" if report["passed"] else "FAIL"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args) -> int:
    tolerance = args.tolerance
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise UsageError("--tolerance", str(tolerance), "must be a finite number >= 0")
    seed = _int("--seed", args.seed, low=0)
    json_path = output_path("--json", args.json)
    png_path = output_path("--png", args.png)
    _check_png_support(png_path)

    if args.script is not None:
        if not os.path.isfile(args.script):
            raise UsageError("--script", args.script, "no such file")
        compare_steps = _compare_steps(args.compare, None)
        title = f"{args.script} {' '.join(args.script_args)}".strip()
        reference = run_script(args.script, args.script_args, "reference", seed)
        kernel = run_script(args.script, args.script_args, "kernel", seed)
        if len(reference.losses) != len(kernel.losses):
            raise UsageError(
                "--script",
                args.script,
                f"the runs recorded {len(reference.losses)} and {len(kernel.losses)} losses; "
                "identical training records the same number",
            )
    else:
        if args.script_args:
            raise UsageError("ARGS", " ".join(args.script_args), "are only for --script")
        steps = _int("--steps", args.steps)
        compare_steps = _compare_steps(args.compare, steps)
        batch = _int("--batch-size", args.batch_size)
        seq = _int("--seq-len", args.seq_len)
        train = load_example()
        try:
            device = train.resolve_device(args.device)
        except SystemExit as exc:  # the example's own one-line refusal
            raise UsageError("--device", args.device, str(exc.code)) from None
        if device.type == "meta":
            raise UsageError(
                "--device",
                args.device,
                "holds no data, so nothing can train on it: use cpu or neuron",
            )
        _check_example_memory(train, batch, seq)
        title = f"Llama example (examples/llama), {steps} steps, seed {seed}, device {device}"
        common = dict(steps=steps, seed=seed, device=device, batch_size=batch, seq_len=seq)
        reference = run_example(kernels=False, **common)
        kernel = run_example(kernels=True, **common)

    n = len(reference.losses)
    if compare_steps and compare_steps[-1] > n:
        raise UsageError(
            "--compare", args.compare, f"step {compare_steps[-1]} is past the {n} recorded"
        )
    report = compare(reference.losses, kernel.losses, tolerance, compare_steps, args.relative)
    bound = "|kernel - reference| / |reference|" if args.relative else "|kernel - reference|"

    print(f"parity: {title}")
    print(f"  reference: {reference.description} ({reference.seconds:.1f} s)")
    print(f"  kernel:    {kernel.description} ({kernel.seconds:.1f} s)")
    for name, piece in kernel.pieces.items():
        how = "kernel" if piece["kernel"] else f"reference ({piece['why']})"
        print(f"    {name:<12} {piece['runs']}: {how}")
    if kernel.launches:
        shown = ", ".join(f"{k} x{v}" for k, v in sorted(kernel.launches.items()))
        print(f"    kernel launches on the interpreter: {shown}")
    print(f"  tolerance: {bound} <= {tolerance:g} at steps {_steps_text(report)}")
    print("\n".join(_table(report, reference, kernel, compare_steps, tolerance)))
    first = report["first_divergent_step"]
    print(f"first divergent step: {first if first is not None else f'none (of {n} steps)'}")
    t = report["trend"]
    print(
        f"gap trend: {t['verdict']} (fitted slope {t['slope']:.3e} per step over steps "
        f"{t['from_step']}-{t['to_step']}, rise {t['rise']:.3e}; growing means a rise above "
        f"{GROWING_RISE:g} x tolerance)"
    )
    n_bad = sum(not c["within"] for c in report["checks"])
    if report["passed"]:
        print(f"PASS: all {len(report['checks'])} compared steps within {tolerance:g}")
    else:
        print(f"FAIL: {n_bad} of {len(report['checks'])} compared steps beyond {tolerance:g}")

    if json_path:
        doc = {
            "format": FORMAT,
            "version": 1,
            "title": title,
            "tolerance": tolerance,
            "relative": args.relative,
            "compare": [c["step"] for c in report["checks"]],
            "reference": asdict(reference),
            "kernel": asdict(kernel),
            **report,
        }
        with open(json_path, "w") as f:
            json.dump(_finite(doc), f, indent=1)
        print(f"wrote {json_path}")
    if png_path:
        _write_png(png_path, reference, kernel, report, tolerance)
        print(f"wrote {png_path}")
    return 0 if report["passed"] else 1


def _steps_text(report: dict) -> str:
    steps = [c["step"] for c in report["checks"]]
    if len(steps) > 8:
        return f"{steps[0]}..{steps[-1]} ({len(steps)} steps)"
    return ",".join(map(str, steps))


def _finite(value):
    """JSON has no inf/NaN: they are written as strings, so any JSON reader can load it."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
