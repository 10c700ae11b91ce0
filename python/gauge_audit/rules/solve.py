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
  parameter), the system is solved by exact linear algebra over ℚ.  A residual that is affine in
  the unknowns by its form (no product of two factors that contain them, no unknown in a
  denominator or a function) is compiled once into an evaluator of its coefficient row in exact
  integers and fractions (:func:`_affine`): a point costs one pass over the expression tree, not
  a SymPy substitution and expansion.  Any other residual takes the general path (substitute,
  expand, read the degree); both give the same equations.
* **Polynomial only when needed and small.**  A system of higher degree (an unknown that also
  acts on the stream, through the norm core) goes to ``sympy.solve`` only within
  :data:`POLY_LIMITS`; a larger one is reported as such, not attempted.

Every limit here is a size, so the same seed gives the same outcome; the time budget
(:mod:`.budget`) is checked between points.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import sympy as sp
from sympy.external.gmpy import MPQ
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


# a value at an integer point, exactly: an int or a rational — SymPy's MPQ, which is gmpy2's mpq
# where gmpy2 is installed (then also the element type of SymPy's QQ), else SymPy's pure-Python
# rational (both faster than fractions.Fraction)
Num = Any  # int | MPQ (MPQ's class depends on the installation, so the type checker sees Any)


class _NotAffine(Exception):
    """The residual is not affine in the unknowns by its form (the general path decides it)."""


def _numeric(e, syms: dict) -> Callable[[list], Num]:
    """An evaluator of an unknown-free subexpression at a point (``pt[i]`` the value of symbol i):
    Python integers and fractions, exactly."""
    if e.is_Symbol:
        i = syms[e]
        return lambda pt: pt[i]
    if e.is_Integer:
        v = int(e)
        return lambda pt: v
    if e.is_Rational:
        q = MPQ(int(e.p), int(e.q))
        return lambda pt: q
    if e.is_Add or e.is_Mul:
        parts = [_numeric(a, syms) for a in e.args]
        if e.is_Add:
            return lambda pt: sum((f(pt) for f in parts), 0)

        def product(pt):
            out: Num = 1
            for f in parts:
                out = out * f(pt)
            return out

        return product
    if e.is_Pow and e.exp.is_Integer:
        base, n = _numeric(e.base, syms), int(e.exp)
        if n >= 0:
            return lambda pt: base(pt) ** n
        return lambda pt: MPQ(1) / base(pt) ** -n  # ZeroDivisionError at a pole: the point is skipped
    raise _NotAffine  # a float, a function, a symbolic exponent: not exact integer arithmetic


def exact_value(e, point: dict) -> Num | None:
    """``e`` at a point of integers (``point``: symbol → int), exactly: an int or an MPQ; None
    when ``e`` is not a rational function of its symbols over ℚ (a float, a function).  Raises
    ZeroDivisionError at a pole."""
    e = sp.sympify(e)
    free = list(e.free_symbols)
    try:
        f = _numeric(e, {s: i for i, s in enumerate(free)})
    except _NotAffine:
        return None
    return f([point[s] for s in free])


def _affine(e, xs: dict, syms: dict, has: Callable) -> Callable[[list], list[Num]]:
    """An evaluator of ``e``'s coefficient row ``[c_1, …, c_n, c_0]`` at a point (``e`` = Σ c_j·x_j + c_0
    there), for ``e`` affine in the unknowns ``xs`` by its form; raises :class:`_NotAffine` otherwise.
    ``has(node)``: does the node contain an unknown."""
    n = len(xs)
    if not has(e):
        f = _numeric(e, syms)

        def const(pt):
            row: list[Num] = [0] * (n + 1)
            row[n] = f(pt)
            return row

        return const
    if e.is_Symbol:  # an unknown
        unit: list[Num] = [0] * (n + 1)
        unit[xs[e]] = 1
        return lambda pt: list(unit)
    if e.is_Add:
        parts = [_affine(a, xs, syms, has) for a in e.args]

        def total(pt):
            row = parts[0](pt)
            for f in parts[1:]:
                for j, c in enumerate(f(pt)):
                    row[j] += c
            return row

        return total
    if e.is_Mul:
        inner = [a for a in e.args if has(a)]
        if len(inner) != 1:
            raise _NotAffine  # a product of two factors with unknowns: its degree needs the expansion
        g = _affine(inner[0], xs, syms, has)
        others = [_numeric(a, syms) for a in e.args if a is not inner[0]]

        def scaled(pt):
            k: Num = 1
            for f in others:
                k = k * f(pt)
            return [k * c for c in g(pt)]

        return scaled
    raise _NotAffine  # an unknown in a power, a denominator or a function


