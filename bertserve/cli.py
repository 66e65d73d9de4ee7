"""The `bertserve` console script.

Each side registers its own subcommands, so this file never imports torch (export side) or grpc
(serving side) before a subcommand of theirs is chosen: a module listed in COMMAND_MODULES exposes
`register(subparsers)`, which adds its subcommands with `set_defaults(run=callable)`; the callable
takes the parsed arguments and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from bertserve import __version__
from bertserve.command_table import COMMAND_MODULES

EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command ended by Ctrl-C


# Third-party modules that only an extra installs (pyproject.toml) -> that extra.
EXTRA_OF_MODULE = {
    "torch": "export",
    "transformers": "export",
    "safetensors": "export",
    "onnx": "export",
    "onnxscript": "export",
    "matplotlib": "dev",
    "psutil": "dev",
}


# bertserve.* packages that ship in distributions of their own -> the extra that installs them.
EXTRA_OF_PACKAGE = {"bertserve.bench": "bench", "bertserve.train": "train"}


def _import_commands(module: str, command: str | None):
    """The module of a subcommand; a package of another distribution that is not installed ends the run
    with one line that names the extra."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_PACKAGE.get(exc.name or "")
        if extra is None or not module.startswith(exc.name + "."):
            raise
        raise SystemExit(
            f"bertserve {command}: needs the {exc.name} package, which this install lacks; "
            f"install the {extra} extra: pip install 'bertserve[{extra}]'"
        ) from None


def _module_for(command: str) -> str | None:
    for module, commands in COMMAND_MODULES.items():
        if command in commands:
            return module
    return None


def build_parser(only_module: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertserve", description="Export BERT checkpoints to ONNX and serve them over gRPC."
    )
    parser.add_argument("--version", action="version", version=f"bertserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module, commands in COMMAND_MODULES.items():
        if only_module is None or module == only_module:
            _import_commands(module, next(iter(commands))).register(subparsers)
        else:  # placeholders keep --help complete without importing the module
            for command, description in commands.items():
                subparsers.add_parser(command, help=description)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        return _main(argv, command)
    except KeyboardInterrupt:  # Ctrl-C: one line, and the shell's code for SIGINT
        print(f"bertserve {command}: interrupted" if command else "bertserve: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: list[str], command: str | None) -> int:
    module = _module_for(command) if command else None
    parser = build_parser(only_module=module or "")
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF_MODULE.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"bertserve {args.command}: needs {exc.name}, which this install lacks; "
            f"install the {extra} extra: pip install 'bertserve[{extra}]'",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
