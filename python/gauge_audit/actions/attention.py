"""Gauge actions inside attention: per-head (per-KV-group) GL actions on the
query–key and value–output spaces, head permutations, bias shifts, and the
false contrasts that papers propose instead."""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from ..models.layers import rope_planes
from ..runtime import stacked_inv, stacked_solve
from . import strata
from .base import (
    Action,
    Element,
    Params,
    Special,
    as64,
    attn_prefixes,
    cond,
    put,
    random_gl,
    require_invertible,
    require_shape,
    updated,
)


# ----------------------------------------------------------------------------- helpers
def _group_elements(cfg: Config, el: Element, key: str, heads: int) -> torch.Tensor:
    m = el.parts[key]
    require_shape(key, m, (cfg.n_layers, heads, cfg.d_head, cfg.d_head))
    require_invertible(key, m)
    return as64(m)


def _rotary_split(cfg: Config) -> int:
    """R: the coordinates RoPE rotates (the first R of a head); the rest pass unrotated."""
    return (cfg.rotary_dim or cfg.d_head) if cfg.pos == "rope" else 0


def commutant_distance(cfg: Config, m: torch.Tensor) -> float:
    """Relative distance of each d_head×d_head block from the RoPE commutant
    {per frequency plane a·I + b·J} ⊕ GL(d_head − R) on the unrotated coordinates (largest over the stack)."""
    p = torch.zeros_like(m)
    for i, j in rope_planes(cfg):
        a = (m[..., i, i] + m[..., j, j]) / 2
        b = (m[..., i, j] - m[..., j, i]) / 2
        p[..., i, i], p[..., j, j], p[..., i, j], p[..., j, i] = a, a, b, -b
    r = _rotary_split(cfg)
    p[..., r:, r:] = m[..., r:, r:]
    num = torch.linalg.matrix_norm(m - p).flatten()
    den = torch.linalg.matrix_norm(m).flatten()
    return float((num / den).max())


def random_commutant(cfg: Config, g: torch.Generator, kappa: float, lead: tuple) -> torch.Tensor:
    """Per plane r·(cos φ·I + sin φ·J): the commutant of RoPE, with κ = max r / min r; a partial rotary's
    unrotated block gets a GL element of condition number κ."""
    half = len(rope_planes(cfg))
    r0 = _rotary_split(cfg)
    m = torch.zeros(*lead, cfg.d_head, cfg.d_head, dtype=torch.float64)
    for idx in torch.cartesian_prod(*[torch.arange(n) for n in lead]).reshape(-1, len(lead)).tolist():
        r = torch.logspace(-0.5, 0.5, half, base=kappa, dtype=torch.float64)[torch.randperm(half, generator=g)]
        phi = 2 * torch.pi * torch.rand(half, generator=g, dtype=torch.float64)
        for (i, j), rr, ph in zip(rope_planes(cfg), r, phi):
            a, b = rr * torch.cos(ph), rr * torch.sin(ph)
            m[(*idx, i, i)], m[(*idx, j, j)], m[(*idx, i, j)], m[(*idx, j, i)] = a, a, b, -b
        if r0 < cfg.d_head:
            m[tuple(idx)][r0:, r0:] = random_gl(cfg.d_head - r0, g, kappa)
    return m


def _stack_gl(cfg: Config, g: torch.Generator, kappa: float, heads: int) -> torch.Tensor:
    return torch.stack(
        [torch.stack([random_gl(cfg.d_head, g, kappa) for _ in range(heads)]) for _ in range(cfg.n_layers)]
    )


