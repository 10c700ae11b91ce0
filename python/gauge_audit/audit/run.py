"""Run every applicable checker on every claim and combine the evidence."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ..claims import Claim
from ..errors import GaugeAuditError
from ..runtime import reproducible
from .checkers import Context
from .dispatch import CHECKER_FUNCTIONS
from .evidence import ERROR, NOT_RUN, Evidence, Verdict, combine
from .rule_checks import DEADLINE_KEY


@dataclass
class ClaimResult:
    claim: Claim
    evidence: list[Evidence]
    verdict: Verdict

    def to_json(self) -> dict:
        c = self.claim
        rule = {"rule": c.rule.text()} if c.rule is not None else {}
        return {
            **rule,
            "id": c.id,
            "document": c.document.title,
            "source": c.source,
            "location": c.location,
            "statement": c.statement,
            "kind": c.kind,
            "file": c.file,
            "line": c.line,
            "verdict": self.verdict.verdict,
            "why": self.verdict.why,
            "conflicts": self.verdict.conflicts,
            "corrected_rule": self.verdict.corrected_rule,
            "counterexample": self.verdict.counterexample,
            "evidence": {e.checker: e.to_json() for e in self.evidence},
        }


@dataclass
class AuditReport:
    seed: int
    full: bool
    results: list[ClaimResult]
    extras: dict = field(default_factory=dict)  # plots' data, counts tables, ... (deterministic)
    timings: dict = field(default_factory=dict)  # seconds per claim/checker (kept out of report.json)

    def verdicts(self) -> dict[str, str]:
        return {r.claim.id: r.verdict.verdict for r in self.results}

    def to_json(self) -> dict:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.verdict.verdict] = counts.get(r.verdict.verdict, 0) + 1
        return {
            "seed": self.seed,
            "full": self.full,
            "summary": dict(sorted(counts.items())),
            "claims": [r.to_json() for r in self.results],
            "extras": self.extras,
        }


class Progress(Protocol):
    """What the audit reports while it runs (the CLI draws a bar from it)."""

    def start(self, claim_id: str, checker: str) -> None: ...

    def done(self, line: str) -> None: ...


def audit(
    claims: list[Claim], ctx: Context | None = None, progress: Progress | None = None, max_minutes: float | None = None
) -> AuditReport:
    """``max_minutes`` (None: no limit) bounds the whole run: a check that would start after it
    is NOT-RUN and says so, and the rule checkers' searches get no more than what is left."""
    # One intra-op thread throughout, phases that would choose more included (runtime's thread
    # policy): the checks are small operations, and the report must be byte-identical whatever
    # OMP_NUM_THREADS says.
    with reproducible():
        return _audit(claims, ctx or Context(), progress, max_minutes)


def _audit(claims: list[Claim], ctx: Context, progress: Progress | None, max_minutes: float | None) -> AuditReport:
    report = AuditReport(ctx.seed, ctx.full, [])
    t_all = time.perf_counter()
    deadline = None if max_minutes is None else time.monotonic() + 60.0 * max_minutes
    if deadline is not None:
        ctx.cache[DEADLINE_KEY] = deadline
    for i, claim in enumerate(claims, 1):
        evidence = []
        for name in claim.checkers:
            fn = CHECKER_FUNCTIONS.get(name)
            t = time.perf_counter()
            if progress:
                progress.start(claim.id, name)
            if deadline is not None and time.monotonic() >= deadline:
                ev = Evidence(
                    name,
                    NOT_RUN,
                    f"not run: the audit's --max-minutes budget ({max_minutes:g} min) ended before this check",
                )
            elif fn is None:
                ev = Evidence(name, NOT_RUN, f"the {name} checker is not available in this build")
            else:
                try:
                    ev = fn(claim, ctx)
                except GaugeAuditError as exc:
                    ev = Evidence(name, ERROR, str(exc))
            dt = time.perf_counter() - t
            report.timings[f"{claim.id}/{name}"] = round(dt, 3)
            evidence.append(ev)
            if progress:
                progress.done(f"[{i}/{len(claims)}] {claim.id:26s} {name:9s} {ev.outcome:22s} {dt:6.1f}s")
        report.results.append(ClaimResult(claim, evidence, combine(evidence)))
    report.timings["total"] = round(time.perf_counter() - t_all, 3)
    return report
