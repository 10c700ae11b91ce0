"""Dense linear algebra on nested Python lists, generic over the number type.

The same code runs on ``fractions.Fraction`` (exact: the certified counterexamples
transform rational parameters with no rounding at all), on ``mpmath.mpf`` at the
working precision (the dps-scaled residuals) and, for products only, on
``mpmath.iv`` intervals.  Nothing here touches torch.

Matrices are lists of rows; vectors are plain lists.  Row-vector convention, as in
:mod:`gauge_audit.models.layers`: ``x @ W`` is ``vecmat(x, W)``.
"""

from __future__ import annotations

from fractions import Fraction

import mpmath
from mpmath import mp
from mpmath.libmp import bitcount, from_man_exp, fzero, mpf_add, mpf_mul

from ..errors import GaugeAuditError

_MPF = type(mp.mpf(0))


def dot(a, b):
    """Σ a_i b_i.  For mpf vectors the products and their sum are formed exactly and
    rounded once to the working precision (a correctly rounded dot product); anything
    else (Fractions: exact; intervals: enclosing) is a left-to-right Python sum."""
    if a and isinstance(a[0], _MPF) and isinstance(b[0], _MPF):
        return mp.make_mpf(_mpf_dot(a, b, mp.prec))
    it = iter(zip(a, b))
    try:
        x, y = next(it)
    except StopIteration:
        return 0
    s = x * y
    for x, y in it:
        s = s + x * y
    return s


def _mpf_dot(a, b, prec: int) -> tuple:
    """The raw mpf of ``mpf_sum([mpf_mul(x, y) …], prec, "n")`` (mpmath's exact sum of the exact
    products, rounded once), with the products formed in the summing loop: the same integer
    arithmetic and the same cut-offs for extreme exponent differences — equal bit for bit — without
    a tuple and two calls per term (the precision checker's forwards are mostly this loop)."""
    man = 0
    exp = 0
    max_extra_prec = prec * 2 or 1000000
    special = None
    for x, y in zip(a, b):
        xsign, xm, xe, xb = x._mpf_
        ysign, ym, ye, yb = y._mpf_
        pman = xm * ym
        if not pman:  # a zero, an infinity or a NaN among the factors: mpmath's own product
            p = mpf_mul(x._mpf_, y._mpf_)
            if p[2] and not p[1]:  # an infinity or a NaN
                special = mpf_add(special or fzero, p, 1)
            continue
        pexp = xe + ye
        if xsign ^ ysign:
            pman = -pman
        delta = pexp - exp
        if pexp >= exp:
            if (delta > max_extra_prec) and ((not man) or delta - bitcount(abs(man)) > max_extra_prec):
                man = pman
                exp = pexp
            else:
                man += pman << delta
        else:
            delta = -delta
            # the product's bit count is xb + yb or xb + yb − 1: counted only where that decides
            hi = xb + yb
            if delta - hi > max_extra_prec:
                small = True
            elif delta - hi + 1 <= max_extra_prec:
                small = False
            else:
                small = delta - bitcount(abs(pman)) > max_extra_prec
            if small:
                if not man:
                    man, exp = pman, pexp
            else:
                man = (man << delta) + pman
                exp = pexp
    if special:
        return special
    return from_man_exp(man, exp, prec, "n")


def transpose(a: list) -> list:
    return [list(col) for col in zip(*a)]


def matmul(a: list, b: list) -> list:
    cols = transpose(b)
    return [[dot(row, col) for col in cols] for row in a]


def vecmat(x: list, w: list) -> list:
    """Row vector times matrix."""
    return [dot(x, col) for col in transpose(w)]


def identity(n: int, one=1, zero=0) -> list:
    return [[one if i == j else zero for j in range(n)] for i in range(n)]


def add(a: list, b: list) -> list:
    if a and isinstance(a[0], list):
        return [add(x, y) for x, y in zip(a, b)]
    return [x + y for x, y in zip(a, b)]


def sub(a: list, b: list) -> list:
    if a and isinstance(a[0], list):
        return [sub(x, y) for x, y in zip(a, b)]
    return [x - y for x, y in zip(a, b)]


def scale(a: list, c) -> list:
    if a and isinstance(a[0], list):
        return [scale(x, c) for x in a]
    return [x * c for x in a]


def inverse(a: list) -> list:
    """Gauss–Jordan elimination with partial pivoting.

    Exact for Fractions; backward stable at the working precision for mpf (so the
    computed inverse is accurate to about κ(a)·2^-prec).  A singular matrix is a
    :class:`GaugeAuditError`.
    """
    n = len(a)
    if any(len(r) != n for r in a):
        raise GaugeAuditError(f"cannot invert a non-square {n}x{len(a[0])} matrix")
    one = a[0][0] * 0 + 1
    m = [list(r) + [one if i == j else one * 0 for j in range(n)] for i, r in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if m[p][c] == 0:
            raise GaugeAuditError("group element is singular (zero pivot in Gauss–Jordan elimination)")
        m[c], m[p] = m[p], m[c]
        piv = m[c][c]
        m[c] = [x / piv for x in m[c]]
        for r in range(n):
            if r != c and m[r][c] != 0:
                f = m[r][c]
                m[r] = [x - f * y for x, y in zip(m[r], m[c])]
    return [r[n:] for r in m]


def flatten(a) -> list:
    if isinstance(a, list):
        return [y for x in a for y in flatten(x)]
    return [a]


def shape(a) -> tuple:
    s = []
    while isinstance(a, list):
        s.append(len(a))
        a = a[0] if a else None
    return tuple(s)


def to_fraction(x: float, denominator: int | None = None) -> Fraction:
    """The float exactly (``denominator`` None) or rounded to the grid 1/denominator."""
    if denominator is None:
        return Fraction(x)
    return Fraction(round(x * denominator), denominator)


def convert(a, fn):
    """Apply ``fn`` to every leaf of a nested list."""
    if isinstance(a, list):
        return [convert(x, fn) for x in a]
    return fn(a)


def cayley(a: list) -> list:
    """(I − A)(I + A)⁻¹: orthogonal with determinant +1 whenever A is skew-symmetric,
    exactly in rational arithmetic and to the working precision in mpf."""
    n = len(a)
    one = a[0][0] * 0 + 1
    eye = identity(n, one, one * 0)
    return matmul(sub(eye, a), inverse(add(eye, a)))


def mp_matrix(a: list) -> mpmath.matrix:  # pragma: no cover - convenience for interactive use
    return mp.matrix(a)