def _times(t: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Per-head right multiplication: weights (h, d, e)·(h, e, e) or biases (h, e)·(h, e, e)."""
    if t.dim() == 2:
        return torch.einsum("he,hef->hf", t, m)
    return t @ m


def _qk_transform(cfg: Config, params: Params, m_query: torch.Tensor, m_key: torch.Tensor) -> Params:
    """W_Q[h] ↦ W_Q[h]·m_query[h] (and b_Q); W_K[j] ↦ W_K[j]·m_key[j] (and b_K)."""
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        for name, m in (("Q", m_query[l]), ("K", m_key[l])):
            for kind in ("W", "b"):
                key = f"{pre}.{kind}_{name}"
                if key in params:
                    changes[key] = put(_times(as64(params[key]), m), params[key])
    return updated(params, changes)


def _inv_t(m: torch.Tensor) -> torch.Tensor:
    return stacked_inv(m).transpose(-1, -2)


# ----------------------------------------------------------------------------- qk-gl
def _qk_gl_applies(cfg: Config) -> str | None:
    if cfg.qk_norm != "none":
        return (
            "the QK-norm n(x W_Q M) ≠ n(x W_Q)·M for a generic M: per-head GL(d_k) is not a symmetry; what "
            "survives is the scaling of the norm weights per RoPE plane (qk-norm-scale)"
        )
    return None


def _partial_rotary(cfg: Config) -> str | None:
    if cfg.pos == "rope" and cfg.rotary_dim:
        return (
            "partial rotary: this contrast's special points are derived for a rotary over the whole head; "
            "qk-gl samples the partial commutant (planes ⊕ GL on the unrotated coordinates)"
        )
    return None


def _qk_gl_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    lead = (cfg.n_layers, cfg.n_kv_heads)
    m = random_commutant(cfg, g, kappa, lead) if cfg.pos == "rope" else _stack_gl(cfg, g, kappa, cfg.n_kv_heads)
    return Element({"M": m}, cond(m))


def qk_gl(cfg: Config, params: Params, el: Element) -> Params:
    """Group: GL(d_k) per KV head and layer (the RoPE commutant ∏_planes GL(1,ℂ) under RoPE).

    Acts: for KV head j with element M_j, every query head h of its group:
    W_Q[h] ↦ W_Q[h]·M_j, b_Q[h] ↦ b_Q[h]·M_j; and W_K[j] ↦ W_K[j]·M_j⁻ᵀ, b_K[j] ↦ b_K[j]·M_j⁻ᵀ.

    Why: every score is q·kᵀ = (x W_Q + b_Q)(y W_K + b_K)ᵀ, and (q M)(k M⁻ᵀ)ᵀ = q M M⁻¹ kᵀ = q kᵀ.
    Under RoPE, q ↦ q·R_p: (q M R_p)(k M⁻ᵀ R_s)ᵀ = q kᵀ needs M R_p = R_p M for all positions,
    i.e. M in the commutant (per frequency plane a·I + b·J; with a partial rotary, any GL block on the
    unrotated coordinates, which R_p fixes); then M⁻ᵀ is in it too.
    """
    m = _group_elements(cfg, el, "M", cfg.n_kv_heads)
    if cfg.pos == "rope":
        dist = commutant_distance(cfg, m)
        if dist > 1e-10:
            raise GaugeAuditError(
                f"M is outside the RoPE commutant (relative distance {dist:.2e}); under RoPE "
                "only per-frequency-plane blocks a·I + b·J commute with every position rotation"
            )
    return _qk_transform(cfg, params, m.repeat_interleave(cfg.group_size, dim=1), _inv_t(m))


# ----------------------------------------------------------------------------- vo-gl
def _vo_gl_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    n = _stack_gl(cfg, g, kappa, cfg.n_kv_heads)
    return Element({"N": n}, cond(n))


def vo_gl(cfg: Config, params: Params, el: Element) -> Params:
    """Group: GL(d_v) per KV head and layer.

    Acts: W_V[j] ↦ W_V[j]·N_j, b_V[j] ↦ b_V[j]·N_j, and for every query head h of
    KV group j the head's rows of the output projection W_O[h] ↦ N_j⁻¹·W_O[h].

    Why: head h outputs softmax(·)(x W_V + b_V) W_O[h]; the attention weights do not
    involve V, and (A x W_V N)(N⁻¹ W_O) = A x W_V W_O.
    """
    n = _group_elements(cfg, el, "N", cfg.n_kv_heads)
    n_q = n.repeat_interleave(cfg.group_size, dim=1)
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        for kind in ("W", "b"):
            key = f"{pre}.{kind}_V"
            if key in params:
                changes[key] = put(_times(as64(params[key]), n[l]), params[key])
        key = f"{pre}.W_O"
        changes[key] = put(stacked_solve(n_q[l], as64(params[key])), params[key])
    return updated(params, changes)


# ----------------------------------------------------------------------------- head-perm
def _perm_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    kv = torch.stack([torch.randperm(cfg.n_kv_heads, generator=g) for _ in range(cfg.n_layers)])
    q = torch.stack(
        [
            torch.stack([torch.randperm(cfg.group_size, generator=g) for _ in range(cfg.n_kv_heads)])
            for _ in range(cfg.n_layers)
        ]
    )
    return Element({"kv_perm": kv, "q_perm": q}, 1.0)


def _check_perm(name: str, p: torch.Tensor) -> None:
    n = p.shape[-1]
    if p.dtype.is_floating_point or not torch.equal(p.sort(-1).values, torch.arange(n).expand_as(p)):
        raise GaugeAuditError(f"{name} is not a permutation")


def head_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_{n_kv} ≀ S_g per layer (plain S_h for MHA).

    Acts: KV heads are permuted by kv_perm, together with the query heads they serve;
    within each group the query heads are permuted by q_perm.  Every per-head tensor
    (W_Q, b_Q, W_O along the query-head axis; W_K, b_K, W_V, b_V along the KV axis)
    is re-indexed consistently.

    Why: the output is a sum over heads Σ_h z_h W_O[h], and each query head's result
    depends only on its own W_Q/W_O rows and the shared K/V of its group.  A full-width QK-norm
    (OLMo 2) takes its rms over all heads, which a permutation leaves alone; its per-head weight
    chunks are re-indexed with the heads.
    """
    kv, qp = el.parts["kv_perm"], el.parts["q_perm"]
    require_shape("kv_perm", kv.double(), (cfg.n_layers, cfg.n_kv_heads))
    require_shape("q_perm", qp.double(), (cfg.n_layers, cfg.n_kv_heads, cfg.group_size))
    _check_perm("kv_perm", kv)
    _check_perm("q_perm", qp)
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        q_index = torch.tensor(
            [
                int(kv[l, j]) * cfg.group_size + int(qp[l, j, r])
                for j in range(cfg.n_kv_heads)
                for r in range(cfg.group_size)
            ]
        )
        for name, index in (("Q", q_index), ("O", q_index), ("K", kv[l]), ("V", kv[l])):
            for kind in ("W", "b"):
                key = f"{pre}.{kind}_{name}"
                if key in params and not (name == "O" and kind == "b"):
                    changes[key] = params[key][index.to(params[key].device)].clone()
        if cfg.qk_norm == "full":  # the full-width QK-norm weights are per head: re-indexed with their heads
            for key, index in ((f"{pre}.q_norm", q_index), (f"{pre}.k_norm", kv[l])):
                w = params[key].reshape(-1, cfg.d_head)
                changes[key] = w[index.to(w.device)].reshape(-1).clone()
    return updated(params, changes)


# ----------------------------------------------------------------------------- bias shifts
def _key_bias_applies(cfg: Config) -> str | None:
    if not cfg.attn_bias:
        return "the model has no key bias"
    if cfg.pos == "rope" and rotated_coordinates(cfg) == cfg.d_head:
        return "under RoPE the key bias is rotated with the key, so a shift changes scores position-dependently"
    return None


def rotated_coordinates(cfg: Config) -> int:
    """The leading coordinates of each head RoPE rotates (0 without RoPE)."""
    return (cfg.rotary_dim or cfg.d_head) if cfg.pos == "rope" else 0


def _key_bias_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    el = _bias_shift_sample(cfg, params, g, kappa)
    el.parts["c"][..., : rotated_coordinates(cfg)] = 0.0  # a partial rotary: only the unrotated coordinates
    return el


def _bias_shift_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    c = 0.1 * torch.randn(cfg.n_layers, cfg.n_kv_heads, cfg.d_head, generator=g, dtype=torch.float64)
    return Element({"c": c}, 1.0)


def key_bias_shift(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_k}, +) per KV head and layer (no RoPE; under a partial rotary (ℝ^{d_k − R}, +)
    on the unrotated coordinates).

    Acts: b_K[j] ↦ b_K[j] + c_j.

    Why: each score q·kᵀ gains q·c_j, the same for every key of a given query, and
    softmax is invariant under adding a constant to a row (the causal mask removes
    keys, not this constancy).
    """
    c = el.parts["c"]
    require_shape("c", c, (cfg.n_layers, cfg.n_kv_heads, cfg.d_head))
    if rotated_coordinates(cfg) and bool((c[..., : rotated_coordinates(cfg)] != 0).any()):
        raise GaugeAuditError(
            f"key-bias-shift: under RoPE only the unrotated coordinates {rotated_coordinates(cfg)}..{cfg.d_head - 1} "
            "of the key bias may shift"
        )
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        key = f"{pre}.b_K"
        changes[key] = put(as64(params[key]) + as64(c[l]), params[key])
    return updated(params, changes)


def _value_bias_applies(cfg: Config) -> str | None:
    if not cfg.attn_bias:
        return "the model has no value bias"
    if not cfg.out_bias:
        return "the model has no output bias to absorb the value bias"
    return None


def value_bias_fold(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_v}, +) per KV head and layer; c_j = −b_V[j] folds b_V away entirely.

    Acts: b_V[j] ↦ b_V[j] + c_j and b_O ↦ b_O − Σ_{h in group j} c_j·W_O[h].

    Why: attention rows sum to 1, so a value bias reaches every position unchanged:
    A(XW_V + 1b_V) = A X W_V + 1 b_V; its contribution Σ_h b_V W_O[h] is a constant,
    which the output bias can carry instead.
    """
    c = el.parts["c"]
    require_shape("c", c, (cfg.n_layers, cfg.n_kv_heads, cfg.d_head))
    changes = {}
    for l, pre in enumerate(attn_prefixes(cfg)):
        c_q = as64(c[l]).repeat_interleave(cfg.group_size, dim=0)  # (h, e)
        changes[f"{pre}.b_V"] = put(as64(params[f"{pre}.b_V"]) + as64(c[l]), params[f"{pre}.b_V"])
        delta = torch.einsum("he,hed->d", c_q, as64(params[f"{pre}.W_O"]))
        changes[f"{pre}.b_O"] = put(as64(params[f"{pre}.b_O"]) - delta, params[f"{pre}.b_O"])
    return updated(params, changes)


