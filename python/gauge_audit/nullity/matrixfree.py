"""Certify the nullity without forming J (for P beyond the dense limit).

The theory's generators V span a candidate kernel.  The nullity is certified equal to
rank(V) when

1. every flat generator has ‖J·v‖ within the derived tolerance (batched JVPs), and the
   orthonormal basis Q of their span has ‖J·Q‖₂ at the rounding level;
2. the smallest singular value of J on W = span(V)^⊥ is bounded away from zero.

(2) is λ_min of A = P_W·JᵀJ·P_W on W.  JᵀJ is ill-conditioned (κ(J) ~ 10³–10⁴ on W at
generic points), so the Krylov method runs on S·A·S with a randomized Nyström
preconditioner: from ℓ products Y = A·Ω (Ω Gaussian in W) the top-ℓ eigenpairs (U, Λ) of A
are approximated and S = U·diag(√(λ_ℓ/λ_i))·Uᵀ + (I − U·Uᵀ) flattens them (Frangella, Tropp
& Udell, "Randomized Nyström preconditioning", 2023).  Because ‖S‖₂ ≤ 1, xᵀAx = yᵀ(SAS)y
with x = S·y gives λ_min(A) ≥ λ_min(SAS).

The Krylov method (default ``krylov="block"``) is a block Krylov–Rayleigh–Ritz iteration:
each step applies SAS to a whole block of b vectors (one vmapped JVP + VJP over b tangents,
several times cheaper per vector than b single products) and extends an orthonormal basis
of the block Krylov space; the smallest Ritz pair (θ, x) has an exactly computed residual
r = ‖SASx − θx‖ (from the stored images), and it stops once r ≤ tol·θ.

What is certified, exactly: [θ − r, θ + r] contains an eigenvalue of SAS (a rigorous
statement about the computed operator, up to the rounding of the products), and
√(θ − r) is reported as the lower bound for σ_min(J|W).  That this eigenvalue is the
*smallest* one rests on the Krylov space of a random Gaussian start block having converged
to the bottom of the spectrum — true with probability one in exact arithmetic once converged,
but not an inertia proof; the dense path remains the reference wherever it runs.  The gap
ratio is that bound over ‖J·Q‖₂.  ``krylov="lanczos"`` keeps the single-vector Lanczos.

Each JᵀJ·x is one forward-mode JVP plus one reverse-mode VJP over the whole batch,
vmapped over blocks of vectors; J itself (rows × P) is never formed.
"""

from __future__ import annotations

import math
import time

import torch
from torch.func import jvp, vjp, vmap

from ..errors import GaugeAuditError
from ..runtime import generator
from . import explain as ex
from .generators import Family
from .measure import EPS64, MIN_GAP, Genericity, Problem, progress


class Operator:
    """Blocked products with J, Jᵀ and JᵀJ at the problem's parameter point."""

    def __init__(self, problem: Problem, block: int = 32):
        self.problem = problem
        self.block = block
        f = problem.forward_flat
        self._jvp = vmap(lambda v: jvp(f, (problem.theta,), (v,))[1])
        _, pull = vjp(f, problem.theta)
        self._vjp = vmap(lambda u: pull(u)[0])
        self.products = 0

    def J(self, V: torch.Tensor) -> torch.Tensor:
        """J·vᵢ for the rows of V (k × P) → (k × rows)."""
        out = [self._jvp(V[i:i + self.block]) for i in range(0, V.shape[0], self.block)]
        self.products += V.shape[0]
        return torch.cat(out) if out else torch.zeros(0, self.problem.rows, dtype=torch.float64)

    def JtJ(self, X: torch.Tensor) -> torch.Tensor:
        """JᵀJ·xᵢ for the rows of X (k × P)."""
        out = []
        for i in range(0, X.shape[0], self.block):
            out.append(self._vjp(self._jvp(X[i:i + self.block])))
        self.products += X.shape[0]
        return torch.cat(out)


def frobenius_estimate(op: Operator, probes: int, seed: int) -> float:
    """‖J‖_F by Hutchinson: E‖J·z‖² = ‖J‖_F² for Rademacher z."""
    g = generator(seed)
    z = torch.randint(0, 2, (probes, op.problem.P), generator=g).to(torch.float64) * 2 - 1
    return float(torch.sqrt((op.J(z) ** 2).sum(1).mean()))


