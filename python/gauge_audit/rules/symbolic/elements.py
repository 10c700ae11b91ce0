"""Generic group elements for the symbolic checker: exact rational points of every connected
component of a declared group, drawn at random from integers in [1, ``spread``].

A non-zero polynomial of degree D vanishes at such a point with probability ≤ D/spread
(Schwartz–Zippel), so an identity that holds at two independent draws holds for the generic
element up to that probability; :func:`element_assignments` gives every unit of a rule its
points.  ``spread`` is a parameter (default :data:`SPREAD`) so that the counterexample search can
draw small elements (entries 1..4) with the same samplers.
"""

from __future__ import annotations

import itertools
import random

import sympy as sp

from ...claims.rule import Element, Rule
from ...errors import GaugeAuditError
from ..engine import Shape, units
from ..groups import rotary_layout

SPREAD = 2**20  # random integers in [1, SPREAD]: a non-zero polynomial of degree D vanishes at a
DRAWS = 2  # random point with probability ≤ D/SPREAD (Schwartz–Zippel); two independent draws
MAX_ASSIGNMENTS = 32


def random_int(rng: random.Random, signed: bool = True, spread: int = SPREAD) -> int:
    v = rng.randint(1, spread)
    return -v if signed and rng.random() < 0.5 else v


def _rational_skew(n: int, rng: random.Random, spread: int) -> sp.Matrix:
    a = sp.zeros(n, n)
    for i in range(n):
        for j in range(i + 1, n):
            v = sp.Rational(random_int(rng, spread=spread), rng.randint(1, spread))
            a[i, j], a[j, i] = v, -v
    return a


def _cayley(a: sp.Matrix) -> sp.Matrix:
    n = a.shape[0]
    return (sp.eye(n) - a) * (sp.eye(n) + a).inv()


def _signs(n: int, rng: random.Random) -> list[tuple]:
    """Every sign pattern of n entries (n ≤ 4), else six random ones."""
    if n <= 4:
        return list(itertools.product((1, -1), repeat=n))
    return [tuple(rng.choice((1, -1)) for _ in range(n)) for _ in range(6)]


def _rational_rotation(rng: random.Random, spread: int) -> tuple:
    """(cos, sin) of an exact rational plane rotation: ((1 − t²), 2t)/(1 + t²), t random rational."""
    t = sp.Rational(random_int(rng, spread=spread), rng.randint(1, spread))
    return (1 - t**2) / (1 + t**2), 2 * t / (1 + t**2)


def _rotary_points(el: Element, n: int, rng: random.Random, spread: int, planes: tuple) -> list[sp.Matrix]:
    """The rotary groups (the commutant of the rotary rotations): a·I + b·J in every plane (b = 0 for
    the diagonal one, a² + b² = 1 for the orthogonal ones), the group's own element on the
    pass-through block; one point of every component of the pass-through block's group."""
    pl, rest = rotary_layout(n, planes)
    grp = el.group.removeprefix("rotary-")
    m = sp.zeros(n, n)
    for i, j in pl:
        if grp in ("O", "SO"):
            a, b = _rational_rotation(rng, spread)
        else:
            a, b = random_int(rng, spread=spread), (random_int(rng, spread=spread) if grp == "GL" else 0)
        m[i, i], m[j, j], m[i, j], m[j, i] = a, a, b, -b
    if not rest:
        return [m]
    sub = group_points(
        Element(el.symbol, grp if grp != "diagonal" else "diagonal-matrix", len(rest)), len(rest), rng, spread
    )
    out = []
    for blk in sub[:4]:
        x = m.copy()
        for a, i in enumerate(rest):
            for b, j in enumerate(rest):
                x[i, j] = blk[a, b]
        out.append(x)
    return out


