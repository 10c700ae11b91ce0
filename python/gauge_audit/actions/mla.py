"""Gauge actions of multi-head latent attention (DeepSeek-V3, models/deepseek.py), and the reasons
the per-head actions of the other families do not apply to it.

Per layer, with c = n(x W_D + b_D)⊙γ a latent (c_Q of rank r_Q, c_KV of rank r_KV):

* ``latent-rotation`` — O(r) per latent: W_D·O, b_D·O, readers W_U[h] ↦ D_γ⁻¹·Oᵀ·D_γ·W_U[h].  The
  RMSNorm commutes with O, so c ↦ n(·)·O·D_γ, and D_γ⁻¹OᵀD_γ undoes O·D_γ = D_γ·(D_γ⁻¹ O D_γ).
* ``latent-norm-scale`` — (ℝ≠0)^r per latent: γ ↦ γ⊙s, the readers' rows ÷ s.
* ``mla-nope-gl`` — GL(d_nope) per head: the nope query columns ·M, W_UK[h]·M⁻ᵀ.
* ``mla-rope-commutant`` — one RoPE-commutant element N per layer (per plane a·I + b·J): every
  head's rope query columns ·N and the shared key W_KR, b_KR ·N⁻ᵀ (N⁻ᵀ commutes with RoPE too).
* ``mla-vo-gl`` — GL(d_v) per head: W_UV[h]·N, N⁻¹·W_O[h].
* ``deepseek-swiglu-scaling`` — (ℝ≠0)^width per SwiGLU of DeepSeek's FFNs (dense, routed and shared
  experts, whose widths differ by layer): the element keyed by FFN prefix.
* ``mla-head-perm`` — S_h per layer: the heads' W_UQ/W_Q, W_UK, W_UV and W_O together (the RoPE key is
  shared, so it stays).
* ``deepseek-expert-perm`` — S_{E/G} ≀ S_G per MoE layer: the routed experts within their groups and
  the groups as wholes (group-limited routing ranks groups), with the router columns and bias.
* ``deepseek-ffn-perm`` — S_width per SwiGLU (dense FFN, routed or shared expert), keyed by FFN prefix.
* ``latent-gl`` — FALSE CONTRAST: the latent rule with a generic M ∈ GL(r) in place of O; the
  RMSNorm divides by rms(yM) ≠ rms(y), so the function changes.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.deepseek import DeepseekConfig, as_latent, ffn_units
from ..models.layers import rope_planes
from ..runtime import stacked_inv
from .base import (
    Action,
    Element,
    Params,
    as64,
    attn_prefixes,
    cond,
    put,
    random_gl,
    random_orthogonal,
    require_invertible,
    require_shape,
    updated,
)


def _is_mla(cfg: Config) -> str | None:
    return None if cfg.latent_attention else "the model has no latent attention (MLA)"


def latents(cfg: DeepseekConfig) -> list[tuple[str, int, str, list[str]]]:
    """(name, rank, norm weight, readers) of each latent of a layer (the element's part is named
    after it; its down-projection is W_D{name}, its bias b_D{name})."""
    out = [("KV", cfg.kv_lora_rank, "kv_norm", ["W_UK", "W_UV"])]
    return ([("Q", cfg.q_lora_rank, "q_norm", ["W_UQ"])] if cfg.q_lora_rank else []) + out


def query_name(cfg: DeepseekConfig, pre: str) -> str:
    """The per-head query weight of attention ``pre``: W_UQ (read from the query latent) or W_Q."""
    return f"{pre}.W_UQ" if cfg.q_lora_rank else f"{pre}.W_Q"


# ----------------------------------------------------------------------------- latents
def _latent_sample(orthogonal: bool):
    def sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
        parts = {}
        for name, r, _, _ in latents(cfg):
            draws = [random_orthogonal(r, g) if orthogonal else random_gl(r, g, kappa) for _ in range(cfg.n_layers)]
            parts[name] = torch.stack(draws)
        # the readers see D_γ⁻¹·M⁻¹·D_γ: its condition number is what rounding is amplified by
        k = max(
            cond(_conjugated(params, f"{pre}.{norm}", stacked_inv(parts[name][l])))
            for l, pre in enumerate(attn_prefixes(cfg))
            for name, _, norm, _ in latents(cfg)
        )
        return Element(parts, k if orthogonal else max(k, *(cond(m) for m in parts.values())))

    return sample


def _conjugated(params: Params, norm: str, m: torch.Tensor) -> torch.Tensor:
    gamma = as64(params[norm])
    if (gamma == 0).any():
        raise GaugeAuditError(f"{norm} has a zero weight entry: the latent's readers need γ invertible")
    return m * gamma[None, :] / gamma[:, None]  # D_γ⁻¹·m·D_γ


def _latent_map(cfg: DeepseekConfig, params: Params, el: Element, orthogonal: bool) -> Params:
    changes = {}
    for name, r, norm, readers in latents(cfg):
        ms = el.parts[name]
        require_shape(name, ms, (cfg.n_layers, r, r))
        require_invertible(name, ms)
        ms = as64(ms)
        if (
            orthogonal
            and torch.linalg.matrix_norm(ms.transpose(-1, -2) @ ms - torch.eye(r, dtype=torch.float64)).max()
            > 1e-10 * r
        ):
            raise GaugeAuditError(f"{name} is not orthogonal (the latent's RMSNorm commutes only with isometries)")
        eye = torch.eye(r, dtype=torch.float64)
        for l, pre in enumerate(attn_prefixes(cfg)):
            if torch.equal(ms[l], eye):  # nothing moves (and a latent with a zero γ entry may be left so)
                continue
            for t in (f"{pre}.W_D{name}", f"{pre}.b_D{name}"):
                if t in params:
                    changes[t] = put(as64(params[t]) @ ms[l], params[t])
            c_inv = _conjugated(params, f"{pre}.{norm}", stacked_inv(ms[l]))
            for w in readers:
                changes[f"{pre}.{w}"] = put(c_inv @ as64(params[f"{pre}.{w}"]), params[f"{pre}.{w}"])
    return updated(params, changes)


def latent_rotation(cfg: Config, params: Params, el: Element) -> Params:
    """Group: O(r_KV) (and O(r_Q) with a query latent) per layer.

    Acts: W_D ↦ W_D·O, b_D ↦ b_D·O, and every reader of the latent W_U[h] ↦ D_γ⁻¹·Oᵀ·D_γ·W_U[h]
    (c_KV: W_UK and W_UV of every head; c_Q: W_UQ).

    Why: rms(y·O) = rms(y), so the latent becomes n(y)·O·D_γ = c·(D_γ⁻¹·O·D_γ), which the readers undo.
    """
    cfg = as_latent(cfg)
    return _latent_map(cfg, params, el, orthogonal=True)


def latent_gl(cfg: Config, params: Params, el: Element) -> Params:
    """FALSE CONTRAST: latent-rotation's rule with a generic M ∈ GL(r): rms(y·M) ≠ rms(y), so the
    normalised latent is not c·(D_γ⁻¹MD_γ) and the function changes — the latent keeps O(r), not GL(r)."""
    cfg = as_latent(cfg)
    return _latent_map(cfg, params, el, orthogonal=False)


def _scale_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    parts = {}
    for name, r, _, _ in latents(cfg):
        s = kappa ** (torch.rand(cfg.n_layers, r, generator=g, dtype=torch.float64) - 0.5)
        parts[name] = s * torch.where(torch.rand(cfg.n_layers, r, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
    return Element(parts, max(float(s.abs().max() / s.abs().min()) for s in parts.values()))


def latent_norm_scale(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ≠0)^r_KV (and (ℝ≠0)^r_Q) per layer.

    Acts: the latent's norm weight γ ↦ γ⊙s, and row i of every reader W_U[h] ↦ W_U[h][i]/s_i.

    Why: c·W_U = n(y)·D_γ·W_U = n(y)·D_{γ⊙s}·D_s⁻¹·W_U.
    """
    cfg = as_latent(cfg)
    changes = {}
    for name, r, norm, readers in latents(cfg):
        s = el.parts[name]
        require_shape(name, s, (cfg.n_layers, r))
        if (s == 0).any():
            raise GaugeAuditError(f"{name} has a zero entry (not invertible)")
        s = as64(s)
        for l, pre in enumerate(attn_prefixes(cfg)):
            changes[f"{pre}.{norm}"] = put(as64(params[f"{pre}.{norm}"]) * s[l], params[f"{pre}.{norm}"])
            for w in readers:
                t = params[f"{pre}.{w}"]
                changes[f"{pre}.{w}"] = put(as64(t) / s[l][None, :, None], t)
    return updated(params, changes)


