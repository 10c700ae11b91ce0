"""Compare the measured null space with the theory's generators.

For every family: ‖J·v‖ against a derived tolerance, the rank of its vectors against
its formula; for the union: its rank, and the measured nullity minus that rank (the
*unexplained* dimension).  Unexplained directions are returned with their dominant
parameter blocks — a finding to explain, not a failure to hide.

Tolerance for ‖J·v‖ (an exact generator has J·v = 0)::

    tol(v) = L · K · ε · ‖J‖_F · ‖v‖

K is the path length (:func:`path_length`, as in :mod:`gauge_audit.numeric`) (the summed inner-
product lengths along one block, so each computed entry of J carries a relative error
≲ K·ε, Higham §3.1), L the number of layers those errors accumulate over, and
‖E‖₂ ≤ ‖|J|‖₂ ≤ ‖J‖_F bounds how an entrywise relative error K·ε·|J| acts on v.
A wrong generator has ‖J·v‖ ≥ σ_min⁺(J)·dist(v, ker J), orders of magnitude above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..numeric import path_length  # the same rounding model as the torch check
from .families import Family
from .measure import EPS64, Problem, numerical_rank


def generator_tolerance(problem: Problem, j_fro: float) -> tuple[float, str]:
    """Relative tolerance on ‖J·v‖/‖v‖ and its formula."""
    K, k_text = path_length(problem.cfg, problem.seq_len)
    L = max(1, problem.cfg.n_layers)
    tol = L * K * EPS64 * j_fro
    return tol, f"L·K·ε·‖J‖_F = {L}·{K}·ε·{j_fro:.3g}  (K = {k_text})"


@dataclass
class Span:
    """The row span of a stack of generators (rows normalised): its rank, the singular values of
    the normalised stack, and — computed only when asked for — an orthonormal basis."""

    rank: int
    s: torch.Tensor  # singular values of the normalised stack, descending
    rows: torch.Tensor = field(repr=False)  # the normalised stack (k × P)
    _eig: tuple | None = field(default=None, repr=False)  # (U, √λ) of the Gram, fast path
    _basis: torch.Tensor | None = field(default=None, repr=False)

    def basis(self) -> torch.Tensor:
        """P × rank, orthonormal (nᵀ·U·Λ^{-1/2} on the fast path: orthonormal to ~ε·κ²)."""
        if self._basis is None:
            assert self._eig is not None  # the fast path keeps the Gram's eigenpairs instead of a basis
            U, root = self._eig
            self._basis = self.rows.T @ (U / root[None, :])
        return self._basis

    def frame(self) -> torch.Tensor:
        """P × rank, columns spanning it: the normalised generators themselves when independent
        (the fast path), else the orthonormal basis."""
        return self.rows.T if self._basis is None else self._basis

    def project_out(self, X: torch.Tensor) -> torch.Tensor:
        """X − X·Q·Qᵀ for the rows of X (Q the basis), without forming Q on the fast path."""
        if self.rank == 0:
            return X
        if self._basis is None:
            assert self._eig is not None  # the fast path keeps the Gram's eigenpairs instead of a basis
            U, root = self._eig
            return X - ((X @ self.rows.T) @ (U / (root * root)[None, :]) @ U.T) @ self.rows
        Q = self._basis
        return X - (X @ Q) @ Q.T


def _gram(parts: list[torch.Tensor]) -> torch.Tensor:
    """The Gram of the stacked rows of ``parts``, block by block on the columns both blocks touch
    (generator families are sparse: most pairs share few or no coordinates)."""
    sups = [torch.nonzero((a != 0).any(0)).flatten() for a in parts]
    offs = [0]
    for a in parts:
        offs.append(offs[-1] + a.shape[0])
    G = torch.zeros(offs[-1], offs[-1], dtype=torch.float64)
    P = parts[0].shape[1]
    for i, a in enumerate(parts):
        for j in range(i + 1):
            mask = torch.zeros(P, dtype=torch.bool)
            mask[sups[i]] = True
            common = sups[j][mask[sups[j]]]
            if common.numel() == 0:
                continue
            blk = a[:, common] @ parts[j][:, common].T
            G[offs[i] : offs[i + 1], offs[j] : offs[j + 1]] = blk
            G[offs[j] : offs[j + 1], offs[i] : offs[i + 1]] = blk.T
    return G


def span_rank(blocks: list[torch.Tensor]) -> Span:
    """The span of the stacked rows of ``blocks`` (each k_i × P, e.g. one per family), rows normalised."""
    P = blocks[0].shape[1]
    parts = [a / torch.linalg.vector_norm(a, dim=1, keepdim=True).clamp_min(1e-300) for a in blocks if a.shape[0]]
    if not parts:
        return Span(
            0,
            torch.zeros(0, dtype=torch.float64),
            torch.zeros(0, P, dtype=torch.float64),
            _basis=torch.zeros(P, 0, dtype=torch.float64),
        )
    n = torch.cat(parts) if len(parts) > 1 else parts[0]
    k = n.shape[0]
    if 2 * k <= P:
        # fast path for a tall, clearly full-rank stack (κ < 100): the k × k Gram's eigenvectors
        # give the basis nᵀ·U·Λ^{-1/2} in a fraction of a QR's time
        ev, U = torch.linalg.eigh(_gram(parts))
        if float(ev[0]) > 1e-4 * float(ev[-1]):
            root = torch.sqrt(ev.flip(0))
            return Span(k, root, n, _eig=(U.flip(1), root))
    q, r = torch.linalg.qr(n.T)  # P × k, k × k
    u, s, _ = torch.linalg.svd(r)
    # rank by the largest gap of the normalised generators' spectrum (extended by the noise floor)
    rank = numerical_rank(s, min_gap=1.0).rank
    return Span(rank, s, n, _basis=q @ u[:, :rank])


def support_rank(V: torch.Tensor) -> int:
    """rank of the rows of V, computed on the columns they touch (generators are sparse)."""
    sup = (V != 0).any(0)
    return span_rank([V[:, sup]]).rank


@dataclass
class Unexplained:
    count: int
    directions: torch.Tensor  # (P × count) orthonormal, in ker J ∩ span(generators)^⊥
    blocks: list[list[tuple[str, float]]]  # per direction: dominant parameter blocks (name, share)


@dataclass
class Explanation:
    families: list[Family]
    explained: int  # rank of the span of the flat families
    predicted: int  # Σ of their formulas
    tolerance_formula: str
    all_within_tolerance: bool
    overlap: int  # predicted − explained (0: the families are independent)
    span: Span | None = field(repr=False, default=None)  # of the flat families' generators

    @property
    def basis(self) -> torch.Tensor:
        """P × explained, orthonormal."""
        assert self.span is not None  # set by explain
        return self.span.basis()

    def by_family(self) -> dict[str, int]:
        return flat_ranks(self.families)


def flat_ranks(families: list[Family]) -> dict[str, int]:
    """name → rank of every flat family (ranks are set by :func:`explain`)."""
    out = {}
    for f in families:
        if f.flat:
            assert f.rank is not None
            out[f.name] = f.rank
    return out


def check_families(
    problem: Problem,
    fams: list[Family],
    JV: list[torch.Tensor],
    j_fro: float,
    threshold: float | None,
    exact_span: Span | None = None,
) -> Explanation:
    """Record residuals and ranks; decide ε-broken families against the rank threshold.

    ``JV[i]`` is J·vᵢ for the rows of family i (k × rows); ``threshold`` is the absolute
    singular-value threshold of the measurement (None: no measurement to compare with);
    ``exact_span``: :func:`span_rank` of the exact families' vectors, if already computed.
    """
    tol_rel, formula = generator_tolerance(problem, j_fro)
    ok = True
    exact = [f.vectors for f in fams if f.kind != "eps-broken"]
    if exact_span is None:
        exact_span = span_rank(exact or [torch.zeros(0, problem.P, dtype=torch.float64)])
    for f, jv in zip(fams, JV):
        vec = f.vectors
        if f.kind == "eps-broken":
            # its singular value: ‖J·v‖ over the part of v outside the exact kernel
            vec = exact_span.project_out(vec)
        norms = torch.linalg.vector_norm(vec, dim=1).clamp_min(1e-300)
        res = torch.linalg.vector_norm(jv, dim=1) / norms
        f.residual = float(res.max()) if res.numel() else 0.0
        f.tolerance = tol_rel
        f.rank = support_rank(f.vectors)
        if f.kind == "eps-broken":
            # a symmetry only at ε = 0: flat for the measurement iff its singular value is below the threshold
            f.flat = threshold is not None and f.residual < threshold
            f.extra["relative_singular_value"] = f.residual / j_fro
        else:
            f.flat = True
            if f.residual > tol_rel:
                ok = False
    flat = [f for f in fams if f.flat]
    if all(f.kind != "eps-broken" for f in flat) and len(flat) == len(exact):
        span = exact_span  # the flat families are exactly the exact ones
    else:
        span = span_rank([f.vectors for f in flat] or [torch.zeros(0, problem.P, dtype=torch.float64)])
    predicted = sum(f.expected for f in flat)
    return Explanation(fams, span.rank, predicted, formula, ok, predicted - span.rank, span)


def unexplained_directions(problem: Problem, null: torch.Tensor, basis: torch.Tensor, top: int = 4) -> Unexplained:
    """ker J ∩ span(generators)^⊥: the null vectors' components outside the span."""
    if null.shape[1] == 0:
        return Unexplained(0, null, [])
    res = null - basis @ (basis.T @ null) if basis.shape[1] else null
    u, s, _ = torch.linalg.svd(res, full_matrices=False)
    count = int((s > 0.5).sum())  # singular values are ≈1 (outside the span) or ≈0 (inside)
    dirs = u[:, :count]
    blocks = []
    for i in range(count):
        shares = problem.layout.block_norms(dirs[:, i])
        blocks.append(sorted(((n, sh) for n, sh in shares.items() if sh > 1e-3), key=lambda t: -t[1])[:top])
    return Unexplained(count, dirs, blocks)


def summarize_blocks(u: Unexplained, top: int = 6) -> list[tuple[str, float]]:
    """Parameter blocks carrying the unexplained subspace, by total share."""
    if u.count == 0:
        return []
    tot: dict[str, float] = {}
    for i in range(u.count):
        for n, sh in u.blocks[i]:
            tot[n] = tot.get(n, 0.0) + sh
    return sorted(((n, v / u.count) for n, v in tot.items()), key=lambda t: -t[1])[:top]


def frobenius(J: torch.Tensor) -> float:
    return float(torch.linalg.matrix_norm(J))


__all__ = [
    "Explanation",
    "Span",
    "Unexplained",
    "check_families",
    "unexplained_directions",
    "span_rank",
    "support_rank",
    "generator_tolerance",
    "summarize_blocks",
    "frobenius",
    "math",
]
