"""The structured result every derivation returns, and the verdict rule."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sympy as sp

HOLDS = "HOLDS"
FAILS = "FAILS"
HOLDS_WITH_CORRECTION = "HOLDS-WITH-CORRECTION"
VERDICTS = (HOLDS, FAILS, HOLDS_WITH_CORRECTION)


def decide(claimed_ok: bool, corrected_ok: bool | None = None, substance_kept: bool = False) -> str:
    """The verdict from computed facts.

    ``claimed_ok``: the claimed rule/number checks out (zero residual, equal count, ...).
    ``corrected_ok``: a derived corrected rule checks out (None: no correction derived).
    ``substance_kept``: the correction keeps what the claim is about (same group, same
    count, or a reading the source's own notation admits).  Otherwise the claim FAILS.
    """
    if claimed_ok:
        return HOLDS
    if corrected_ok and substance_kept:
        return HOLDS_WITH_CORRECTION
    return FAILS


def _text(x) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, (sp.Basic, sp.MatrixBase)):
        return sp.sstr(x)
    return str(x)


@dataclass
class Derivation:
    """The outcome of one SymPy derivation.

    ``derived`` is the rule or condition the derivation produced, ``residual`` the
    residual expression of the rule as claimed (``0`` when it holds), ``steps`` the
    numbered reasoning, ``data`` the numbers (dimensions, counts) for tests and reports,
    ``exprs`` the key expressions as (label, SymPy object) for ``--latex``.
    """

    claim: str
    title: str
    claimed: str
    verdict: str
    derived: str
    residual: str
    steps: list[str] = field(default_factory=list)
    corrected_rule: str | None = None
    counterexample: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    exprs: list[tuple[str, Any]] = field(default_factory=list)

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"bad verdict {self.verdict!r}")
        self.derived = _text(self.derived)
        self.residual = _text(self.residual)

    @property
    def latex(self) -> str:
        """LaTeX of the key expressions, one ``label: $...$`` per line."""
        lines = [f"% {self.claim}: {self.title} -- verdict {self.verdict}"]
        for label, obj in self.exprs:
            body = obj if isinstance(obj, str) else sp.latex(obj)
            lines.append(f"{label}: $${body}$$")
        return "\n".join(lines)

    def render(self) -> str:
        out = [f"{self.claim}: {self.title}", "", f"Claim: {self.claimed}", ""]
        for i, s in enumerate(self.steps, 1):
            out.append(f"  {i}. {s}")
        out += ["", f"Derived:  {self.derived}", f"Residual of the claimed rule:  {self.residual}"]
        if self.corrected_rule:
            out.append(f"Corrected rule:  {self.corrected_rule}")
        if self.counterexample:
            out.append(f"Counterexample:  {self.counterexample}")
        out += ["", f"Verdict: {self.verdict}"]
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim": self.claim,
            "title": self.title,
            "claimed": self.claimed,
            "verdict": self.verdict,
            "derived": self.derived,
            "residual": self.residual,
            "steps": list(self.steps),
            "corrected_rule": self.corrected_rule,
            "counterexample": self.counterexample,
            "data": _jsonable(self.data),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, bool) or x is None or isinstance(x, (int, float, str)):
        return x
    if isinstance(x, sp.Integer):
        return int(x)
    if isinstance(x, sp.Basic) and x.is_number and x.is_rational:
        return str(x)
    return _text(x)
