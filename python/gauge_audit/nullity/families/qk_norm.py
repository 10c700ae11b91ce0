"""QK-norm families (Qwen3's per-head norm shared by the heads, OLMo 2's full-width norm).

The norm replaces qk-gl: of the per-KV-group GL(d_k) (or the RoPE commutant) only what commutes
with n(·)·diag(γ) survives, and for generic, distinct γ that is discrete.  The continuous part lives
on the norm weights — per RoPE plane (and per unrotated coordinate) a rescaling of γ_q against γ_k,
per layer (shared weights) or per layer and KV group (full-width weights): the action qk-norm-scale.

The projections into the norm gain a scale invariance n(c·y) = n(y) — per query and key head for
a per-head norm, one per layer and side for a full-width norm — exact only at ε = 0 (eps-broken).
"""

from __future__ import annotations

from ...actions.qk_norm import units
from ..measure import Problem
from .base import Family, Rows, attn_prefixes, make_family


def qk_norm_scale_family(problem: Problem) -> Family | None:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    if cfg.qk_norm == "none":
        return None
    e, g = cfg.d_head, cfg.group_size
    groups = [None] if cfg.qk_norm == "head" else list(range(cfg.n_kv_heads))
    for pre in attn_prefixes(cfg):
        gq, gk = p[f"{pre}.q_norm"], p[f"{pre}.k_norm"]
        for j in groups:
            for coords in units(cfg):
                v = R.new()
                dq, dk = R.at(v, f"{pre}.q_norm"), R.at(v, f"{pre}.k_norm")
                if j is None:
                    idx_q = idx_k = list(coords)
                else:  # full width: KV head j's slice of γ_k and its query heads' slices of γ_q
                    idx_q = [h * e + c for h in range(j * g, (j + 1) * g) for c in coords]
                    idx_k = [j * e + c for c in coords]
                dq[idx_q] = gq[idx_q]
                dk[idx_k] = -gk[idx_k]
    per = "1" if cfg.qk_norm == "head" else "n_kv"
    n_units = len(units(cfg))
    formula = f"L·{per}·(R/2 + d_k − R)" if cfg.pos == "rope" else f"L·{per}·d_k"
    return make_family(
        problem.layout,
        "qk-norm-scale",
        formula,
        cfg.n_layers * len(groups) * n_units,
        R,
        """After the QK-norm, scaling γ_q by c and γ_k by 1/c on one RoPE plane multiplies that
                plane of q by c and of k by 1/c — c·I commutes with the rotation — so every score is
                unchanged (an unrotated coordinate scales alone).  Generator: dγ_q = γ_q on the unit,
                dγ_k = −γ_k.  A full-width norm's γ is per head: one set per KV group and its query heads.
                This is all that survives of qk-gl for generic γ (an element must commute with n(·)·diag(γ)
                and with RoPE).""",
    )


def qk_norm_input_family(problem: Problem) -> Family | None:
    cfg, p, R = problem.cfg, problem.params(), Rows(problem.layout)
    if cfg.qk_norm == "none":
        return None
    for pre in attn_prefixes(cfg):
        for side, heads in (("Q", cfg.n_heads), ("K", cfg.n_kv_heads)):
            for h in range(heads) if cfg.qk_norm == "head" else [None]:
                v = R.new()
                for name in (f"{pre}.W_{side}", f"{pre}.b_{side}"):
                    if name in p:
                        if h is None:
                            R.at(v, name)[:] = p[name]
                        else:
                            R.at(v, name)[h] = p[name][h]
    per = "(n_heads + n_kv)" if cfg.qk_norm == "head" else "2"
    count = cfg.n_layers * ((cfg.n_heads + cfg.n_kv_heads) if cfg.qk_norm == "head" else 2)
    return make_family(
        problem.layout,
        "qk-norm-input-scale",
        f"L·{per}",
        count,
        R,
        """n(c·y) = n(y) at ε = 0: scaling a normed projection (a head's W_Q, b_Q or W_K, b_K; for a
                full-width norm all heads of one side together) does not change q or k.  Exact only at
                ε = 0.""",
        kind="exact" if cfg.norm_eps == 0 else "eps-broken",
    )
