"""The op registry is complete: every op a ``kernels/*.py`` module declares is in ``REGISTRY``
and is ``torch.ops.neuron.<op>`` after a plain ``import neuron_kernels``.

A module left out of the registry imports in ``kernels/__init__.py`` (or a spec built without
``register(...)``) would otherwise fail silently: no torch op, and the contract suite,
parametrized over ``REGISTRY``, collects no test for it. The facts are gathered in a fresh
interpreter, since in this one any test may already have imported the module by hand.
"""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a fresh interpreter: what `import neuron_kernels` registers, then every kernel
# module's declared specs (a spec belongs to the module that defines its run_kernels).
_GATHER = r"""
import importlib, json, pathlib
import torch
import neuron_kernels
from neuron_kernels import kernels
from neuron_kernels.kernels import REGISTRY, OpSpec

registered = {name: id(spec) for name, spec in REGISTRY.items()}
torch_ops = []
for name in registered:
    try:
        getattr(torch.ops.neuron, name)
        torch_ops.append(name)
    except (AttributeError, RuntimeError):
        pass
declared = {}
for path in sorted(pathlib.Path(kernels.__file__).parent.glob("*.py")):
    if path.name in ("__init__.py", "spec.py"):
        continue
    module = importlib.import_module(f"neuron_kernels.kernels.{path.stem}")
    specs = [v for v in vars(module).values() if isinstance(v, OpSpec)]
    mine = [s for s in specs if getattr(s.run_kernels, "__module__", "") == module.__name__]
    declared[f"kernels/{path.name}"] = [
        [s.name, registered.get(s.name) == id(s)] for s in mine
    ]
print(json.dumps({"torch_ops": torch_ops, "declared": declared}))
"""


def registry_gaps(declared: dict, torch_ops: set) -> list[str]:
    """One line per declared op that is missing from the registry or from ``torch.ops.neuron``.

    Args:
        declared: ``{"kernels/<file>.py": [[op name, in REGISTRY after import], ...]}``.
        torch_ops: op names ``torch.ops.neuron`` resolves.
    """
    gaps = []
    for path, ops in sorted(declared.items()):
        module = path.removeprefix("kernels/").removesuffix(".py")
        for name, in_registry in ops:
            if not in_registry:
                gaps.append(
                    f"{path}: op {name!r} is not in REGISTRY after `import neuron_kernels`: add "
                    f"`{module}` to the registry imports in kernels/__init__.py and declare the "
                    "spec as `SPEC = register(OpSpec(...))`"
                )
            elif name not in torch_ops:
                gaps.append(f"{path}: op {name!r} is in REGISTRY but not torch.ops.neuron.{name}")
    return gaps


def _gather() -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _GATHER], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_declared_op_is_registered_and_a_torch_op():
    facts = _gather()
    assert sum(len(ops) for ops in facts["declared"].values()) >= 6, facts  # it found the ops
    gaps = registry_gaps(facts["declared"], set(facts["torch_ops"]))
    assert not gaps, "\n".join(gaps)


def test_a_missing_registry_line_names_the_file_and_the_fix():
    declared = {"kernels/matmul.py": [["matmul", True]], "kernels/new_op.py": [["new_op", False]]}
    gaps = registry_gaps(declared, {"matmul"})
    assert len(gaps) == 1 and gaps[0].startswith("kernels/new_op.py: op 'new_op'"), gaps
    assert "`new_op` to the registry imports in kernels/__init__.py" in gaps[0]


def test_a_registered_op_without_its_torch_op_is_named():
    gaps = registry_gaps({"kernels/matmul.py": [["matmul", True]]}, set())
    assert gaps == ["kernels/matmul.py: op 'matmul' is in REGISTRY but not torch.ops.neuron.matmul"]
