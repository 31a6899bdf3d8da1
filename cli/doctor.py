"""``neuron-kernels doctor``: the pre-flight checklist before moving a training job.

    neuron-kernels doctor
    neuron-kernels doctor --json          # machine-readable, on stdout

Versions (torch, and nki / neuronx-cc / torch-neuronx when installed), the NKI backend that
will run kernels, whether a ``neuron`` device is visible, which ``torch.ops.neuron.*`` ops
run their NKI kernel on it and which fall back to reference math (and why), which tuned
configs ``perf_results`` holds for the target, and the rollback switch. It only looks:
nothing is compiled or run, and a machine without the Neuron SDK gets a plain sentence,
not a traceback.

Exit codes: 0 all good; 1 problems found (listed under "Problems found": a bad
``NEURON_KERNELS_CPU`` / ``NEURON_KERNELS_DISABLE`` / ``NEURON_KERNELS_NKI`` value, an
unreadable perf_results file, a tuned entry the op cannot use, a probe that failed);
2 a bad command line (e.g. ``--target trn9``). It runs and reports even when
``NEURON_KERNELS_NKI`` names a backend that cannot load (the ops are then not registered).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from importlib import metadata

from neuron_kernels.cli._inputs import target as read_target

__all__ = ["FORMAT", "SDK_PACKAGES", "add_arguments", "collect", "main"]

FORMAT = "neuron-kernels/doctor"
# The Neuron SDK's Python packages a Trn node needs (the [neuron] extra), by distribution name.
SDK_PACKAGES = ("nki", "neuronx-cc", "torch-neuronx")


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--target",
        default=None,
        help="trn1|trn2|trn3 for the perf_results lookup (default: "
        "NEURON_PLATFORM_TARGET_OVERRIDE, else trn2)",
    )


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _guard(problems: list[str], what: str, fn, default=None):
    """``fn()``, or ``default`` with a line in ``problems``: one broken probe must not hide
    the rest of the report behind a traceback."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001  (any failure is reported, never raised)
        problems.append(f"{what}: {type(exc).__name__}: {exc}")
        return default


def _device(problems: list[str]) -> dict:
    import torch

    from neuron_kernels.torch_ops import neuron_device

    neuronx = _guard(problems, "import torch_neuronx", neuron_device.torch_neuronx_available, False)
    accel = getattr(torch, "accelerator", None)
    current = None
    if accel is not None:
        current = _guard(problems, "torch.accelerator", lambda: accel.current_accelerator())
    current_name = None if current is None else str(getattr(current, "type", current))
    key = _guard(problems, "PrivateUse1 name", torch._C._get_privateuse1_backend_name)
    count = 0
    if neuronx and current_name == "neuron":
        count = _guard(problems, "torch.accelerator.device_count", accel.device_count, 0)
    return {
        "torch_accelerator": current_name,
        "torch_accelerator_api": accel is not None,
        "torch_neuronx_importable": bool(neuronx),
        "privateuse1_name": key,
        "neuron_visible": current_name == "neuron" and count > 0,
        "neuron_device_count": count,
    }


def _entry_problem(spec, entry: dict, target: str) -> str | None:
    """Why the op could not run ``entry``'s config at the shape it was tuned at, or None."""
    from neuron_kernels.errors import LimitError

    try:
        config = spec.config.from_dict(entry["config"])
        if entry.get("shape"):
            spec.check(spec.parse_shape(entry["shape"]), entry["dtype"], config, target)
    except (LimitError, TypeError) as exc:
        return str(exc)
    return None


# TorchNeuron 2.14 is the line with nki_op/wrap_nki and the neuron compile backend; earlier
# torch-neuronx releases are the XLA-based line this library's ops cannot use.
SUPPORTED_TORCH_NEURONX = ((2, 14), (2, 15))
TORCH_NEURONX_PIN = "torch-neuronx>=2.14,<2.15"
SMOKE_TEST = "python examples/trn2_smoke.py"


