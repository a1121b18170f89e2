"""``autotune`` command line: one class per subcommand, each with ``add_arguments`` and ``run -> int``.

Exit codes: 0 success (an infeasible plan is still a successful *query*), 2 bad input (one line on stderr),
3 regression found (``retune``), 1 unexpected internal error.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from autotune import __version__
from autotune.errors import AutotuneError
from autotune.interrupt import Interrupted, signals_interrupt

__all__ = ["main", "COMMANDS"]

COMMANDS: dict[str, str] = {
    "estimate": "autotune.cli.estimate:EstimateCommand",
    "search": "autotune.cli.search:SearchCommand",
    "emit": "autotune.cli.emit:EmitCommand",
    "report": "autotune.cli.report:ReportCommand",
    "scale": "autotune.cli.scale:ScaleCommand",
    "explain": "autotune.cli.explain:ExplainCommand",
    "probe": "autotune.cli.probe:ProbeCommand",
    "calibrate": "autotune.cli.calibrate:CalibrateCommand",
    "worker": "autotune.cli.worker:WorkerCommand",
    "retune": "autotune.cli.retune:RetuneCommand",
    "models": "autotune.cli.models:ModelsCommand",
}
"""Subcommand name -> ``module:Class``; imported lazily so ``estimate`` never imports optuna."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, like every other user error
        self.exit(2, f"{self.prog}: error: {message}\n")


def _load(target: str) -> type[Any]:
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)  # type: ignore[no-any-return]


def build_parser(commands: dict[str, type[Any]] | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="autotune", description="Find the fastest way to train a model on a GPU cluster.")
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, cls in (commands or _available()).items():
        p = sub.add_parser(name, help=cls.help, description=cls.help)
        cls.add_arguments(p)
        p.set_defaults(_command=cls)
    return parser


def _available() -> dict[str, type[Any]]:
    found: dict[str, type[Any]] = {}
    for name, target in COMMANDS.items():
        try:
            found[name] = _load(target)
        except ModuleNotFoundError as e:
            if not e.name or not e.name.startswith("autotune"):
                raise
    return found


def _requested(argv: Sequence[str]) -> dict[str, type[Any]] | None:
    """Only the named subcommand's module is imported (``autotune estimate`` never loads optuna or
    matplotlib; ``autotune probe`` runs on a GPU box that has torch alone); with no subcommand none is:
    ``autotune --help`` lists each command's ``help`` read from its source (0.1 s, not 0.9 s of imports)."""
    name = next((a for a in argv if not a.startswith("-")), None)
    if name in COMMANDS:
        return {name: _load(COMMANDS[name])}
    return _listed()


class _Listed:
    """A subcommand as ``autotune --help`` lists it: its help line, no arguments, never run."""

    help = ""

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        pass


def _listed() -> dict[str, type[Any]] | None:
    """Each installed subcommand's ``help`` class attribute, read with ``ast``; None if one cannot be read."""
    found: dict[str, type[Any]] = {}
    for name, target in COMMANDS.items():
        module, cls = target.split(":")
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            continue
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        body = next((c.body for c in tree.body if isinstance(c, ast.ClassDef) and c.name == cls), [])
        text = next(
            (
                node.value.value
                for node in body
                if isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and [getattr(t, "id", None) for t in node.targets] == ["help"]
            ),
            None,
        )
        if not isinstance(text, str):
            return None
        found[name] = type(cls, (_Listed,), {"help": text})
    return found


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_requested(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "_command", None):
        parser.print_help()
        return 2
    try:
        with signals_interrupt():  # SIGTERM/SIGHUP unwind like Ctrl-C: trials stopped, study updated
            return int(args._command().run(args))
    except AutotuneError as e:
        print(f"autotune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        how = f" by {e}" if isinstance(e, Interrupted) else ""
        print(f"autotune {args.command}: interrupted{how}{getattr(e, 'resume_hint', '')}", file=sys.stderr)
        return e.exit_code if isinstance(e, Interrupted) else 130
    except BrokenPipeError:  # `autotune ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
