"""Gauge fixing of multi-head latent attention (DeepSeek-V2/V3, :mod:`gauge_audit.models.deepseek`):
the latents' norm scales and rotations, the per-head GL on the unrotated (nope) query/key part, the
RoPE commutant on the RoPE key that every head shares, and the per-head GL on values and output
(after the stream steps of the pipeline; the other families' head steps do not apply to MLA).

Per layer and latent (c_Q of rank r_Q when the query has one, c_KV of rank r_KV) the down-projection
D = [W_D; b_D] (d(+1) × r) is read by W_U[h] through the latent's RMSNorm and weight γ.  Order:
latent-norm-scale first (γ = 1; the latent rotation's reader rule D_γ⁻¹·Oᵀ·D_γ is then Oᵀ itself,
and it leaves γ alone), then the latent rotation (its condition, on Dᵀ·D, is invariant under every
later step, which touch only the readers, and under the stream rotation, which maps D ↦ Rᵀ·D),
then the head steps, whose conditions are Gram matrices of the readers' columns — invariant under
the latent rotation's Oᵀ on their rows and under the stream rotation on W_Q, W_KR.

Special points: the latent rotation is conjugated by D_γ, not restricted by it, so equal latent norm
weights (γ ∝ 1, Hugging Face's initialisation) are not special (the nullity theory finds no extra
family there) and their canonical form is unique; what is not unique is reported: equal
eigenvalues of a latent's Dᵀ·D, equal singular values of a head's nope or value map, a zero or
circular RoPE plane, a zero latent norm weight, vanishing third moments.
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS, Element
from ..actions.base import cond
from ..actions.mla import latents, query_name
from ..models.config import Config
from ..models.deepseek import DeepseekConfig, as_latent
from ..models.layers import rope_planes
from .base import Context, Params, descending, gram_axes, match
from .heads import balanced_block, balanced_conditions, gl_decisions, plane_commutant, plane_conditions


def _mla(cfg: Config) -> DeepseekConfig | None:
    return as_latent(cfg) if cfg.latent_attention else None


def _down(p: Params, pre: str, name: str) -> torch.Tensor:
    """[W_D; b_D]: the latent's down-projection with its bias as one more input row."""
    w, b = p[f"{pre}.W_D{name}"], p.get(f"{pre}.b_D{name}")
    return w if b is None else torch.cat([w, b[None, :]], 0)


def _pre(layer: int) -> str:
    return f"blocks.{layer}.attn"


# ----------------------------------------------------------------------------- latent-norm-scale
def fix_latent_norm_scale(ctx: Context) -> None:
    """Condition: γ = 1 for every latent norm (c_Q, c_KV of every layer): r_Q + r_KV per layer.

    Reachable: s = 1/γ (latent-norm-scale: γ ↦ γ⊙s, the readers' rows ÷ s).  Unique: the scale
    group acts freely on a γ without zero entries; a zero entry is left and reported."""
    cfg = _mla(ctx.cfg)
    if cfg is None:
        return
    p, parts, notes = ctx.params, {}, []
    for name, r, norm, _ in latents(cfg):
        s = torch.ones(cfg.n_layers, r, dtype=torch.float64)
        for layer in range(cfg.n_layers):
            g = p[f"{_pre(layer)}.{norm}"]
            zero = g == 0
            if zero.any():
                notes.append(
                    f"{_pre(layer)}.{norm}: {int(zero.sum())} zero weight entries keep their scale (not unique)"
                )
            s[layer] = torch.where(zero, 1.0, 1.0 / torch.where(zero, 1.0, g))
        parts[name] = s
    kappa = max(float(s.abs().max() / s.abs().min()) for s in parts.values())
    ctx.apply(
        "latent-norm-scale", "latent-norm-scale", Element(parts, kappa), "γ = 1 for every latent norm", notes=notes
    )


def cond_latent_norm_scale(cfg: Config, p: Params) -> torch.Tensor | None:
    c = _mla(cfg)
    if c is None:
        return None
    return torch.cat([p[f"{_pre(i)}.{norm}"] - 1.0 for i in range(c.n_layers) for _, _, norm, _ in latents(c)])