# ----------------------------------------------------------------------------- false contrasts
def _contrast_kappa(kappa: float) -> float:
    # A contrast must be drawn away from the subgroup where it happens to be true
    # (orthogonal M for the same-action rule): κ ≥ 4 keeps it generic.
    return max(kappa, 4.0)


def _same_action_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    m = _stack_gl(cfg, g, _contrast_kappa(kappa), cfg.n_kv_heads)
    return Element({"M": m}, cond(m))


def qk_same_action(cfg: Config, params: Params, el: Element) -> Params:
    """FALSE CONTRAST (the wiki's rule): W_Q ↦ W_Q·M and W_K ↦ W_K·M with the same M.

    Scores become q M Mᵀ kᵀ, unchanged only when M·Mᵀ = I (M orthogonal); for a
    non-orthogonal M ∈ GL(d_k) the attention pattern changes.
    """
    m = _group_elements(cfg, el, "M", cfg.n_kv_heads)
    return _qk_transform(cfg, params, m.repeat_interleave(cfg.group_size, dim=1), m)


def _rope_generic_applies(cfg: Config) -> str | None:
    return None if cfg.pos == "rope" else "the model has no RoPE"


def _rope_generic_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    m = _stack_gl(cfg, g, _contrast_kappa(kappa), cfg.n_kv_heads)
    return Element({"M": m}, cond(m))


