"""Model alignment and mode connectivity on the teacher set-up of :mod:`.sharpness`.

* ``align_models`` as the wiki writes it: 1 000 sampled gauge elements τ (per head M, N with
  condition number log-uniform in [1, 10], a random head permutation), keep the τ minimising
  ‖θ₁ − τ(θ₂)‖, for θ₂ = g·θ₁ in θ₁'s own orbit — against the closed-form alignment: match heads by
  the invariants W_Q·W_Kᵀ and W_V·W_O, then solve W_Q,1 = W_Q,2·M and W_V,1 = W_V,2·N by least squares.
* mode connectivity: two students trained from different seeds (L-BFGS, at most ``TRAIN_ITER``
  iterations) to the same teacher; are their minima one gauge transformation apart?  The loss along
  the straight line θ_A → θ_B and along the gauge path t ↦ g(t)·θ_A, g(t) = (1 − t)·I + t·g, are
  measured at 21 points each.

Distances are relative to ‖θ₁‖; "aligned" means within 10³·P·ε (P parameters) — the rounding of
the least-squares solve, far below the sampled minimum.
"""

from __future__ import annotations

import ast
import itertools
import math

import torch

from ..runtime import eps, generator, stacked_det
from .registry import FAILS, HOLDS, UNDECIDED, Finding, experiment
from .sharpness import gauge_map, setup

N_SAMPLES = 1000
TRAIN_ITER = 1500
#: the wiki's code, verbatim (§9.4)
WIKI_CODE = '''def align_models(theta1, theta2, G_max):
    """将两个模型对齐到同一规范等价类"""
    min_dist = float('inf')
    best_tau = None

    for tau in sample_gauge_group(G_max, n_samples=1000):
        dist = norm(theta1 - tau(theta2))
        if dist < min_dist:
            min_dist = dist
            best_tau = tau

    return theta2_aligned = best_tau(theta2)
'''


def _parses(code: str) -> str | None:
    try:
        ast.parse(code)
    except SyntaxError as exc:
        return f"line {exc.lineno}: {exc.msg}"
    return None


def _sample(cfg, g: torch.Generator):
    h, d = cfg.n_heads, cfg.d_head

    def one():
        U, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        V, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        k = float(10 ** torch.rand(1, generator=g, dtype=torch.float64))
        s = torch.logspace(0, torch.log10(torch.tensor(k)).item(), d, dtype=torch.float64)
        return U @ torch.diag(s) @ V.T

    M = torch.stack([one() for _ in range(h)])
    N = torch.stack([one() for _ in range(h)])
    return M, N, torch.randperm(h, generator=g)


def _permute(cfg, unflat, theta, perm):
    p = unflat(theta)
    return torch.cat([p[f"blocks.0.attn.{k}"][perm].reshape(-1) for k in ("W_Q", "W_K", "W_V", "W_O")])


def act(cfg, unflat, theta, M, N, perm):
    return gauge_map(cfg, M, N) @ _permute(cfg, unflat, theta, perm)


def closed_form(cfg, unflat, theta1, theta2):
    """Align θ₂ to θ₁: heads matched by the invariants, then per-head least squares for M and N."""
    p1, p2 = unflat(theta1), unflat(theta2)
    q1, k1, v1, o1 = (p1[f"blocks.0.attn.{k}"] for k in ("W_Q", "W_K", "W_V", "W_O"))
    q2, k2, v2, o2 = (p2[f"blocks.0.attn.{k}"] for k in ("W_Q", "W_K", "W_V", "W_O"))
    inv1 = [torch.cat([(q1[i] @ k1[i].T).reshape(-1), (v1[i] @ o1[i]).reshape(-1)]) for i in range(cfg.n_heads)]
    inv2 = [torch.cat([(q2[i] @ k2[i].T).reshape(-1), (v2[i] @ o2[i]).reshape(-1)]) for i in range(cfg.n_heads)]
    best = min(
        itertools.permutations(range(cfg.n_heads)),
        key=lambda pi: sum(float((inv2[pi[i]] - inv1[i]).norm()) for i in range(cfg.n_heads)),
    )
    perm = torch.tensor(best)
    q2, v2 = q2[perm], v2[perm]
    M = torch.stack([torch.linalg.lstsq(q2[i], q1[i]).solution for i in range(cfg.n_heads)])
    N = torch.stack([torch.linalg.lstsq(v2[i], v1[i]).solution for i in range(cfg.n_heads)])
    aligned = act(cfg, unflat, theta2, M, N, perm)
    invariant_gap = max(float((inv2[perm[i]] - inv1[i]).norm() / inv1[i].norm()) for i in range(cfg.n_heads))
    return aligned, M, N, perm, invariant_gap


