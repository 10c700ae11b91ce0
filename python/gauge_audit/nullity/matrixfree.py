"""Certify the nullity without forming J (for P beyond the dense limit).

The theory's generators span a candidate kernel.  The matrix-free path certifies that J has
no other flat direction, by inertia rather than by an SVD:

1. **The sketch.**  J here is the Jacobian over the sketch's inputs, with each position's
   outputs compressed to ⌈d_model/4⌉ random orthonormal combinations (S·J; ‖S‖ = 1 so no
   singular value grows; see :func:`sketch_width` for why few rows per position).  ≥ 1.05·(P − k)
   rows (k: the exact generators), every token used.  Its rows are streamed in blocks (reverse
   mode per sequence), straight into the certificate's coordinates; J itself is never held.
2. **Upper end.**  Every generator's image S·J·v is accumulated from the streamed rows (sparse
   families by sparse products): ‖S·J·Q‖₂ ≤ δ for an orthonormal basis Q
   of the exact generators' span, so at least k singular values are ≤ δ.
3. **Lower end, by Courant–Fischer and inertia.**  Let I be k coordinates on which Q is well
   conditioned (the row pivots of LU with partial pivoting, on the normalised generators
   themselves when independent: Q = V·C with C invertible, so Q_I is invertible with V_I, and
   no orthonormal basis need be formed).  U = {v : v_I = 0} has
   codimension k, so the (k+1)-th smallest singular value of S·J is ≥ min over U of
   ‖S·J·v‖/‖v‖ = σ_min(S·J_{:,Iᶜ}) — for *any* I; pivoting keeps the kernel out of U.  That is
   certified from the Gram G = (S·J_{:,Iᶜ}·D)ᵀ(S·J_{:,Iᶜ}·D) (lower triangle only; D a
   power-of-two column scaling, exact) by one floating-point Cholesky factorisation of
   G − τI, τ = 2c: if it completes, G − τI is positive definite up to rounding, so
   λ_min(G) ≥ τ − c with

       c = (γ_{n+1}/(1 − γ_{n+1}) + γ_m) · tr(G)

   (γ_m: forming G from m rows, |Ĝ − G| ≤ γ_m·|SJ|ᵀ|SJ|; γ_{n+1}: Cholesky's backward error
   |ΔA| ≤ γ_{n+1}·|R̂ᵀ||R̂| (Higham, *Accuracy and Stability*, Thm 10.3), whose 2-norm is at most
   tr by Cauchy–Schwarz — Rump's criterion, BIT 46, 2006).  γ_j is the worst-case j·u/(1 − j·u)
   with ``rounding="worst-case"`` (rigorous), or Higham & Mary's probabilistic λ·√j·u (λ = 10)
   with ``"probabilistic"``; the default ``"statistical"`` also treats the entries' errors as
   independent, so the error matrix's 2-norm is ≈ 2·√n·(entry bound) instead of tr (Bandeira &
   van Handel) — see :func:`rounding_bound`; the tests check all three against an 80-bit
   reference (the statistical bound still exceeds the actual error by ~10³).
   Then σ_min(S·J_{:,Iᶜ}) ≥ √(τ − c)/max D, less the rounding of J's own entries.
4. **ε-broken generators** (exact only at ε = 0) are not eliminated: those inside the kernel's
   gap are deflated (β·EEᵀ added to G), the others are measured.  Directions the Gram cannot
   resolve — a non-flat ε-broken one, or the small-singular-value tail of a thin sketch — are
   handled by inertia: when the Cholesky breaks down, an LDLᵀ (Bunch–Kaufman) factorisation
   counts the eigenvalues ν below τ (Sylvester; by Weyl at most ν singular values lie below
   √(τ − c)), inverse iteration returns those directions with guard vectors, and a Rayleigh–Ritz
   step with *exact* products (forward-mode JVPs, no Gram) measures their singular values.
   Null ones (inside the kernel's gap) are unexplained directions — the sketch is first doubled
   (up to 4·P rows) in case the sketch, not J, is deficient.

What rests on more than floating-point bounds: the rounding model (unless worst-case),
and for the ν low directions the Rayleigh–Ritz step (their exact singular values are measured
on the computed subspace).  The dense path remains the reference wherever it runs.

Cost: the sketch rows, m·(P − k)² flops for the Gram and (P − k)³/3 for the Cholesky —
at P = 20 096 (k = 2 536, m = 18 528) these two are ~85 % of the time.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import torch
from torch.func import jvp, vmap

from ..errors import GaugeAuditError
from ..progress import bar, timed_call
from ..runtime import generator, stacked_lu_factor, stacked_solve
from . import explain as ex
from .cost import matmul_gflops
from .families import Family, theory
from .measure import EPS64, MIN_GAP, Problem, jacobian_pieces, make_problem, output_width, progress, project_outputs
from .report import make_report

U64 = EPS64 / 2  # unit roundoff of float64


LAMBDA = 10.0  # the probabilistic bound's confidence parameter (Higham & Mary 2019)


ROUNDING = ("statistical", "probabilistic", "worst-case")


def gamma(j: int, rounding: str = "worst-case") -> float:
    """γ_j = j·u/(1 − j·u), the worst-case bound on j accumulated roundings; or, for the
    probabilistic models, Higham & Mary's γ̃_j(λ) = exp(λ·√j·u + j·u²/(1 − u)) − 1, which holds
    with probability ≥ 1 − 2j·exp(−λ²(1 − u)²/2) when the roundings are independent with mean
    zero (SIAM J. Sci. Comput. 41, 2019, Thm 2.4).  With λ = 10 the union over the n²/2 inner
    products of a factorisation of order n ≤ 10⁵ fails with probability < 10⁻⁶."""
    if rounding in ("probabilistic", "statistical"):
        return math.expm1(LAMBDA * math.sqrt(j) * U64 + j * U64 * U64 / (1 - U64))
    if rounding != "worst-case":
        raise GaugeAuditError(f"unknown rounding model {rounding!r} (choose {', '.join(ROUNDING)})")
    return j * U64 / (1 - j * U64)


def rounding_bound(n: int, m: int, G: torch.Tensor, rounding: str) -> float:
    """c ≥ ‖Ĝ − G‖₂ + ‖ΔA‖₂: forming the n × n Gram from m rows, plus Cholesky's backward error.

    Entrywise, |Ĝ − G|_ij ≤ γ_m·(|A|ᵀ|A|)_ij ≤ γ_m·√(G_ii·G_jj) and |ΔA|_ij ≤ γ_{n+1}·‖r_i‖‖r_j‖
    (Higham Thm 10.3).  ``worst-case`` / ``probabilistic``: the 2-norm of such a matrix is at
    most γ·tr(G) (Cauchy–Schwarz; Rump 2006), with γ worst-case or Higham–Mary.
    ``statistical``: the entries' errors are moreover independent of one another (they come
    from disjoint roundings), so the spectral norm concentrates at ≤ 2·max_i (Σ_j b_ij²)^{1/2}
    (Bandeira & van Handel, Ann. Probab. 44, 2016) — √n·max G_ii instead of tr(G)."""
    if rounding == "statistical":
        big = float(torch.diagonal(G).max())
        return 2.0 * (gamma(m, rounding) * math.sqrt(n) + gamma(n + 1, rounding) * math.sqrt(n)) * big
    g = gamma(n + 1, rounding)
    return (g / (1 - g) + gamma(m, rounding)) * float(torch.diagonal(G).sum())


# ----------------------------------------------------------------------------- the sketch
def sketch_width(cfg) -> int:
    """Rows kept per position: ⌈d_model/4⌉ random orthonormal combinations of the outputs.  The
    rows of one position are strongly correlated (a language model's logits reach the
    parameters through one d_model-wide stream vector), so for a given number of rows, more
    positions with fewer rows each make a better-conditioned sketch — measured on gpt2 d = 16:
    at 1.06 rows per column, d_model/4 rows per position give the same smallest singular values
    as d_model rows per position at 1.3 — and the rows come cheaper (a smaller backward pass each)."""
    return max(1, min(output_width(cfg), math.ceil(cfg.d_model / 4)))


def sketch_batch(cfg, n: int, factor: float) -> int:
    """Sequences for ≥ factor·n sketch rows, enough for every token / token type to occur."""
    b = math.ceil(factor * n / (cfg.n_ctx * sketch_width(cfg)))
    if not cfg.attention_only:
        b = max(b, math.ceil(cfg.vocab / cfg.n_ctx), math.ceil(max(cfg.n_types, 1) / cfg.n_ctx))
    return max(1, b)


def projection(cfg, batch: int, seed: int) -> torch.Tensor:
    """Per sequence and position, d' orthonormal combinations of the outputs (batch × n × d' × width):
    S has orthonormal rows, so every singular value of S·J is at most the matching one of J."""
    width, dp = output_width(cfg), sketch_width(cfg)
    g = torch.randn(batch, cfg.n_ctx, width, dp, generator=generator(seed), dtype=torch.float64)
    return torch.linalg.qr(g).Q.transpose(-1, -2).contiguous()


def pivot_coordinates(Q: torch.Tensor) -> torch.Tensor:
    """k coordinates on which the P × k matrix Q (independent columns spanning the kernel
    candidate) is well conditioned: the row pivots of LU with partial pivoting (every
    multiplier ≤ 1 in modulus)."""
    P, k = Q.shape
    if k == 0:
        return torch.zeros(0, dtype=torch.long)
    _, piv = stacked_lu_factor(Q.float())  # only the pivot order is used: single precision suffices
    perm = list(range(P))
    for i, p in enumerate(piv.tolist()):  # LAPACK row swaps, 1-based
        perm[i], perm[p - 1] = perm[p - 1], perm[i]
    return torch.tensor(sorted(perm[:k]), dtype=torch.long)


def syrk_lower(G: torch.Tensor, A: torch.Tensor, block: int = 1024) -> None:
    """G[lower] += A·Aᵀ for A (n × rows), only the lower triangle (half the flops)."""
    n = A.shape[0]
    for j in range(0, n, block):
        e = min(n, j + block)
        G[j:, j:e].addmm_(A[j:], A[j:e].T)


SPARSE_COST = 30  # a sparse (CSR) product costs ~30× a dense one per multiply-add on CPU (measured)


class _Product:
    """X ↦ V·X for a fixed, usually sparse, V (g × N) and tall blocks X (N × rows): as a CSR product,
    a dense product on the columns V touches, or a plain dense product — whichever is cheapest."""

    M: torch.Tensor | None  # None only in mode "zero"

    def __init__(self, V: torch.Tensor):
        nz = V != 0
        self.sup = torch.nonzero(nz.any(0)).flatten()
        g, nnz, s = V.shape[0], int(nz.sum()), self.sup.numel()
        if nnz == 0:
            self.mode, self.M = "zero", None
        elif SPARSE_COST * nnz < g * s:
            with warnings.catch_warnings():  # "sparse CSR support is in beta": products are all we use
                warnings.simplefilter("ignore", UserWarning)
                self.mode, self.M = "sparse", V.to_sparse_csr()
        elif 2 * s <= V.shape[1]:
            self.mode, self.M = "gather", V.index_select(1, self.sup).contiguous()
        else:
            self.mode, self.M = "dense", V
        self.g = g

    def __call__(self, X: torch.Tensor) -> torch.Tensor:
        if self.mode == "zero":
            return torch.zeros(self.g, X.shape[1], dtype=X.dtype)
        assert self.M is not None  # set in every mode but "zero"
        if self.mode == "gather":
            return self.M @ X.index_select(0, self.sup)
        return self.M @ X


class _Images:
    """S·J·v for every generator, accumulated block by block from the streamed rows, which come
    split into the certificate's coordinates (``cols``) and the pivots' (``piv``)."""

    def __init__(self, fams: list[Family], cols: torch.Tensor, piv: torch.Tensor):
        self.parts: list = [
            (_Product(f.vectors.index_select(1, cols)), _Product(f.vectors.index_select(1, piv)), []) for f in fams
        ]

    def add(self, A: torch.Tensor, Bp: torch.Tensor) -> None:
        for on_cols, on_piv, out in self.parts:
            out.append(on_cols(A) + on_piv(Bp))

    def result(self) -> list[torch.Tensor]:
        return [torch.cat(out, dim=1) for _, _, out in self.parts]


@dataclass
class Sketch:
    gram: torch.Tensor | None  # lower triangle of (S·J_{:,cols})ᵀ(S·J_{:,cols}); None once freed
    images: list[torch.Tensor]  # per family: S·J·vᵢ (k × rows)
    rows: int
    fro: float  # ‖S·J‖_F (exact, all columns)
    gram_seconds: float = 0.0  # time in the Gram's syrk updates (m·n² flops)


FLUSH = 4096  # rows per Gram update (BLAS-3 efficiency)


def _routes(layout, idx: torch.Tensor) -> list[tuple[str, int, int, torch.Tensor | None]]:
    """For sorted coordinates ``idx``: per parameter tensor, the range of ``idx`` positions inside
    it and their offsets within the tensor (None: all of it, in order)."""
    out = []
    for name in layout.names:
        sl = layout.span(name)
        a, b = int(torch.searchsorted(idx, sl.start)), int(torch.searchsorted(idx, sl.stop))
        if b > a:
            local = idx[a:b] - sl.start
            out.append((name, a, b, None if b - a == sl.stop - sl.start else local))
    return out


def stream_sketch(
    problem: Problem, proj, cols: torch.Tensor, piv: torch.Tensor, fams: list[Family], quiet: bool
) -> Sketch:
    """Stream S·J's rows once: each block is written, transposed, straight into a buffer of the
    certificate's coordinates (A, n × rows) and one of the pivots' (k × rows); the Gram's lower
    triangle and the generators' images are updated from those buffers every ≥ FLUSH rows."""
    n, k = cols.numel(), piv.numel()
    G = torch.zeros(n, n, dtype=torch.float64)
    images = _Images(fams, cols, piv)
    to_cols, to_piv = _routes(problem.layout, cols), _routes(problem.layout, piv)
    A: torch.Tensor | None = None
    Bp: torch.Tensor | None = None
    m, fill, fro2, t_gram = 0, 0, 0.0, 0.0
    b = problem.batch
    pb = bar(total=b, desc="sketch rows", unit="seq", disable=quiet)

    def flush():
        nonlocal fill, fro2, t_gram
        assert A is not None and Bp is not None  # allocated with the first block
        a, bp = A[:, :fill], Bp[:, :fill]
        images.add(a, bp)
        fro2 += float(torch.linalg.vector_norm(a)) ** 2 + float(torch.linalg.vector_norm(bp)) ** 2
        t = time.perf_counter()
        syrk_lower(G, a)
        t_gram += time.perf_counter() - t
        fill = 0

    for done, pieces in jacobian_pieces(problem, proj=proj):
        r = next(iter(pieces.values())).shape[0]
        if A is None or Bp is None:  # buffers (allocated together) for ≥ FLUSH rows plus one block
            A = torch.empty(n, FLUSH + r, dtype=torch.float64)
            Bp = torch.empty(k, FLUSH + r, dtype=torch.float64)
        for buf, routes in ((A, to_cols), (Bp, to_piv)):
            for name, a, e, local in routes:
                src = pieces[name].T
                buf[a:e, fill : fill + r] = src if local is None else src[local]
        fill += r
        m += r
        if fill >= FLUSH or done == b:
            flush()
        pb.update(done - pb.n)
    pb.close()
    return Sketch(G, images.result(), m, math.sqrt(fro2), t_gram)


