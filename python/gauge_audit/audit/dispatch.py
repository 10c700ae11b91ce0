"""Claim → checker: a claim with a ``[claim.rule]`` goes to the rule checkers
(:mod:`.rule_checks`), every other to the plain ones (:mod:`.checkers`); above both.
"""

from __future__ import annotations

import time

from ..claims import Claim
from ..errors import GaugeAuditError
from . import rule_checks
from .checkers import Context, lean, nullity, precision, symbolic, torch
from .evidence import ERROR, NOT_RUN, Evidence


def _dispatch(name: str, fn):
    """A claim with a [claim.rule] goes to the rule checkers (audit.rule_checks)."""

    def run(claim: Claim, ctx: Context) -> Evidence:
        if claim.rule is not None:
            return rule_checks.run(name, claim, ctx)
        return fn(claim, ctx)

    run.__name__ = fn.__name__
    return run


CHECKER_FUNCTIONS = {
    name: _dispatch(name, fn)
    for name, fn in {
        "lean": lean,
        "symbolic": symbolic,
        "torch": torch,
        "precision": precision,
        "nullity": nullity,
    }.items()
}


def run_check(name: str, claim: Claim, ctx: Context, deadline: float | None, max_minutes: float | None) -> Evidence:
    """One checker on one claim: NOT-RUN once the audit's deadline (``time.monotonic()``) has
    passed, ERROR for an input the checker refuses (a :class:`GaugeAuditError`)."""
    fn = CHECKER_FUNCTIONS.get(name)
    if deadline is not None and time.monotonic() >= deadline:
        return Evidence(
            name, NOT_RUN, f"not run: the audit's --max-minutes budget ({max_minutes:g} min) ended before this check"
        )
    if fn is None:
        return Evidence(name, NOT_RUN, f"the {name} checker is not available in this build")
    try:
        return fn(claim, ctx)
    except GaugeAuditError as exc:
        return Evidence(name, ERROR, str(exc))


def step_line(i: int, n: int, claim_id: str, name: str, ev: Evidence, seconds: float) -> str:
    """The progress line of one finished (claim, checker) step."""
    return f"[{i}/{n}] {claim_id:26s} {name:9s} {ev.outcome:22s} {seconds:6.1f}s"
