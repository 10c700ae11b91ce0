"""The Lean side, seen from Python: which theorem settles which claim, and `lake build`.

Convention (used by the Lean files, the proofs.md generator and the tests): the
docstring of every main theorem names its claim as ``(claim `ID`)``, e.g.

    /-- Attention scores are unchanged by W_Q ↦ W_Q·M, W_K ↦ W_K·M⁻ᵀ (claim `qk-gl`). -/
    theorem qk_scores_invariant ...
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEAN_DIR = ROOT / "lean"

_DECL = re.compile(
    r"/--(?P<doc>(?:(?!-/).)*?)-/\s*(?:@\[[^\]]*\]\s*)?(?:protected\s+|private\s+)?"
    r"(?P<kind>theorem|def|example|instance)\s+(?P<name>[^\s:({\[]+)",
    re.S,
)
_CLAIM = re.compile(r"claim `([a-z0-9][a-z0-9-]*)`")
_NAMESPACE = re.compile(r"^\s*namespace\s+(\S+)", re.M)


@dataclass(frozen=True)
class LeanTheorem:
    name: str          # fully qualified, e.g. GaugeAudit.qk_scores_invariant
    claims: tuple[str, ...]
    file: str          # relative to the repository root
    line: int


def lean_files(lean_dir: Path = LEAN_DIR) -> list[Path]:
    return sorted(p for p in lean_dir.rglob("*.lean") if ".lake" not in p.parts)


def theorems(lean_dir: Path = LEAN_DIR) -> list[LeanTheorem]:
    """Every theorem whose docstring names a claim, in file order."""
    found: list[LeanTheorem] = []
    for path in lean_files(lean_dir):
        text = path.read_text(encoding="utf-8")
        namespaces = [(m.start(), m.group(1)) for m in _NAMESPACE.finditer(text)]
        for m in _DECL.finditer(text):
            if m.group("kind") != "theorem":
                continue
            ids = tuple(dict.fromkeys(_CLAIM.findall(m.group("doc"))))
            if not ids:
                continue
            ns = [n for pos, n in namespaces if pos < m.start()]
            name = m.group("name")
            if ns and not name.startswith(ns[-1] + "."):
                name = f"{ns[-1]}.{name}"
            line = text.count("\n", 0, m.start("name")) + 1
            found.append(LeanTheorem(name, ids, str(path.relative_to(ROOT)), line))
    return found


def theorems_by_claim(lean_dir: Path = LEAN_DIR) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for thm in theorems(lean_dir):
        for cid in thm.claims:
            out.setdefault(cid, []).append(thm.name)
    return out


def lake_path() -> str | None:
    return shutil.which("lake")


def lake_build(timeout: float = 1800.0) -> subprocess.CompletedProcess:
    """Run ``lake build`` at the repository root (caller checks :func:`lake_path` first)."""
    return subprocess.run(["lake", "build"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
