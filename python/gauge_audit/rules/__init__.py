"""Transformation rules as data, settled by every checker.

A claim file's ``[claim.rule]`` (parsed by :mod:`gauge_audit.claims.rule`) states a gauge
transformation the way a paper writes it.  This package applies it: one engine over every number
system (:mod:`.engine`, :mod:`.algebra`), the groups' samplers and tangent spaces (:mod:`.groups`),
and the checkers — torch (:mod:`.torch_check`), SymPy (:mod:`.symbolic`), mpmath
(:mod:`.precision`) and Jacobian nullity (:mod:`.nullity`).  :mod:`gauge_audit.testing` exposes the
same engine to users' own test suites.
"""

from ..claims.rule import Rule, parse_rule
from .engine import Ctx, NotApplicable, ProjectView, Shape, applicability, apply
from .torch_check import check_rule, draw, models_for, transform

__all__ = [
    "Ctx",
    "NotApplicable",
    "ProjectView",
    "Rule",
    "Shape",
    "applicability",
    "apply",
    "check_rule",
    "draw",
    "models_for",
    "parse_rule",
    "transform",
]