def _project(X: torch.Tensor, Q: torch.Tensor) -> torch.Tensor:
    """Rows of X with their components in span(Q) (P × k, orthonormal) removed (twice, for stability)."""
    if Q.shape[1] == 0:
        return X
    for _ in range(2):
        X = X - (X @ Q) @ Q.T
    return X


def nystrom(op: Operator, Q: torch.Tensor, rank: int, seed: int):
    """Approximate top eigenpairs (U: P × r, lam: r) of A = P_W JᵀJ P_W."""
    g = generator(seed)
    P = op.problem.P
    omega = _project(torch.randn(rank, P, generator=g, dtype=torch.float64), Q)
    omega = torch.linalg.qr(omega.T).Q.T                   # orthonormal rows in W
    Y = _project(op.JtJ(omega), Q)                          # rank × P
    nu = EPS64 * float(torch.linalg.matrix_norm(Y))
    Yn = Y + nu * omega
    C = torch.linalg.cholesky(omega @ Yn.T)                 # (ΩᵀY_ν), rank × rank
    B = torch.linalg.solve_triangular(C, Yn, upper=False)   # C⁻¹·Y_νᵀ (as rows)
    U, s, _ = torch.linalg.svd(B.T, full_matrices=False)    # P × r
    lam = torch.clamp(s ** 2 - nu, min=0.0)
    return U, lam


def lanczos_min(apply, start: torch.Tensor, steps: int, Q: torch.Tensor, tol: float, quiet: bool,
                check_every: int = 10) -> tuple[float, float, int]:
    """Smallest eigenvalue of the symmetric operator ``apply`` on W (start ∈ W):
    (smallest Ritz value, its residual bound, steps taken).  Full re-orthogonalisation."""
    P = start.numel()
    basis = torch.zeros(steps + 1, P, dtype=torch.float64)
    alpha, beta = [], []
    q = start / torch.linalg.vector_norm(start)
    basis[0] = q
    theta, resid = float("nan"), float("inf")
    t0 = time.time()
    for j in range(steps):
        w = apply(basis[j][None])[0]
        a = float(w @ basis[j])
        alpha.append(a)
        w = w - basis[:j + 1].T @ (basis[:j + 1] @ w)
        w = w - basis[:j + 1].T @ (basis[:j + 1] @ w)
        w = _project(w[None], Q)[0]
        b = float(torch.linalg.vector_norm(w))
        beta.append(b)
        if (j + 1) % check_every == 0 or j + 1 == steps or b < 1e-14:
            T = torch.diag(torch.tensor(alpha, dtype=torch.float64))
            if j > 0:
                off = torch.tensor(beta[:-1], dtype=torch.float64)
                T = T + torch.diag(off, 1) + torch.diag(off, -1)
            ev, evec = torch.linalg.eigh(T)
            theta, resid = float(ev[0]), abs(b * float(evec[-1, 0]))
            if time.time() - t0 > 2 and (j + 1) % (check_every * 5) == 0:
                progress(f"Lanczos step {j + 1}: λ_min ≈ {theta:.3e} (residual {resid:.1e})", quiet)
            if resid <= tol * max(theta, 1e-300) or b < 1e-14:
                return theta, resid, j + 1
        basis[j + 1] = w / b
    return theta, resid, steps


