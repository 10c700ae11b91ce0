"""Gauge fixing inside attention: head permutations, the query–key GL (RoPE commutant, GQA-tied;
a partial rotary's GL on the unrotated coordinates) and the value–output GL (steps 9, 12, 13 of the pipeline).

Per layer and KV group j the query side is the stack X of its query heads' [W_Q[h]; b_Q[h]]
(g·(d+1) × d_k rows: the group shares one M) and the key side Y = [W_K[j]; b_K[j]]; qk-gl maps
(X, Y) ↦ (X·M, Y·M⁻ᵀ) and leaves every bilinear map X_h·Yᵀ unchanged.  Likewise the value side
[W_V[j]; b_V[j]] and the output side, the stack of W_O[h]ᵀ, under vo-gl with N.
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS, Element
from ..actions.base import cond
from ..models.config import Config
from ..models.layers import rope_planes
from ..runtime import stacked_inv
from .base import SIGN_SENSITIVITY, Context, Decision, Params, balance, descending, match, procrustes, signs


def _rows(p: Params, pre: str, name: str, idx: int) -> torch.Tensor:
    """[W[idx]; b[idx]]: the weight with its bias as one more input row (input 1)."""
    w = p[f"{pre}.W_{name}"][idx]
    b = p.get(f"{pre}.b_{name}")
    return w if b is None else torch.cat([w, b[idx][None, :]], 0)


def _heads(cfg: Config, j: int) -> range:
    return range(j * cfg.group_size, (j + 1) * cfg.group_size)


def qk_pair(cfg: Config, p: Params, layer: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    pre = f"blocks.{layer}.attn"
    return torch.cat([_rows(p, pre, "Q", h) for h in _heads(cfg, j)], 0), _rows(p, pre, "K", j)


def vo_pair(cfg: Config, p: Params, layer: int, j: int) -> tuple[torch.Tensor, torch.Tensor]:
    pre = f"blocks.{layer}.attn"
    return _rows(p, pre, "V", j), torch.cat([p[f"{pre}.W_O"][h].T for h in _heads(cfg, j)], 0)


def _head_factors(cfg: Config, p: Params, layer: int) -> tuple[torch.Tensor, ...]:
    """Per query head h of KV group j the factors of its score map X_h·Y_jᵀ and its output map
    V_j·W_O[h] (both invariant under qk-gl and vo-gl): X (n_heads, d+1, d_k), Y, V (n_heads, d+1, ·)
    and W = W_O (n_heads, d_v, d), the KV group's Y and V repeated over its query heads."""
    pre = f"blocks.{layer}.attn"
    kv = [j for j in range(cfg.n_kv_heads) for _ in _heads(cfg, j)]
    x = torch.stack([_rows(p, pre, "Q", h) for h in range(cfg.n_heads)])
    y = torch.stack([_rows(p, pre, "K", j) for j in range(cfg.n_kv_heads)])[kv]
    v = torch.stack([_rows(p, pre, "V", j) for j in range(cfg.n_kv_heads)])[kv]
    return x, y, v, p[f"{pre}.W_O"]


def _applies(action: str, cfg: Config) -> bool:
    """Multi-head latent attention has no per-head W_Q/W_K/W_V: these steps are :mod:`.mla`'s there."""
    return ACTIONS[action].applies(cfg) is None


def _group_sums(f: tuple[torch.Tensor, ...], nkv: int) -> tuple[torch.Tensor, ...]:
    """The factors of each KV group's summed maps: Σ_h X_h·Yᵀ = (Σ_h X_h)·Yᵀ, Σ_h V·W_O[h] = V·Σ_h W_O[h]."""
    x, y, v, w = (t.reshape(nkv, -1, *t.shape[1:]) for t in f)
    return x.sum(1), y[:, 0], v[:, 0], w.sum(1)


