"""The continuous elements of alignment, one builder per action: given the current B' and A
(float64, project layout), the element of that action bringing B' closest to A, from the fits of
:mod:`.procrustes`.  Each returns None where the action has nothing to move here.

The stream rotation is fitted after folding the norm weights (norm-scale with s = 1/γ, so every
weighted norm has γ = 1 and the reader rule C = D_γ⁻¹·R·D_γ is R itself): in those coordinates
the writers move as W ↦ W·R and the readers as W ↦ Rᵀ·W, i.e. the readers' transposes as rows
times R, and one orthogonal Procrustes problem on the stacked rows is the exact optimum (under
LayerNorm on 1^⊥, since R must fix 1).  A is folded the same way in memory only.
"""

from __future__ import annotations

import torch

from ..actions import Element
from ..actions.base import cond
from ..actions.qk_norm import units
from ..actions.stream import norm_readers, stream_writers
from ..gauge_fix.base import ones_basis, procrustes
from ..gauge_fix.heads import qk_pair, vo_pair
from ..models.config import Config
from ..models.layers import rope_planes
from .procrustes import pair_fit, scale_fit

Params = dict


def _kappa(s: torch.Tensor) -> float:
    a = s.abs()
    return float(a.max() / a.min()) if a.numel() else 1.0


# ----------------------------------------------------------------------------- norms
def weighted_norms(cfg: Config, p: Params) -> list[str]:
    """The norms norm-scale can rescale: weighted, with transformable readers."""
    return [n for n in norm_readers(cfg, p) if f"{n}.w" in p]


def fold(cfg: Config, p: Params) -> Element | None:
    """norm-scale with s = 1/γ (γ = 0 entries keep s = 1): every weighted norm gets γ = 1."""
    parts = {}
    for n in weighted_norms(cfg, p):
        g = p[f"{n}.w"]
        parts[n] = torch.where(g == 0, torch.ones_like(g), 1.0 / torch.where(g == 0, torch.ones_like(g), g))
    return Element(parts, max(_kappa(s) for s in parts.values())) if parts else None


def norm_scale(cfg: Config, b: Params, a: Params) -> Element | None:
    """norm-scale: per coordinate i the s minimising ‖s·(γ, β)_i − (γ, β)_i^A‖² + Σ_readers
    ‖W[i]/s − W^A[i]‖² (:func:`.procrustes.scale_fit`)."""
    parts = {}
    readers = norm_readers(cfg, b)
    for n in weighted_norms(cfg, b):
        fwd = [f"{n}.w"] + ([f"{n}.b"] if f"{n}.b" in b else [])
        aa = sum(b[k] * b[k] for k in fwd)
        ab = sum(b[k] * a[k] for k in fwd)
        cc = torch.zeros(cfg.d_model, dtype=torch.float64)
        ce = torch.zeros(cfg.d_model, dtype=torch.float64)
        for w, _ in readers[n]:
            wb, wa = b[w].movedim(-2, 0).reshape(cfg.d_model, -1), a[w].movedim(-2, 0).reshape(cfg.d_model, -1)
            cc = cc + (wb * wb).sum(1)
            ce = ce + (wb * wa).sum(1)
        parts[n] = scale_fit(aa, ab, cc, ce)
    return Element(parts, max(_kappa(s) for s in parts.values())) if parts else None


def unfold_to(cfg: Config, b: Params, a: Params) -> Element | None:
    """norm-scale with s = γ_A/γ_B: B's norm weights become those of ``a`` (entries where either
    is 0 keep s = 1)."""
    parts = {}
    for n in weighted_norms(cfg, b):
        gb, ga = b[f"{n}.w"], a[f"{n}.w"]
        ok = (gb != 0) & (ga != 0)
        parts[n] = torch.where(ok, ga / torch.where(ok, gb, torch.ones_like(gb)), torch.ones_like(gb))
    return Element(parts, max(_kappa(s) for s in parts.values())) if parts else None


# ----------------------------------------------------------------------------- stream rotation
def _reader_rows(cfg: Config, p: Params, w: str, gamma: torch.Tensor | None) -> torch.Tensor:
    """A reader W (…, d, cols) in folded coordinates (D_γ·W) as rows: (… · cols, d)."""
    t = p[w] if gamma is None else p[w] * gamma[:, None]
    return t.movedim(-2, -1).reshape(-1, cfg.d_model)


def _stream_rows(cfg: Config, p: Params, folded_from: Params | None, all_tensors: bool) -> torch.Tensor:
    """Every tensor the rotation moves, as rows that are multiplied by R: the writers (token and
    position tables, and with ``all_tensors`` W_O, b_O, W_out, b_out), each norm's folded β, and
    the folded readers' transposes.  ``folded_from``: the model whose γ folds them (A's, whose γ
    is not 1); None for a model already folded.  Without ``all_tensors`` only what no head or unit
    permutation moves: the embeddings, the final norm and the unembedding."""
    rows = []
    for w in stream_writers(cfg, p):
        if all_tensors or w.startswith("embed."):
            rows.append(p[w].reshape(-1, cfg.d_model))
    for n, readers in norm_readers(cfg, p).items():
        if not all_tensors and n != "ln_final":
            continue
        gamma = folded_from[f"{n}.w"] if folded_from is not None and f"{n}.w" in folded_from else None
        if f"{n}.b" in p:
            beta = p[f"{n}.b"]
            rows.append((beta if gamma is None else beta / torch.where(gamma == 0, 1.0, gamma))[None])
        for w, _ in readers:
            rows.append(_reader_rows(cfg, p, w, gamma))
    return torch.cat(rows)