@experiment("wiki-align-models")
def wiki_align_models(seed: int, full: bool) -> Finding:
    cfg, theta1, unflat, loss, _ = setup(seed)
    g = generator(seed + 41)
    M, N, perm = _sample(cfg, g)
    theta2 = act(cfg, unflat, theta1, M, N, perm)  # θ₂ in θ₁'s orbit: distance 0 is reachable
    ref = float(theta1.norm())
    best = min(float((theta1 - act(cfg, unflat, theta2, *_sample(cfg, g))).norm()) / ref for _ in range(N_SAMPLES))
    aligned, *_ = closed_form(cfg, unflat, theta1, theta2)
    closed = float((theta1 - aligned).norm()) / ref
    # reported as the power of ten above it: a rounding-level residual whose last bits follow the
    # LAPACK least squares' threading state (2.9e-16, 3.37e-16 or 3.39e-16 for the same inputs
    # on one thread), which would make the report differ between runs
    closed_bound = 10.0 ** math.ceil(math.log10(closed)) if closed > 0 else 0.0
    tol = 1e3 * theta1.numel() * eps(torch.float64)
    syntax = _parses(WIKI_CODE)
    text = (
        f"θ₂ = g·θ₁ (same orbit): align_models with {N_SAMPLES} samples reaches relative distance {best:.3f}; "
        f"closed-form alignment ≤ {closed_bound:.0e} (tol {tol:.1e})"
        + (f"; the code as written does not parse ({syntax})" if syntax else "")
    )
    details = {
        "sampled": best,
        "closed_form_at_most": closed_bound,
        "tolerance": tol,
        "syntax_error": syntax,
        "samples": N_SAMPLES,
    }
    if closed > tol:
        return Finding(UNDECIDED, "the closed-form alignment did not reach the orbit point: " + text, details)
    if best > 1e3 * tol:
        return Finding(
            FAILS,
            text,
            details,
            counterexample=f"seed {seed}: best of {N_SAMPLES} sampled τ leaves ‖θ₁ − τ(θ₂)‖/‖θ₁‖ = "
            f"{best:.3f}, the closed form ≤ {closed_bound:.0e}",
        )
    return Finding(HOLDS, text, details)


def _train(loss, theta0):
    v = theta0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [v],
        max_iter=TRAIN_ITER,
        tolerance_grad=1e-7,
        tolerance_change=1e-30,
        history_size=50,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        val = loss(v)
        val.backward()
        return val

    opt.step(closure)
    return v.detach()


def _digits(x):
    """12 significant digits for the report: the last bits of these losses and distances depend on
    the memory alignment the BLAS kernels meet (seen run to run in one process), not on the seed;
    the verdict reads the unrounded values."""
    return float(f"{x:.12g}") if isinstance(x, float) else x


@experiment("wiki-mode-connectivity")
def wiki_mode_connectivity(seed: int, full: bool) -> Finding:
    cfg, teacher, unflat, loss, _ = setup(seed)
    starts = [
        torch.randn(teacher.shape, generator=generator(seed + 500 + i), dtype=torch.float64) * 0.5 for i in range(2)
    ]
    a, b = (_train(loss, s) for s in starts)
    la, lb = float(loss(a)), float(loss(b))
    aligned, M, N, perm, gap = closed_form(cfg, unflat, a, b)
    dist = float((a - aligned).norm() / a.norm())
    with torch.no_grad():
        line = [float(loss((1 - t) * a + t * b)) for t in torch.linspace(0, 1, 21, dtype=torch.float64)]
        # gauge path from b to its aligned image (= a): b ↦ g(t)·b, g(t) = (1 − t)·I + t·(M, N), heads permuted
        eye = torch.eye(cfg.d_head, dtype=torch.float64).expand_as(M)
        path, dets = [], []
        for t in torch.linspace(0, 1, 21, dtype=torch.float64):
            Mt, Nt = (1 - t) * eye + t * M, (1 - t) * eye + t * N
            dets.append(float(torch.cat([stacked_det(Mt), stacked_det(Nt)]).abs().min()))
            path.append(float(loss(act(cfg, unflat, b, Mt, Nt, perm))))
    crit = []
    for v in (a, b):
        grad = torch.autograd.functional.jacobian(loss, v)
        w = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, v))
        crit.append(
            {
                "loss": float(loss(v)),
                "grad_norm": float(grad.norm()),
                "lambda_min": float(w[0]),
                "lambda_max": float(w[-1]),
                "flat": int((w.abs() <= 1e-6 * w[-1]).sum()),
            }
        )
    # a (local) minimum: gradient and negative curvature both at the level the optimiser resolves
    minima = all(c["grad_norm"] <= 1e-6 and c["lambda_min"] >= -1e-6 * c["lambda_max"] for c in crit)
    details = {
        "students": [{k: _digits(v) for k, v in c.items()} for c in crit],
        "aligned_distance": _digits(dist),
        "invariant_gap": _digits(gap),
        "line": [_digits(x) for x in line],
        "gauge_path": [_digits(x) for x in path],
        "min_det_on_path": _digits(min(dets)),
        "train_iter": TRAIN_ITER,
    }
    text = (
        f"students from two seeds: loss {la:.4g}, {lb:.4g} (teacher 0), ‖∇L‖ "
        f"{crit[0]['grad_norm']:.1e}, {crit[1]['grad_norm']:.1e}, λ_min/λ_max "
        f"{crit[0]['lambda_min'] / crit[0]['lambda_max']:.1e}, {crit[1]['lambda_min'] / crit[1]['lambda_max']:.1e} "
        f"({crit[0]['flat']}, {crit[1]['flat']} flat directions); after closed-form alignment "
        f"‖θ_A − g·θ_B‖/‖θ_A‖ = {dist:.2g}; straight line θ_A → θ_B: max loss {max(line):.3g}"
    )
    if not minima:
        return Finding(UNDECIDED, "training did not reach a minimum within the budget: " + text, details)
    tol = 1e3 * teacher.numel() * eps(torch.float64)
    if abs(la - lb) > tol * max(la, lb, 1e-300) * 1e3:
        # a gauge transformation preserves L exactly, so minima at different heights are not gauge-related
        return Finding(
            FAILS,
            text + ": minima at different loss values cannot be one gauge transformation apart",
            details,
            counterexample=f"seed {seed}: local minima with L = {la:.4g} and L = {lb:.4g} (and the teacher, L = 0)",
        )
    if dist <= 1e6 * tol and min(dets) > 0 and max(path) <= 1e-16 * max(1.0, la):
        return Finding(HOLDS, text, details)
    return Finding(UNDECIDED, text, details)
