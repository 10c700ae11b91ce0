"""Naming a solved matrix in the rule language: the candidate expressions built from the rule's
elements, their transposes and inverses and their conjugates by a norm's diag(γ)
(:func:`candidates`), compared exactly with the solution (:func:`match_named`).
"""

from __future__ import annotations

import sympy as sp

from ...claims.matexpr import parse_expression
from ...claims.rule import Rule, symbols_for
from ...errors import GaugeAuditError
from ...models.naming import PARAMS
from ..algebra import SympyOps, evaluate
from ..engine import Ctx
from .model import SymView, is_zero


def candidates(rule: Rule, norm: str | None = None) -> list[str]:
    """Expressions a solved factor is compared with: the elements, their transposes and inverses,
    diagonals of vector elements, and their conjugates by a norm's diag(γ)."""
    base = []
    for e in rule.elements:
        s = e.symbol
        if e.kind == "matrix":
            base += [s, f"transpose({s})", f"inv({s})", f"inv(transpose({s}))"]
        elif e.kind == "vector" and e.group != "translation":
            base += [f"diag({s})", f"inv(diag({s}))"]
        elif e.kind == "scalar":
            base += [s, f"inv({s})"]
    out = list(base)
    if norm:
        g = f"diag({norm}.w)"
        out += [f"inv({g}) @ {x} @ {g}" for x in base] + [f"{g} @ {x} @ inv({g})" for x in base]
    return out


def match_named(
    B: sp.Matrix, cands: list[str], rule: Rule, view: SymView, els: dict, ctx: Ctx, point: dict | None = None
) -> str | None:
    """The first candidate expression equal to B (``eye`` for the identity), or None.  ``point``:
    B is the solution at these values of the parameters, so the candidates are compared there."""
    syms = symbols_for(rule.elements)
    if B.shape[0] == B.shape[1] and all(is_zero(x) for x in (B - sp.eye(B.shape[0]))):
        return "eye"
    for text in cands:
        try:
            node = parse_expression(text, syms)
        except GaugeAuditError:
            continue  # a candidate of another shape
        env = {
            n: (view.value(n, ctx.at(PARAMS[n].level)) if n in PARAMS else els[ctx.at(rule.scope_level)][n])
            for n in node.names()
        }
        try:
            val = evaluate(node, env, SympyOps(), view.shape.dims)
        except GaugeAuditError:
            continue
        if point:
            val = val.xreplace(point)
        if val.shape == B.shape and all(is_zero(x) for x in (val - B)):
            return text
    return None
