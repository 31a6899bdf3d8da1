"""The ``neuron-kernels`` command: one subcommand per module, imported only when used."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module exposing ``add_arguments(parser)`` and ``main(args) -> int``
SUBCOMMANDS = {
    "demo": ("neuron_kernels.demo", "run an NKI kernel on the interpreter and check its result"),
    "profile": ("neuron_kernels.simulator.profile_cli", "modeled profile of an op on a target (cost model)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-kernels", description="NKI kernels for AWS Trainium.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(importlib.import_module(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