def _release(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _node(packages: dict, problems: list[str]) -> dict:
    """The target and LNC kernels launch with on this node, and where each comes from."""
    from neuron_kernels import hardware

    def source_of_target():
        if os.environ.get(hardware.TARGET_ENV):
            return hardware.TARGET_ENV
        return hardware.PLATFORM_QUERY if packages.get("torch-neuronx") else "default"

    target = _guard(problems, "target", lambda: hardware.default_target().name)
    lnc = _guard(problems, "LNC", hardware.launch_lnc) if target else None
    if os.environ.get(hardware.LNC_ENV, "").strip():
        lnc_source = hardware.LNC_ENV
    elif packages.get("torch-neuronx"):
        lnc_source = "torch_neuronx.utils.get_logical_neuron_cores()"
    else:
        lnc_source = f"the {target} default"
    version = packages.get("torch-neuronx")
    supported = version is None or (
        SUPPORTED_TORCH_NEURONX[0] <= _release(version) < SUPPORTED_TORCH_NEURONX[1]
    )
    return {
        "target": target,
        "target_source": source_of_target(),
        "lnc": lnc,
        "lnc_source": lnc_source,
        "torch_neuronx_supported": supported,
        "torch_neuronx_pin": TORCH_NEURONX_PIN,
        "smoke_test": SMOKE_TEST,
    }


def _hardware_tuning(problems: list[str]) -> dict:
    """Whether ``autotune --backend hardware`` (and ``calibrate --measure``) can run here,
    and if not the one thing missing (autotune/hw_node.py: a NeuronCore, nki >= 0.6, an
    nrtpy interpreter from $NEURON_KERNELS_NRTPY_PYTHON, the node's cores)."""
    from neuron_kernels.autotune import hw_node

    ready = _guard(problems, "hardware backend check", hw_node.readiness)
    if ready is None:
        return {"ready": False, "missing": "the check itself failed (see problems)"}
    out = {"ready": ready.ready, "missing": ready.missing, "nrtpy_python": ready.nrtpy_python}
    if ready.node is not None:
        out.update(
            instance_type=ready.node.instance_type,
            lnc=ready.node.lnc,
            logical_cores=len(ready.node.logical_cores),
        )
    return out


def _perf_results(spec, target: str, problems: list[str]) -> dict:
    """The op's entries in the user's and the shipped results folders: each one fresh (tuned
    on this kernel and cost model) and usable (its config passes the op's check), or not."""
    from neuron_kernels import tuned_configs
    from neuron_kernels._version import COST_MODEL_VERSION

    info = {"files": [], "entries": []}
    current = _guard(
        problems, f"kernel hash of {spec.name}", lambda: tuned_configs.kernel_hash(spec)
    )
    total = 0
    for layer, root in tuned_configs.layer_roots():
        path = tuned_configs.results_path(spec.name, target, root)
        if not path.is_file():
            continue
        info["files"].append({"layer": layer, "file": str(path)})
        try:
            entries = tuned_configs.load_entries(path, spec.name, target)
        except (OSError, ValueError) as exc:
            problems.append(f"{path} is unreadable ({exc}); {spec.name} ignores it")
            continue
        total += len(entries)
        for e in entries:
            fresh = e["kernel_hash"] == current and (
                e["source"] == "hardware" or e.get("model_version") == COST_MODEL_VERSION
            )
            why = _entry_problem(spec, e, target) if fresh else None
            if why is not None:
                problems.append(
                    f"{path}: the {e['source']} entry for {e['shape_bucket']} {e['dtype']} is "
                    f"not usable ({why}); {spec.name} runs its default config there"
                )
            info["entries"].append(
                {
                    "shape_bucket": e["shape_bucket"],
                    "dtype": e["dtype"],
                    "source": e["source"],  # modeled (cost model) or hardware (a Trn run)
                    "layer": layer,  # user or shipped
                    "fresh": fresh,  # tuned on this kernel's code (and cost model)
                    "usable": fresh and why is None,
                }
            )
    usable = [e for e in info["entries"] if e["usable"]]
    by_source = {s: sum(e["source"] == s for e in usable) for s in tuned_configs.SOURCES}
    if usable:
        info["status"] = f"tuned: {len(usable)} entries ({by_source['modeled']} modeled, " + (
            f"{by_source['hardware']} hardware); other shapes use the default config"
        )
    elif total:
        info["status"] = (
            f"default config ({total} entries, none usable: tuned on another version of the "
            "kernel or cost model, or refused by its check)"
        )
    else:
        info["status"] = f"default config (no tuned configs for {target})"
    return info


def _op_rows(state: dict, target: str, problems: list[str]) -> list[dict]:
    import torch

    from neuron_kernels.kernels import REGISTRY
    from neuron_kernels.torch_ops import library

    native_blockers = []
    if state["rollback"]["on"]:
        native_blockers.append(f"the rollback switch {state['rollback']['variable']}=1 is on")
    if state["backend"]["name"] != "nki":
        native_blockers.append("the nki package is not installed")
    if not state["device"]["neuron_visible"]:
        native_blockers.append("no neuron device is visible")
    rows = []
    for name in sorted(REGISTRY):
        spec = REGISTRY[name]
        registered = _guard(
            problems,
            f"dispatch table of neuron::{name}",
            lambda n=name: (
                library.registered_through_nki_op(n)
                or torch._C._dispatch_has_kernel_for_dispatch_key(f"neuron::{n}", "PrivateUse1")
            ),
            False,
        )
        why = list(native_blockers)
        if not registered:
            why.append("no neuron-device kernel is registered for it")
        if state["rollback"]["on"]:
            cpu = "reference math (rollback switch on)"
        elif state["cpu_mode"] == "interpret":
            cpu = "NKI kernel on the interpreter"
        else:
            cpu = "reference math"
        rows.append(
            {
                "op": f"torch.ops.neuron.{name}",
                "description": spec.description,
                "neuron_device": "fallback" if why else "kernel",
                "why": "; ".join(why) if why else "NKI kernel, compiled by neuronx-cc",
                "cpu_tensors": cpu,
                "perf_results": _perf_results(spec, target, problems),
            }
        )
    return rows


def collect(target_name: str | None = None) -> dict:
    """Everything the doctor reports, as plain data (what ``--json`` prints)."""
    import torch

    import neuron_kernels
    from neuron_kernels.hardware import TARGET_ENV

    problems: list[str] = []
    target = read_target(target_name)
    if neuron_kernels.BACKEND_ERROR is not None:
        return _collect_without_backend(target, problems)
    from neuron_kernels import backend
    from neuron_kernels.torch_ops import routing

    packages = {dist: _version(dist) for dist in SDK_PACKAGES}
    sdk_installed = all(packages.values())
    rollback_raw = os.environ.get(routing.DISABLE_ENV)
    rollback_on = _guard(problems, routing.DISABLE_ENV, routing.kernels_disabled, False)
    cpu_mode = _guard(problems, routing.CPU_MODE_ENV, routing.current_cpu_mode, "reference")
    state = {
        "format": FORMAT,
        "version": 1,
        "neuron_kernels": neuron_kernels.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "packages": packages,
        "neuron_sdk": {
            "installed": sdk_installed,
            "missing": [d for d, v in packages.items() if v is None],
        },
        "backend": {
            "name": backend.name,  # "nki" (AWS's package) or "interpreter" (ours)
            "variable": backend.BACKEND_ENV,
            "value": os.environ.get(backend.BACKEND_ENV),
        },
        "device": _device(problems),
        "target": {
            "name": target.name,
            "variable": TARGET_ENV,
            "value": os.environ.get(TARGET_ENV),
        },
        "node": _node(packages, problems),
        "cpu_mode": cpu_mode,
        "rollback": {
            "variable": routing.DISABLE_ENV,
            "value": rollback_raw,
            "on": bool(rollback_on),
            "effect": "every op runs its reference math on every device, neuron included",
            "how": f"export {routing.DISABLE_ENV}=1 (no code change; unset or 0 to undo)",
        },
    }
    state["hardware_tuning"] = _hardware_tuning(problems)
    state["ops"] = _op_rows(state, target.name, problems)
    state["all_ops_fall_back"] = all(r["neuron_device"] == "fallback" for r in state["ops"])
    state["problems"] = problems
    state["summary"] = _summary(state)
    return state


def _collect_without_backend(target, problems: list[str]) -> dict:
    """The report when ``NEURON_KERNELS_NKI`` names a backend that cannot load: no op could
    be registered, so only what needs no kernel is probed."""
    import torch

    import neuron_kernels
    from neuron_kernels.hardware import TARGET_ENV

    error = neuron_kernels.BACKEND_ERROR
    BACKEND_ENV = error.setting  # noqa: N806  (importing neuron_kernels.backend would raise)
    problems.append(str(error))
    packages = {dist: _version(dist) for dist in SDK_PACKAGES}
    return {
        "format": FORMAT,
        "version": 1,
        "neuron_kernels": neuron_kernels.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "packages": packages,
        "neuron_sdk": {
            "installed": all(packages.values()),
            "missing": [d for d, v in packages.items() if v is None],
        },
        "backend": {
            "name": None,
            "variable": BACKEND_ENV,
            "value": os.environ.get(BACKEND_ENV),
            "error": str(error),
        },
        "target": {
            "name": target.name,
            "variable": TARGET_ENV,
            "value": os.environ.get(TARGET_ENV),
        },
        "ops": [],
        "all_ops_fall_back": True,
        "problems": problems,
        "summary": (
            f"No op is registered: {BACKEND_ENV}={os.environ.get(BACKEND_ENV)!r} names an NKI "
            f"backend that cannot load here ({error}). Unset it or set it to auto or interpreter."
        ),
    }


def _summary(state: dict) -> str:
    n = len(state["ops"])
    native = sum(r["neuron_device"] == "kernel" for r in state["ops"])
    if not state["neuron_sdk"]["installed"]:
        missing = ", ".join(state["neuron_sdk"]["missing"])
        return (
            f"The Neuron SDK is not installed here ({missing} missing): every op ({n} of {n}) "
            "falls back to its reference math on the neuron device, and CPU tensors run "
            f"{'the kernels on our NKI interpreter' if state['cpu_mode'] == 'interpret' else 'reference math'}."
        )
    if native == 0:
        return f"Every op ({n} of {n}) falls back: {state['ops'][0]['why'] if n else 'no ops'}."
    return f"{native} of {n} ops run their NKI kernel on the neuron device."


def _print(state: dict) -> None:
    print(
        f"neuron-kernels {state['neuron_kernels']}  python {state['python']}  torch {state['torch']}"
    )
    print(state["summary"])
    if state["backend"]["name"] is None:
        _print_problems(state)
        return
    print("\nNeuron SDK packages:")
    for dist, ver in state["packages"].items():
        print(f"  {dist:<14} {ver or 'not installed'}")
    node = state["node"]
    if not node["torch_neuronx_supported"]:
        print(
            f"  torch-neuronx {state['packages']['torch-neuronx']} is unsupported (the older "
            f"XLA-based line): pip install '{node['torch_neuronx_pin']}' and the torch it pins, "
            "--extra-index-url https://pip.repos.neuron.amazonaws.com"
        )
    b = state["backend"]
    what = "AWS's nki package" if b["name"] == "nki" else "our NKI interpreter (no nki package)"
    print(f"\nKernels run on: {what}  [{b['variable']}={b['value'] or 'auto'}]")
    d = state["device"]
    seen = "yes" if d["neuron_visible"] else "no"
    print(
        f"neuron device visible: {seen} (torch.accelerator: {d['torch_accelerator'] or 'none'}; "
        f"torch-neuronx importable: {'yes' if d['torch_neuronx_importable'] else 'no'})"
    )
    t = state["target"]
    print(f"target: {t['name']}  [{t['variable']}={t['value'] or 'unset'}]")
    print(
        f"TorchNeuron target: {node['target'] or 'unsupported'} (from {node['target_source']}); "
        f"LNC: {node['lnc'] or '?'} (from {node['lnc_source']})"
    )
    print(f"CPU tensors: {state['cpu_mode']}  [NEURON_KERNELS_CPU]")
    hw = state["hardware_tuning"]
    print(
        "hardware tuning (autotune --backend hardware): "
        + ("ready" if hw["ready"] else f"cannot run here: {hw['missing']}")
    )
    print("\nOps:")
    for r in state["ops"]:
        print(f"  {r['op']}: neuron device -> {r['neuron_device']} ({r['why']})")
        print(
            f"      CPU tensors -> {r['cpu_tensors']}; perf_results: {r['perf_results']['status']}"
        )
    rb = state["rollback"]
    status = "ON" if rb["on"] else "off"
    print(f"\nRollback switch {rb['variable']}: {status} (value {rb['value']!r})")
    print(f"  {rb['how']}: {rb['effect']}")
    print(
        f"\nOn a Trn2 node, from a checkout: {node['smoke_test']} (every op eager and compiled "
        "against CPU references, one PASS/FAIL line each)."
    )
    _print_problems(state)


def _print_problems(state: dict) -> None:
    if state["problems"]:
        print("\nProblems found:")
        for p in state["problems"]:
            print(f"  - {p}")


def main(args) -> int:
    """Print the report; exit code 0 all good, 1 problems found (2, a bad command line, is
    raised as a UsageError before anything is probed)."""
    state = collect(args.target)
    if args.json:
        json.dump(state, sys.stdout, indent=1)
        print()
    else:
        _print(state)
    return 1 if state["problems"] else 0
