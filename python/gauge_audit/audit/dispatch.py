"""Claim → checker: a claim with a ``[claim.rule]`` goes to the rule checkers
(:mod:`.rule_checks`), every other to the plain ones (:mod:`.checkers`); above both.
"""

from __future__ import annotations

from ..claims import Claim
from . import rule_checks
from .checkers import Context, lean, nullity, precision, symbolic, torch
from .evidence import Evidence


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
