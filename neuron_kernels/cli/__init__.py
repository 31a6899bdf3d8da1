"""The ``neuron-kernels`` command: one subcommand per module, imported only when it runs.

A subcommand module exposes ``add_arguments(parser)`` and ``main(args) -> int``. Listing
the commands (``--help``) imports none of them, so a slow or broken subcommand never
costs the others anything.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help)
SUBCOMMANDS = {
    "demo": (
        "neuron_kernels.cli.demo",
        "run an NKI kernel on the interpreter and check its result",
    ),
    "profile": ("neuron_kernels.cli.profile", "modeled profile of an op on a target (cost model)"),
    "calibrate": (
        "neuron_kernels.cli.calibrate",
        "cost model vs published hardware; fit it to yours",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``command``'s module is imported to add its arguments."""
    parser = argparse.ArgumentParser(
        prog="neuron-kernels", description="NKI kernels for AWS Trainium."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        if name == command:
            importlib.import_module(module).add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(command).parse_args(argv)
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
