"""Reading command-line values that several subcommands share, each refused as a
:class:`~neuron_kernels.cli.UsageError` naming the setting the user actually gave."""

from __future__ import annotations

import json
import os

from neuron_kernels.cli import UsageError
from neuron_kernels.errors import LimitError

__all__ = [
    "DTYPE_ALIASES",
    "HOST_MEMORY_SHARE",
    "op_problem",
    "LNC_HELP",
    "host_memory_bytes",
    "lnc",
    "output_path",
    "read_json_file",
    "target",
]

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "fp32": "float32",
    "f32": "float32",
    "fp16": "float16",
    "f16": "float16",
}


# A run builds the op's inputs in host memory; more than this share of what is available is
# refused before anything is allocated (the rest is for the interpreter's own buffers).
HOST_MEMORY_SHARE = 0.5


def host_memory_bytes() -> int:
    """The memory available now (``kernels.footprint.host_memory_bytes``, shared with the
    ops' interpret-mode check), imported at the call: importing the kernels loads the NKI
    backend, which ``doctor`` must survive when ``NEURON_KERNELS_NKI`` is broken."""
    from neuron_kernels.kernels.footprint import host_memory_bytes as available

    return available()


def op_problem(spec, setting: str, text: str, dtype: str) -> dict:
    """The problem of shape ``text`` in ``dtype`` as the op itself sees it at call time, or a
    :class:`UsageError` naming ``setting`` and ``text``: parsed, its inputs built on the meta
    device (nothing allocated) and passed through the op's own ``validate``, no size changed
    by building them (e.g. attention's H rounded to a multiple of Hkv), and inputs and
    outputs within :data:`HOST_MEMORY_SHARE` of the memory available here. ``profile``,
    ``autotune`` and ``calibrate --fit`` read every shape through it."""
    import torch

    from neuron_kernels.kernels.spec import measure_generator

    try:
        parsed = spec.parse_shape(text)
    except LimitError as exc:
        raise UsageError(setting, text, exc.rule) from None
    try:
        with torch.device("meta"):
            args = spec.make_inputs(parsed, dtype, measure_generator())
        spec.validate(*args)
        problem = spec.problem(*args)
    except LimitError as exc:
        raise UsageError(setting, text, f"{exc.arg} {exc.rule}, got {exc.value}") from None
    for dim in spec.dims:
        if problem.get(dim) != parsed.get(dim):
            rule = "must be a multiple of hkv (H % Hkv == 0)" if dim == "h" else "is not valid"
            raise UsageError(
                setting,
                text,
                f"{dim} {rule}, got {parsed.get(dim)} ({spec.name}'s inputs at this shape "
                f"have {dim} = {problem.get(dim)})",
            )
    need, have = spec.host_bytes(parsed, dtype), host_memory_bytes()
    if need > HOST_MEMORY_SHARE * have:
        raise UsageError(
            setting,
            text,
            f"its {dtype} inputs and outputs take {need / 2**30:.1f} GiB of host memory, "
            f"more than half of the {have / 2**30:.1f} GiB available here",
        )
    return problem


def target(flag_value: str | None, flag: str = "--target"):
    """The :class:`Target` of ``--target`` if given, else of NEURON_PLATFORM_TARGET_OVERRIDE,
    else trn2; a bad name is refused naming whichever of the two the user set."""
    from neuron_kernels.hardware import TARGET_ENV, default_target, target_from_name

    try:
        if flag_value is not None:
            return target_from_name(flag_value, setting=flag)
        return default_target()
    except LimitError as exc:
        setting = flag if flag_value is not None else TARGET_ENV
        value = flag_value if flag_value is not None else os.environ.get(TARGET_ENV)
        raise UsageError(setting, value, exc.rule) from None


LNC_HELP = (
    "logical NeuronCore size of the launch, the cores the kernels split their work over: "
    "1 or 2 on trn2/trn3, 1 on trn1 (default: NEURON_LOGICAL_NC_CONFIG, else the target's "
    "default: trn2/trn3 2, trn1 1)"
)


def lnc(flag_value: str | None, tg, flag: str = "--lnc") -> int:
    """The launch LNC of ``--lnc`` if given (an LNC ``tg`` has: trn1 1; trn2/trn3 1 or 2),
    else the one a launch on ``tg`` uses (:func:`~neuron_kernels.hardware.launch_lnc`:
    NEURON_LOGICAL_NC_CONFIG, else torch-neuronx's count, else the target's default); a
    bad value is refused naming whichever the user set."""
    from neuron_kernels.hardware import LNC_ENV, launch_lnc

    choices = "|".join(str(c) for c in tg.lnc_choices)
    if flag_value is None:
        try:
            return launch_lnc(tg)
        except LimitError as exc:
            raise UsageError(LNC_ENV, os.environ.get(LNC_ENV), exc.rule) from None
    text = str(flag_value).strip()
    if not text.isdigit() or int(text) not in tg.lnc_choices:
        raise UsageError(flag, flag_value, f"must be an LNC {tg.name} has ({choices})")
    return int(text)


def read_json_file(flag: str, path: str, what: str = "a JSON object"):
    """The JSON document at ``path`` (an object), refused naming ``flag`` if it is missing,
    unreadable, not JSON or not an object."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(flag, path, "no such file") from None
    except IsADirectoryError:
        raise UsageError(flag, path, "is a folder, not a file") from None
    except OSError as exc:
        raise UsageError(flag, path, f"cannot be read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(flag, path, f"is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise UsageError(flag, path, f"must hold {what}, holds a {type(doc).__name__}")
    return doc


def output_path(flag: str, path: str | None) -> str | None:
    """``path`` if its folder exists and is writable: checked before a long run, not after."""
    if path is None:
        return None
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise UsageError(flag, path, "is a folder; give a file name")
    if not os.path.isdir(folder):
        raise UsageError(flag, path, f"its folder {os.path.dirname(path) or '.'} does not exist")
    if not os.access(folder, os.W_OK):
        raise UsageError(flag, path, f"its folder {os.path.dirname(path) or '.'} is not writable")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise UsageError(flag, path, "exists and is not writable")
    return path