# ----------------------------------------------------------------------------- latent-rotation
def fix_latent_rotation(ctx: Context) -> None:
    """Condition: per layer and latent, the Gram Dᵀ·D of the down-projection D = [W_D; b_D] is
    diagonal with descending entries, and each column D·eᵢ has a positive third moment:
    r(r − 1)/2 conditions per latent.

    Reachable: O = the Gram's eigenvectors, signed (latent-rotation; after latent-norm-scale γ = 1,
    so its readers take Oᵀ).  Unique when the eigenvalues are distinct and no third moment
    vanishes; otherwise reported, as is a latent with a zero norm weight (left unrotated: its
    zeroed coordinate's reader rows are free).  With a reference, O is the orthogonal Procrustes
    fit of D to the reference's."""
    cfg = _mla(ctx.cfg)
    if cfg is None:
        return
    p, parts, decisions, notes = ctx.params, {}, [], []
    for name, r, norm, _ in latents(cfg):
        o = torch.zeros(cfg.n_layers, r, r, dtype=torch.float64)
        for layer in range(cfg.n_layers):
            where = f"latent c_{name} of block {layer}"
            if (p[f"{_pre(layer)}.{norm}"] == 0).any():
                # a zeroed latent coordinate: the readers' rule D_γ⁻¹·Oᵀ·D_γ does not exist
                notes.append(f"latent-rotation {where}: a zero norm weight, rotation not fixed")
                decisions.append(ctx.decision("spectrum", f"{where}: a zero norm weight", [0.0], 1.0))
                o[layer] = torch.eye(r, dtype=torch.float64)
                continue
            ref = _down(ctx.reference, _pre(layer), name) if ctx.reference is not None else None
            o[layer], ds = gram_axes(ctx, _down(p, _pre(layer), name), ref, where)
            decisions += ds
        parts[name] = o
    ctx.apply(
        "latent-rotation",
        "latent-rotation",
        Element(parts, 1.0),
        "every latent's down-projection Gram diagonal, descending, axes signed by their third moment",
        decisions=decisions,
        notes=notes,
    )


def cond_latent_rotation(cfg: Config, p: Params) -> torch.Tensor | None:
    c = _mla(cfg)
    if c is None:
        return None
    out = []
    for layer in range(c.n_layers):
        for name, r, _, _ in latents(c):
            d = _down(p, _pre(layer), name)
            i, j = torch.triu_indices(r, r, 1)
            out.append((d.T @ d)[i, j])
    return torch.cat(out)


# ----------------------------------------------------------------------------- mla-head-perm
def _head_maps(cfg: DeepseekConfig, p: Params, layer: int) -> torch.Tensor:
    """Per head, flattened: its nope score map X^nope·W_UKᵀ, its rope score map X^rope·[W_KR; b_KR]ᵀ
    and its output map W_UV·W_O — invariant under mla-nope-gl, the shared RoPE commutant and
    mla-vo-gl, which come later: (n_heads, ·)."""
    out = []
    for h in range(cfg.n_heads):
        x, k = nope_pair(cfg, p, layer, h)
        xr, kr = rope_pair(cfg, p, layer)
        q_in = xr.shape[0] // cfg.n_heads
        v, o = vo_pair(cfg, p, layer, h)
        maps = (x @ k.T, xr[h * q_in : (h + 1) * q_in] @ kr.T, v @ o.T)
        out.append(torch.cat([m.reshape(-1) for m in maps]))
    return torch.stack(out)


def fix_mla_head_perm(ctx: Context) -> None:
    """Condition: in every layer the heads are ordered by decreasing ‖nope score map‖² + ‖rope score
    map‖² + ‖output map‖² (:func:`_head_maps`).  Reachable: sort (mla-head-perm).  Unique when no
    two keys tie (reported).  With a reference, heads are matched to the reference's by their maps
    (after the latent steps both are in the same latent frame)."""
    cfg = _mla(ctx.cfg)
    if cfg is None or cfg.n_heads == 1 or ctx.reuse("mla-head-perm"):
        return
    perm = torch.zeros(cfg.n_layers, cfg.n_heads, dtype=torch.long)
    margins = []
    for layer in range(cfg.n_layers):
        feat = _head_maps(cfg, ctx.params, layer)
        if ctx.reference is None:
            perm[layer], gaps = descending((feat * feat).sum(1))
            margins.append(gaps)
        else:
            perm[layer], m = match(torch.cdist(feat, _head_maps(cfg, ctx.reference, layer)) ** 2)
            margins.append(torch.tensor([m]))
    ctx.apply(
        "mla-head-perm",
        "mla-head-perm",
        Element({"perm": perm}, 1.0),
        "heads in decreasing order of their score and output map norms",
        decisions=[ctx.decision("order" if ctx.reference is None else "match", "heads", torch.cat(margins), 4.0)],
    )


