"""The ``neuron-kernels`` command: one subcommand per module, imported only when it runs.

A subcommand module exposes ``add_arguments(parser)`` and ``main(args) -> int``. Listing
the commands (``--help``) imports none of them, so a slow or broken subcommand never
costs the others anything. Bad input anywhere is one line naming the flag and the value,
exit code 2 (:class:`UsageError`); a closed pipe (``| head``) ends the command quietly.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

__all__ = ["SUBCOMMANDS", "UsageError", "build_parser", "main"]

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "demo": (
        "neuron_kernels.cli.demo",
        "run every op's NKI kernels on the interpreter, in each dtype, against fp64 references",
    ),
    "profile": ("neuron_kernels.cli.profile", "modeled profile of an op on a target (cost model)"),
    "calibrate": (
        "neuron_kernels.cli.calibrate",
        "cost model vs published hardware; fit it to yours",
    ),
    "parity": (
        "neuron_kernels.cli.parity",
        "loss-curve parity: the same training on the reference path and on the kernels",
    ),
    "doctor": (
        "neuron_kernels.cli.doctor",
        "pre-flight: versions, device, which ops run a kernel, tuned configs, rollback",
    ),
    "autotune": (
        "neuron_kernels.cli.autotune",
        "search an op's tile configs with Optuna (cost model or Trn2) and ship the best",
    ),
}

EXIT_USAGE = 2  # argparse's code for a bad command line; every bad input uses it
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that went away


class UsageError(Exception):
    """Bad input given on the command line (or in a file or variable it names).

    Printed as ``neuron-kernels <command>: error: <setting> <value>: <why>``, exit code 2."""

    def __init__(self, setting: str, value, why: str) -> None:
        self.setting, self.value, self.why = setting, value, why
        shown = value if isinstance(value, str) else repr(value)
        super().__init__(f"{setting} {shown}: {why}")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (the usage block stays behind ``--help``)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to add its arguments."""
    from neuron_kernels._version import __version__

    parser = _Parser(prog="neuron-kernels", description="NKI kernels for AWS Trainium.")
    parser.add_argument("--version", action="version", version=f"neuron-kernels {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


_NEGATIVE_VALUE = re.compile(r"^-\d")


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--shape -1x2x3`` -> ``--shape=-1x2x3``: argparse would read the value as a flag and
    say "expected one argument"; attached, it reaches the op, whose message names the rule."""
    out: list[str] = []
    for token in argv:
        if out and _NEGATIVE_VALUE.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


# Subcommands that run without the NKI backend (they report it instead of using it).
RUN_WITHOUT_BACKEND = ("doctor",)


def _backend_refusal(command: str | None) -> str | None:
    """The one-line error when ``NEURON_KERNELS_NKI`` kept the ops from loading (see
    ``neuron_kernels.BACKEND_ERROR``) and ``command`` needs them, else None."""
    import neuron_kernels

    error = neuron_kernels.BACKEND_ERROR
    if error is None or command not in SUBCOMMANDS or command in RUN_WITHOUT_BACKEND:
        return None
    return str(
        UsageError(error.setting, error.value, f"{error.why} (neuron-kernels doctor says more)")
    )


def _check_interpreter_settings() -> None:
    """The interpreter's environment settings (``NKI_PRECISE_FP``), refused in one line before
    any kernel runs, instead of a traceback from the first store."""
    from neuron_kernels.errors import LimitError
    from neuron_kernels.interpreter.dtypes import PRECISE_FP_ENV, precise_fp_from_env

    try:
        precise_fp_from_env()
    except LimitError as exc:
        raise UsageError(PRECISE_FP_ENV, os.environ.get(PRECISE_FP_ENV), exc.rule) from None


def main(argv: list[str] | None = None) -> int:
    argv = _attach_negative_values(sys.argv[1:] if argv is None else list(argv))
    command = next((a for a in argv if not a.startswith("-")), None)
    prog = f"neuron-kernels {command}"
    if command in SUBCOMMANDS:  # (--version and --help end in the parser: no ops needed)
        import neuron_kernels

        neuron_kernels.register_ops()
    refused = _backend_refusal(command)
    if refused:
        print(f"{prog}: error: {refused}", file=sys.stderr)
        return EXIT_USAGE
    args = build_parser(command).parse_args(argv)
    prog = f"neuron-kernels {args.command}"
    try:
        if args.command not in RUN_WITHOUT_BACKEND:
            _check_interpreter_settings()
        return int(importlib.import_module(args._module).main(args) or 0)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # The reader (`| head`) is gone: send what is still buffered nowhere, as the Python
        # docs advise for SIGPIPE, instead of a BrokenPipeError at interpreter exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
