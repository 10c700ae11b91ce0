"""Evidence from one checker about one claim, and how evidence becomes a verdict.

A checker either *decides* (HOLDS, FAILS, HOLDS-WITH-CORRECTION) or does not
(NOT-RUN, NOT-APPLICABLE, UNDECIDED, ERROR).  Only deciding evidence enters the
verdict:

* all HOLDS → HOLDS; all FAILS → FAILS (with the counterexample);
* FAILS and HOLDS-WITH-CORRECTION agree that the claim *as stated* is not right;
  together (or HOLDS-WITH-CORRECTION alone) → HOLDS-WITH-CORRECTION with the rule;
* HOLDS next to HOLDS-WITH-CORRECTION → HOLDS-WITH-CORRECTION, and the pair is listed
  as a *refinement* (the HOLDS checker tested a part of the claim that is right;
  the other found what must be corrected);
* HOLDS next to FAILS is a *conflict*: listed, and the verdict is UNDECIDED — a
  disagreement between checkers is never resolved silently.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

HOLDS, FAILS, CORRECTED, UNDECIDED = "HOLDS", "FAILS", "HOLDS-WITH-CORRECTION", "UNDECIDED"
DECIDING = (HOLDS, FAILS, CORRECTED)
NOT_RUN, NOT_APPLICABLE, ERROR = "NOT-RUN", "NOT-APPLICABLE", "ERROR"
CHECKERS = ("lean", "symbolic", "precision", "torch", "nullity")


@dataclass
class Evidence:
    checker: str
    outcome: str  # one of DECIDING or NOT_RUN / NOT_APPLICABLE / UNDECIDED / ERROR
    summary: str  # one line for the verdict table
    details: dict = field(default_factory=dict)  # numbers; JSON-able and deterministic for a seed
    corrected_rule: str | None = None
    counterexample: str | None = None
    # the nearest true statement of a failed claim as this checker re-checked it: {"statement", "holds"}
    # (the symbolic checker, which derives it, adds the rule and the sizes it was checked at)
    nearest: dict | None = None

    @property
    def decides(self) -> bool:
        return self.outcome in DECIDING

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    verdict: str
    why: str
    conflicts: list[str]
    corrected_rule: str | None
    counterexample: str | None
    refinements: list[str] = field(default_factory=list)
    nearest: dict | None = None  # a failed claim's nearest true statement, with who confirmed it


def nearest_statement(evidence: list[Evidence]) -> dict | None:
    """The derived nearest true statement (from the checker that derived it, the one whose record
    carries the rule) with the checkers that re-checked it: ``confirmed_by`` / ``contradicted_by``."""
    derived = next((e.nearest for e in evidence if e.nearest and "rule" in e.nearest), None)
    if derived is None:
        return None
    return {
        **derived,
        "confirmed_by": [e.checker for e in evidence if e.nearest and e.nearest.get("holds")],
        "contradicted_by": [e.checker for e in evidence if e.nearest and e.nearest.get("holds") is False],
    }


def combine(evidence: list[Evidence]) -> Verdict:
    v = _combine(evidence)
    if v.verdict in (FAILS, UNDECIDED):
        v.nearest = nearest_statement(evidence)
    return v


def _combine(evidence: list[Evidence]) -> Verdict:
    deciding = [e for e in evidence if e.decides]
    corrected = next((e.corrected_rule for e in deciding if e.corrected_rule), None)
    counter = next((e.counterexample for e in deciding if e.counterexample), None)
    if not deciding:
        reasons = "; ".join(f"{e.checker}: {e.outcome.lower()}" for e in evidence) or "no checker applies"
        return Verdict(UNDECIDED, f"no checker decided ({reasons})", [], corrected, counter)
    holds = [e for e in deciding if e.outcome == HOLDS]
    fails = [e for e in deciding if e.outcome == FAILS]
    fixed = [e for e in deciding if e.outcome == CORRECTED]
    if holds and fails:
        conflicts = [f"{h.checker} says HOLDS but {f.checker} says FAILS" for h in holds for f in fails]
        return Verdict(UNDECIDED, "checkers disagree", conflicts, corrected, counter)
    names = ", ".join(e.checker for e in deciding)
    if fixed:
        refinements = [
            f"{h.checker} says HOLDS for the part it tests; {f.checker} says {CORRECTED}" for h in holds for f in fixed
        ]
        return Verdict(
            CORRECTED, f"not right as stated; corrected rule established ({names})", [], corrected, counter, refinements
        )
    if holds:
        return Verdict(HOLDS, f"decided by {names}", [], None, None)
    return Verdict(FAILS, f"refuted by {names}", [], None, counter)


def result_row(r) -> dict:
    """One model's numeric check (a :class:`gauge_audit.numeric.CheckResult`) as a row of a checker's details."""
    return {
        "model": r.model,
        "verdict": r.verdict,
        "max_rel_error": r.max_rel_error,
        "residual_eps": r.residual_eps,
        "tolerance_statistical_eps": r.tolerance_statistical_eps,
        "tolerance_eps": r.tolerance_eps,
        "kappa": r.kappa,
        "routing_changed": r.routing_changed,
    }
