"""Families of the gemma family (sandwich RMSNorms, QK-norm, GeGLU, tied or untied head).

The stream x is written by √d·W_E and by the post-norms, x ← x + n(o)⊙γ' (o a sublayer's output),
and read only through the pre-norms n(x)⊙γ (ln1 → W_Q, W_K, W_V; ln2 → W_gate, W_in; ln_final →
W_U, tied W_Eᵀ).  What survives, derived (models/gemma.py has the equations):

* vo-gl, GL(d_v) per KV head: it acts inside the head (W_V·N, N⁻¹·W_O leave the sublayer output o,
  the post-norm's input, unchanged) — the post-attention norm does not touch it.
* QK: without QK-norm the RoPE commutant (qk-gl, as in LLaMA).  With QK-norm q = RoPE(n(x W_Q)⊙γ_q):
  n passes only orthogonal M; then M·D_γq·C·D_γk·M'ᵀ = D_γq·C·D_γk for every C in the RoPE commutant
  forces M, M' block-diagonal over the planes, and on a plane where γ_q or γ_k is not constant only
  ±I (a finite group).  What is left is continuous only in the weights: qk-norm-scale, γ_q ↦ γ_q⊙s,
  γ_k ↦ γ_k⊘s with s constant on each RoPE plane (s commutes with every C): d_k/2 per layer.
* norm-scale on the pre-norms (their readers absorb diag(s)⁻¹); the final norm only when untied.
* swiglu-scaling: the GeGLU up-projection is linear, (ℝ≠0)^{d_ff} as for SwiGLU.
* ε-broken (exact only for ε = 0): a query or key head ×c before its QK-norm (qk-norm-input-scale,
  L·(h + n_kv)); a sublayer output ×c before its post-norm (post-norm-scale, 2L); the whole stream
  ×c (stream-scale: W_E and every post-norm γ' ×c, the tied final γ ×1/c).
* blocked: the stream rotation needs R·D_γ' = D_γ'·R for every post-norm weight (and, tied, for the
  final norm's): generically only diagonal ±1.

Special points, detected at the sampled parameters and counted when present: every γ' (and a tied
γ_f) ∝ 1 — Gemma's w = 0, Hugging Face's initialisation — gives the stream rotation so(d)
(stream-rotation-special); γ_q and γ_k both constant on a RoPE plane give that plane's rotation
per KV group, shared by its query heads (qk-plane-rotation-special).
"""

from __future__ import annotations

import torch

from ...models.layers import rope_planes
from ..measure import Problem
from .attention import qk_family, vo_family
from .base import Family, Rows, attn_prefixes, make_family, null_rows

SPECIAL_RTOL = 1e-12  # a weight is constant on a set when its spread is below this, relative


def _readers(cfg, p: dict) -> dict[str, list[tuple[str, int]]]:
    """pre-norm → [(reader, axis of d_model)]."""
    out = {}
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        out[f"{b}.ln1"] = [(f"{b}.attn.W_{n}", 1) for n in "QKV"]
        out[f"{b}.ln2"] = [(f"{b}.mlp.W_gate", 0), (f"{b}.mlp.W_in", 0)]
    if not cfg.tied:
        out["ln_final"] = [("unembed.W_U", 0)]
    return out


def _post_norms(cfg) -> list[str]:
    return [f"blocks.{i}.{n}" for i in range(cfg.n_layers) for n in ("ln1_post", "ln2_post")]


def _eps_kind(cfg) -> str:
    return "exact" if cfg.norm_eps == 0 else "eps-broken"


def _constant(t: torch.Tensor) -> bool:
    return float(t.max() - t.min()) <= SPECIAL_RTOL * float(t.abs().max())


def norm_scale_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    readers = _readers(cfg, p)
    for n, rs in readers.items():
        for i in range(cfg.d_model):
            v = R.new()
            R.at(v, f"{n}.w")[i] = p[f"{n}.w"][i]
            for w, axis in rs:
                R.at(v, w).select(axis, i).copy_(-p[w].select(axis, i))
    formula = "2L·d" if cfg.tied else "(2L+1)·d"
    return make_family(
        problem.layout,
        "norm-scale",
        formula,
        len(readers) * cfg.d_model,
        R,
        """Per pre-norm: γ⊙s and its readers diag(s)⁻¹·W.  The post-norms write into the stream,
                       which only norms read, so their weights have no such partner.""",
    )


