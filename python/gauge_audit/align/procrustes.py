"""The continuous fits of alignment: for one factor of the group, the element bringing B's tensors
closest (Frobenius) to A's.

* :func:`pair_fit` — a pair (X, Y) acted on as (X·M, Y·M⁻ᵀ) (query/key of a KV group under
  qk-gl, value/output under vo-gl), M in GL, O, or their RoPE commutants (per frequency plane a
  complex scalar w: z ↦ w·z on X's plane, z ↦ z/w̄ on Y's; the unrotated coordinates any block):
  min ‖X·M − X_A‖² + ‖Y·M⁻ᵀ − Y_A‖².  Orthogonal: M⁻ᵀ = M, so one Procrustes problem on the
  stacked pair (closed form; per plane the phase of Σ z̄·z_A).  GL: not convex; the best of the
  closed-form candidates (least squares from the X side, from the Y side, the orthogonal fit, the
  identity) is polished by L-BFGS under an iteration budget and kept only where it is lower.
* :func:`scale_fit` — diagonal factors s acting as (s·a, b/s) (norm weights and their readers, FFN
  units, QK-norm planes): per factor min_s ‖s·a − a_A‖² + ‖b/s − b_A‖², whose stationary points are
  the real roots of a quartic (all roots, then the best; batched companion matrices).
"""

from __future__ import annotations

import torch

from ..gauge_fix.base import procrustes
from ..runtime import stacked_inv, stacked_solve

POLISH_ITERATIONS = 20


def scale_fit(
    aa: torch.Tensor, ab: torch.Tensor, cc: torch.Tensor, ce: torch.Tensor, positive: bool = False
) -> torch.Tensor:
    """Per entry the s ≠ 0 (s > 0 with ``positive``) minimising f(s) = aa·s² − 2·ab·s + cc/s² −
    2·ce/s, i.e. ‖s·a − a_A‖² + ‖b/s − b_A‖² with aa = ‖a‖², ab = ⟨a, a_A⟩, cc = ‖b‖², ce = ⟨b, b_A⟩.
    f'(s) = 0 ⟺ aa·s⁴ − ab·s³ + ce·s − cc = 0.  Entries with nothing to scale keep s = 1."""
    shape = aa.shape
    aa, ab, cc, ce = (t.reshape(-1).to(torch.float64) for t in (aa, ab, cc, ce))
    s = torch.ones_like(aa)

    def f(t):
        return aa * t * t - 2 * ab * t + cc / (t * t) - 2 * ce / t

    both = (aa > 0) & (cc > 0)
    if both.any():
        a, b, c, e = aa[both], ab[both], cc[both], ce[both]
        comp = torch.zeros(a.numel(), 4, 4, dtype=torch.float64)
        comp[:, 0, 0] = b / a  # monic s⁴ − (b/a)s³ + 0·s² + (e/a)s − c/a: first row = −coefficients
        comp[:, 0, 2] = -e / a
        comp[:, 0, 3] = c / a
        comp[:, 1, 0] = comp[:, 2, 1] = comp[:, 3, 2] = 1.0
        roots = torch.linalg.eigvals(comp)
        real = roots.real
        ok = (roots.imag.abs() <= 1e-7 * roots.abs().clamp_min(1e-300)) & (real != 0)
        if positive:
            ok = ok & (real > 0)
        cand = torch.where(ok, real, torch.ones_like(real))
        vals = torch.where(
            ok, _f(a[:, None], b[:, None], c[:, None], e[:, None], cand), torch.full_like(real, torch.inf)
        )
        pick = vals.argmin(1)
        best = cand.gather(1, pick[:, None])[:, 0]
        # Newton steps on f' polish the eigenvalue (its accuracy is the companion matrix's)
        for _ in range(2):
            d1 = 2 * a * best - 2 * b - 2 * c / best**3 + 2 * e / best**2
            d2 = 2 * a + 6 * c / best**4 - 4 * e / best**3
            step = torch.where(d2 > 0, d1 / d2, torch.zeros_like(d1))
            nxt = best - step
            good = (_f(a, b, c, e, nxt) <= _f(a, b, c, e, best)) & (nxt != 0)
            if positive:
                good = good & (nxt > 0)
            best = torch.where(good, nxt, best)
        s[both] = best
    only_a = (aa > 0) & (cc == 0) & (ab != 0)
    s[only_a] = ab[only_a] / aa[only_a]
    only_c = (aa == 0) & (cc > 0) & (ce != 0)
    s[only_c] = cc[only_c] / ce[only_c]
    if positive:
        s = torch.where(s > 0, s, torch.ones_like(s))
    s = torch.where(f(s) <= f(torch.ones_like(s)), s, torch.ones_like(s))
    return s.reshape(shape)