def qk_gl_rope_generic(cfg: Config, params: Params, el: Element) -> Params:
    """FALSE CONTRAST: the plain qk-gl rule W_Q·M, W_K·M⁻ᵀ with a generic M ∈ GL(d_k)
    under RoPE.  R_p M ≠ M R_p unless M is in the RoPE commutant, so scores change."""
    m = _group_elements(cfg, el, "M", cfg.n_kv_heads)
    return _qk_transform(cfg, params, m.repeat_interleave(cfg.group_size, dim=1), _inv_t(m))


def _untied_applies(cfg: Config) -> str | None:
    if cfg.group_size == 1:
        return "every KV head serves a single query head (MHA)"
    return _partial_rotary(cfg)


def _untied_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    k = _contrast_kappa(kappa)
    if cfg.pos == "rope":
        m = random_commutant(cfg, g, k, (cfg.n_layers, cfg.n_heads))
    else:
        m = _stack_gl(cfg, g, k, cfg.n_heads)
    return Element({"M": m}, cond(m))


def qk_gl_untied_gqa(cfg: Config, params: Params, el: Element) -> Params:
    """FALSE CONTRAST (GQA/MQA): a different M_h for each query head of a KV group,
    with the shared key transformed by the first head's M⁻ᵀ.  The other query heads
    then see q M_h M_first⁻¹ kᵀ ≠ q kᵀ: the group must share one M."""
    m = _group_elements(cfg, el, "M", cfg.n_heads)
    first = m[:, :: cfg.group_size]
    return _qk_transform(cfg, params, m, _inv_t(first))


# ----------------------------------------------------------------------------- special points
# Each contrast above fails generically because a score q·kᵀ becomes q·A·kᵀ with A ≠ I (A = M·Mᵀ,
# M·R_Δ·M⁻¹·R_Δᵀ, M_h·M_first⁻¹): for generic A, u·A·v = 0 forces u = 0 or v = 0.  So it holds
# exactly where no head's changed scores can reach the output: the head's output ignores its
# pattern (W_O[h] = 0, or constant values W_V[j] = 0), its queries are 0, or its keys are the same
# at every position (softmax ignores a constant per query) — or the inputs have one position,
# where every softmax row has one key.
def _single_position(n: int) -> str | None:
    return (
        ("the inputs have a single position: every softmax row has one key, so no score reaches the output")
        if n == 1
        else None
    )