# ----------------------------------------------------------------------------- heads
def _nope_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    m = torch.stack(
        [torch.stack([random_gl(cfg.nope_dim, g, kappa) for _ in range(cfg.n_heads)]) for _ in range(cfg.n_layers)]
    )
    return Element({"M": m}, cond(m))


def _nope_applies(cfg: Config) -> str | None:
    reason = _is_mla(cfg)
    if reason is None and cfg.latent_attention and as_latent(cfg).nope_dim == 0:
        return "the heads have no unrotated (nope) query/key coordinates"
    return reason


def mla_nope_gl(cfg: Config, params: Params, el: Element) -> Params:
    """Group: GL(d_nope) per head per layer.

    Acts: head h's nope query columns (W_UQ[h] or W_Q[h], the first d_nope) ↦ ·M[h], W_UK[h] ↦ W_UK[h]·M[h]⁻ᵀ.

    Why: the nope part of the score is q_h^nope·k_h^nopeᵀ, and M·M⁻¹ = I; RoPE does not touch it.
    """
    cfg = as_latent(cfg)
    m = el.parts["M"]
    require_shape("M", m, (cfg.n_layers, cfg.n_heads, cfg.nope_dim, cfg.nope_dim))
    require_invertible("M", m)
    m, e = as64(m), cfg.nope_dim
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        wq = query_name(cfg, pre)
        q = as64(params[wq]).clone()
        q[..., :e] = q[..., :e] @ m[l]
        changes[wq] = put(q, params[wq])
        k = params[f"{pre}.W_UK"]
        changes[f"{pre}.W_UK"] = put(as64(k) @ stacked_inv(m[l]).transpose(-1, -2), k)
    return updated(params, changes)