def qk_norm_plane_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    for pre in attn_prefixes(cfg):
        for i, j in rope_planes(cfg):
            v = R.new()
            for idx in (i, j):
                R.at(v, f"{pre}.q_norm")[idx] = p[f"{pre}.q_norm"][idx]
                R.at(v, f"{pre}.k_norm")[idx] = -p[f"{pre}.k_norm"][idx]
    return make_family(
        problem.layout,
        "qk-norm-scale",
        "L·d_k/2",
        cfg.n_layers * (cfg.d_head // 2),
        R,
        """γ_q ↦ γ_q⊙s, γ_k ↦ γ_k⊘s with s constant on each RoPE plane: s commutes with every
                       position rotation, so every score q·R_Δ·kᵀ keeps its value.  The only continuous
                       QK freedom a generic QK-normalised layer keeps (per-head GL(d_k) is cut to ±1 per
                       plane by the norm and its shared weights).""",
    )


def qk_norm_input_scale_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    for pre in attn_prefixes(cfg):
        for name, heads in (("W_Q", cfg.n_heads), ("W_K", cfg.n_kv_heads)):
            for h in range(heads):
                R.at(R.new(), f"{pre}.{name}")[h] = p[f"{pre}.{name}"][h]
    return make_family(
        problem.layout,
        "qk-norm-input-scale",
        "L·(h + n_kv)",
        cfg.n_layers * (cfg.n_heads + cfg.n_kv_heads),
        R,
        """A query or key head ×c before its RMSNorm over d_head: n(c·y) = n(y) exactly only when
                       ε = 0.""",
        kind=_eps_kind(cfg),
    )


def post_norm_scale_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    for i in range(cfg.n_layers):
        for w in (f"blocks.{i}.attn.W_O", f"blocks.{i}.mlp.W_out"):
            R.at(R.new(), w)[...] = p[w]
    return make_family(
        problem.layout,
        "post-norm-scale",
        "2L",
        2 * cfg.n_layers,
        R,
        """A sublayer's output ×c (W_O or W_out ×c) is divided out by its post-norm — exactly
                       only when ε = 0.""",
        kind=_eps_kind(cfg),
    )


def stream_scale_family(problem: Problem) -> Family:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    v = R.new()
    R.at(v, "embed.W_E")[...] = p["embed.W_E"]
    for n in _post_norms(cfg):
        R.at(v, f"{n}.w")[...] = p[f"{n}.w"]
    if cfg.tied:
        R.at(v, "ln_final.w")[...] = -p["ln_final.w"]
    return make_family(
        problem.layout,
        "stream-scale",
        "1",
        1,
        R,
        """Every stream writer ×c (W_E, every post-norm γ') scales the stream, which every
                       pre-norm divides out — exactly only when ε = 0.  Tied: the final γ ×1/c keeps the
                       logits.""",
        kind=_eps_kind(cfg),
    )


def stream_rotation_special(problem: Problem) -> Family | None:
    """so(d) on the stream, present only where every post-norm weight (and a tied final one) is ∝ 1."""
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    fixed = _post_norms(cfg) + (["ln_final"] if cfg.tied else [])
    if not all(_constant(p[f"{n}.w"]) for n in fixed):
        return None
    d, readers = cfg.d_model, _readers(cfg, p)
    for a in range(d):
        for b in range(a + 1, d):
            A = torch.zeros(d, d, dtype=torch.float64)
            A[a, b], A[b, a] = 1.0, -1.0
            v = R.new()
            # writers x ↦ x·(I + tA): W_E·A, and each post-norm's input o·A (W_O·A, W_out·A)
            R.at(v, "embed.W_E")[...] = p["embed.W_E"] @ A
            for i in range(cfg.n_layers):
                for w in (f"blocks.{i}.attn.W_O", f"blocks.{i}.mlp.W_out"):
                    R.at(v, w)[...] = p[w] @ A
            # readers of a pre-norm: W ↦ D_γ⁻¹·(I − tA)·D_γ·W keeps n(x(I+tA))⊙γ·W
            for n, rs in readers.items():
                g = p[f"{n}.w"]
                B = (-A * g[None, :]) / g[:, None]
                for w, axis in rs:
                    t = p[w].movedim(axis, -1)
                    R.at(v, w)[...] = (t @ B.T).movedim(-1, axis)
    return make_family(
        problem.layout,
        "stream-rotation-special",
        "d(d−1)/2",
        d * (d - 1) // 2,
        R,
        """At this point every post-norm weight γ' (and the tied final weight) is ∝ 1 — for
                       Gemma's (1 + w) norms w = 0 — so n(o)⊙γ' commutes with every rotation R: writers
                       ×R, pre-norm readers D_γ⁻¹Rᵀ D_γ·W.  Generic weights have none of it.""",
    )


def qk_plane_rotation_special(problem: Problem) -> Family | None:
    """so(2) per KV group on every RoPE plane where γ_q and γ_k are both constant."""
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    g = cfg.group_size
    for pre in attn_prefixes(cfg):
        for i, j in rope_planes(cfg):
            plane = [i, j]
            if not (_constant(p[f"{pre}.q_norm"][plane]) and _constant(p[f"{pre}.k_norm"][plane])):
                continue
            A = torch.zeros(cfg.d_head, cfg.d_head, dtype=torch.float64)
            A[i, j], A[j, i] = 1.0, -1.0
            for kv in range(cfg.n_kv_heads):
                v = R.new()
                for h in range(kv * g, (kv + 1) * g):
                    R.at(v, f"{pre}.W_Q")[h] = p[f"{pre}.W_Q"][h] @ A
                R.at(v, f"{pre}.W_K")[kv] = p[f"{pre}.W_K"][kv] @ A
    if not R.rows:
        return None
    return make_family(
        problem.layout,
        "qk-plane-rotation-special",
        "n_kv · (planes with constant γ_q and γ_k)",
        len(R.rows),
        R,
        """On a RoPE plane where γ_q and γ_k are constant (for Gemma's (1 + w)
                       norms: w = 0 there) a rotation of the plane commutes with the norm, its weights and
                       RoPE: W_Q[h]·O and W_K[j]·O for the query heads of the group keep every score.""",
    )


def first_block_token_scales(problem: Problem) -> Family | None:
    """ε = 0 and QK-norm: block 0's queries and keys are n(y_t) with y_t = n(x_t)⊙γ₁·W for the few
    token embeddings x_t the sample holds, so only the directions of the y_t matter: every dW with
    X·dW = diag(c)·Y (X the tokens' normalised inputs, Y = X·W) is flat.  Created by the finite
    vocabulary, not the architecture (gone for ε > 0, where |y_t| matters)."""
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    if cfg.norm_eps != 0 or cfg.qk_norm == "none":
        return None
    tokens = torch.unique(problem.inputs["tokens"])
    x = p["embed.W_E"][tokens]
    x = x * torch.rsqrt((x * x).mean(-1, keepdim=True)) * p["blocks.0.ln1.w"]  # (T, d)
    T, d, e = x.shape[0], cfg.d_model, cfg.d_head
    for name, heads in (("W_Q", cfg.n_heads), ("W_K", cfg.n_kv_heads)):
        for h in range(heads):
            W = p[f"blocks.0.attn.{name}"][h]  # (d, e)
            Y = x @ W
            # unknowns (vec dW, c): X·dW − diag(c)·Y = 0, one equation per (token, coordinate)
            M = torch.cat(
                [
                    torch.kron(x, torch.eye(e, dtype=torch.float64)),
                    -(Y[:, :, None] * torch.eye(T, dtype=torch.float64)[:, None, :]).reshape(T * e, T),
                ],
                dim=1,
            )
            dW = null_rows(M, d * e + T)[:, : d * e]
            w = (W / W.norm()).reshape(1, -1)
            dW = dW - (dW @ w.T) @ w  # qk-norm-input-scale has W itself
            u, sv, _ = torch.linalg.svd(dW.T, full_matrices=False)
            for col in u[:, : int((sv > 1e-8 * max(1.0, float(sv.max()) if sv.numel() else 0.0)).sum())].T:
                R.at(R.new(), f"blocks.0.attn.{name}")[h] = col.reshape(d, e)
    if not R.rows:
        return None
    return make_family(
        problem.layout,
        "first-block-token-scales",
        "Σ over block 0's QK heads of the freedom left by the sampled tokens",
        len(R.rows),
        R,
        first_block_token_scales.__doc__ or "",
        kind="data",
    )


def gemma_families(problem: Problem) -> list[Family | None]:
    cfg = problem.cfg
    qk = qk_family(problem) if cfg.qk_norm == "none" else qk_norm_plane_family(problem)
    out = [
        qk,
        vo_family(problem),
        norm_scale_family(problem),
        post_norm_scale_family(problem),
        stream_scale_family(problem),
        stream_rotation_special(problem),
    ]
    if cfg.qk_norm != "none":
        out += [
            qk_norm_input_scale_family(problem),
            qk_plane_rotation_special(problem),
            first_block_token_scales(problem),
        ]
    return out
