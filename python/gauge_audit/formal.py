"""The Lean side, seen from Python: which theorem settles which claim, and `lake build`.

Convention (used by the Lean files, the proofs.md generator and the tests): the
docstring of every main theorem names its claim as ``(claim `ID`)``, e.g.

    /-- Attention scores are unchanged by W_Q ↦ W_Q·M, W_K ↦ W_K·M⁻ᵀ (claim `qk-gl`). -/
    theorem qk_scores_invariant ...

A docstring may name several claims.  The marker may carry the theorem's *role* for
that claim: ``(claim `ID`, refutes)`` — it proves the claim false as stated;
``(claim `ID`, corrects)`` — it proves the corrected rule; ``(claim `ID`, context)``
— it proves a fact the claim uses (a special case, the arithmetic) without deciding it; plain
``(claim `ID`)`` — it establishes the claim.  Namespaces are tracked through ``namespace X`` /
``end X`` (nested namespaces compose), so names come back fully qualified.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEAN_DIR = ROOT / "lean"
AXIOMS_FILE = LEAN_DIR / "GaugeAudit" / "Axioms.lean"

#: the axioms a proof may depend on (Lean's standard ones); anything else fails `lake build`
STANDARD_AXIOMS = ("propext", "Classical.choice", "Quot.sound")

_DECL = re.compile(
    r"/--(?P<doc>(?:(?!-/).)*?)-/\s*(?:@\[[^\]]*\]\s*)?(?:protected\s+|private\s+)?"
    r"(?P<kind>theorem|def|example|instance)\s+(?P<name>[^\s:({\[]+)",
    re.S,
)
_CLAIM = re.compile(r"claim `([a-z0-9][a-z0-9-]*)`(?:,\s*(refutes|corrects|context|establishes))?")
ROLES = ("establishes", "refutes", "corrects", "context")
_SCOPE = re.compile(r"^[ \t]*(?P<kw>namespace|section|end)\b[ \t]*(?P<arg>[^\s-]*)", re.M)
_COMMENT = re.compile(r"/-.*?-/|--[^\n]*", re.S)
# forbidden in proofs: `sorry`, `admit`, `native_decide` anywhere in code, and new `axiom`s
_FORBIDDEN = re.compile(
    r"\b(sorry|admit|native_decide)\b|^[ \t]*(?:@\[[^\]]*\][ \t]*)?"
    r"(?:private[ \t]+|protected[ \t]+|noncomputable[ \t]+|unsafe[ \t]+)*"
    r"axiom\b",
    re.M,
)
_PRINT_AXIOMS = re.compile(r"#print\s+axioms\s+(\S+)")


@dataclass(frozen=True)
class LeanTheorem:
    name: str  # fully qualified, e.g. GaugeAudit.qk_scores_invariant
    claims: tuple[str, ...]
    file: str  # relative to the repository root
    line: int
    roles: dict = field(default_factory=dict)  # claim id -> role (see the module docstring)


def lean_files(lean_dir: Path = LEAN_DIR) -> list[Path]:
    return sorted(p for p in lean_dir.rglob("*.lean") if ".lake" not in p.parts)


def _blank_comments(text: str) -> str:
    """``text`` with every comment and docstring replaced by spaces (offsets and lines kept)."""
    return _COMMENT.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _namespace_at(code: str) -> list[tuple[int, str]]:
    """(offset, current namespace) after every ``namespace``/``section``/``end`` command."""
    stack: list[tuple[str, str]] = []  # (kind, name)
    out: list[tuple[int, str]] = [(0, "")]
    for m in _SCOPE.finditer(code):
        kw, arg = m.group("kw"), m.group("arg")
        if kw == "namespace" and arg:
            stack.append(("namespace", arg))
        elif kw == "section":
            stack.append(("section", arg))
        elif kw == "end" and stack:
            stack.pop()
        ns = ".".join(n for k, n in stack if k == "namespace")
        out.append((m.end(), ns))
    return out


def theorems(lean_dir: Path = LEAN_DIR) -> list[LeanTheorem]:
    """Every theorem whose docstring names a claim, in file order."""
    found: list[LeanTheorem] = []
    for path in lean_files(lean_dir):
        text = path.read_text(encoding="utf-8")
        scopes = _namespace_at(_blank_comments(text))
        for m in _DECL.finditer(text):
            if m.group("kind") != "theorem":
                continue
            marks = _CLAIM.findall(m.group("doc"))
            ids = tuple(dict.fromkeys(cid for cid, _ in marks))
            roles = {cid: role or "establishes" for cid, role in reversed(marks)}
            if not ids:
                continue
            ns = [n for pos, n in scopes if pos <= m.start()][-1]
            name = m.group("name")
            if name.startswith("_root_."):
                name = name[len("_root_.") :]
            elif ns and not name.startswith(ns + "."):
                name = f"{ns}.{name}"
            line = text.count("\n", 0, m.start("name")) + 1
            try:
                rel = str(path.relative_to(ROOT))
            except ValueError:
                rel = str(path)
            found.append(LeanTheorem(name, ids, rel, line, roles))
    return found


def theorems_by_claim(lean_dir: Path = LEAN_DIR) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for thm in theorems(lean_dir):
        for cid in thm.claims:
            out.setdefault(cid, []).append(thm.name)
    return out


def forbidden_tokens(lean_dir: Path = LEAN_DIR) -> list[str]:
    """``FILE:LINE: token`` for every ``sorry``/``admit``/``native_decide``/``axiom`` declaration
    outside comments and docstrings."""
    problems: list[str] = []
    for path in lean_files(lean_dir):
        code = _blank_comments(path.read_text(encoding="utf-8"))
        for m in _FORBIDDEN.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{path.relative_to(lean_dir.parent)}:{line}: {m.group(0).strip()}")
    return problems


def axiom_guarded(axioms_file: Path = AXIOMS_FILE) -> set[str]:
    """Names (as written, relative to ``GaugeAudit``) that the axiom audit file checks."""
    if not axioms_file.exists():
        return set()
    code = _blank_comments(axioms_file.read_text(encoding="utf-8"))
    return set(_PRINT_AXIOMS.findall(code))


def lake_path() -> str | None:
    return shutil.which("lake")


def lake_build(timeout: float = 1800.0) -> subprocess.CompletedProcess:
    """Run ``lake build`` at the repository root (caller checks :func:`lake_path` first)."""
    return subprocess.run(["lake", "build"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