def block_lanczos_min(apply, start: torch.Tensor, max_vectors: int, Q: torch.Tensor, tol: float, quiet: bool
                      ) -> tuple[float, float, int]:
    """Smallest eigenvalue of the symmetric operator ``apply`` on W by block Krylov–Rayleigh–Ritz.

    ``start`` (b × P, in W) is the first block; each step applies the operator to one whole block
    (b vectors in one vmapped JVP + VJP), orthogonalises the result against the whole basis (twice)
    and extends it.  The Rayleigh–Ritz pair (θ, x) of the basis gives the exact residual
    ‖Ax − θx‖ from the stored images, so [θ − r, θ + r] contains an eigenvalue of the operator.
    Returns (θ_min, r, vectors applied)."""
    b, P = start.shape
    basis = torch.zeros(max_vectors + b, P, dtype=torch.float64)
    images = torch.zeros(max_vectors + b, P, dtype=torch.float64)
    blk = torch.linalg.qr(_project(start, Q).T).Q.T
    n = 0
    theta, resid = float("nan"), float("inf")
    t0 = time.time()
    T = torch.zeros(max_vectors + b, max_vectors + b, dtype=torch.float64)
    last = 0
    while n + blk.shape[0] <= max_vectors and blk.shape[0] > 0:
        m = blk.shape[0]
        basis[n:n + m] = blk
        images[n:n + m] = apply(blk)
        n += m
        V, AV = basis[:n], images[:n]
        T[n - m:n, :n] = AV[n - m:n] @ V.T
        T[:n, n - m:n] = T[n - m:n, :n].T
        if n >= 1.2 * last or n + m > max_vectors:   # Rayleigh–Ritz every ~20 % growth of the basis
            last = n
            Tn = 0.5 * (T[:n, :n] + T[:n, :n].T)
            ev, evec = torch.linalg.eigh(Tn)
            y = evec[:, 0]
            theta = float(ev[0])
            resid = float(torch.linalg.vector_norm(y @ AV - theta * (y @ V)))
            if time.time() - t0 > 2:
                progress(f"block Krylov {n} vectors: λ_min ≈ {theta:.3e} (residual {resid:.1e})", quiet)
            if resid <= tol * max(theta, 1e-300):
                return theta, resid, n
        # next block: the newest images, orthogonalised against the basis (twice) and W's complement
        W = images[n - m:n].clone()
        for _ in range(2):
            W = W - (W @ V.T) @ V
        W = _project(W, Q)
        q, r = torch.linalg.qr(W.T)
        dr = torch.abs(torch.diagonal(r))
        blk = q.T[dr > 1e-10 * max(float(dr.max()), 1e-300)]
        blk = blk - (blk @ V.T) @ V
        blk = torch.linalg.qr(blk.T).Q.T
    return theta, resid, n


