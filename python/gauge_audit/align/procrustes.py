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

POLISH_ITERATIONS = 60


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
def pair_loss(x, y, xa, ya, m) -> torch.Tensor:
    """‖X·M − X_A‖² + ‖Y·M⁻ᵀ − Y_A‖² (Y·M⁻ᵀ = (M⁻¹·Yᵀ)ᵀ, solved, not inverted)."""
    ym = torch.linalg.solve(m, y.T).T
    return ((x @ m - xa) ** 2).sum() + ((ym - ya) ** 2).sum()


def pair_fit(
    x: torch.Tensor,
    y: torch.Tensor,
    xa: torch.Tensor,
    ya: torch.Tensor,
    planes: list[tuple[int, int]],
    orthogonal: bool,
) -> torch.Tensor:
    """The M (e × e, block-diagonal: a complex scalar per RoPE plane in ``planes``, one dense
    block on the other coordinates) minimising :func:`pair_loss`; orthogonal or general.  The
    blocks are independent (M is block-diagonal, so is M⁻ᵀ), so each is fitted on its columns."""
    e = x.shape[1]
    m = torch.eye(e, dtype=torch.float64)
    rotated = [i for p in planes for i in p]
    rest = [i for i in range(e) if i not in set(rotated)]
    if planes:
        w = _plane_fit(x, y, xa, ya, planes, orthogonal)
        for (i, j), wk in zip(planes, w.tolist()):
            m[i, i] = m[j, j] = wk.real
            m[i, j], m[j, i] = wk.imag, -wk.imag
    if rest:
        idx = torch.tensor(rest)
        blk = _dense_fit(x[:, idx], y[:, idx], xa[:, idx], ya[:, idx], orthogonal)
        m[idx[:, None], idx[None, :]] = blk
    return m


def _dense_fit(x, y, xa, ya, orthogonal: bool) -> torch.Tensor:
    q = procrustes(torch.cat([x, y]), torch.cat([xa, ya]))
    if orthogonal:
        return q
    e = x.shape[1]
    cands = [torch.eye(e, dtype=torch.float64), q]
    from_x = lambda: torch.linalg.lstsq(x, xa).solution  # noqa: E731  X·M = X_A
    from_y = lambda: torch.linalg.inv(torch.linalg.lstsq(y, ya).solution).T  # noqa: E731  Y·M⁻ᵀ = Y_A
    for solve in (from_x, from_y):
        try:
            c = solve()
        except RuntimeError:  # a singular least-squares solution: not a candidate
            continue
        if torch.isfinite(c).all() and torch.linalg.matrix_rank(c) == e:
            cands.append(c)
    losses = [float(pair_loss(x, y, xa, ya, c)) for c in cands]
    best = cands[min(range(len(cands)), key=lambda k: losses[k])]
    return _polish(lambda m: pair_loss(x, y, xa, ya, m), best)


def _planes_of(t: torch.Tensor, planes) -> torch.Tensor:
    """(rows, P) complex: z = t_i + i·t_j per plane."""
    i = torch.tensor([p[0] for p in planes])
    j = torch.tensor([p[1] for p in planes])
    return torch.complex(t[:, i], t[:, j])


def _plane_loss(zx, zy, zxa, zya, wr, wi) -> torch.Tensor:
    w = torch.complex(wr, wi)
    return ((w * zx - zxa).abs() ** 2).sum() + ((zy / w.conj() - zya).abs() ** 2).sum()


def _plane_fit(x, y, xa, ya, planes, orthogonal: bool) -> torch.Tensor:
    zx, zy, zxa, zya = (_planes_of(t, planes) for t in (x, y, xa, ya))
    cross = (zx.conj() * zxa).sum(0) + (zy.conj() * zya).sum(0)
    phase = torch.where(cross.abs() > 0, cross / cross.abs().clamp_min(1e-300), torch.ones_like(cross))
    if orthogonal:
        return phase
    nx, ny = (zx.abs() ** 2).sum(0), (zy.abs() ** 2).sum(0)
    wq = torch.where(nx > 0, (zx.conj() * zxa).sum(0) / nx.clamp_min(1e-300), phase)
    u = torch.where(ny > 0, (zy.conj() * zya).sum(0) / ny.clamp_min(1e-300), phase)
    wk = torch.where(u.abs() > 0, 1.0 / u.conj(), phase)

    def per_plane(w):  # the loss of each plane on its own (the planes are independent)
        return ((w * zx - zxa).abs() ** 2).sum(0) + ((zy / w.conj() - zya).abs() ** 2).sum(0)

    cands = torch.stack([torch.ones_like(phase), phase, wq, wk])
    vals = torch.stack([per_plane(c) for c in cands])
    vals = torch.where(torch.isfinite(vals), vals, torch.full_like(vals, torch.inf))
    w0 = cands.gather(0, vals.argmin(0)[None])[0]
    theta = _polish(
        lambda t: _plane_loss(zx, zy, zxa, zya, t[0], t[1]),
        torch.stack([w0.real, w0.imag]),
    )
    w1 = torch.complex(theta[0], theta[1])
    keep = per_plane(w1) <= per_plane(w0)
    return torch.where(keep, w1, w0)


def _polish(loss, theta0: torch.Tensor, iterations: int = POLISH_ITERATIONS) -> torch.Tensor:
    """L-BFGS from ``theta0`` under an iteration budget; ``theta0`` back unless it lowers the loss."""
    with torch.no_grad():
        start = float(loss(theta0))
    theta = theta0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS(
        [theta],
        lr=1.0,
        max_iter=iterations,
        tolerance_grad=1e-14 * max(start, 1e-300),
        tolerance_change=1e-16,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        val = loss(theta)
        val.backward()
        return val

    try:
        opt.step(closure)
    except RuntimeError:  # a singular trial matrix inside the line search: keep the start
        return theta0
    out = theta.detach()
    with torch.no_grad():
        end = float(loss(out))
    return out if end < start and torch.isfinite(out).all() else theta0