def _rope_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    planes = rope_planes(cfg)
    n = torch.zeros(cfg.n_layers, cfg.d_head, cfg.d_head, dtype=torch.float64)
    for l in range(cfg.n_layers):
        r = torch.logspace(-0.5, 0.5, len(planes), base=kappa, dtype=torch.float64)[
            torch.randperm(len(planes), generator=g)
        ]
        phi = 2 * torch.pi * torch.rand(len(planes), generator=g, dtype=torch.float64)
        for (i, j), rr, ph in zip(planes, r, phi):
            a, b = rr * torch.cos(ph), rr * torch.sin(ph)
            n[l, i, i], n[l, j, j], n[l, i, j], n[l, j, i] = a, a, b, -b
    return Element({"N": n}, cond(n))


def mla_rope_commutant(cfg: Config, params: Params, el: Element) -> Params:
    """Group: the RoPE commutant (per plane a·I + b·J, GL(1,ℂ)^{d_rope/2}) once per layer — not per head.

    Acts: every head's rope query columns (the last d_rope of W_UQ[h] or W_Q[h]) ↦ ·N, and the shared
    RoPE key W_KR, b_KR ↦ ·N⁻ᵀ.

    Why: N commutes with every position rotation R_Δ, so q·N·R_Δ·(k·N⁻ᵀ)ᵀ = q·R_Δ·kᵀ; the key is one
    for all heads, so all heads must take the same N.
    """
    cfg = as_latent(cfg)
    n = el.parts["N"]
    require_shape("N", n, (cfg.n_layers, cfg.d_head, cfg.d_head))
    require_invertible("N", n)
    n, e = as64(n), cfg.nope_dim
    dist = 0.0
    for i, j in rope_planes(cfg):
        dist = max(dist, float((n[:, i, i] - n[:, j, j]).abs().max()), float((n[:, i, j] + n[:, j, i]).abs().max()))
    off = n.clone()
    for i, j in rope_planes(cfg):
        off[:, i, i] = off[:, j, j] = off[:, i, j] = off[:, j, i] = 0.0
    if max(dist, float(off.abs().max())) > 1e-12 * float(n.abs().max()):
        raise GaugeAuditError("N is not in the RoPE commutant (per plane a·I + b·J, nothing across planes)")
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        wq = query_name(cfg, pre)
        q = as64(params[wq]).clone()
        q[..., e:] = q[..., e:] @ n[l]
        changes[wq] = put(q, params[wq])
        inv_t = stacked_inv(n[l]).T
        for t in (f"{pre}.W_KR", f"{pre}.b_KR"):
            if t in params:
                changes[t] = put(as64(params[t]) @ inv_t, params[t])
    return updated(params, changes)


