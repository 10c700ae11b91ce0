"""The QK freedom a query/key RMSNorm leaves (Gemma 3): a trade between the two norm weights.

With q = RoPE(n(x W_Q)⊙γ_q) and k = RoPE(n(x W_K)⊙γ_k) the per-head GL(d_k) of qk-gl is gone
(see attention._qk_gl_applies); what remains continuous acts on the weights, shared by the heads.
"""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.layers import rope_planes
from .base import Action, Element, Params, as64, attn_prefixes, put, require_shape, updated


def _applies(cfg: Config) -> str | None:
    if getattr(cfg, "qk_norm", "none") != "head":
        return "the model has no query/key RMSNorm over d_head"
    return None


def _per_coordinate(cfg: Config, s: torch.Tensor) -> torch.Tensor:
    """(L, d_head/2) per-plane factors → (L, d_head), equal on both coordinates of each plane."""
    out = torch.empty(s.shape[0], cfg.d_head, dtype=torch.float64)
    for p, (i, j) in enumerate(rope_planes(cfg)):
        out[:, i] = out[:, j] = s[:, p]
    return out


def _sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    s = kappa ** (torch.rand(cfg.n_layers, cfg.d_head // 2, generator=g, dtype=torch.float64) - 0.5)
    return Element({"s": s}, float(s.max() / s.min()))


def qk_norm_trade(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ_{≠0})^{d_k/2} per layer (one factor per RoPE plane, shared by every head).

    Acts: γ_q ↦ γ_q⊙s, γ_k ↦ γ_k⊘s, with s equal on the two coordinates of each RoPE plane.

    Why: a score is q·R_Δ·kᵀ with q = n(x W_Q)·D_γq, k = n(y W_K)·D_γk; D_s is a scalar on each
    plane, so it commutes with every rotation R_Δ and D_s·R_Δ·D_s⁻¹ = R_Δ.  (A factor that differs
    within a plane does not commute with R_Δ: scores change.)
    """
    s = el.parts["s"]
    require_shape("s", s, (cfg.n_layers, cfg.d_head // 2))
    if (s == 0).any():
        raise GaugeAuditError("the trade has a zero factor (not invertible)")
    full = _per_coordinate(cfg, as64(s))
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        q, k = f"{pre}.q_norm.w", f"{pre}.k_norm.w"
        changes[q] = put(as64(params[q]) * full[l], params[q])
        changes[k] = put(as64(params[k]) / full[l], params[k])
    return updated(params, changes)


ACTIONS = [Action("qk-norm-trade", "(ℝ≠0)^{d_k/2} per layer on the QK-norm weights", True, _applies, _sample,
                  qk_norm_trade)]