def _f(a, b, c, e, t):
    return a * t * t - 2 * b * t + c / (t * t) - 2 * e / t


# ----------------------------------------------------------------------------- pairs (X·M, Y·M⁻ᵀ)
# Every function below takes a batch of independent problems (leading axis P: one per layer and
# KV group); the losses are summed for L-BFGS (their gradients do not interact) and each problem
# keeps its polished M only where its own loss fell.
def pair_losses(x, y, xa, ya, m) -> torch.Tensor:
    """Per problem ‖X·M − X_A‖² + ‖Y·M⁻ᵀ − Y_A‖² (Y·M⁻ᵀ = (M⁻¹·Yᵀ)ᵀ, solved, not inverted)."""
    ym = stacked_solve(m, y.transpose(-1, -2)).transpose(-1, -2)
    return ((x @ m - xa) ** 2).sum((-2, -1)) + ((ym - ya) ** 2).sum((-2, -1))


def pair_fit(
    x: torch.Tensor,
    y: torch.Tensor,
    xa: torch.Tensor,
    ya: torch.Tensor,
    planes: list[tuple[int, int]],
    orthogonal: bool,
    floor: float = 0.0,
) -> torch.Tensor:
    """The M (P × e × e, block-diagonal: a complex scalar per RoPE plane in ``planes``, one dense
    block on the other coordinates) minimising each problem's pair loss; orthogonal or general.
    The blocks are independent (M is block-diagonal, so is M⁻ᵀ), so each is fitted on its columns.
    ``floor``: a relative squared distance below which a closed-form fit is not polished (the
    rounding of the stored values: L-BFGS could only fit their noise)."""
    n, e = x.shape[0], x.shape[-1]
    m = torch.eye(e, dtype=torch.float64).repeat(n, 1, 1)
    rotated = {i for p in planes for i in p}
    rest = [i for i in range(e) if i not in rotated]
    if planes:
        w = _plane_fit(x, y, xa, ya, planes, orthogonal, floor)  # (P, planes)
        for k, (i, j) in enumerate(planes):
            m[:, i, i] = m[:, j, j] = w[:, k].real
            m[:, i, j], m[:, j, i] = w[:, k].imag, -w[:, k].imag
    if rest:
        idx = torch.tensor(rest)
        blk = _dense_fit(x[..., idx], y[..., idx], xa[..., idx], ya[..., idx], orthogonal, floor)
        m[:, idx[:, None], idx[None, :]] = blk
    return m


def _dense_fit(x, y, xa, ya, orthogonal: bool, floor: float) -> torch.Tensor:
    q = procrustes(torch.cat([x, y], -2), torch.cat([xa, ya], -2))
    if orthogonal:
        return q
    e = x.shape[-1]
    cands = [torch.eye(e, dtype=torch.float64).expand_as(q), q]
    for c in (_lstsq(x, xa), _inv_t(_lstsq(y, ya))):  # X·M = X_A; Y·M⁻ᵀ = Y_A
        if c is not None:
            cands.append(c)
    cands_t = torch.stack(cands)  # (C, P, e, e)
    losses = torch.stack([_safe_losses(x, y, xa, ya, c) for c in cands])
    best = cands_t.gather(0, losses.argmin(0)[None, :, None, None].expand(1, *q.shape))[0]
    scale = (xa**2).sum((-2, -1)) + (ya**2).sum((-2, -1))
    return _polish(lambda m: pair_losses(x, y, xa, ya, m), best, floor * scale)


def _lstsq(a, b) -> torch.Tensor | None:
    try:
        return torch.linalg.lstsq(a, b).solution
    except RuntimeError:  # rank-deficient beyond what the driver handles: no candidate
        return None


def _inv_t(m):
    if m is None:
        return None
    try:
        return stacked_inv(m).transpose(-1, -2)
    except RuntimeError:  # a singular solution: no candidate
        return None