def _vo_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    m = torch.stack(
        [torch.stack([random_gl(cfg.v_dim, g, kappa) for _ in range(cfg.n_heads)]) for _ in range(cfg.n_layers)]
    )
    return Element({"N": m}, cond(m))


def mla_vo_gl(cfg: Config, params: Params, el: Element) -> Params:
    """Group: GL(d_v) per head per layer.

    Acts: W_UV[h] ↦ W_UV[h]·N[h], W_O[h] ↦ N[h]⁻¹·W_O[h].

    Why: the pattern does not involve the values, and A·(c_KV W_UV N)(N⁻¹ W_O) = A·c_KV W_UV W_O.
    """
    cfg = as_latent(cfg)
    m = el.parts["N"]
    require_shape("N", m, (cfg.n_layers, cfg.n_heads, cfg.v_dim, cfg.v_dim))
    require_invertible("N", m)
    m = as64(m)
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        v, o = params[f"{pre}.W_UV"], params[f"{pre}.W_O"]
        changes[f"{pre}.W_UV"] = put(as64(v) @ m[l], v)
        changes[f"{pre}.W_O"] = put(stacked_inv(m[l]) @ as64(o), o)
    return updated(params, changes)


# ----------------------------------------------------------------------------- FFNs
def _units_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    widths = {pre: (cfg.experts, w) if e is not None else (w,) for pre, e, w in ffn_units(cfg)}
    parts = {
        pre: kappa ** (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5)
        * torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0).to(torch.float64)
        for pre, shape in widths.items()
    }
    return Element(parts, max(float(s.abs().max() / s.abs().min()) for s in parts.values()))


def deepseek_swiglu_scaling(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ≠0)^width per SwiGLU — every dense FFN, routed expert and shared expert — keyed by
    the FFN's prefix (``blocks.3.moe``: one row per expert).

    Acts: W_in[:, i] ↦ s_i·W_in[:, i], W_out[i, :] ↦ W_out[i, :]/s_i; the gate is untouched.

    Why: the unit silu(x·w_gate)·(x·w_in) is linear in w_in (as swiglu-scaling, whose stacked
    element cannot hold FFNs whose widths differ by layer).
    """
    changes = {}
    for pre, s in el.parts.items():
        if f"{pre}.W_in" not in params:
            raise GaugeAuditError(f"{pre} is not a SwiGLU FFN of this model")
        w_in, w_out = params[f"{pre}.W_in"], params[f"{pre}.W_out"]
        require_shape(pre, s, (*w_in.shape[:-2], w_in.shape[-1]))
        if (s == 0).any():
            raise GaugeAuditError(f"{pre} has a zero scale (not invertible)")
        s = as64(s)
        changes[f"{pre}.W_in"] = put(as64(w_in) * s[..., None, :], w_in)
        changes[f"{pre}.W_out"] = put(as64(w_out) / s[..., :, None], w_out)
    return updated(params, changes)


# ----------------------------------------------------------------------------- permutations
def _is_perm(t: torch.Tensor, n: int) -> bool:
    return not t.dtype.is_floating_point and torch.equal(t.sort(-1).values, torch.arange(n).expand_as(t))


def _head_perm_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element({"perm": torch.stack([torch.randperm(cfg.n_heads, generator=g) for _ in range(cfg.n_layers)])}, 1.0)


def mla_head_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_h per layer.

    Acts: head h ↦ π(h): the head axis of W_UQ (or W_Q), W_UK, W_UV and W_O.

    Why: the heads' outputs are summed; each head's query, nope key, value and output move together,
    and the RoPE key, shared by all heads, is the same for every label.
    """
    cfg = as_latent(cfg)
    perm = el.parts["perm"]
    require_shape("perm", perm.double(), (cfg.n_layers, cfg.n_heads))
    if not _is_perm(perm, cfg.n_heads):
        raise GaugeAuditError("perm is not a permutation of the heads")
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        for name in (query_name(cfg, pre), f"{pre}.W_UK", f"{pre}.W_UV", f"{pre}.W_O"):
            changes[name] = params[name][perm[l]].clone()
    return updated(params, changes)


