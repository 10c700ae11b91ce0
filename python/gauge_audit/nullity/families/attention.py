"""Attention families: qk-gl (the per-KV-group GL(d_k), or the RoPE commutant), vo-gl
(GL(d_v)), key-bias-shift and value-bias-fold.  Together qk-gl and vo-gl are MGS's G_max.
"""

from __future__ import annotations

import torch

from ...models.config import Config
from ...models.layers import rope_planes
from ..measure import Problem
from .base import Family, Rows, attn_prefixes, make_family


def _qk_basis(cfg: Config) -> list[torch.Tensor]:
    """A basis of gl(d_k), or of the RoPE commutant's Lie algebra (per plane I and J; with a partial
    rotary, gl of the unrotated coordinates too, which every position rotation fixes)."""
    e = cfg.d_head
    out = []
    if cfg.pos == "rope":
        for i, j in rope_planes(cfg):
            a = torch.zeros(e, e, dtype=torch.float64)
            a[i, i] = a[j, j] = 1.0
            b = torch.zeros(e, e, dtype=torch.float64)
            b[i, j], b[j, i] = 1.0, -1.0
            out += [a, b]
        r = cfg.rotary_dim or e
        for i in range(r, e):
            for j in range(r, e):
                a = torch.zeros(e, e, dtype=torch.float64)
                a[i, j] = 1.0
                out.append(a)
        return out
    for i in range(e):
        for j in range(e):
            a = torch.zeros(e, e, dtype=torch.float64)
            a[i, j] = 1.0
            out.append(a)
    return out


def qk_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    g = cfg.group_size
    for pre in attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for a in _qk_basis(cfg):
                v = R.new()
                for h in range(j * g, (j + 1) * g):
                    R.at(v, f"{pre}.W_Q")[h] = p[f"{pre}.W_Q"][h] @ a
                    if f"{pre}.b_Q" in p:
                        R.at(v, f"{pre}.b_Q")[h] = p[f"{pre}.b_Q"][h] @ a
                R.at(v, f"{pre}.W_K")[j] = -p[f"{pre}.W_K"][j] @ a.T
                if f"{pre}.b_K" in p:
                    R.at(v, f"{pre}.b_K")[j] = -p[f"{pre}.b_K"][j] @ a.T
    rope = cfg.pos == "rope"
    rest = cfg.d_head - (cfg.rotary_dim or cfg.d_head)  # unrotated coordinates of a partial rotary
    formula = ("L·n_kv·(R + (d_k − R)²)" if rest else "L·n_kv·d_k") if rope else "L·n_kv·d_k²"
    per = (cfg.d_head - rest + rest * rest) if rope else cfg.d_head**2
    return make_family(
        problem.layout,
        "qk-gl",
        formula,
        cfg.n_layers * cfg.n_kv_heads * per,
        R,
        """Per KV group j: W_Q[h]·M, b_Q[h]·M for its query heads, W_K[j]·M⁻ᵀ, b_K[j]·M⁻ᵀ keep
                every score q·kᵀ.  Generator for A ∈ gl(d_k): dW_Q = W_Q·A, dW_K = −W_K·Aᵀ.  Under RoPE
                M must commute with every position rotation R_Δ: per frequency plane a·I + b·J
                (GL(1,ℂ)^{d_k/2}, d_k real dimensions).""",
        in_gmax=True,
    )


def vo_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    g, e = cfg.group_size, cfg.d_head
    for pre in attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for a_i in range(e):
                for a_j in range(e):
                    a = torch.zeros(e, e, dtype=torch.float64)
                    a[a_i, a_j] = 1.0
                    v = R.new()
                    R.at(v, f"{pre}.W_V")[j] = p[f"{pre}.W_V"][j] @ a
                    if f"{pre}.b_V" in p:
                        R.at(v, f"{pre}.b_V")[j] = p[f"{pre}.b_V"][j] @ a
                    for h in range(j * g, (j + 1) * g):
                        R.at(v, f"{pre}.W_O")[h] = -a @ p[f"{pre}.W_O"][h]
    return make_family(
        problem.layout,
        "vo-gl",
        "L·n_kv·d_v²",
        cfg.n_layers * cfg.n_kv_heads * e * e,
        R,
        """Per KV group j: W_V[j]·N, b_V[j]·N and N⁻¹·W_O[h] for its query heads: the attention
                pattern does not involve V, and A·(X W_V N)(N⁻¹ W_O) = A·X W_V W_O.  Generator:
                dW_V = W_V·A, dW_O = −A·W_O.""",
        in_gmax=True,
    )


def key_bias_family(problem: Problem) -> Family | None:
    cfg = problem.cfg
    # the coordinates RoPE leaves alone: all without RoPE, the last d_k − R under a partial rotary
    first = (cfg.rotary_dim or cfg.d_head) if cfg.pos == "rope" else 0
    if not cfg.attn_bias or first == cfg.d_head:
        return None
    R = Rows(problem.layout)
    for pre in attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for i in range(first, cfg.d_head):
                R.at(R.new(), f"{pre}.b_K")[j, i] = 1.0
    return make_family(
        problem.layout,
        "key-bias-shift",
        "L·n_kv·(d_k − R)" if first else "L·n_kv·d_k",
        cfg.n_layers * cfg.n_kv_heads * (cfg.d_head - first),
        R,
        """b_K enters each score only through q·b_K, constant over the keys of a query, and the
                softmax ignores a constant added to a row: the key bias is flat on every coordinate
                RoPE does not rotate (all of them without RoPE; under RoPE the rotated ones move with
                the key position, so only the d_k − R unrotated ones of a partial rotary stay).""",
    )


def value_bias_family(problem: Problem) -> Family | None:
    cfg, p = problem.cfg, problem.params()
    if not cfg.attn_bias or not cfg.out_bias:
        return None
    R, g = Rows(problem.layout), cfg.group_size
    for pre in attn_prefixes(cfg):
        for j in range(cfg.n_kv_heads):
            for i in range(cfg.d_head):
                v = R.new()
                R.at(v, f"{pre}.b_V")[j, i] = 1.0
                R.at(v, f"{pre}.b_O")[:] = -sum(p[f"{pre}.W_O"][h][i] for h in range(j * g, (j + 1) * g))
    return make_family(
        problem.layout,
        "value-bias-fold",
        "L·n_kv·d_v",
        cfg.n_layers * cfg.n_kv_heads * cfg.d_head,
        R,
        """Attention rows sum to 1, so b_V reaches every position as the constant b_V·W_O,
                which b_O can carry instead: db_V = c, db_O = −Σ_h c·W_O[h].""",
    )
