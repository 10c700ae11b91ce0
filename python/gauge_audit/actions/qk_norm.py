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
from .base import Action, Element, Params, as64, attn_prefixes, put, query_heads, require_shape, updated


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


def turn_applies(cfg: Config) -> str | None:
    if cfg.qk_norm not in ("head", "full"):
        return "the model has no QK-norm (its plane rotations are continuous: qk-gl)"
    return None if cfg.pos == "rope" else "the model has no RoPE planes"


def _turn_shape(cfg: Config) -> tuple[int, int, int]:
    return (cfg.n_layers, cfg.n_kv_heads, len(rope_planes(cfg)))


def _sample_turns(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    t = torch.randint(0, 4, _turn_shape(cfg), generator=g)
    if cfg.qk_norm == "head":  # a quarter turn exchanges shared norm entries: every KV group turns with it
        t = 2 * (t // 2) + (t[:, :1] % 2)
    return Element({"turns": t.to(torch.float64)}, 1.0)


def _quarter(x: torch.Tensor, y: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The plane's coordinates (x, y) turned k quarters: (x, y) ↦ (−y, x) k times."""
    for _ in range(k % 4):
        x, y = -y, x
    return x, y


def qk_plane_turn(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℤ/4)^(KV groups × RoPE planes) per QK-normed layer — with a norm shared by the heads,
    a quarter turn of a plane in every KV group at once (a half turn per group on its own).

    Acts: on layer l, KV group j, plane (a, b), k = turns[l, j, plane]: the columns a, b of W_Q of
    every query head of group j and of W_K[j] (and b_Q, b_K) are turned k quarters, (x, y) ↦ (−y, x);
    for odd k the plane's QK-norm entries a ↔ b are exchanged (q_norm and k_norm; a full-width
    norm: those of group j's heads).

    Why: n(y) is unchanged by a signed permutation of coordinates, so the norm's output is turned
    too, times the exchanged weights; a quarter turn commutes with the plane's RoPE rotation, and the
    score q·k sees the same turn on both sides.  The half turn (k = 2) changes no weight: with
    generic norm weights it is the discrete part the continuous qk-norm-scale does not reach."""
    t = el.parts["turns"]
    require_shape("turns", t, _turn_shape(cfg))
    k = t.round().to(torch.int64) % 4
    if cfg.qk_norm == "head" and bool(((k % 2) != (k[:, :1] % 2)).any()):
        raise GaugeAuditError("with a norm shared by the heads every KV group takes the same quarter-turn parity")
    planes, e = rope_planes(cfg), cfg.d_head
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        if not bool(k[l].any()):
            continue
        new = {
            n: as64(params[n]).clone()
            for n in (f"{pre}.W_Q", f"{pre}.W_K", f"{pre}.b_Q", f"{pre}.b_K", f"{pre}.q_norm", f"{pre}.k_norm")
            if n in params
        }
        for j in range(cfg.n_kv_heads):
            for p, (a, b) in enumerate(planes):
                kk = int(k[l, j, p])
                if not kk:
                    continue
                for name, heads in ((f"{pre}.W_Q", query_heads(cfg, j)), (f"{pre}.W_K", [j])):
                    for h in heads:
                        x, y = _quarter(new[name][h, :, a].clone(), new[name][h, :, b].clone(), kk)
                        new[name][h, :, a], new[name][h, :, b] = x, y
                for name, heads in ((f"{pre}.b_Q", query_heads(cfg, j)), (f"{pre}.b_K", [j])):
                    if name in new:
                        for h in heads:
                            x, y = _quarter(new[name][h, a].clone(), new[name][h, b].clone(), kk)
                            new[name][h, a], new[name][h, b] = x, y
                if kk % 2 and (cfg.qk_norm == "full" or j == 0):
                    offsets = (
                        ((f"{pre}.q_norm", [h * e for h in query_heads(cfg, j)]), (f"{pre}.k_norm", [j * e]))
                        if cfg.qk_norm == "full"
                        else ((f"{pre}.q_norm", [0]), (f"{pre}.k_norm", [0]))
                    )
                    for name, starts in offsets:
                        for o in starts:
                            new[name][[o + a, o + b]] = new[name][[o + b, o + a]].clone()
        changes.update({n: put(v, params[n]) for n, v in new.items()})
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
    Action(
        "qk-plane-turn",
        "(ℤ/4)^(KV groups × RoPE planes) per QK-normed layer: quarter turns with the norm entries exchanged",
        True,
        turn_applies,
        _sample_turns,
        qk_plane_turn,
        generic_kappa=False,
    ),
]
