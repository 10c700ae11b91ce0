"""Exact Lie-algebra dimensions of attention-layer symmetries.

A (possibly grouped, possibly rotary) attention layer computes its output from, per
query head i with K/V group g(i),

* the score bilinear forms  B_{i,r} = W_Q^i · R_r · W_K^{g(i)ᵀ}  (R_r = RoPE rotation for relative
  offset r; R_0 = I, and without RoPE only R_0 occurs), and
* the value–output circuit  C_i = W_V^{g(i)} · W_O^i.

The infinitesimal symmetries are the tangent directions (δW_Q, δW_K, δW_V, δW_O) that
leave every B_{i,r} and C_i unchanged to first order — the kernel of the Jacobian of
θ ↦ (B, C).  (That the layer's function determines (B, C) on the generic stratum is
the factorisation step of MGS's maximality theorem; the nullity audit checks the full
network numerically.)  The kernel dimension is computed exactly over ℚ at random
rational weights from a seeded generator; RoPE angles are rational points on the unit
circle (Pythagorean triples), so every entry stays exact.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction

import sympy as sp
from sympy.polys.domains import QQ
from sympy.polys.matrices import DomainMatrix

#: (cos, sin) on the unit circle, exact; distinct angles, none a rational multiple of π
PYTHAGOREAN = [
    (Fraction(3, 5), Fraction(4, 5)),
    (Fraction(5, 13), Fraction(12, 13)),
    (Fraction(8, 17), Fraction(15, 17)),
    (Fraction(7, 25), Fraction(24, 25)),
    (Fraction(20, 29), Fraction(21, 29)),
]


def _rand_matrix(rng: random.Random, rows: int, cols: int) -> list[list[Fraction]]:
    return [[Fraction(rng.randint(-9, 9), rng.randint(1, 5)) for _ in range(cols)] for _ in range(rows)]


def _matmul(a, b):
    n, k, m = len(a), len(b), len(b[0])
    return [[sum((a[i][t] * b[t][j] for t in range(k)), Fraction(0)) for j in range(m)] for i in range(n)]


def _transpose(a):
    return [list(r) for r in zip(*a)]


def _zeros(r, c):
    return [[Fraction(0)] * c for _ in range(r)]


def _rotation_power(cs: tuple[Fraction, Fraction], power: int):
    c, s = cs
    m = [[Fraction(1), Fraction(0)], [Fraction(0), Fraction(1)]]
    r = [[c, -s], [s, c]]
    for _ in range(power):
        m = _matmul(m, r)
    return m


def rope_matrix(planes: list[tuple[Fraction, Fraction]], offset: int):
    """Block-diagonal RoPE rotation R(offset·θ_j) over the given planes (exact)."""
    dk = 2 * len(planes)
    out = _zeros(dk, dk)
    for j, cs in enumerate(planes):
        blk = _rotation_power(cs, offset)
        for a in range(2):
            for b in range(2):
                out[2 * j + a][2 * j + b] = blk[a][b]
    return out


@dataclass(frozen=True)
class LieDim:
    dimension: int  # kernel dimension (infinitesimal symmetries)
    unknowns: int  # number of parameters varied
    rank: int  # rank of the linearised constraints
    constraints: int


def attention_symmetry_dim(
    n_q: int,
    n_kv: int,
    d_model: int,
    d_k: int,
    d_v: int,
    rope_planes: list[tuple[Fraction, Fraction]] | None = None,
    offsets: int = 4,
    seed: int = 0,
) -> LieDim:
    """Dimension of the infinitesimal symmetry algebra of one attention layer (exact, over ℚ).

    ``rope_planes`` (length d_k/2): (cos θ_j, sin θ_j) per frequency plane; None = no RoPE.
    Query head i uses K/V group i·n_kv // n_q (n_kv = n_q: MHA; 1: MQA).
    """
    if n_q % n_kv:
        raise ValueError("n_q must be a multiple of n_kv")
    rng = random.Random(seed)
    WQ = [_rand_matrix(rng, d_model, d_k) for _ in range(n_q)]
    WK = [_rand_matrix(rng, d_model, d_k) for _ in range(n_kv)]
    WV = [_rand_matrix(rng, d_model, d_v) for _ in range(n_kv)]
    WO = [_rand_matrix(rng, d_v, d_model) for _ in range(n_q)]
    group = [i * n_kv // n_q for i in range(n_q)]
    if rope_planes is None:
        rots = [None]
    else:
        if 2 * len(rope_planes) != d_k:
            raise ValueError("need d_k/2 rope planes")
        rots = [rope_matrix(rope_planes, r) for r in range(offsets)]

    # unknown blocks: (name, index, rows, cols)
    blocks = (
        [("Q", i, d_model, d_k) for i in range(n_q)]
        + [("K", g, d_model, d_k) for g in range(n_kv)]
        + [("V", g, d_model, d_v) for g in range(n_kv)]
        + [("O", i, d_v, d_model) for i in range(n_q)]
    )
    cols = []  # one column (flattened constraint image) per unknown entry

    def image(name, idx, a, b):
        """The first-order change of every (B_{i,r}, C_i) when entry (a,b) of δW_name^idx is 1."""
        out: list = []
        for i in range(n_q):
            g = group[i]
            for R in rots:
                # δB = δW_Q R W_Kᵀ + W_Q R δW_Kᵀ
                blk = _zeros(d_model, d_model)
                if name == "Q" and idx == i:
                    row = [R[b][t] if R else Fraction(int(b == t)) for t in range(d_k)]
                    for c in range(d_model):
                        blk[a][c] = sum((row[t] * WK[g][c][t] for t in range(d_k)), Fraction(0))
                if name == "K" and idx == g:
                    col = [R[t][b] if R else Fraction(int(t == b)) for t in range(d_k)]
                    for r_ in range(d_model):
                        blk[r_][a] += sum((WQ[i][r_][t] * col[t] for t in range(d_k)), Fraction(0))
                out.extend(x for rr in blk for x in rr)
            # δC = δW_V W_O + W_V δW_O
            blk = _zeros(d_model, d_model)
            if name == "V" and idx == g:
                for c in range(d_model):
                    blk[a][c] = WO[i][b][c]
            if name == "O" and idx == i:
                for r_ in range(d_model):
                    blk[r_][b] += WV[g][r_][a]
            out.extend(x for rr in blk for x in rr)
        return out

    for name, idx, rows, ncols in blocks:
        for a in range(rows):
            for b in range(ncols):
                cols.append(image(name, idx, a, b))
    n_unknowns = len(cols)
    n_cons = len(cols[0])
    mat = DomainMatrix([[QQ(x.numerator, x.denominator) for x in col] for col in cols], (n_unknowns, n_cons), QQ)
    rank = mat.rank()  # rank of the transpose = rank of the constraint matrix
    return LieDim(n_unknowns - rank, n_unknowns, rank, n_cons)


def commutant_dim(mats: list[list[list[Fraction]]]) -> int:
    """dim {A : A·R = R·A for every R in mats} (exact)."""
    n = len(mats[0])
    rows = []
    for R in mats:
        for i in range(n):
            for j in range(n):
                # (A R - R A)_{ij} = Σ_t A_it R_tj - R_it A_tj, unknown A_ab at index a*n+b
                coeff = [Fraction(0)] * (n * n)
                for t in range(n):
                    coeff[i * n + t] += R[t][j]
                    coeff[t * n + j] -= R[i][t]
                rows.append(coeff)
    mat = DomainMatrix([[QQ(x.numerator, x.denominator) for x in r] for r in rows], (len(rows), n * n), QQ)
    return n * n - mat.rank()


def to_sympy(m) -> sp.Matrix:
    return sp.Matrix([[sp.Rational(x.numerator, x.denominator) for x in r] for r in m])
