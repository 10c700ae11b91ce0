"""Run every applicable checker on every claim and combine the evidence."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from ..claims import Claim
from ..runtime import reproducible
from . import parallel
from .checkers import Context
from .dispatch import run_check, step_line
from .evidence import Evidence, Verdict, combine
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
            "nearest": self.verdict.nearest,
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
    claims: list[Claim],
    ctx: Context | None = None,
    progress: Progress | None = None,
    max_minutes: float | None = None,
    jobs: int = 1,
) -> AuditReport:
    """``max_minutes`` (None: no limit) bounds the whole run: a check that would start after it
    is NOT-RUN and says so, and the rule checkers' searches get no more than what is left.
    ``jobs`` > 1: the checks run on that many worker processes (:mod:`.parallel`; 0: one per
    usable core where the claims repay it) — the same report, byte for byte."""
    # One intra-op thread throughout, phases that would choose more included (runtime's thread
    # policy): the checks are small operations, and the report must be byte-identical whatever
    # OMP_NUM_THREADS says.
    with reproducible():
        return _audit(claims, ctx or Context(), progress, max_minutes, jobs)


def _audit(
    claims: list[Claim], ctx: Context, progress: Progress | None, max_minutes: float | None, jobs: int
) -> AuditReport:
    report = AuditReport(ctx.seed, ctx.full, [])
    t_all = time.perf_counter()
    deadline = None if max_minutes is None else time.monotonic() + 60.0 * max_minutes
    if deadline is not None:
        ctx.cache[DEADLINE_KEY] = deadline
    ahead = parallel.run(claims, ctx, jobs, progress, deadline, max_minutes) if jobs != 1 else parallel.Ahead()
    for i, claim in enumerate(claims, 1):
        evidence = []
        for name in claim.checkers:
            if (i - 1, name) in ahead.evidence:
                ev, dt = ahead.evidence[i - 1, name]
            else:
                t = time.perf_counter()
                if progress:
                    progress.start(claim.id, name)
                # a step assembled from checks the workers measured is no new work: past the deadline too
                ev = run_check(name, claim, ctx, None if (i - 1, name) in ahead.ready else deadline, max_minutes)
                dt = time.perf_counter() - t
                if progress:
                    progress.done(step_line(i, len(claims), claim.id, name, ev, dt))
            report.timings[f"{claim.id}/{name}"] = round(dt, 3)
            evidence.append(ev)
        report.results.append(ClaimResult(claim, evidence, combine(evidence)))
    report.timings.update(ahead.seconds)
    report.timings["total"] = round(time.perf_counter() - t_all, 3)
    return report