# ----------------------------------------------------------------------------- inertia
def pow2_scaling(G: torch.Tensor) -> torch.Tensor:
    """Powers of two d_i ≈ 1/√G_ii (exact scaling: D·G·D has no rounding)."""
    diag = torch.diagonal(G).clamp_min(1e-300)
    return torch.exp2(torch.round(-0.5 * torch.log2(diag)))


def inertia_below(G: torch.Tensor, tau: float) -> int:
    """Number of eigenvalues of the symmetric G below τ, by Sylvester's law of inertia on the
    Bunch–Kaufman LDLᵀ factorisation of G − τI."""
    A = G - tau * torch.eye(G.shape[0], dtype=G.dtype)
    LD, piv = torch.linalg.ldl_factor(A)
    del A
    n, neg, i = G.shape[0], 0, 0
    pv = piv.tolist()
    while i < n:
        if pv[i] < 0 and i + 1 < n:  # a 2×2 pivot block (lower storage)
            blk = torch.tensor(
                [[float(LD[i, i]), float(LD[i + 1, i])], [float(LD[i + 1, i]), float(LD[i + 1, i + 1])]],
                dtype=torch.float64,
            )
            neg += int((torch.linalg.eigvalsh(blk) < 0).sum())
            i += 2
        else:
            neg += int(LD[i, i] < 0)
            i += 1
    return neg