def _compile_affine(residuals: list, xs: list, free: list) -> list | None:
    """Every residual's coefficient-row evaluator (:func:`_affine`), or None if one is not affine by
    its form (then the general path decides them all)."""
    xi = {x: j for j, x in enumerate(xs)}
    si = {s: i for i, s in enumerate(free)}
    memo: dict = {}

    def has(node) -> bool:
        if node not in memo:
            memo[node] = node in xi if node.is_Symbol else any(has(a) for a in node.args)
        return memo[node]

    try:
        return [_affine(sp.sympify(e), xi, si, has) for e in residuals]
    except _NotAffine:
        return None


def _solve_rows(rows: list, n: int, solve: bool = False) -> tuple[int, bool, list | None]:
    """(rank of A, whether A·x + c = 0 is consistent, and with ``solve`` its unique solution or
    None) for the coefficient rows [A | c], exactly over ℚ."""
    M = DomainMatrix([[QQ(c.numerator, c.denominator) for c in r] for r in rows], (len(rows), n + 1), QQ)
    r = M[:, :n].rank()
    if M.rank() > r:
        return r, False, None
    if not solve or r < n:
        return r, True, None
    red, _ = M.rref()  # rank n, consistent: the first n rows are [I | −x]
    entries = red.to_list()
    return r, True, [-entries[i][n] for i in range(n)]


def _points(fixed: dict, varying: list, rng: random.Random, budget: Budget, max_points: int):
    """The sample points: the fixed symbols at their common values, the others drawn afresh; the
    time budget checked before each."""
    for _ in range(max_points):
        budget.check()
        yield {**fixed, **{s: _draw(s, rng) for s in varying}}


def _settled(r: int, rank: int, stable: int, n: int) -> tuple[int, bool]:
    """(points in a row without a rank change, whether sampling may stop): full rank held once
    more, or a deficient rank held for EXTRA_POINTS points."""
    stable = stable + 1 if r == rank else 0
    return stable, (r == n and stable >= EXTRA_POINTS - 1) or (r < n and stable >= EXTRA_POINTS)


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
    rows = _compile_affine(residuals, xs, free)
    if rows is not None:
        return _solve_affine(rows, xs, free, fixed, varying, rng, budget, max_points)
    eqs: list = []
    seen: set = set()
    rank, stable, degree = -1, 0, 0
    for point in _points(fixed, varying, rng, budget, max_points):
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
        stable, stop = _settled(r, rank, stable, len(xs))
        rank = r
        if stop:
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


PRIME = 2**61 - 1  # the stopping rule's ranks are taken modulo this prime (exact answers over ℚ at the end)


