"""The groups a rule's elements are drawn from, in every form a checker needs.

* :func:`sample` — a seeded float64 draw with a controlled condition number κ (torch checker,
  testing API, precision checker): GL with singular values log-spaced in [κ^-½, κ^½] (as the
  built-in actions), Haar-random O / SO, rotations fixing the all-ones vector, diagonals with
  entries of both signs (or positive) spread over [κ^-½, κ^½], random permutations, small
  translations, a non-zero scalar;
* :func:`exact` — a float draw made exact for the precision checker (entries as exact numbers;
  rotations replaced by the exactly orthogonal Cayley rotation next to them);
* :func:`tangent_basis` — a basis of the Lie algebra (the derivatives at the identity of the
  one-parameter subgroups), as displacements from the identity element (nullity checker);
* :func:`identity` — the identity element (translations: zero).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from ..actions.base import random_gl, random_orthogonal, rotation_fixing_ones
from ..claims.rule import Element
from ..errors import GaugeAuditError
from ..precision.linalg import inverse
from ..precision.transforms import exact_rotation
from ..runtime import stacked_det

TRANSLATION_SCALE = 0.1  # as the built-in bias shifts


def rotary_layout(n: int, planes: tuple) -> tuple[list[tuple[int, int]], list[int]]:
    """(the rotary planes, the pass-through coordinates) of an n-wide head: every coordinate in no
    plane passes through RoPE unrotated (all of them without RoPE)."""
    used = {i for p in planes for i in p}
    return [tuple(p) for p in planes], [i for i in range(n) if i not in used]


def _embed(idx: list[int], block: torch.Tensor, out: torch.Tensor) -> None:
    for a, i in enumerate(idx):
        for b, j in enumerate(idx):
            out[i, j] = block[a, b]


def _rotary(el: Element, n: int, planes: tuple, g: torch.Generator, kappa: float) -> torch.Tensor:
    """A random element of a rotary group: per plane r·[[cos θ, sin θ], [−sin θ, cos θ]] (r = 1 for
    the orthogonal ones, θ = 0 for the diagonal one), and on the pass-through block the group's own
    element (GL κ-controlled, O / SO Haar, a signed diagonal)."""
    pl, rest = rotary_layout(n, planes)
    out = torch.zeros(n, n, dtype=torch.float64)
    grp = el.group
    for i, j in pl:
        r = float(_spread(1, g, kappa)) if grp in ("rotary-GL", "rotary-diagonal") else 1.0
        if grp == "rotary-diagonal":
            r = r * (-1.0 if float(torch.rand(1, generator=g)) < 0.5 else 1.0)
        th = 0.0 if grp == "rotary-diagonal" else float(2 * torch.pi * torch.rand(1, generator=g, dtype=torch.float64))
        c, s = r * math.cos(th), r * math.sin(th)
        out[i, i], out[j, j], out[i, j], out[j, i] = c, c, s, -s
    if rest:
        p = len(rest)
        if grp == "rotary-GL":
            block = random_gl(p, g, kappa)
        elif grp == "rotary-diagonal":
            block = torch.diag(_spread(p, g, kappa) * torch.where(torch.rand(p, generator=g) < 0.5, -1.0, 1.0))
        else:
            block = random_orthogonal(p, g, special=grp == "rotary-SO")
        _embed(rest, block.to(torch.float64), out)
    return out


def size(el: Element, dims: dict) -> int:
    if el.dim is None:
        return 1
    return dims[el.dim] if isinstance(el.dim, str) else el.dim


def _spread(n: int, g: torch.Generator, kappa: float) -> torch.Tensor:
    """n values in [κ^-½, κ^½], log-uniform."""
    return kappa ** (torch.rand(n, generator=g, dtype=torch.float64) - 0.5)


def sample(el: Element, dims: dict, g: torch.Generator, kappa: float, planes: tuple = ()) -> tuple[torch.Tensor, float]:
    """A random element (2-D: n×n, a 1×n row, or 1×1) and its condition number; ``planes``: the
    model's rotary planes (the rotary groups are defined by them)."""
    if kappa < 1:
        raise GaugeAuditError(f"condition number must be >= 1, got {kappa}")
    n = size(el, dims)
    grp = el.group
    if grp.startswith("rotary-"):
        m = _rotary(el, n, planes, g, kappa)
        return m, float(torch.linalg.cond(m)) if grp in ("rotary-GL", "rotary-diagonal") else 1.0
    if grp == "O1":
        r = rotation_fixing_ones(n, g)
        if n > 1 and float(torch.rand(1, generator=g)) < 0.5:
            r = r[[1, 0, *range(2, n)], :]  # the swap of two coordinates: a reflection that fixes 1
        return r, 1.0
    if grp in ("diagonal-matrix", "signs"):
        s = _spread(n, g, kappa) if grp == "diagonal-matrix" else torch.ones(n, dtype=torch.float64)
        s = s * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        return torch.diag(s), float(s.abs().max() / s.abs().min())
    if grp == "GL":
        m = random_gl(n, g, kappa)
        return m, float(torch.linalg.cond(m))
    if grp in ("O", "SO"):
        return random_orthogonal(n, g, special=grp == "SO"), 1.0
    if grp == "SO1":
        return rotation_fixing_ones(n, g), 1.0
    if grp in ("diagonal", "positive-diagonal"):
        s = _spread(n, g, kappa)
        if grp == "diagonal":
            s = s * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        return s.reshape(1, n), float(s.abs().max() / s.abs().min())
    if grp == "permutation":
        return torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=g)], 1.0
    if grp == "translation":
        return TRANSLATION_SCALE * torch.randn(1, n, generator=g, dtype=torch.float64), 1.0
    if grp == "scalar":
        c = _spread(1, g, kappa) * (-1.0 if float(torch.rand(1, generator=g)) < 0.5 else 1.0)
        return c.reshape(1, 1), 1.0
    raise GaugeAuditError(f"unknown group {grp!r}")  # pragma: no cover - validated at load time