def rotation(cfg: Config, b_folded: Params, a: Params, all_tensors: bool) -> Element:
    """stream-rotation R (orthogonal; fixing 1 under LayerNorm) minimising the folded distance of
    every tensor it moves (module docstring)."""
    xb = _stream_rows(cfg, b_folded, None, all_tensors)
    xa = _stream_rows(cfg, a, a, all_tensors)
    if cfg.norm.startswith("layernorm"):
        u = ones_basis(cfg.d_model)
        r = u @ procrustes(xb @ u, xa @ u) @ u.T + 1.0 / cfg.d_model
    else:
        r = procrustes(xb, xa)
    return Element({"R": r}, 1.0)


# ----------------------------------------------------------------------------- attention
def _planes(cfg: Config) -> list[tuple[int, int]]:
    return rope_planes(cfg) if cfg.pos == "rope" else []


def gl_pairs(cfg: Config, b: Params, a: Params, key: str, orthogonal: bool, floor: float = 0.0) -> Element:
    """qk-gl (key "M": per KV group the query/key pair, on the RoPE commutant) or vo-gl (key "N":
    the value/output pair), every group's matrix from one batched :func:`.procrustes.pair_fit`."""
    pair, planes = (qk_pair, _planes(cfg)) if key == "M" else (vo_pair, [])
    where = [(layer, j) for layer in range(cfg.n_layers) for j in range(cfg.n_kv_heads)]
    sides = [[pair(cfg, p, layer, j) for layer, j in where] for p in (b, a)]
    x, y = (torch.stack([s[k] for s in sides[0]]) for k in (0, 1))
    xa, ya = (torch.stack([s[k] for s in sides[1]]) for k in (0, 1))
    ms = pair_fit(x, y, xa, ya, planes, orthogonal, floor).reshape(cfg.n_layers, cfg.n_kv_heads, cfg.d_head, cfg.d_head)
    return Element({key: ms}, cond(ms))


def qk_norm_scale(cfg: Config, b: Params, a: Params) -> Element:
    """qk-norm-scale: per layer (and KV group for a full-width norm) and unit (a RoPE plane or an
    unrotated coordinate) the c minimising ‖c·γ_q − γ_q^A‖² + ‖γ_k/c − γ_k^A‖² over the unit's
    coordinates (of every query head of the group for a full-width norm)."""
    us = units(cfg)
    groups = cfg.n_kv_heads if cfg.qk_norm == "full" else 1  # a shared norm: one factor set
    sums = torch.zeros(4, cfg.n_layers, groups, len(us), dtype=torch.float64)
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}.attn"
        # (groups, heads of the group or 1, d_head)
        qb, qa = (p[f"{pre}.q_norm"].reshape(groups, -1, cfg.d_head) for p in (b, a))
        kb, ka = (p[f"{pre}.k_norm"].reshape(groups, -1, cfg.d_head) for p in (b, a))
        for u, coords in enumerate(us):
            idx = list(coords)
            for k, t in enumerate((qb * qb, qb * qa, kb * kb, kb * ka)):
                sums[k, layer, :, u] = t[..., idx].sum((-2, -1))
    c = scale_fit(sums[0], sums[1], sums[2], sums[3])
    c = c if cfg.qk_norm == "full" else c[:, 0]
    return Element({"c": c}, _kappa(c))


# ----------------------------------------------------------------------------- FFN
def unit_scaling(cfg: Config, b: Params, a: Params, positive: bool) -> Element:
    """relu-scaling (positive) / swiglu-scaling: per unit the s minimising ‖s·[W_in[:, i]; b_in[i]]
    − A's‖² + ‖W_out[i]/s − A's‖² (the gate is not scaled)."""
    sums: list[list[torch.Tensor]] = [[], [], [], []]
    for layer in range(cfg.n_layers):
        pre = f"blocks.{layer}.{'moe' if cfg.experts else 'mlp'}"
        wb, wa = b[f"{pre}.W_in"], a[f"{pre}.W_in"]
        aa, ab = (wb * wb).sum(-2), (wb * wa).sum(-2)  # over the input axis: (…, d_ff)
        if f"{pre}.b_in" in b:
            bb, ba = b[f"{pre}.b_in"], a[f"{pre}.b_in"]
            aa, ab = aa + bb * bb, ab + bb * ba
        ob, oa = b[f"{pre}.W_out"], a[f"{pre}.W_out"]
        for k, t in enumerate((aa, ab, (ob * ob).sum(-1), (ob * oa).sum(-1))):
            sums[k].append(t)
    aa, ab, cc, ce = (torch.stack(t) for t in sums)
    s = scale_fit(aa, ab, cc, ce, positive=positive)
    return Element({"s": s}, _kappa(s))
