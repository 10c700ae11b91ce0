"""Output directories of the commands that write one: a directory that exists is refused (the
user's files are never written into or over) unless the command offers ``--force``, which
replaces it — and only once the new contents are complete."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ..models.checkpoint.writer import atomic_dir
from ..models.checkpoint.writer import refuse_existing as refuse_existing_path


def refuse_existing(out: Path, force: bool = False) -> None:
    """Fail before any work when ``out`` cannot be written (checked up front: an audit must not
    run for minutes and then find its directory taken)."""
    refuse_existing_path(out, force, hint="; --force replaces it")


@contextlib.contextmanager
def new_dir(out: Path, force: bool = False) -> Iterator[Path]:
    """A temporary directory that becomes ``out`` when the block succeeds (nothing changes at
    ``out`` when it fails).  With ``force`` an existing ``out`` is moved aside first, restored
    if the block fails and removed once the new directory is in place."""
    out = Path(out)
    refuse_existing(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        with atomic_dir(out) as tmp:
            yield tmp
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".old", dir=out.parent))
    aside.rmdir()
    out.rename(aside)
    try:
        with atomic_dir(out) as tmp:
            yield tmp
    except BaseException:
        aside.rename(out)
        raise
    shutil.rmtree(aside, ignore_errors=True)