def low_eigenpairs(G: torch.Tensor, tau: float, count: int, seed: int, iters: int = 20, guards: int = 16):
    """The ``count`` lowest eigenpairs of the symmetric positive semi-definite G, and ``guards``
    more, by subspace inverse iteration with (G + τI)⁻¹ (a Cholesky factor) and Rayleigh–Ritz:
    (Ritz values, vectors, residual norms ‖G·x − θ·x‖), ascending.  The guards carry the
    directions that pollute the low ones most (the next eigenvalues), so that a later
    Rayleigh–Ritz with exact products can rotate that pollution out."""
    n = G.shape[0]
    b = min(n, count + guards)
    A = G + tau * torch.eye(n, dtype=G.dtype)
    L = torch.linalg.cholesky(A)
    del A
    X = torch.linalg.qr(torch.randn(n, b, generator=generator(seed), dtype=torch.float64)).Q
    for _ in range(iters):
        X = torch.linalg.qr(_chol_solve(L, X)).Q
    theta, vec = torch.linalg.eigh(X.T @ (G @ X))
    return theta, X @ vec


def _chol_solve(L: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """(L·Lᵀ)⁻¹·X by two triangular solves (much faster than cholesky_solve for few columns)."""
    return torch.linalg.solve_triangular(L.T, torch.linalg.solve_triangular(L, X, upper=False), upper=True)


def _sym_times(G: torch.Tensor, X: torch.Tensor, block: int = 2048) -> torch.Tensor:
    """G·X for a symmetric G of which only the lower triangle is stored (no n × n temporaries)."""
    n = G.shape[0]
    Y = torch.zeros(n, X.shape[1], dtype=X.dtype)
    for i in range(0, n, block):
        e = min(n, i + block)
        D = torch.tril(G[i:e, i:e])
        Y[i:e] += D @ X[i:e] + torch.tril(D, -1).T @ X[i:e]
        if i:
            Y[i:e] += G[i:e, :i] @ X[:i]
            Y[:i] += G[i:e, :i].T @ X[i:e]
    return Y


def certify(
    G: torch.Tensor,
    m: int,
    seed: int,
    quiet: bool,
    rounding: str = "statistical",
    flat: torch.Tensor | None = None,
    nonflat: torch.Tensor | None = None,
    nonflat_images: torch.Tensor | None = None,
) -> dict:
    """The lower-end certificate from the (lower-stored) sketch Gram G on the coordinates off
    the exact generators' pivots.

    ``flat`` / ``nonflat`` (n × e, unscaled coordinates): the ε-broken generators (reduced to
    those coordinates) whose singular values fall inside / outside the kernel's gap, and
    ``nonflat_images`` S·J of the latter (e × rows, exact products).  With D·G·D scaled to unit
    diagonal (D: powers of two), E an orthonormal basis of D⁻¹·[flat, nonflat], β = tr:

    * Cholesky of D·G·D + β·E·Eᵀ − τI, τ = 2c (c: the rounding bound).  If it completes,
      zᵀ(DGD)z ≥ (τ − c)‖z‖² for z ⊥ E.  For the non-flat ε-broken block E₂, with a = λ_min of
      its exact Gram (from ``nonflat_images``) and γ ≥ ‖(I − EEᵀ)·DGD·E₂‖₂, every z in
      span(E₂) ⊕ E^⊥ has zᵀ(DGD)z ≥ λ_min([[a, γ], [γ, τ − c]])·‖z‖² — the certified bound.
    * If that bound is not positive (E₂ lies below the Gram's resolution), the e₂ directions of E₂
      corrected by one least-squares step are returned for the caller to measure exactly; the
      rest is certified (≥ τ − c off E).
    * If the Cholesky breaks down: the inertia of D·G·D + β·E₁E₁ᵀ − τI
      (LDLᵀ) gives the number ν of eigenvalues below τ — at most ν singular values of the
      sketch lie below √(τ − c) (Weyl: the exact Gram differs from the computed one by ≤ c) —
      and inverse iteration returns those ν directions, whose singular values the caller
      measures with exact products: small-but-nonzero ones (an ill-conditioned sketch, a
      non-flat ε-broken direction) are not null."""
    n = G.shape[0]
    d = pow2_scaling(G)
    G.mul_(d[:, None]).mul_(d[None, :])
    tr = float(torch.diagonal(G).sum())
    c = rounding_bound(n, m, G, rounding)
    tau = 2.0 * c
    out = {"shift": tau, "rounding": c, "dmax": float(d.max()), "scaling": d}
    empty = torch.zeros(n, 0, dtype=torch.float64)
    Z1 = (flat if flat is not None else empty) / d[:, None]
    Z2 = (nonflat if nonflat is not None else empty) / d[:, None]
    E1 = torch.linalg.qr(Z1).Q if Z1.shape[1] else empty
    E = torch.linalg.qr(torch.cat([Z1, Z2], dim=1)).Q if Z1.shape[1] + Z2.shape[1] else empty
    schur = None
    if Z2.shape[1]:
        E2 = torch.linalg.qr(Z2 - E1 @ (E1.T @ Z2)).Q
        GE2 = _sym_times(G, E2)
        gam = float(torch.linalg.matrix_norm(GE2 - E @ (E.T @ GE2), ord=2)) + c
        # the exact Gram of the block: (S·J·D·E₂)ᵀ(S·J·D·E₂) from exact images (E₂ = Z₂·R⁻¹ on the part ⊥ E₁)
        coef = torch.linalg.lstsq(Z2, E2).solution  # E₂ = Z₂·coef
        assert nonflat_images is not None  # given with every nonflat direction
        JE2 = nonflat_images.T @ coef
        a = float(torch.linalg.eigvalsh(JE2.T @ JE2)[0])
        schur = (a, gam)
    Gd = torch.diagonal(G).clone()
    if E.shape[1]:
        G.addmm_(E, E.T, alpha=tr)
    G.diagonal().sub_(tau)
    t_chol = time.perf_counter()
    L, info = timed_call(
        torch.linalg.cholesky_ex,
        G,
        desc="certificate: Cholesky",
        expected_seconds=n**3 / 3 / (matmul_gflops() * 1e9),
        disable=quiet,
    )
    out["cholesky_seconds"] = time.perf_counter() - t_chol

    def restore():  # G as it was (only when the Gram is needed again)
        if E.shape[1]:
            G.addmm_(E, E.T, alpha=-tr)
        torch.diagonal(G).copy_(Gd)

    lam = tau - c
    if int(info) == 0 and schur is not None:
        a, gam = schur
        lam_b = 0.5 * (a + lam) - math.sqrt(0.25 * (a - lam) ** 2 + gam * gam)
        if lam_b <= 0:
            # the ε-broken block is below the Gram's resolution: all but e₂ directions are certified
            # (≥ τ − c off E); the e₂ remaining ones are those of E₂ corrected by one least-squares step
            # y = −(DGD + βEEᵀ − τI)⁻¹·(I − EEᵀ)·DGD·E₂, measured by the caller with exact products
            corr = _chol_solve(L, GE2 - E @ (E.T @ GE2))
            F = torch.linalg.qr(torch.cat([E2, E2 - corr], dim=1)).Q
            progress(
                f"certificate: Cholesky of the {n}×{n} sketch Gram ({m} rows) − τI completed off "
                f"{E2.shape[1]} ε-broken direction(s) below its resolution; measuring those exactly",
                quiet,
            )
            return {**out, "below": E2.shape[1], "lambda_cert": lam, "directions": F * d[:, None]}
        lam = min(lam, lam_b)
    if int(info) == 0:
        x = torch.randn(n, 1, generator=generator(seed), dtype=torch.float64)
        for _ in range(4):  # an estimate of λ_min off E for the report (inverse iteration, from above)
            x = _chol_solve(L, x)
            x = x / torch.linalg.vector_norm(x)
        est = float(torch.linalg.vector_norm(L.T @ x) ** 2) + tau
        progress(
            f"certificate: Cholesky of the {n}×{n} sketch Gram ({m} rows) − τI completed "
            f"(τ = {tau:.2e}, rounding bound {c:.2e})",
            quiet,
        )
        return {**out, "below": 0, "lambda_cert": lam, "lambda_est": est}
    del L
    restore()
    Gf = torch.tril(G) + torch.tril(G, -1).T
    if E1.shape[1]:
        Gf.addmm_(E1, E1.T, alpha=tr)
    nu = timed_call(
        inertia_below,
        Gf,
        tau,
        desc="certificate: LDLᵀ inertia",
        expected_seconds=2 * n**3 / 3 / (matmul_gflops() * 1e9),
        disable=quiet,
    )
    theta, X = low_eigenpairs(Gf, tau, nu, seed)
    progress(
        f"certificate: {nu} eigenvalue(s) of the {n}×{n} sketch Gram ({m} rows) below τ = {tau:.2e} "
        f"(Ritz values {float(theta[0]):.2e}…{float(theta[-1]):.2e}); measuring them exactly",
        quiet,
    )
    return {**out, "below": nu, "lambda_cert": tau - c, "directions": X * d[:, None]}


def sketch_products(problem: Problem, proj, W: torch.Tensor, block: int = 32) -> torch.Tensor:
    """S·J·W (rows × r) by forward-mode JVPs over the sketch's inputs (exact products)."""
    width = output_width(problem.cfg)

    def f(theta):
        return project_outputs(problem.forward_flat(theta).reshape(problem.batch, -1, width), proj).reshape(-1)

    one = vmap(lambda v: jvp(f, (problem.theta,), (v,))[1])
    return torch.cat([one(W.T[i : i + block]) for i in range(0, W.shape[1], block)]).T


def exact_singular_values(problem: Problem, proj, cols: torch.Tensor, X: torch.Tensor):
    """Singular values (ascending) and right singular vectors of S·J on span(X) (X: coordinates
    ``cols``) — a Rayleigh–Ritz step with exact products, no Gram."""
    W = torch.zeros(problem.P, X.shape[1], dtype=torch.float64)
    W[cols] = X
    W = torch.linalg.qr(W).Q
    _, s, vh = torch.linalg.svd(sketch_products(problem, proj, W), full_matrices=False)
    return s.flip(0), W @ vh.flip(0).T


# ----------------------------------------------------------------------------- analysis
MAX_FACTOR = 4.5  # sketch rows doubled up to ~4·(P − k) (the dense path uses 3·P full rows) before ν counts


def analyze_matrix_free(cfg, seed: int, quiet: bool, t0: float, sketch: float = 1.05, rounding: str = "statistical"):
    factor = sketch * (max(1.0, cfg.experts / cfg.top_k) if cfg.experts else 1.0)
    timings: dict = {}
    # the certificate works on P − k coordinates (k: the architecture's exact generators, whose
    # count does not depend on the inputs), so the sketch is sized to that
    probe = make_problem(cfg, seed, batch=sketch_batch(cfg, 0, factor))
    k_arch = sum(f.k for f in theory(probe, True)[1] if f.kind == "exact")
    n_cert = max(1, probe.P - k_arch)
    while True:
        problem = make_problem(cfg, seed, batch=sketch_batch(cfg, n_cert, factor))
        progress(
            f"{cfg.family}: P = {problem.P} parameters, sketch of {problem.batch} sequences × "
            f"{cfg.n_ctx} positions × {sketch_width(cfg)} rows, method matrix-free",
            quiet,
        )
        gen, fams = theory(problem, quiet)
        timings["setup"] = time.time() - t0

        # the exact generators' span and k coordinates on which it is well conditioned (pivots);
        # the certificate runs on the other P − k coordinates
        t = time.time()
        exact = [f.vectors for f in fams if f.kind != "eps-broken"]
        exact_span = ex.span_rank(exact or [torch.zeros(0, problem.P, dtype=torch.float64)])
        B = exact_span.frame()
        piv = pivot_coordinates(B)
        keep = torch.ones(problem.P, dtype=torch.bool)
        keep[piv] = False
        cols = torch.nonzero(keep).flatten()
        if cols.numel() == 0:
            raise GaugeAuditError("the generators span the whole parameter space: nothing to certify")
        timings["pivots"] = time.time() - t
        t = time.time()
        proj = projection(cfg, problem.batch, seed + 5)
        sk = stream_sketch(problem, proj, cols, piv, fams, quiet)
        timings["sketch"] = time.time() - t

        j_fro, JV = sk.fro, sk.images
        JV_exact = [jv for f, jv in zip(fams, JV) if f.kind != "eps-broken"]
        JVf = torch.cat(JV_exact) if JV_exact else torch.zeros(0, sk.rows, dtype=torch.float64)
        null_norm = _basis_image_norm(exact, JVf, exact_span)
        floor = max(null_norm, EPS64 * j_fro)  # the kernel's measured image, at least one rounding of ‖J‖
        # ε-broken generators: singular value ‖J·v‖/‖v off the exact kernel‖; flat when inside the gap
        eps_sv, flat_z, non_z, non_img = [], [], [], []
        for f, jv in zip(fams, JV):
            if f.kind != "eps-broken":
                continue
            perp = exact_span.project_out(f.vectors)
            sv = float(
                (torch.linalg.vector_norm(jv, dim=1) / torch.linalg.vector_norm(perp, dim=1).clamp_min(1e-300)).max()
            )
            eps_sv.append(sv)
            # the same direction modulo the exact kernel, with zero pivot coordinates
            red = f.vectors - (stacked_solve(B[piv], f.vectors[:, piv].T).T @ B.T) if B.shape[1] else f.vectors
            if sv <= MIN_GAP * floor:
                flat_z.append(red[:, cols].T)
            else:
                non_z.append(red[:, cols].T)
                non_img.append(jv)
        t = time.time()
        assert sk.gram is not None  # a fresh sketch
        cert = certify(
            sk.gram,
            sk.rows,
            seed + 13,
            quiet,
            rounding,
            flat=torch.cat(flat_z, 1) if flat_z else None,
            nonflat=torch.cat(non_z, 1) if non_z else None,
            nonflat_images=torch.cat(non_img) if non_img else None,
        )
        sk.gram, gram_seconds = None, sk.gram_seconds
        timings["certificate"] = time.time() - t
        low_sv: torch.Tensor | None = None
        nulls = 0
        if cert["below"]:
            t = time.time()
            # exact singular values on the ν low directions and their guards: the ν smallest
            low_sv, low_vecs = exact_singular_values(problem, proj, cols, cert["directions"])
            low_sv, low_vecs = low_sv[: cert["below"]], low_vecs[:, : cert["below"]]
            nulls = int((low_sv <= MIN_GAP * floor).sum())
            timings["low_directions"] = time.time() - t
            progress(
                f"the {cert['below']} low directions: exact singular values {float(low_sv[0]):.3e}…"
                f"{float(low_sv[-1]):.3e}; {nulls} within the kernel's gap",
                quiet,
            )
        tol_rel, _ = ex.generator_tolerance(problem, j_fro)
        # certified: all but (exact + flat ε-broken + ν) singular values of S·J are ≥ √λ/max D, less J's rounding
        sigma_low = max(0.0, math.sqrt(cert["lambda_cert"]) / cert["dmax"] - tol_rel)
        # the null side of the gap: the kernel's image, flat ε-broken directions, null low directions
        null_side = max(
            [floor]
            + [x for x in eps_sv if x <= MIN_GAP * floor]
            + ([float(low_sv[nulls - 1])] if nulls and low_sv is not None else [])
        )
        nonnull = [x for x in eps_sv if x > MIN_GAP * floor] + (
            [float(x) for x in low_sv[nulls:]] if low_sv is not None else []
        )
        lowest_nonnull = min([sigma_low] + nonnull)
        gap = lowest_nonnull / null_side if null_side > 0 else float("inf")
        if (nulls == 0 and gap >= MIN_GAP) or factor * 2 > MAX_FACTOR:
            break
        # null low directions or a weak gap: maybe the sketch was too thin for some parameter
        factor *= 2
        progress(f"retrying with a sketch of {factor:.2g}·(P − k) rows", quiet)

    t = time.time()
    null_dirs = low_vecs[:, :nulls] if nulls else None
    unexplained = nulls
    # an estimate of the smallest non-null singular value: the exact low ones (Rayleigh–Ritz), else
    # the inverse-iteration estimate behind the Cholesky certificate
    sigma_est = (
        min([float(x) for x in low_sv[nulls:]] or [sigma_low])
        if cert["below"] and low_sv is not None  # low_sv is set exactly when cert["below"]
        else math.sqrt(cert["lambda_est"]) / cert["dmax"]
    )
    threshold = math.sqrt(null_side * lowest_nonnull) if lowest_nonnull > 0 else 0.0
    if gap < MIN_GAP:
        raise GaugeAuditError(
            f"matrix-free certificate too weak: the smallest certified non-null singular value {lowest_nonnull:.3g} "
            f"against the kernel's {null_side:.3g} (ratio {gap:.3g} < {MIN_GAP:.0e}); "
            "run --method dense on a smaller configuration"
        )
    expl = ex.check_families(problem, fams, JV, j_fro, threshold, exact_span)
    nullity = expl.explained + unexplained
    timings["generators"] = time.time() - t
    report = make_report(
        problem,
        gen,
        fams,
        expl,
        nullity,
        gap,
        float("nan"),
        threshold / max(j_fro, 1e-300),
        "matrix-free",
        timings,
        j_fro,
        None,
    )
    report.rows = sk.rows
    if unexplained:
        # the null directions live on the coordinates off the pivots; their parts outside the
        # generators' span are what no family explains
        assert null_dirs is not None  # unexplained = nulls > 0
        res = null_dirs - expl.basis @ (expl.basis.T @ null_dirs) if expl.basis.shape[1] else null_dirs
        u = ex.unexplained_directions(problem, torch.linalg.qr(res).Q, expl.basis)
        report.unexplained_blocks = ex.summarize_blocks(u)
        report.unexplained_examples = u.blocks[:8]
    report.extra.update(
        {
            "sigma_min_complement": sigma_low,
            "sigma_min_estimate": sigma_est,
            "kernel_residual": null_norm,
            "sketch_rows": sk.rows,
            "sketch_sequences": problem.batch,
            "cholesky_shift": cert["shift"],
            "gram_seconds": gram_seconds,
            "gram_flops": float(sk.rows) * cols.numel() ** 2,
            "cholesky_seconds": cert.get("cholesky_seconds", 0.0),
            "cholesky_flops": cols.numel() ** 3 / 3,
            "rounding_bound": cert["rounding"],
            "rounding_model": rounding,
            "eps_broken_singular_values": eps_sv,
            "low_directions": cert["below"],
            "low_singular_values": [] if low_sv is None else low_sv.tolist(),
            "eliminated_coordinates": problem.P - cols.numel(),
        }
    )
    progress(
        f"matrix-free: nullity {nullity} (explained {expl.explained}, unexplained {unexplained}); "
        f"smallest non-null singular value ≥ {lowest_nonnull:.3e}, kernel {null_side:.2e}, gap {gap:.3g}",
        quiet,
    )
    return report


def _basis_image_norm(V: list[torch.Tensor], JV: torch.Tensor, span: ex.Span) -> float:
    """An upper bound on ‖J·Q‖₂ for an orthonormal basis Q of the span of the stacked rows of V,
    from J·V: with the rows normalised (Vₙ) and r = rank, Q = Vₙᵀ·C with ‖C‖₂ = 1/s_r(Vₙ), so
    ‖J·Q‖₂ ≤ ‖J·Vₙᵀ‖_F / s_r."""
    if not V or span.rank == 0:
        return 0.0
    norms = torch.cat([torch.linalg.vector_norm(v, dim=1) for v in V]).clamp_min(1e-300)[:, None]
    return float(torch.linalg.vector_norm(JV / norms)) / float(span.s[span.rank - 1])