def identity(el: Element, dims: dict) -> torch.Tensor:
    n = size(el, dims)
    if el.kind == "matrix":
        return torch.eye(n, dtype=torch.float64)
    if el.group == "translation":
        return torch.zeros(1, n, dtype=torch.float64)
    return torch.ones(1, n, dtype=torch.float64)


def _unit(n: int, i: int, j: int) -> torch.Tensor:
    a = torch.zeros(n, n, dtype=torch.float64)
    a[i, j] = 1.0
    return a


def tangent_basis(el: Element, dims: dict, planes: tuple = ()) -> list[torch.Tensor]:
    """A basis of the Lie algebra as tangent vectors at the identity (same shape as the element).
    Finite groups (permutations, signs) have none."""
    n = size(el, dims)
    grp = el.group
    out = []
    if grp.startswith("rotary-"):
        pl, rest = rotary_layout(n, planes)
        for i, j in pl:
            if grp in ("rotary-GL", "rotary-diagonal"):
                out.append(_unit(n, i, i) + _unit(n, j, j))  # the plane's scale
            if grp != "rotary-diagonal":
                out.append(_unit(n, i, j) - _unit(n, j, i))  # the plane's rotation
        for pos, i in enumerate(rest):
            for j in rest[pos:]:
                if grp == "rotary-GL":
                    out += [_unit(n, i, j)] + ([_unit(n, j, i)] if j != i else [])
                elif grp == "rotary-diagonal" and i == j:
                    out.append(_unit(n, i, i))
                elif grp in ("rotary-O", "rotary-SO") and i != j:
                    out.append(_unit(n, i, j) - _unit(n, j, i))
        return out
    if grp == "diagonal-matrix":
        return [_unit(n, i, i) for i in range(n)]
    if grp == "O1":
        grp = "SO1"  # the same Lie algebra
    if grp == "GL":
        for i in range(n):
            for j in range(n):
                a = torch.zeros(n, n, dtype=torch.float64)
                a[i, j] = 1.0
                out.append(a)
    elif grp in ("O", "SO"):
        for i in range(n):
            for j in range(i + 1, n):
                a = torch.zeros(n, n, dtype=torch.float64)
                a[i, j], a[j, i] = 1.0, -1.0
                out.append(a)
    elif grp == "SO1":
        # skew A with A·1 = 0: P·E_ij·P for the projector P onto 1^⊥, then an independent subset
        p = torch.eye(n, dtype=torch.float64) - torch.full((n, n), 1.0 / n, dtype=torch.float64)
        cands = []
        for i in range(n):
            for j in range(i + 1, n):
                a = torch.zeros(n, n, dtype=torch.float64)
                a[i, j], a[j, i] = 1.0, -1.0
                cands.append(p @ a @ p)
        if cands:  # an orthonormal basis of their span (dimension (n−1)(n−2)/2), from the SVD
            _, sv, vh = torch.linalg.svd(torch.stack([c.reshape(-1) for c in cands]), full_matrices=False)
            out = [vh[k].reshape(n, n) for k in range((n - 1) * (n - 2) // 2)]
    elif grp in ("diagonal", "positive-diagonal", "translation"):
        for i in range(n):
            a = torch.zeros(1, n, dtype=torch.float64)
            a[0, i] = 1.0
            out.append(a)
    elif grp == "scalar":
        out.append(torch.ones(1, 1, dtype=torch.float64))
    return out


# ----------------------------------------------------------------------------- exact forms
def exact(el: Element, value: torch.Tensor, num, planes: tuple = ()) -> list:
    """The float64 draw as an exact element: entries converted by ``num`` (a float → the number
    type, exactly); O / SO / SO1 made exactly orthogonal (a det −1 element of O(n) through
    diag(−1, 1, …)·R so the Cayley transform exists)."""
    data = [[num(x) for x in row] for row in value.tolist()]
    if el.group in ("O", "SO", "SO1", "O1", "rotary-O", "rotary-SO") and len(data) > 1:
        # a det −1 element through a reflection F (F·R ∈ SO, so the Cayley transform exists): a sign
        # flip of one coordinate — a pass-through one for the rotary groups (a reflection inside a
        # rotary plane does not commute with RoPE) —, the swap of two coordinates for O1 (it fixes 1)
        flip = float(stacked_det(value)) < 0
        k = 0
        if el.group.startswith("rotary-"):
            pl, rest = rotary_layout(len(data), planes)
            k = rest[0] if rest else 0
        if flip:
            data = _reflect(data, el.group == "O1", k)
        data = exact_rotation(data, fix_ones=el.group in ("SO1", "O1"))
        if flip:
            data = _reflect(data, el.group == "O1", k)
    return data


def _reflect(data: list, swap: bool, k: int) -> list:
    if swap:
        return [data[1], data[0], *data[2:]]
    return [[-x for x in row] if i == k else row for i, row in enumerate(data)]


def dyadic(el: Element, value: torch.Tensor, grid: int, planes: tuple = ()) -> list:
    """The draw rounded to multiples of 1/grid (Fractions) for a certificate: still in its group
    (rotations re-made exactly orthogonal, diagonals kept non-zero / positive, permutations and
    translations exact), and checked invertible."""

    def frac(x: float) -> Fraction:
        return Fraction(round(x * grid), grid)

    rounded = torch.tensor([[float(frac(x)) for x in row] for row in value.tolist()], dtype=torch.float64)
    if el.group in ("diagonal", "positive-diagonal", "scalar"):
        rounded = torch.where(rounded == 0, torch.sign(value) / grid, rounded)
    if el.group in ("diagonal-matrix", "rotary-diagonal"):  # keep the diagonal invertible
        d = torch.diagonal(rounded)
        d.copy_(torch.where(d == 0, torch.sign(torch.diagonal(value)) / grid, d))
    data = exact(el, rounded, Fraction, planes)
    if el.kind == "matrix":
        inverse(data)  # raises GaugeAuditError when the rounded element is singular
    return data


__all__ = ["dyadic", "exact", "identity", "rotary_layout", "rotation_fixing_ones", "sample", "size", "tangent_basis"]