# ----------------------------------------------------------------------------- the heads
def nope_pair(cfg: DeepseekConfig, p: Params, layer: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Head h's nope query columns (r_Q or d × d_nope) and its nope key W_UK[h] (r_KV × d_nope)."""
    pre = _pre(layer)
    return p[query_name(cfg, pre)][h][:, : cfg.nope_dim], p[f"{pre}.W_UK"][h]


def rope_pair(cfg: DeepseekConfig, p: Params, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every head's rope query columns, stacked (h·(r_Q or d) × d_rope), and the shared RoPE key
    [W_KR; b_KR] (d(+1) × d_rope): one commutant element acts on all of them."""
    pre = _pre(layer)
    q = p[query_name(cfg, pre)][..., cfg.nope_dim :]
    k, b = p[f"{pre}.W_KR"], p.get(f"{pre}.b_KR")
    return q.reshape(-1, cfg.d_head), k if b is None else torch.cat([k, b[None, :]], 0)


def vo_pair(cfg: DeepseekConfig, p: Params, layer: int, h: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Head h's value map W_UV[h] (r_KV × d_v) and its output W_O[h]ᵀ (d × d_v)."""
    pre = _pre(layer)
    return p[f"{pre}.W_UV"][h], p[f"{pre}.W_O"][h].T


def _fix_per_head(ctx: Context, family: str, pair, width: int, part: str, text: str) -> None:
    cfg = ctx.cfg
    cfg = as_latent(cfg)
    ms = torch.zeros(cfg.n_layers, cfg.n_heads, width, width, dtype=torch.float64)
    gaps: list[tuple[torch.Tensor, float]] = []
    sgn: list = []
    notes: list[str] = []
    for layer in range(cfg.n_layers):
        for h in range(cfg.n_heads):
            x, y = pair(cfg, ctx.params, layer, h)
            ref = pair(cfg, ctx.reference, layer, h) if ctx.reference is not None else None
            ms[layer, h] = balanced_block(ctx, x, y, ref, family, f"block {layer} head {h}", notes, gaps, sgn)
    ctx.apply(
        family,
        family,
        Element({part: ms}, cond(ms)),
        text,
        decisions=gl_decisions(ctx, family, gaps, [], sgn),
        notes=notes,
    )


_BALANCED = "balanced factors with diagonal descending Grams, columns signed by their third moment"


def fix_nope(ctx: Context) -> None:
    """Condition, per layer and head: the nope query columns X·M and the nope key W_UK[h]·M⁻ᵀ
    balanced (equal diagonal Grams, the singular values of the head's nope score map, descending)
    and each column of X·M with a positive third moment: d_nope² conditions (as qk-gl without RoPE).

    Reachable: the balanced factorisation (mla-nope-gl).  Unique when the singular values are
    distinct and non-zero (a rank-deficient head is left and reported); sign ties reported.  With a
    reference: the balanced form rotated by the Procrustes fit to the reference's."""
    if ACTIONS["mla-nope-gl"].applies(ctx.cfg) is None:
        _fix_per_head(ctx, "mla-nope-gl", nope_pair, ctx.cfg.nope_dim, "M", _BALANCED)  # type: ignore[attr-defined]


def fix_rope(ctx: Context) -> None:
    """Condition, per layer and RoPE plane (z = x_a + i·x_b on the stacked query columns of every
    head, and on the shared key): ‖w·z_q‖ = ‖z_k/w̄‖ and Σ(w·z_q)² real positive — the plane's two
    stacked query columns orthogonal with the first the longer — then the third-moment sign:
    d_rope conditions per layer (the partial-rotary / qk-gl RoPE commutant step, with one element
    for every head because the key is shared).

    Reachable: per plane |w| = (‖z_k‖/‖z_q‖)^{1/2}, arg w = −arg(Σz_q²)/2 (mla-rope-commutant).
    Unique when Σz_q² ≠ 0 (a zero or circular plane is reported); sign ties reported.  With a
    reference: the phase fit per plane."""
    cfg = _mla(ctx.cfg)
    if cfg is None:
        return
    e, planes = cfg.d_head, rope_planes(cfg)
    ns = torch.zeros(cfg.n_layers, e, e, dtype=torch.float64)
    phase: list[float] = []
    sgn: list = []
    notes: list[str] = []
    for layer in range(cfg.n_layers):
        x, y = rope_pair(cfg, ctx.params, layer)
        ref = rope_pair(cfg, ctx.reference, layer) if ctx.reference is not None else None
        plane_commutant(ctx, ns[layer], x, y, ref, planes, f"mla-rope-commutant block {layer}", phase, sgn, notes)
    ctx.apply(
        "mla-rope-commutant",
        "mla-rope-commutant",
        Element({"N": ns}, cond(ns)),
        "per RoPE plane: the shared key and every head's stacked queries of balanced norms, query columns orthogonal, signed",
        decisions=gl_decisions(ctx, "mla-rope-commutant", [], phase, sgn),
        notes=notes,
    )


def fix_mla_vo(ctx: Context) -> None:
    """Condition, per layer and head: W_UV[h]·N and W_O[h]ᵀ·N⁻ᵀ balanced and each value column
    with a positive third moment: d_v² conditions.  Reachable and unique as for mla-nope-gl."""
    cfg = _mla(ctx.cfg)
    if cfg is not None:
        _fix_per_head(ctx, "mla-vo-gl", vo_pair, cfg.v_dim, "N", _BALANCED)


def cond_nope(cfg: Config, p: Params) -> torch.Tensor | None:
    c = _mla(cfg)
    if c is None or ACTIONS["mla-nope-gl"].applies(c) is not None:
        return None
    return torch.cat(
        [t for i in range(c.n_layers) for h in range(c.n_heads) for t in balanced_conditions(*nope_pair(c, p, i, h))]
    )


def cond_rope(cfg: Config, p: Params) -> torch.Tensor | None:
    c = _mla(cfg)
    if c is None:
        return None
    return torch.cat([t for i in range(c.n_layers) for t in plane_conditions(*rope_pair(c, p, i), rope_planes(c))])


def cond_mla_vo(cfg: Config, p: Params) -> torch.Tensor | None:
    c = _mla(cfg)
    if c is None:
        return None
    return torch.cat(
        [t for i in range(c.n_layers) for h in range(c.n_heads) for t in balanced_conditions(*vo_pair(c, p, i, h))]
    )