def _heads_special(cfg: Config, params: Params, n: int, affected=None, planes: bool = False) -> str | None:
    """Why no changed score reaches the output (None: one does).  ``affected(cfg)`` marks the query
    heads whose scores change (default all); with ``planes`` (an A in the RoPE commutant, acting
    plane by plane) a head is also safe when each plane has a zero query or a zero key."""
    if _single_position(n):
        return _single_position(n)
    kinds: dict[str, int] = {}
    for layer in range(cfg.n_layers):
        todo = affected(cfg) if affected else torch.ones(cfg.n_heads, dtype=torch.bool)
        for label, safe in (
            ("W_O = 0 or W_V = 0", strata.heads_ignored(cfg, params, layer)),
            ("zero queries", strata.queries_zero(cfg, params, layer)),
            ("constant keys", strata.keys_constant(cfg, params, layer)),
        ):
            hit = todo & safe
            if hit.any():
                kinds[label] = kinds.get(label, 0) + int(hit.sum())
            todo = todo & ~safe
        if planes and todo.any():
            q = strata.plane_support(cfg, params, layer, "Q")
            k = strata.plane_support(cfg, params, layer, "K").repeat_interleave(cfg.group_size, dim=0)
            disjoint = ~(q & k).any(dim=1)
            hit = todo & disjoint
            if hit.any():
                kinds["no RoPE plane with both a query and a key"] = kinds.get(
                    "no RoPE plane with both a query and a key", 0
                ) + int(hit.sum())
            todo = todo & ~disjoint
        if todo.any():
            return None
    counts = ", ".join(f"{c} with {label}" for label, c in kinds.items())
    return (
        f"no head's changed scores reach the output (heads whose scores change: {counts})"
        if counts
        else "no head's scores change"
    )


def _exact(reason: str | None) -> Special | None:
    """A stratum of zero tests: the point is on it (defect 0) or not near it."""
    return Special(reason) if reason else None


def _same_action_special(cfg: Config, params: Params, n: int, eps: float) -> Special | None:
    return _exact(_heads_special(cfg, params, n))


def _rope_generic_special(cfg: Config, params: Params, n: int, eps: float) -> Special | None:
    return _exact(_heads_special(cfg, params, n))


def _not_first_of_group(cfg: Config) -> torch.Tensor:
    """The query heads that are not the first of their KV group (the first keeps q·kᵀ exactly)."""
    return torch.arange(cfg.n_heads) % cfg.group_size != 0


def _untied_special(cfg: Config, params: Params, n: int, eps: float) -> Special | None:
    # Under RoPE the sampled M_h are in the commutant, so A = M_h·M_first⁻¹ acts plane by plane.
    return _exact(_heads_special(cfg, params, n, _not_first_of_group, planes=cfg.pos == "rope"))


ACTIONS = [
    Action(
        "qk-gl",
        "GL(d_k) per KV head per layer (RoPE: commutant ∏ GL(1,ℂ))",
        True,
        _qk_gl_applies,
        _qk_gl_sample,
        qk_gl,
        claim="qk-gl",
    ),
    Action("vo-gl", "GL(d_v) per KV head per layer", True, lambda cfg: None, _vo_gl_sample, vo_gl, claim="vo-gl"),
    Action(
        "head-perm",
        "S_{n_kv} ≀ S_g per layer",
        True,
        lambda cfg: None,
        _perm_sample,
        head_perm,
        claim="head-perm",
        generic_kappa=False,
    ),
    Action(
        "key-bias-shift",
        "(ℝ^{d_k},+) per KV head per layer",
        True,
        _key_bias_applies,
        _key_bias_sample,
        key_bias_shift,
        generic_kappa=False,
    ),
    Action(
        "value-bias-fold",
        "(ℝ^{d_v},+) per KV head per layer",
        True,
        _value_bias_applies,
        _bias_shift_sample,
        value_bias_fold,
        generic_kappa=False,
    ),
    Action(
        "qk-same-action",
        "W_Q·M, W_K·M (wiki)",
        False,
        lambda cfg: None,
        _same_action_sample,
        qk_same_action,
        claim="qk-same-action",
        special=_same_action_special,
    ),
    Action(
        "qk-gl-rope-generic",
        "generic GL(d_k) under RoPE",
        False,
        _rope_generic_applies,
        _rope_generic_sample,
        qk_gl_rope_generic,
        claim="rope-commutant",
        special=_rope_generic_special,
    ),
    Action(
        "qk-gl-untied-gqa",
        "one M per query head under GQA",
        False,
        _untied_applies,
        _untied_sample,
        qk_gl_untied_gqa,
        claim="gqa-tied",
        special=_untied_special,
    ),
]