def _safe_losses(x, y, xa, ya, m) -> torch.Tensor:
    """Per problem loss, +inf for a singular or non-finite M."""
    out = torch.full((m.shape[0],), torch.inf, dtype=torch.float64)
    ok = torch.isfinite(m).all(-1).all(-1)
    ok = ok & (torch.linalg.matrix_rank(torch.where(ok[:, None, None], m, 0.0)) == m.shape[-1])
    if ok.any():
        vals = pair_losses(x[ok], y[ok], xa[ok], ya[ok], m[ok])
        out[ok] = torch.where(torch.isfinite(vals), vals, torch.inf)
    return out


def _planes_of(t: torch.Tensor, planes) -> torch.Tensor:
    """(P, rows, planes) complex: z = t_i + i·t_j per plane."""
    i = torch.tensor([p[0] for p in planes])
    j = torch.tensor([p[1] for p in planes])
    return torch.complex(t[..., i], t[..., j])


def _plane_losses(zx, zy, zxa, zya, w) -> torch.Tensor:
    """(P, planes): each plane's loss ‖w·z_x − z_x^A‖² + ‖z_y/w̄ − z_y^A‖²."""
    w = w[:, None, :]
    return ((w * zx - zxa).abs() ** 2).sum(1) + ((zy / w.conj() - zya).abs() ** 2).sum(1)


def _plane_fit(x, y, xa, ya, planes, orthogonal: bool, floor: float) -> torch.Tensor:
    zx, zy, zxa, zya = (_planes_of(t, planes) for t in (x, y, xa, ya))
    cross = (zx.conj() * zxa).sum(1) + (zy.conj() * zya).sum(1)
    one = torch.ones_like(cross)
    phase = torch.where(cross.abs() > 0, cross / cross.abs().clamp_min(1e-300), one)
    if orthogonal:
        return phase
    nx, ny = (zx.abs() ** 2).sum(1), (zy.abs() ** 2).sum(1)
    wq = torch.where(nx > 0, (zx.conj() * zxa).sum(1) / nx.clamp_min(1e-300), phase)
    u = torch.where(ny > 0, (zy.conj() * zya).sum(1) / ny.clamp_min(1e-300), phase)
    wk = torch.where(u.abs() > 0, 1.0 / torch.where(u.abs() > 0, u, one).conj(), phase)
    cands = torch.stack([one, phase, wq, wk])
    vals = torch.stack([_plane_losses(zx, zy, zxa, zya, c) for c in cands])
    vals = torch.where(torch.isfinite(vals), vals, torch.inf)
    w0 = cands.gather(0, vals.argmin(0)[None])[0]
    scale = (zxa.abs() ** 2).sum(1) + (zya.abs() ** 2).sum(1)
    theta = _polish(
        lambda t: _plane_losses(zx, zy, zxa, zya, torch.complex(t[0], t[1])),
        torch.stack([w0.real, w0.imag]),
        floor * scale,
        axis=1,
    )
    return torch.complex(theta[0], theta[1])


def _polish(
    losses, theta0: torch.Tensor, floor: torch.Tensor, iterations: int = POLISH_ITERATIONS, axis: int = 0
) -> torch.Tensor:
    """L-BFGS on the summed per-problem ``losses`` from ``theta0`` (θ's axes from ``axis`` on are
    the losses' axes: the problems), under an iteration budget; each problem keeps θ₀ unless its
    own loss fell.  Nothing is polished when every problem's loss is at most its ``floor``."""
    with torch.no_grad():
        start = losses(theta0)
    if bool((start <= floor).all()):
        return theta0
    theta = theta0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [theta],
        lr=1.0,
        max_iter=iterations,
        tolerance_grad=1e-14 * max(float(start.sum()), 1e-300),
        tolerance_change=1e-16,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        val = losses(theta).sum()
        val.backward()
        return val

    try:
        opt.step(closure)
    except RuntimeError:  # a singular trial matrix inside the line search: keep the start
        return theta0
    out = theta.detach()
    with torch.no_grad():
        end = losses(out)
    better = torch.isfinite(end) & (end < start)
    mask = better.reshape((1,) * axis + tuple(better.shape) + (1,) * (out.dim() - axis - better.dim()))
    return torch.where(mask, out, theta0)