def _moe_prefixes(cfg: DeepseekConfig) -> list[str]:
    return [f"blocks.{i}.moe" for i in range(cfg.n_layers) if cfg.moe_layer(i)]


def _expert_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    per = cfg.experts // cfg.n_group
    parts = {}
    for pre in _moe_prefixes(cfg):
        groups = torch.randperm(cfg.n_group, generator=g)
        parts[pre] = torch.cat([int(j) * per + torch.randperm(per, generator=g) for j in groups])
    return Element(parts, 1.0)


def _moe_applies(cfg: Config) -> str | None:
    return _is_mla(cfg) or (None if cfg.experts else "the model has no mixture of experts")


def _expert_relabel(el: Element, layer: int, idx: torch.Tensor) -> torch.Tensor:
    perm = el.parts.get(f"blocks.{layer}.moe")
    return idx if perm is None else perm[idx]


def deepseek_expert_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_{E/G} ≀ S_G per MoE layer (G = n_group), keyed by the MoE block's prefix.

    Acts: expert e ↦ π(e): the router's columns W_router[:, π] and its score-correction bias, and
    every routed expert's tensors along the expert axis; π maps each group of E/G consecutive
    experts onto a group (the shared experts stay).

    Why: the scores, the group ranking (a function of each group's set of choices) and the top-k
    are permutation-equivariant under such a π, so Σ_top g_e·E_e(x) is unchanged; a π mixing groups
    would change which experts a group limit keeps.
    """
    cfg = as_latent(cfg)
    per = cfg.experts // cfg.n_group
    changes = {}
    for pre, perm in el.parts.items():
        if f"{pre}.W_router" not in params:
            raise GaugeAuditError(f"{pre} is not a mixture-of-experts block of this model")
        require_shape(pre, perm.double(), (cfg.experts,))
        blocks = perm.reshape(cfg.n_group, per) if _is_perm(perm, cfg.experts) else None
        if blocks is None or not all(len({int(e) // per for e in b}) == 1 for b in blocks):
            raise GaugeAuditError(f"{pre}: not a permutation of the experts that maps groups onto groups")
        changes[f"{pre}.W_router"] = params[f"{pre}.W_router"][:, perm].clone()
        if f"{pre}.b_router" in params:
            changes[f"{pre}.b_router"] = params[f"{pre}.b_router"][perm].clone()
        for name in ("W_in", "W_gate", "W_out"):
            changes[f"{pre}.{name}"] = params[f"{pre}.{name}"][perm].clone()
    return updated(params, changes)


def _ffn_perm_sample(cfg: DeepseekConfig, params: Params, g: torch.Generator, kappa: float) -> Element:
    parts: dict[str, list[torch.Tensor]] = {}
    for pre, _, w in ffn_units(cfg):
        parts.setdefault(pre, []).append(torch.randperm(w, generator=g))
    return Element({pre: torch.stack(ps) if pre.endswith(".moe") else ps[0] for pre, ps in parts.items()}, 1.0)


def deepseek_ffn_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_width per SwiGLU (every dense FFN, routed and shared expert), keyed by FFN prefix.

    Acts: hidden unit i ↦ π(i): the columns of W_in and W_gate and the rows of W_out.

    Why: the activation acts unit by unit (as ffn-perm, whose stacked element cannot hold FFNs whose
    widths differ by layer).
    """
    changes = {}
    for pre, perm in el.parts.items():
        if f"{pre}.W_in" not in params:
            raise GaugeAuditError(f"{pre} is not a SwiGLU FFN of this model")
        w_in = params[f"{pre}.W_in"]
        require_shape(pre, perm.double(), (*w_in.shape[:-2], w_in.shape[-1]))
        if not _is_perm(perm, w_in.shape[-1]):
            raise GaugeAuditError(f"{pre}: not a permutation of the hidden units")
        cols = perm[..., None, :]
        for name in ("W_in", "W_gate"):
            t = params[f"{pre}.{name}"]
            changes[f"{pre}.{name}"] = torch.gather(t, -1, cols.expand_as(t))
        w = params[f"{pre}.W_out"]
        changes[f"{pre}.W_out"] = torch.gather(w, -2, perm[..., :, None].expand_as(w))
    return updated(params, changes)


ACTIONS = [
    Action("latent-rotation", "O(r_KV) (× O(r_Q)) per layer", True, _is_mla, _latent_sample(True), latent_rotation),
    Action("latent-norm-scale", "(ℝ≠0)^r_KV (× (ℝ≠0)^r_Q) per layer", True, _is_mla, _scale_sample, latent_norm_scale),
    Action("mla-nope-gl", "GL(d_nope) per head per layer", True, _nope_applies, _nope_sample, mla_nope_gl),
    Action(
        "mla-rope-commutant",
        "RoPE commutant GL(1,ℂ)^{d_rope/2} per layer (shared by the heads)",
        True,
        _is_mla,
        _rope_sample,
        mla_rope_commutant,
    ),
    Action("mla-vo-gl", "GL(d_v) per head per layer", True, _is_mla, _vo_sample, mla_vo_gl),
    Action(
        "deepseek-swiglu-scaling",
        "(ℝ≠0)^width per SwiGLU FFN, routed and shared expert",
        True,
        _is_mla,
        _units_sample,
        deepseek_swiglu_scaling,
        element_layout="norms",
    ),
    Action("mla-head-perm", "S_h per layer", True, _is_mla, _head_perm_sample, mla_head_perm, generic_kappa=False),
    Action(
        "deepseek-expert-perm",
        "S_{E/G} ≀ S_G per MoE layer",
        True,
        _moe_applies,
        _expert_sample,
        deepseek_expert_perm,
        generic_kappa=False,
        expert_relabel=_expert_relabel,
        element_layout="norms",
    ),
    Action(
        "deepseek-ffn-perm",
        "S_width per SwiGLU FFN, routed and shared expert",
        True,
        _is_mla,
        _ffn_perm_sample,
        deepseek_ffn_perm,
        generic_kappa=False,
        element_layout="norms",
    ),
    Action("latent-gl", "GL(r) on a latent (false contrast)", False, _is_mla, _latent_sample(False), latent_gl),
]
MLA_NAMES = frozenset(a.name for a in ACTIONS)

# The other families' actions on an MLA model: those that carry over, and why the rest do not.
CARRIED = frozenset({"stream-rotation", "norm-scale"})
_WHY = {
    "qk-gl": "MLA splits each head's query/key into a nope part (mla-nope-gl, per head) and a RoPE part whose key "
    "is shared by all heads (mla-rope-commutant, per layer): no per-head GL(d_k) acts on a whole head",
    "vo-gl": "MLA's values are c_KV·W_UV[h]: the per-head GL(d_v) is mla-vo-gl",
    "head-perm": "MLA has no KV groups and its RoPE key is shared: the heads' permutation is mla-head-perm",
    "expert-perm": "DeepSeek's experts are permuted within their groups and by whole groups (group-limited "
    "routing), and its first layers are dense: deepseek-expert-perm",
    "ffn-perm": "DeepSeek's FFNs differ by layer (dense, routed and shared experts): deepseek-ffn-perm, keyed by FFN",
    "swiglu-scaling": "DeepSeek's FFNs differ by layer (dense, routed and shared experts): their scaling is "
    "deepseek-swiglu-scaling, keyed by FFN",
    "router-offset": "DeepSeek-V3's sigmoid router scores do not ignore a shift common to every expert's "
    "column (V2's softmax router does: router-offset applies there)",
}


def refusal(name: str, cfg: Config) -> str | None:
    """Why the other families' action ``name`` does not apply to an MLA model (None: it does)."""
    if not cfg.latent_attention or name in CARRIED or name in MLA_NAMES:
        return None
    if name == "router-offset" and as_latent(cfg).router == "softmax":
        return None
    return _WHY.get(
        name, "written for the per-head W_Q/W_K/W_V layout, which multi-head latent attention does not have"
    )


def gated(action: Action) -> Action:
    """``action`` refusing MLA models with the reason (the MLA actions and those that carry over pass)."""
    if action.name in MLA_NAMES or action.name in CARRIED:
        return action
    inner = action.applies

    def applies(cfg: Config) -> str | None:
        return refusal(action.name, cfg) or inner(cfg)

    return replace(action, applies=applies)