def group_points(el: Element, n: int, rng: random.Random, spread: int = SPREAD, planes: tuple = ()) -> list[sp.Matrix]:
    """One random exact point of every connected component of the group (both determinant signs of
    GL and O, every sign pattern of a diagonal), every permutation of permutation(n) (n ≤ 4).
    ``planes``: the model's rotary planes (they define the rotary groups)."""
    grp = el.group
    if grp.startswith("rotary-"):
        return _rotary_points(el, n, rng, spread, planes)
    if grp == "O1":
        r = group_points(Element(el.symbol, "SO1", n), n, rng, spread)[0]
        return [r, r.extract([1, 0, *range(2, n)], list(range(n)))] if n > 1 else [r]
    if grp in ("diagonal-matrix", "signs"):
        mags = [random_int(rng, signed=False, spread=spread) if grp == "diagonal-matrix" else 1 for _ in range(n)]
        return [sp.diag(*[m * s for m, s in zip(mags, sg)]) for sg in _signs(n, rng)]
    if grp == "GL":
        while True:
            m = sp.Matrix(n, n, lambda i, j: random_int(rng, spread=spread))
            if m.det() != 0:
                break
        flip = sp.diag(-1, *([1] * (n - 1)))
        return [m, flip * m] if n > 0 else [m]
    if grp in ("O", "SO", "SO1"):
        if n == 1:
            return [sp.eye(1)] if grp != "O" else [sp.eye(1), -sp.eye(1)]
        a = _rational_skew(n, rng, spread)
        if grp == "SO1":
            p = sp.eye(n) - sp.ones(n, n) / n
            a = p * a * p
        r = _cayley(a)
        return [r, sp.diag(-1, *([1] * (n - 1))) * r] if grp == "O" else [r]
    if grp in ("diagonal", "positive-diagonal"):
        mags = [random_int(rng, signed=False, spread=spread) for _ in range(n)]
        signs = [(1,) * n] if grp == "positive-diagonal" else list(itertools.product((1, -1), repeat=n))
        return [sp.Matrix([[m * s for m, s in zip(mags, sg)]]) for sg in signs]
    if grp == "translation":
        return [sp.Matrix([[random_int(rng, spread=spread) for _ in range(n)]])]
    if grp == "scalar":
        c = random_int(rng, signed=False, spread=spread)
        return [sp.Matrix([[c]]), sp.Matrix([[-c]])]
    if grp == "permutation":
        perms = list(itertools.permutations(range(n))) if n <= 4 else [tuple(rng.sample(range(n), n)) for _ in range(6)]
        return [sp.eye(n)[list(p), :] for p in perms]
    raise GaugeAuditError(f"unknown group {grp!r}")  # pragma: no cover


def element_assignments(
    rule: Rule, shape: Shape, seed: int = 0, draws: int = DRAWS, override: dict | None = None, spread: int = SPREAD
) -> list[dict]:
    """Exact group elements for every unit: every component combination, ``draws`` independent
    random points each (at most MAX_ASSIGNMENTS, a deterministic sample beyond that).  ``override``
    maps a symbol to the list of values to use instead (a subgroup's points); ``spread`` bounds the
    random integers the points are made of."""
    out = []
    us = units(rule, shape)
    probe = random.Random(0)
    if all(
        len(group_points(el, element_size(el, shape.dims), probe, spread, shape.planes)) > 1 for el in rule.elements
    ):
        draws = 1  # every element already takes ≥ 2 independent random points (its components)
    for k in range(draws):
        rng = random.Random(1000 * seed + k)
        per_unit = []
        for u in us:
            choices = []
            for el in rule.elements:
                vals = (override or {}).get(el.symbol)
                vals = (
                    vals[k % len(vals)]
                    if vals
                    else group_points(el, element_size(el, shape.dims), rng, spread, shape.planes)
                )
                choices.append([(el.symbol, v) for v in vals])
            per_unit.append([(u, dict(c)) for c in itertools.product(*choices)])
        combos = [dict(c) for c in itertools.product(*per_unit)]
        if len(combos) > MAX_ASSIGNMENTS // draws:
            combos = random.Random(seed + k).sample(combos, MAX_ASSIGNMENTS // draws)
        out += combos
    return out


def element_size(el: Element, dims: dict) -> int:
    if el.dim is None:
        return 1
    return dims[el.dim] if isinstance(el.dim, str) else el.dim
