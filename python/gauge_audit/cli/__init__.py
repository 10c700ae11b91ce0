"""The ``gauge-audit`` command.

Each subcommand lives in its own module exposing ``register(subparsers)``; the
module list below is the only place that knows them all.  Every user-facing
failure is a :class:`~gauge_audit.errors.GaugeAuditError`, printed as one line on
stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import sys

import torch

from .. import __version__
from ..errors import GaugeAuditError
from ..progress import quiet

SUBCOMMANDS = (
    "check",
    "derive",
    "claims",
    "audit",
    "precision",
    "nullity",
    "transform",
    "canonicalize",
    "compare",
    "groups",
    "align",
    "merge",
    "barrier",
)


class _HelpFormatter(argparse.HelpFormatter):
    """Every option that takes a value shows its default in ``--help`` (unless its help text
    already says it in words, e.g. "default: the family's")."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.option_strings
            and action.nargs != 0
            and action.default not in (None, argparse.SUPPRESS)
            and "default" not in text
        ):
            text += " (default: %(default)s)"
        return text


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 (argparse's own code), and option
    help shows defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # pragma: no cover - exercised through the CLI tests
        sys.stderr.write(f"gauge-audit: error: {message}\n")
        raise SystemExit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with ``only`` that one (its module alone is imported:
    the others bring the audit, the nullity theory and SymPy, a second of every start)."""
    parser = _Parser(prog="gauge-audit", description="Audit gauge-symmetry claims about transformers.")
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in SUBCOMMANDS if only is None else (only,):
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def _subcommand(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names, when it starts with one (else None: help, --version, a
    typo, which the parser with every subcommand answers).  Not the audit: its report.json is
    byte for byte the same whatever the thread count only with every module loaded before it
    runs, as it always has been (on one thread, in one process, the last bits of an LAPACK least
    squares in the wiki-align-models experiment moved with the set of libraries loaded:
    3.373e-16 against 3.391e-16), and its start is a small part of its time."""
    return argv[0] if argv and argv[0] in SUBCOMMANDS and argv[0] != "audit" else None


def _version() -> str:
    return f"gauge-audit {__version__} (torch {torch.__version__}, Python {platform.python_version()})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_subcommand(argv)).parse_args(argv)
    try:
        if getattr(args, "json", False):  # JSON output: no progress bars, even on a terminal
            with quiet():
                return int(args.func(args) or 0)
        return int(args.func(args) or 0)
    except GaugeAuditError as exc:
        for line in exc.lines:
            sys.stderr.write(f"gauge-audit: error: {line}\n")
        return 2
    except BrokenPipeError:  # e.g. piped into `head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        sys.stderr.write("gauge-audit: interrupted\n")
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