def analyze_matrix_free(problem: Problem, gen: Genericity, fams: list[Family], timings: dict, quiet: bool,
                        nystrom_rank: int | None = None, steps: int = 4000, block: int = 64, probes: int = 16,
                        tol: float = 0.5, krylov: str = "block"):
    from .analysis import _report

    op = Operator(problem, block)
    t = time.time()
    j_fro = frobenius_estimate(op, probes, problem.seed + 7)
    JV = []
    for f in fams:
        JV.append(op.J(f.vectors))
    timings["generators"] = time.time() - t
    progress(f"generators: {sum(f.k for f in fams)} JVPs ({timings['generators']:.1f} s)", quiet)

    # W = the complement of every generator.  ε-broken generators get their singular values from
    # ‖J·v‖ / ‖v outside the exact kernel‖ and count as flat only when those are not separated from
    # the kernel's rounding level by a clear gap.  (Limitation: a mixture of an ε-broken direction
    # with W can have a smaller singular value than either; the certificate bounds W alone.)
    t = time.time()
    flatV = [(f, jv) for f, jv in zip(fams, JV) if f.kind != "eps-broken"]
    V = torch.cat([f.vectors for f, _ in flatV]) if flatV else torch.zeros(0, problem.P, dtype=torch.float64)
    JVf = torch.cat([jv for _, jv in flatV]) if flatV else torch.zeros(0, problem.rows, dtype=torch.float64)
    null_norm = _basis_image_norm(V, JVf)
    _, Q_flat, _ = ex.span_rank(V)
    eps_sv = []
    for f, jv in [(f, jv) for f, jv in zip(fams, JV) if f.kind == "eps-broken"]:
        perp = f.vectors - (f.vectors @ Q_flat) @ Q_flat.T
        eps_sv.append(float((torch.linalg.vector_norm(jv, dim=1)
                             / torch.linalg.vector_norm(perp, dim=1).clamp_min(1e-300)).max()))
    allV = torch.cat([f.vectors for f in fams]) if fams else torch.zeros(0, problem.P, dtype=torch.float64)
    Q_all = ex.span_rank(allV)[1]

    # λ_min of JᵀJ on W with a Nyström preconditioner
    P = problem.P
    dimW = P - Q_all.shape[1]
    if dimW <= 0:
        raise GaugeAuditError("the generators span the whole parameter space: nothing to certify")
    ell = nystrom_rank or min(dimW - 1, max(50, int(4 * math.sqrt(P)) * 2))
    U, lam = nystrom(op, Q_all, ell, problem.seed + 11)
    timings["nystrom"] = time.time() - t
    lam_l = float(lam[-1])
    scale = torch.sqrt(lam_l / torch.clamp(lam, min=lam_l))   # ≤ 1

    def S(X):
        c = X @ U
        return X - c @ U.T + (c * scale) @ U.T

    def apply(X):
        return S(_project(op.JtJ(_project(S(X), Q_all)), Q_all))

    t = time.time()
    if krylov == "block":
        start = torch.randn(block, P, generator=generator(problem.seed + 13), dtype=torch.float64)
        theta, resid, taken = block_lanczos_min(apply, start, min(steps, dimW), Q_all, tol, quiet)
    else:
        start = _project(torch.randn(1, P, generator=generator(problem.seed + 13), dtype=torch.float64), Q_all)[0]
        theta, resid, taken = lanczos_min(apply, start, steps, Q_all, tol, quiet)
    timings["lanczos"] = time.time() - t
    lam_low = max(theta - resid, 0.0)
    sigma_low = math.sqrt(lam_low)
    sigma_max = math.sqrt(float(lam[0])) if lam.numel() else 0.0
    progress(f"Lanczos: {taken} steps, σ_min(J on W) ≥ {sigma_low:.3e} (σ_max ≈ {sigma_max:.3e})", quiet)

    # the nullity: flat generators, plus ε-broken ones whose singular value falls on the null side of the gap
    floor = max(null_norm, EPS64 * sigma_max)   # the kernel's measured image, at least one rounding of σ_max
    eps_nonflat = [x for x in eps_sv if x > MIN_GAP * floor]
    lowest_nonnull = min([sigma_low] + eps_nonflat)
    threshold = math.sqrt(floor * lowest_nonnull) if lowest_nonnull > 0 else 0.0
    expl = ex.check_families(problem, fams, JV, j_fro, threshold)
    gap = lowest_nonnull / floor if floor > 0 else float("inf")
    if gap < MIN_GAP or taken >= steps and resid > tol * max(theta, 1e-300):
        raise GaugeAuditError(
            f"matrix-free certificate failed: σ_min(J on the generators' complement) ≥ {sigma_low:.3g} against a "
            f"kernel residual {floor:.3g} (ratio {gap:.3g}; Lanczos {taken} steps, residual {resid:.2g}); "
            "unexplained directions may exist — run --method dense on a smaller configuration")
    nullity = expl.explained
    report = _report(problem, gen, fams, expl, nullity, gap, float("nan"), threshold / max(sigma_max, 1e-300),
                     "matrix-free", timings, j_fro, None)
    report.extra.update({"sigma_min_complement": sigma_low, "sigma_max": sigma_max, "lanczos_steps": taken,
                         "nystrom_rank": ell, "kernel_residual": null_norm, "jtj_products": op.products,
                         "eps_broken_singular_values": eps_sv})
    return report


def _basis_image_norm(V: torch.Tensor, JV: torch.Tensor) -> float:
    """‖J·Q‖₂ for an orthonormal basis Q of span(V), from J·V (no further products)."""
    if V.shape[0] == 0:
        return 0.0
    norms = torch.linalg.vector_norm(V, dim=1, keepdim=True).clamp_min(1e-300)
    n, jn = V / norms, JV / norms
    q, r = torch.linalg.qr(n.T)
    rank, _, _ = ex.span_rank(V)
    u, s, vh = torch.linalg.svd(r)
    # Q = q·u[:, :rank] = nᵀ·r⁻¹·u[:, :rank] = nᵀ·vhᵀ[:, :rank]·diag(1/s[:rank])
    coeff = vh[:rank].T / s[:rank][None, :]
    JQ = jn.T @ coeff
    return float(torch.linalg.matrix_norm(JQ, ord=2))
