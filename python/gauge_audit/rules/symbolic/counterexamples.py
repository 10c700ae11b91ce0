"""When the stated rule fails: the largest tried subgroup on which it holds (:func:`condition`),
and a concrete exact counterexample — a small element and small integer data at which a failing
identity is non-zero, with its value (:func:`counterexample`), or the generic draw
(:func:`generic_counterexample`) when the budget stops the search.
"""

from __future__ import annotations

import itertools
import random

import sympy as sp

from ...claims.rule import Element, Rule
from ..budget import Budget, unlimited
from .elements import DRAWS, element_assignments, element_size, group_points, random_int
from .interfaces import ArchResult, abbrev, mat_text, run_arch
from .model import LEAST_SIZE, SymModel


def _subgroups(el: Element, n: int, rng: random.Random) -> list[tuple[str, list[list[sp.Matrix]]]]:
    """Proper subsets of the declared group to test the stated rule on, largest first: (label, per
    draw the points to use)."""
    tag = el.symbol

    def pts(group):
        return [group_points(Element(tag, group, n), n, rng) for _ in range(DRAWS)]

    out = []
    if el.group == "GL":
        out += [
            (f"{tag} ∈ O({el.dim})", pts("O")),
            (f"{tag} ∈ SO({el.dim})", pts("SO")),
            (f"{tag} diagonal", [[sp.diag(*p) for p in d] for d in pts("diagonal")]),
        ]
    if el.group in ("O", "SO", "GL"):
        if n >= LEAST_SIZE["SO1"]:  # SO1(2) = {I}: no condition worth stating
            out.append((f"{tag} fixes the all-ones vector (SO1)", pts("SO1")))
        vs = [sp.Matrix([[random_int(rng) for _ in range(n)]]) for _ in range(DRAWS)]
        out.append(
            (
                f"{tag}² = I ({tag} = 2vvᵀ/vᵀv − I, a rotation by π)",
                [[2 * v.T * v / (v * v.T)[0, 0] - sp.eye(n)] for v in vs],
            )
        )
    if el.group == "SO1" and n >= 3:
        # involutions fixing 1: a rotation by π in a plane ⟂ 1 (u, w ⟂ 1, u ⟂ w), at odd n also the
        # rotation by π about the all-ones axis
        u = sp.Matrix([[1, -1] + [0] * (n - 2)])
        w = sp.Matrix([[1, 1, -2] + [0] * (n - 3)])
        plane_turn = sp.eye(n) - 2 * (u.T * u / (u * u.T)[0, 0] + w.T * w / (w * w.T)[0, 0])
        turns = [plane_turn] + ([2 * sp.ones(n, n) / n - sp.eye(n)] if n % 2 else [])
        out.append((f"{tag}² = I ({tag} an involution fixing the all-ones vector)", [turns] * DRAWS))
    if el.group == "diagonal":
        out += [
            (f"{tag} > 0", pts("positive-diagonal")),
            (f"{tag} = ±1", [[sp.Matrix([list(p)]) for p in itertools.product((1, -1), repeat=n)]] * DRAWS),
        ]
    if el.group in ("diagonal", "positive-diagonal"):
        out.append(
            (f"{tag} = c·ones (a common scale)", [[random_int(rng, False) * sp.ones(1, n)] for _ in range(DRAWS)])
        )
    if el.group == "scalar":
        out.append((f"{tag} = ±1", [[sp.Matrix([[1]]), sp.Matrix([[-1]])]] * DRAWS))
    return out


def condition(
    rule: Rule, models: list[SymModel], budget: Budget | None = None, second: list[SymModel] | None = None
) -> tuple[str | None, list[str]]:
    """The largest tried subset of one element's group on which the stated rule holds (every
    other element at generic points), re-checked at the second symbolic size (``second``); and the
    subsets that held at one size only (size-dependent, not reported as conditions).  ``budget`` is
    checked between decisions (BudgetSpent propagates)."""
    budget = budget or unlimited()
    rng = random.Random(11)
    dependent: list[str] = []
    for el in rule.elements:
        n = element_size(el, models[0].shape.dims)
        big = element_size(el, second[0].shape.dims) if second else n
        at_big = dict(_subgroups(el, big, random.Random(12)))
        for label, points in _subgroups(el, n, rng):
            if not _holds_on(rule, models, {el.symbol: points}, budget):
                continue
            if second and not (label in at_big and _holds_on(rule, second, {el.symbol: at_big[label]}, budget)):
                dependent.append(f"{label}: holds at the first symbolic size and not at the second (size-dependent)")
                continue
            return f"holds only for {label}, not for a generic element of {el.text()}", dependent
        return (
            f"holds for no tried proper subset of {el.text()} (its identity element aside)"
            if len(rule.elements) == 1
            else None
        ), dependent
    return None, dependent


def _holds_on(rule: Rule, models: list[SymModel], override: dict, budget: Budget) -> bool:
    for mm in models:
        for els in element_assignments(rule, mm.shape, override=override):
            budget.check()
            if not run_arch(rule, mm, els).holds:
                return False
    return True


def generic_counterexample(r: ArchResult) -> str:
    """The failing identity at the generic draw (no further computation)."""
    bad = next((it for it in r.interfaces if not it.ok), None)
    shown = "; ".join(
        f"{sym} = {abbrev(mat_text(v), 120)}" for els in list(r.elements.values())[:1] for sym, v in els.items()
    )
    return f"{r.arch}, {bad.name if bad else 'an identity'}: non-zero at the drawn exact element ({shown})"


def counterexample(rule: Rule, m: SymModel, r: ArchResult, budget: Budget | None = None) -> str | None:
    """A small exact element (entries 1..4) at which a failing identity is non-zero, with small
    integers for the data and parameters, and that value (the generic draw if no small one fails)."""
    small = element_assignments(rule, m.shape, seed=5, draws=1, spread=4)[:8]
    budget = budget or unlimited()

    def tried():
        for els in small:
            budget.check()
            yield run_arch(rule, m, els)

    r = next((x for x in tried() if not x.holds), r)
    bad = next((it for it in r.interfaces if not it.ok), None)
    if bad is None:  # pragma: no cover - only called for a failing result
        return None
    rng = random.Random(7)
    subs = {
        s: sp.Integer(rng.choice([1, 2, 3]) if s.is_positive else rng.choice([-2, -1, 1, 2, 3]))
        for s in m.data_symbols() + m.param_symbols()
    }
    shown = "; ".join(f"{sym} = {mat_text(v)}" for els in list(r.elements.values())[:1] for sym, v in els.items())
    for e in bad.residual:
        budget.check()
        val = sp.sympify(e).xreplace(subs)  # symbols to numbers at once (subs would substitute one by one)
        free = sorted(val.free_symbols, key=str)
        val = (
            sp.nsimplify(sp.cancel(val))
            if not val.has(sp.erf, sp.exp, sp.Max)
            else sp.N(val.subs({x: 1 for x in free}), 15)
        )
        if val != 0:
            return (
                f"{r.arch}, {bad.name}: with {shown} and small integer data and parameters the identity is off by {val}"
            )
    return f"{r.arch}, {bad.name}: {bad.note or 'non-zero at the drawn element'} ({shown})"