def _map_inner(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Frobenius inner products ⟨S_a[i], S_b[k]⟩ + ⟨O_a[i], O_b[k]⟩ of the maps with these factors,
    (n_a, n_b), through d_k × d_k and d_v × d_v products (⟨A·Bᵀ, C·Dᵀ⟩ = ⟨AᵀC, BᵀD⟩) instead of the
    (d+1) × d maps themselves."""
    (xa, ya, va, wa), (xb, yb, vb, wb) = a, b
    qk = (torch.einsum("ira,krb->ikab", xa, xb) * torch.einsum("ira,krb->ikab", ya, yb)).sum((-2, -1))
    vo = (torch.einsum("ira,krb->ikab", va, vb) * torch.einsum("iar,kbr->ikab", wa, wb)).sum((-2, -1))
    return qk + vo


def _map_norms(f: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """‖S[i]‖² + ‖O[i]‖² (the diagonal of :func:`_map_inner` of ``f`` with itself)."""
    x, y, v, w = f
    qk = (torch.einsum("ira,irb->iab", x, x) * torch.einsum("ira,irb->iab", y, y)).sum((-2, -1))
    return qk + (torch.einsum("ira,irb->iab", v, v) * torch.einsum("iar,ibr->iab", w, w)).sum((-2, -1))


def _dist2(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Squared distances ‖S_a[i] − S_b[k]‖² + ‖O_a[i] − O_b[k]‖² between the maps with these factors."""
    na, nb = _map_norms(a), _map_norms(b)
    return (na[:, None] + nb[None, :] - 2.0 * _map_inner(a, b)).clamp_min(0.0)


# ----------------------------------------------------------------------------- 9 head-perm
def fix_head_perm(ctx: Context) -> None:
    """Condition: in every layer the KV groups are ordered by decreasing key Σ_h (‖X_h·Yᵀ‖² +
    ‖V·W_O[h]‖²) over their query heads, and within a group the query heads by that per-head key.

    Reachable: sort (head-perm, S_{n_kv} ≀ S_g).  Unique when no two keys tie; ties (incl. zero
    heads) are reported.  The keys are invariant under qk-gl and vo-gl, which come later.  With a
    reference, groups and heads are matched to the reference's by their score and output maps."""
    if not _applies("head-perm", ctx.cfg) or ctx.reuse("head-perm"):
        return
    cfg, p = ctx.cfg, ctx.params
    g, nkv = cfg.group_size, cfg.n_kv_heads
    if cfg.n_heads == 1:
        return
    kv = torch.zeros(cfg.n_layers, nkv, dtype=torch.long)
    qp = torch.zeros(cfg.n_layers, nkv, g, dtype=torch.long)
    margins = []
    for layer in range(cfg.n_layers):
        f = _head_factors(cfg, p, layer)
        if ctx.reference is None:
            keys = _map_norms(f)
            order, gaps = descending(keys.reshape(nkv, g).sum(1))
            kv[layer] = order
            margins.append(gaps)
            for j in range(nkv):
                o, gaps = descending(keys[_heads(cfg, int(order[j]))])
                qp[layer, j] = o
                margins.append(gaps)
        else:
            rf = _head_factors(cfg, ctx.reference, layer)
            kv[layer], m = match(_dist2(_group_sums(f, nkv), _group_sums(rf, nkv)))
            margins.append(torch.tensor([m]))
            for j in range(nkv):
                src = int(kv[layer, j])
                here, there = slice(src * g, (src + 1) * g), slice(j * g, (j + 1) * g)
                qp[layer, j], m = match(_dist2(tuple(t[here] for t in f), tuple(t[there] for t in rf)))
                margins.append(torch.tensor([m]))
    kind = "match" if ctx.reference is not None else "order"
    ctx.apply(
        "head-perm",
        "head-perm",
        Element({"kv_perm": kv, "q_perm": qp}, 1.0),
        "KV groups, and query heads within each, in decreasing order of their score+output map norms",
        decisions=[ctx.decision(kind, "heads", torch.cat(margins), 4.0)],
    )


# ----------------------------------------------------------------------------- 12 qk-gl
def _plane_fixes(zq: torch.Tensor, zk: torch.Tensor, ref: tuple | None):
    """Per plane (a column of ``zq``, ``zk``: the query and key planes as complex columns) the
    commutant element w = a + ib (acting as z ↦ w·z on the query plane, z ↦ z/w̄ on the key plane)
    balancing ‖w·zq‖ = ‖zk/w̄‖ and making Σ (w·zq)² real positive (then the sign by the third
    moment), or aligning the phase to the reference planes ``ref`` = (rq, rk).  Every plane at once
    (a head has d_k/2 of them, a checkpoint thousands).  Returns (w, phase margin, sign margin),
    one entry per plane; a zero plane keeps w = 1 with both margins 0."""
    nq, nk = zq.abs().norm(dim=0), zk.abs().norm(dim=0)
    live = (nq > 0) & (nk > 0)
    one = torch.ones_like(nq)
    r = torch.where(live, nk / torch.where(live, nq, one), one).sqrt()
    if ref is not None:
        s = (ref[0] * (r * zq).conj()).sum(0) + (ref[1] * (zk / r).conj()).sum(0)
        scale = ref[0].abs().norm(dim=0) * r * nq + ref[1].abs().norm(dim=0) * nk / r
        sa = s.abs()
        turn = torch.where(sa > 0, s / torch.where(sa > 0, sa, one), torch.ones_like(s))
        pm = torch.where(scale > 0, sa / torch.where(scale > 0, scale, one), 0.0)
        w = torch.where(live, r * turn, torch.ones_like(turn))
        return w, torch.where(live, pm, 0.0), torch.where(live, 1.0, 0.0)
    s2 = (zq * zq).sum(0)
    # the principal square root of |s2|/s2: arg w = −arg(s2)/2
    turn = torch.where(s2.abs() > 0, torch.polar(one, -torch.angle(s2) / 2), torch.ones_like(s2))
    w = r * turn
    sign, margin = signs((w * zq).real, dim=0)
    pm = s2.abs() / torch.where(live, nq * nq, one)
    w = torch.where(live, w * sign, torch.ones_like(w))
    return w, torch.where(live, pm, 0.0), torch.where(live, margin, 0.0)


def _plane_index(planes) -> tuple[torch.Tensor, torch.Tensor]:
    """The planes' first and second coordinates, as index tensors."""
    a, b = (torch.tensor(c, dtype=torch.long) for c in zip(*planes))
    return a, b


def _planes(x: torch.Tensor, planes) -> torch.Tensor:
    """The planes (a, b) of ``x``'s columns as complex columns x_a + i·x_b."""
    a, b = _plane_index(planes)
    return torch.complex(x[:, a], x[:, b])


def fix_qk(ctx: Context) -> None:
    """Condition (no RoPE), per layer and KV group: X·M and Y·M⁻ᵀ balanced — (XM)ᵀ(XM) =
    (YM⁻ᵀ)ᵀ(YM⁻ᵀ) = diag(σ) with σ the singular values of the group's stacked score map X·Yᵀ,
    descending — and each column of X·M with a positive third moment: d_k² conditions.

    Under RoPE only the commutant acts (per frequency plane a complex scalar w: z ↦ w·z on the
    query plane z = x_i + i·x_j, z ↦ z/w̄ on the key plane): per plane ‖w·z_q‖ = ‖z_k/w̄‖ and
    Σ(w·z_q)² real positive, i.e. the plane's two query columns orthogonal with the first the
    longer; then the third-moment sign: d_k conditions.

    Reachable: the balanced factorisation M = R₁⁻¹·U·Σ^{1/2} (QR of X and Y, SVD of R₁R₂ᵀ);
    per plane |w| = (‖z_k‖/‖z_q‖)^{1/2}, arg w = −arg(Σz_q²)/2.  Unique when the σ are distinct
    and non-zero (a zero or rank-deficient group is left unchanged and reported), resp. when
    Σz_q² ≠ 0; sign ties reported.  With a reference the balanced form is instead rotated by the
    orthogonal Procrustes fit to the reference's (under RoPE: the phase fit per plane).

    A partial rotary (RoPE on the first R coordinates only): the commutant is the planes' scalars
    ⊕ GL(d_k − R) on the unrotated coordinates, fixed as without RoPE: R + (d_k − R)² conditions.
    A QK-norm leaves no qk-gl (its weights' rescaling is fixed by :mod:`.qk_norm`)."""
    if ctx.cfg.qk_norm == "none" and _applies("qk-gl", ctx.cfg):
        _fix_gl(ctx, "qk-gl", "qk-gl", "M", qk_pair, rope=ctx.cfg.pos == "rope")


def fix_vo(ctx: Context) -> None:
    """Condition, per layer and KV group: [W_V; b_V]·N and the stacked W_O[h]ᵀ·N⁻ᵀ balanced
    (equal diagonal Gram matrices, the singular values of the group's output map, descending) and
    each value column with a positive third moment: d_v² conditions.  Reachable and unique as
    for qk-gl without RoPE."""
    if _applies("vo-gl", ctx.cfg):
        _fix_gl(ctx, "vo-gl", "vo-gl", "N", vo_pair, rope=False)


def _rest(cfg: Config, rope: bool) -> int:
    """The first coordinate of the block the GL acts on as a whole: 0 without RoPE, R (the rotated
    coordinates) under a partial rotary, d_k (none) under a whole-head rotary."""
    return (cfg.rotary_dim or cfg.d_head) if rope else 0


def balanced_block(ctx: Context, x, y, ref, family: str, where: str, notes, gaps, sgn) -> torch.Tensor:
    """M (e × e) balancing X·M and Y·M⁻ᵀ, signed by the third moment — or, with a reference, the
    balanced form rotated by the Procrustes fit to the reference's; rank-deficient: the identity."""
    bal = balance(x, y)
    if not bal.rank_ok:
        notes.append(f"{family} {where}: rank-deficient (a zero or degenerate head): left unchanged, not unique")
        return bal.m
    m = bal.m
    if ref is not None:
        return m @ procrustes(torch.cat([x @ m, y @ stacked_inv(m).T]), torch.cat(ref))
    s, margin = signs(x @ m, dim=0)
    sgn.append(margin)
    scale = float(x.norm() * y.norm() / bal.sigma[0])
    gaps.append(((bal.sigma[:-1] - bal.sigma[1:]) / bal.sigma[0], scale))
    return m * s


def plane_commutant(ctx: Context, m, x, y, ref, planes, where: str, phase: list, sgn: list, notes: list) -> None:
    """Write into ``m`` the RoPE commutant element fixing each plane (:func:`_plane_fixes`) of the
    query side x and key side y (acting as x·m, y·m⁻ᵀ); ``ref``: the reference's (x, y) or None."""
    if not planes:
        return
    rq = (_planes(ref[0], planes), _planes(ref[1], planes)) if ref is not None else None
    w, pm, sm = _plane_fixes(_planes(x, planes), _planes(y, planes), rq)
    a, b = _plane_index(planes)
    m[a, a] = m[b, b] = w.real
    m[a, b], m[b, a] = w.imag, -w.imag
    notes += [f"{where} plane {k}: zero or circular plane, phase not fixed" for k in (pm == 0).nonzero()[:, 0].tolist()]
    phase += pm.tolist()
    sgn.append(sm)


def gl_decisions(ctx: Context, family: str, gaps: list, phase: list, sgn: list) -> list[Decision]:
    """The decisions of the balanced blocks (singular-value gaps, with the scale that bounds their
    rounding), the RoPE plane phases and the column signs of one GL step."""
    decisions = []
    if gaps:
        worst = max(s for _, s in gaps)
        decisions.append(
            ctx.decision("spectrum", f"{family} singular-value gaps", torch.cat([g for g, _ in gaps]), 2.0 * worst)
        )
    if phase:
        decisions.append(
            ctx.decision("phase" if ctx.reference is None else "match", f"{family} RoPE plane phases", phase, 2.0)
        )
    if sgn and ctx.reference is None:
        flat = torch.cat([torch.as_tensor(s, dtype=torch.float64).reshape(-1) for s in sgn])
        decisions.append(ctx.decision("sign", f"{family} column signs", flat, SIGN_SENSITIVITY))
    return decisions


def _fix_gl(ctx: Context, family: str, action: str, key: str, pair, rope: bool) -> None:
    """``key``: the action's name for its element's matrices (qk-gl's M, vo-gl's N)."""
    cfg, p = ctx.cfg, ctx.params
    e = cfg.d_head
    ms = torch.zeros(cfg.n_layers, cfg.n_kv_heads, e, e, dtype=torch.float64)
    gaps: list[tuple[torch.Tensor, float]] = []
    sgn: list = []
    phase: list[float] = []
    notes: list[str] = []
    planes = rope_planes(cfg) if rope else []
    r = _rest(cfg, rope)
    for layer in range(cfg.n_layers):
        for j in range(cfg.n_kv_heads):
            x, y = pair(cfg, p, layer, j)
            ref = pair(cfg, ctx.reference, layer, j) if ctx.reference is not None else None
            where = f"block {layer} KV group {j}"
            m = torch.zeros(e, e, dtype=torch.float64)
            plane_commutant(ctx, m, x, y, ref, planes, f"{family} {where}", phase, sgn, notes)
            if r < e:  # the whole GL on the coordinates no rotation touches (all of them without RoPE)
                sub = ref if ref is None else (ref[0][:, r:], ref[1][:, r:])
                m[r:, r:] = balanced_block(ctx, x[:, r:], y[:, r:], sub, family, where, notes, gaps, sgn)
            ms[layer, j] = m
    decisions = gl_decisions(ctx, family, gaps, phase, sgn)
    text = "balanced factors with diagonal descending Grams, columns signed by their third moment"
    if rope:
        text = "per RoPE plane: balanced norms, query columns orthogonal, signed" + (
            f"; on the unrotated coordinates {text}" if r < e else ""
        )
    ctx.apply(
        family,
        action,
        Element({key: ms}, cond(ms)),
        text,
        decisions=decisions,
        notes=notes,
    )


def cond_qk(cfg: Config, p: Params) -> torch.Tensor | None:
    if cfg.qk_norm != "none" or not _applies("qk-gl", cfg):
        return None
    return _cond_gl(cfg, p, qk_pair, rope=cfg.pos == "rope")


def cond_vo(cfg: Config, p: Params) -> torch.Tensor | None:
    if not _applies("vo-gl", cfg):
        return None
    return _cond_gl(cfg, p, vo_pair, rope=False)


def _cond_gl(cfg: Config, p: Params, pair, rope: bool) -> torch.Tensor:
    out = []
    r = _rest(cfg, rope)
    n = cfg.d_head - r
    for layer in range(cfg.n_layers):
        for j in range(cfg.n_kv_heads):
            x, y = pair(cfg, p, layer, j)
            out += plane_conditions(x, y, rope_planes(cfg) if rope else [])
            if n:
                out += balanced_conditions(x[:, r:], y[:, r:])
    return torch.cat(out)


def plane_conditions(x: torch.Tensor, y: torch.Tensor, planes) -> list[torch.Tensor]:
    """Per RoPE plane (a, b): ‖x_a‖² + ‖x_b‖² = ‖y_a‖² + ‖y_b‖² and x_a ⊥ x_b — two conditions."""
    out = []
    for a, b in planes:
        out.append((x[:, a] @ x[:, a] + x[:, b] @ x[:, b] - y[:, a] @ y[:, a] - y[:, b] @ y[:, b])[None])
        out.append((x[:, a] @ x[:, b])[None])
    return out


def balanced_conditions(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """XᵀX = YᵀY (upper triangle) and XᵀX diagonal (strict upper triangle): e² conditions."""
    n = x.shape[1]
    upper, strict = torch.triu_indices(n, n, 0), torch.triu_indices(n, n, 1)
    gx, gy = x.T @ x, y.T @ y
    return [(gx - gy)[upper[0], upper[1]], gx[strict[0], strict[1]]]
