"""The command line of a generated file (proofs.md, docs/catalog.md): print it, ``--write`` it, or
``--check`` that the committed copy is current."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def generated_file_main(module: str, path: Path, render: Callable[[], str], argv=None) -> int:
    """``python -m MODULE [--write | --check]`` for the file ``path`` whose text ``render`` makes."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    elif args.check:
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            print(f"{path.name} is stale: run python -m {module} --write", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0
