"""What survives of the query–key gauge under a QK-norm (Qwen3's ``qk_norm="head"``, OLMo 2's "full").

The score of query head h and key head j is  n(q)·D_q·R_p R_sᵀ·D_k·n(k)ᵀ  with q = x W_Q[h],
n(y) = y/rms(y), D_q = diag(γ_q), D_k = diag(γ_k) (one each per layer, shared by the heads) and
R_p the RoPE rotation.  ``qk-gl``'s W_Q[h] ↦ W_Q[h]·M changes the function unless n(qM) = n(q)M
(M orthogonal) *and* M·D_q = D_q·M' with M' commuting with every R_p: for generic, distinct γ
that leaves only signs — the continuous per-KV-head GL(d_k) is gone.  What does survive is on the
norm weights: on each rotary plane (i, j), scaling (γ_q[i], γ_q[j]) by c and (γ_k[i], γ_k[j]) by
1/c multiplies both coordinates of the plane of q by c and of k by 1/c, which commutes with the
rotation and cancels in the score; a coordinate RoPE does not rotate (partial rotary, or no RoPE)
scales on its own.  This is the action ``qk-norm-scale``: (ℝ≠0)^units per layer.  A full-width norm
(OLMo 2: one rms over all heads, γ of length heads·d_head) is also left alone by an orthogonal
block-diagonal M only, and its γ is per head, so the same scaling runs per KV head and its group.
(At special points — γ_q[i] = γ_q[j] and γ_k[i] = γ_k[j] on a plane — the in-plane rotations
commute with D too and the group grows; the action does not sample them.)
"""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.layers import rope_planes
from .base import Action, Element, Params, as64, attn_prefixes, put, require_shape, updated


def units(cfg: Config) -> list[tuple[int, ...]]:
    """The coordinate sets of a head scaled together: the RoPE planes, then every unrotated coordinate."""
    planes = rope_planes(cfg) if cfg.pos == "rope" else []
    rotated = {i for p in planes for i in p}
    return [*planes, *((i,) for i in range(cfg.d_head) if i not in rotated)]


def _applies(cfg: Config) -> str | None:
    return None if cfg.qk_norm in ("head", "full") else "the model has no QK-norm"


def _shape(cfg: Config) -> tuple[int, ...]:
    """(layers, units) for a norm shared by the heads; (layers, KV heads, units) for a full-width one,
    whose weights are per head: each KV head and the query heads it serves scale on their own."""
    n = len(units(cfg))
    return (cfg.n_layers, n) if cfg.qk_norm == "head" else (cfg.n_layers, cfg.n_kv_heads, n)


def _sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    shape = _shape(cfg)
    n = shape[-1]
    rows = [
        torch.logspace(-0.5, 0.5, n, base=kappa, dtype=torch.float64)[torch.randperm(n, generator=g)]
        for _ in range(int(torch.tensor(shape[:-1]).prod()))
    ]
    signs = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    c = torch.stack(rows).reshape(shape) * signs
    return Element({"c": c}, float(c.abs().max() / c.abs().min()))


def qk_norm_scale(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ≠0)^units per layer (a norm shared by the heads), or per layer and KV head (a
    full-width norm) — one factor per RoPE plane and per unrotated coordinate.

    Acts: on layer l's unit u (a plane (i, j) or a coordinate i) with factor c = c[l, u] (full width:
    c[l, j, u] for KV head j and the query heads of its group): γ_q[i] ↦ c·γ_q[i], γ_k[i] ↦ γ_k[i]/c for
    every coordinate i of u (q_norm, k_norm).

    Why: after the norm, q's coordinates of u are multiplied by c and k's by 1/c; on a plane that is
    c·I, which commutes with the RoPE rotation, so every score term q_i k_i of u is unchanged.
    """
    us = units(cfg)
    c = el.parts["c"]
    require_shape("c", c, _shape(cfg))
    c = as64(c)
    if (c == 0).any():
        raise GaugeAuditError("c must be non-zero")
    if cfg.qk_norm == "head":
        c = c[:, None, :]  # one factor set for every KV head
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        per_coord = torch.ones(c.shape[1], cfg.d_head, dtype=torch.float64)  # (KV heads or 1, d_head)
        for u, coords in enumerate(us):
            per_coord[:, list(coords)] = c[l, :, u, None]
        # the query heads of KV group j take group j's factors
        q_factor = per_coord.repeat_interleave(cfg.group_size if cfg.qk_norm == "full" else 1, dim=0)
        for key, f in ((f"{pre}.q_norm", q_factor), (f"{pre}.k_norm", 1 / per_coord)):
            changes[key] = put(as64(params[key]) * f.reshape(-1), params[key])
    return updated(params, changes)


ACTIONS = [
    Action(
        "qk-norm-scale",
        "(ℝ≠0)^(RoPE planes + unrotated coordinates) per QK-normed layer (and KV head)",
        True,
        _applies,
        _sample,
        qk_norm_scale,
    ),
]
