"""Smoke checks for a fresh Trn2 node: each check prints one line, PASS or FAIL.

    python examples/trn2_smoke.py --nrtpy-python ~/nrtpy_venv/bin/python

Run it from the NKI environment (on a Neuron DLAMI, its PyTorch venv) with neuron-kernels
installed; the nrtpy environment is the one of neuron-runtime/nrtpy/nrtpy-getting-started.rst
(``--nrtpy-python`` or ``NEURON_KERNELS_NRTPY_PYTHON``). Nothing is written into the package:
studies and tuned configs go to a temporary folder. Exit code 0 when every check passes.

Checks:
    hardware tuning: a one-trial hardware study of matmul (compile worker -> NEFF, measure
        worker -> device-side latency on a NeuronCore, correctness gate against the
        reference), whose "hardware" entry the op's config lookup then returns.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def check_hardware_tuning(nrtpy_python: str | None, shape: str, workdir: Path) -> tuple[bool, str]:
    """One hardware trial of matmul at ``shape`` (bf16); (passed, what happened)."""
    from neuron_kernels.autotune import results
    from neuron_kernels.autotune.backends import BackendUnavailable
    from neuron_kernels.autotune.neff_backend import HardwareBackend
    from neuron_kernels.autotune.objective import make_point
    from neuron_kernels.autotune.study import tune
    from neuron_kernels.kernels.spec import get_spec

    spec = get_spec("matmul")
    try:
        backend = HardwareBackend("trn2", nrtpy_python=nrtpy_python, workdir=workdir / "hw")
    except BackendUnavailable as exc:
        return False, str(exc)
    point = make_point(spec, shape, "bfloat16")
    root = workdir / "perf_results"
    (found,) = tune(
        spec,
        [point],
        target="trn2",
        trials=1,
        storage_url=f"sqlite:///{workdir / 'studies.db'}",
        backend=backend,
        results_root=root,
        warm_start=False,
    )
    if found.best_us is None:
        return False, f"the trial did not complete ({found.failed} failed, {found.pruned} pruned)"
    choice = results.lookup(spec, point.problem, "bfloat16", "trn2", root)
    if choice.source != "hardware":
        return False, f"the op's lookup returned a {choice.source} config, not the hardware entry"
    hw = choice.entry.get("hardware", {})
    return True, (
        f"{found.best_us:.1f} us device-side median (p99 {choice.entry['metric']['p99_us']:.1f} "
        f"us) on {hw.get('instance_type')} at LNC={hw.get('lnc')}, neuronx-cc "
        f"{hw.get('compiler_version')}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nrtpy-python", default=None, help="the nrtpy environment's python")
    parser.add_argument(
        "--shape", default="1024x1024x1024", help="matmul MxNxK (default %(default)s)"
    )
    args = parser.parse_args(argv)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="trn2-smoke-") as tmp:
        ok, detail = check_hardware_tuning(args.nrtpy_python, args.shape, Path(tmp))
        failed += not ok
        print(
            f"{'PASS' if ok else 'FAIL'} hardware tuning: matmul {args.shape} bf16, one trial: {detail}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
