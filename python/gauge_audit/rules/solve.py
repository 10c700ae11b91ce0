"""Solving for the unknown entries of a correction, exactly and within a size budget.

A correction's unknowns (the entries of a factor ``B`` or an increment ``t``) must make a list
of residuals vanish *identically* in the data and the generic parameters.  Extracting every
coefficient of those residuals symbolically and handing the system to ``sympy.solve`` is what
can run for many minutes (Gröbner bases of large systems).  Instead:

* **Sampling.**  The residuals are evaluated at seeded random integer points of the generic
  symbols (the *fixed* symbols — the parameters a correction may depend on — at one common random
  point): each point gives equations in the unknowns alone, with rational coefficients.  Their
  solution set contains the identity's, so a unique solution of the sampled system is the only
  candidate; points are added until the rank stops growing.  Whatever is found is named and then
  re-checked exactly on fresh draws by the caller, so sampling can miss a correction with small
  probability but never report a wrong one.
* **Linear first.**  When every equation is affine in the unknowns (the usual case: a factor of one
  parameter), the system is solved by exact linear algebra over ℚ (``linsolve``).
* **Polynomial only when needed and small.**  A system of higher degree (an unknown that also
  acts on the stream, through the norm core) goes to ``sympy.solve`` only within
  :data:`POLY_LIMITS`; a larger one is reported as such, not attempted.

Every limit here is a size, so the same seed gives the same outcome; the time budget
(:mod:`.budget`) is checked between points.
"""

from __future__ import annotations

import random

import sympy as sp
from sympy.polys.domains import QQ
from sympy.polys.matrices import DomainMatrix
from sympy.solvers.solveset import NonlinearError

from .budget import Budget

SAMPLE_RANGE = 2**12  # |random integer| ≤ this at a sample point (0 excluded)
EXTRA_POINTS = 2  # points beyond full rank that must stay consistent
POLY_LIMITS = {"unknowns": 4, "degree": 2, "equations": 24}


def unique_linear(eqs: list, xs: list) -> dict | None:
    """The unique solution of a linear system (coefficients may be symbolic constants), or None
    (inconsistent, under-determined, or not linear in ``xs``)."""
    try:
        sol = sp.linsolve(eqs, xs)
    except NonlinearError:
        return None
    if not sol:
        return None
    (vals,) = tuple(sol)
    if any(v.free_symbols & set(xs) for v in vals):
        return None
    return dict(zip(xs, vals))


def _draw(sym: sp.Symbol, rng: random.Random) -> sp.Integer:
    v = rng.randint(1, SAMPLE_RANGE)
    return sp.Integer(v if sym.is_positive or rng.random() < 0.5 else -v)


def _at(e, point: dict, xs: list):
    """The residual's numerator at a point, expanded: a polynomial in the unknowns (None: a pole)."""
    try:
        v = sp.sympify(e).xreplace(point)
    except ZeroDivisionError:  # pragma: no cover - a pole at the point
        return None
    if v.has(sp.zoo, sp.nan, sp.oo):
        return None
    if v.is_polynomial(*xs):  # the usual case: no unknown in a denominator (no together needed)
        return sp.expand(v)
    num, _ = sp.fraction(sp.together(v))
    return sp.expand(num)


def _rank(A: sp.Matrix) -> int:
    """Exact rank over ℚ (the sampled equations have rational coefficients)."""
    return DomainMatrix.from_Matrix(A).convert_to(QQ).rank()


def _degree(e, xs) -> int:
    return sp.Poly(e, *xs).total_degree() if e.free_symbols & set(xs) else 0


def solve_sampled(
    residuals: list, xs: list, fixed_syms: set, rng: random.Random, budget: Budget, max_points: int | None = None
) -> tuple[dict | None, dict, str]:
    """The unique values of the unknowns ``xs`` that make every residual vanish at every sampled
    point, or None.  ``fixed_syms``: symbols held at one common random point (returned, so the
    caller can name the solution there).  Returns (solution or None, the fixed point, why not)."""
    xs = list(xs)
    free = sorted(set().union(*(sp.sympify(e).free_symbols for e in residuals)) - set(xs), key=str)
    fixed = {s: _draw(s, rng) for s in free if s in fixed_syms}
    varying = [s for s in free if s not in fixed_syms]
    max_points = max_points or 2 * len(xs) + 4
    eqs: list = []
    seen: set = set()
    rank, stable, degree = -1, 0, 0
    for _ in range(max_points):
        budget.check()
        point = {**fixed, **{s: _draw(s, rng) for s in varying}}
        for e in residuals:
            v = _at(e, point, xs)
            if v is None or v == 0 or v in seen:
                continue
            if not v.free_symbols & set(xs):
                return None, fixed, "the residual does not depend on the unknowns and is not zero"
            seen.add(v)
            eqs.append(v)
            degree = max(degree, _degree(v, xs))
        if not eqs:
            continue
        if degree > 1:
            if len(eqs) >= POLY_LIMITS["equations"]:
                break
            continue
        A, b = sp.linear_eq_to_matrix(eqs, xs)
        r = _rank(A)
        if _rank(A.row_join(b)) > r:
            return None, fixed, "inconsistent: no value of the unknowns works"
        stable = stable + 1 if r == rank else 0
        rank = r
        if (r == len(xs) and stable >= EXTRA_POINTS - 1) or (r < len(xs) and stable >= EXTRA_POINTS):
            break
    if not eqs:
        return None, fixed, "no equation involves the unknowns"
    if degree <= 1:
        sol = unique_linear(eqs, xs)
        return (sol, fixed, "") if sol is not None else (None, fixed, f"not unique (rank {rank} of {len(xs)})")
    lim = POLY_LIMITS
    if len(xs) > lim["unknowns"] or degree > lim["degree"]:
        return (
            None,
            fixed,
            (
                f"a polynomial system of {len(xs)} unknowns and degree {degree} exceeds the solver's "
                f"size limit ({lim['unknowns']} unknowns, degree {lim['degree']}): not attempted"
            ),
        )
    eqs = eqs[: lim["equations"]]  # a subset: its solutions contain the system's (the caller re-checks)
    budget.check()
    try:
        sols = sp.solve(eqs, xs, dict=True)
    except (NotImplementedError, ValueError):  # pragma: no cover - SymPy gives up
        return None, fixed, "SymPy cannot solve the polynomial system"
    if len(sols) != 1 or any(x not in sols[0] for x in xs):
        return None, fixed, f"{len(sols)} solutions of the polynomial system"
    return sols[0], fixed, ""


__all__ = ["POLY_LIMITS", "solve_sampled", "unique_linear"]