class _Echelon:
    """Rows reduced one at a time to an echelon basis modulo :data:`PRIME`: the rank of the sampled
    system and its consistency after each point in O(n²) per row, instead of an exact rank over ℚ of
    the whole system at every point (whose numbers — Cayley rotations, adjugates — grow large).
    The rank modulo a prime never exceeds the rank over ℚ and equals it unless the prime divides a
    minor; the outcome is therefore confirmed over ℚ (:func:`_exact_outcome`), so the modulus only
    decides when sampling stops."""

    def __init__(self, n: int):
        self.n = n
        self.pivots: dict[int, list[int]] = {}  # pivot column -> its row (mod p), pivot entry 1
        self.rows: list[int] = []  # index (in the caller's list) of each row that raised the rank
        self.inconsistent = False

    def add(self, row: tuple, index: int) -> None:
        r = [(int(c.numerator) % PRIME) * pow(int(c.denominator) % PRIME, PRIME - 2, PRIME) % PRIME for c in row]
        for pc, piv in self.pivots.items():
            f = r[pc]
            if f:
                r = [(a - f * b) % PRIME for a, b in zip(r, piv)]
        lead = next((j for j in range(self.n) if r[j]), None)
        if lead is None:
            self.inconsistent = self.inconsistent or bool(r[self.n])
            return
        col: int = lead
        inv = pow(r[col], PRIME - 2, PRIME)
        r = [a * inv % PRIME for a in r]
        for c2, piv in self.pivots.items():  # keep the basis reduced: pivot columns 0 in the other rows
            f = piv[col]
            if f:
                self.pivots[c2] = [(a - f * b) % PRIME for a, b in zip(piv, r)]
        self.pivots[col] = r
        self.rows.append(index)

    @property
    def rank(self) -> int:
        return len(self.pivots)


def _exact_outcome(eqs: list, n: int, echelon: _Echelon, rank: int) -> tuple[int, bool, list | None]:
    """(rank, consistent, unique solution or None) over ℚ: from the n rows that were independent
    modulo the prime, every row then checked exactly; the whole system's exact reduction otherwise."""
    if echelon.rank == n and not echelon.inconsistent:
        basis = [eqs[i] for i in echelon.rows]
        _, ok, sol = _solve_rows(basis, n, solve=True)
        if ok and sol is not None and all(sum(c * x for c, x in zip(row[:n], sol)) + row[n] == 0 for row in eqs):
            return n, True, sol
    return _solve_rows(eqs, n, solve=True)


def _solve_affine(
    rows: list, xs: list, free: list, fixed: dict, varying: list, rng: random.Random, budget: Budget, max_points: int
) -> tuple[dict | None, dict, str]:
    """:func:`solve_sampled` for residuals affine in the unknowns by their form: the same points,
    the same stopping rule and outcomes, each equation evaluated as its exact coefficient row."""
    n = len(xs)
    eqs: list = []
    seen: set = set()
    rank, stable = -1, 0
    echelon = _Echelon(n)
    for point in _points(fixed, varying, rng, budget, max_points):
        pt = [int(point[s]) for s in free]
        for f in rows:
            try:
                row = tuple(MPQ(c) for c in f(pt))
            except ZeroDivisionError:  # pragma: no cover - a pole at the point
                continue
            if not any(row) or row in seen:
                continue
            if not any(row[:n]):
                return None, fixed, "the residual does not depend on the unknowns and is not zero"
            seen.add(row)
            eqs.append(row)
            echelon.add(row, len(eqs) - 1)
        if not eqs:
            continue
        if echelon.inconsistent:
            r, consistent, _ = _solve_rows(eqs, n)  # confirmed exactly (a prime can fake it, rarely)
            if not consistent:
                return None, fixed, "inconsistent: no value of the unknowns works"
            echelon.inconsistent = False
        r = echelon.rank
        stable, stop = _settled(r, rank, stable, n)
        rank = r
        if stop:
            break
    if not eqs:
        return None, fixed, "no equation involves the unknowns"
    exact_rank, consistent, sol = _exact_outcome(eqs, n, echelon, rank)
    if not consistent:
        return None, fixed, "inconsistent: no value of the unknowns works"
    if sol is None:
        return None, fixed, f"not unique (rank {exact_rank} of {n})"
    return {x: QQ.to_sympy(v) for x, v in zip(xs, sol)}, fixed, ""


__all__ = ["POLY_LIMITS", "exact_value", "solve_sampled", "unique_linear"]
