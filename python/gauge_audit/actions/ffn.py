"""Gauge actions inside the feed-forward network and the mixture of experts.

FFN parameters are (d_model, d_ff) / (d_ff, d_model), with a leading expert axis
in MoE blocks; every action below acts on the hidden (d_ff) axis of each expert.
"""

from __future__ import annotations

import torch

from ..errors import GaugeAuditError
from ..models.config import Config
from . import strata
from .base import Action, Element, Params, Special, as64, put, require_shape, updated


def _ffn_prefixes(cfg: Config) -> list[str]:
    return [f"blocks.{i}.{'moe' if cfg.experts else 'mlp'}" for i in range(cfg.n_layers)]


def _hidden_shape(cfg: Config) -> tuple:
    return (cfg.n_layers, cfg.experts, cfg.d_ff) if cfg.experts else (cfg.n_layers, cfg.d_ff)


def _has_ffn(cfg: Config) -> str | None:
    return "the model has no feed-forward network" if cfg.attention_only else None


def _act_is(*acts: str):
    def applies(cfg: Config) -> str | None:
        return _has_ffn(cfg) or (None if cfg.act in acts else f"the FFN activation is {cfg.act}, not {'/'.join(acts)}")

    return applies


def _hidden_in(cfg: Config, params: Params, pre: str) -> list[str]:
    """Tensors whose last axis is the hidden axis (columns feeding the activation)."""
    names = [f"{pre}.W_in", f"{pre}.b_in", f"{pre}.W_gate", f"{pre}.b_gate"]
    return [n for n in names if n in params]


# ----------------------------------------------------------------------------- permutation
def _perm_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    shape = _hidden_shape(cfg)
    perms = torch.stack([torch.randperm(cfg.d_ff, generator=g) for _ in range(int(torch.tensor(shape[:-1]).prod()))])
    return Element({"perm": perms.reshape(shape)}, 1.0)


def ffn_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_{d_ff} per FFN (per expert in MoE blocks).

    Acts: hidden neuron i ↦ π(i): columns of W_in, W_gate and entries of b_in, b_gate,
    and rows of W_out, are re-indexed by π.

    Why: the activation acts entry-wise, so relabelling hidden neurons consistently on
    both sides of it leaves Σ_i act(x·w_i + b_i)·W_out[i] unchanged.
    """
    perm = el.parts["perm"]
    require_shape("perm", perm.double(), _hidden_shape(cfg))
    if perm.dtype.is_floating_point or not torch.equal(perm.sort(-1).values, torch.arange(cfg.d_ff).expand_as(perm)):
        raise GaugeAuditError("perm is not a permutation of the hidden neurons")
    changes = {}
    for l, pre in enumerate(_ffn_prefixes(cfg)):
        p = perm[l].to(next(iter(params.values())).device)
        for name in _hidden_in(cfg, params, pre):
            t = params[name]
            changes[name] = (
                torch.gather(t, -1, p.reshape(*p.shape[:-1], *([1] * (t.dim() - p.dim())), -1).expand_as(t))
                if t.dim() > p.dim()
                else torch.gather(t, -1, p)
            )
        w = params[f"{pre}.W_out"]
        changes[f"{pre}.W_out"] = torch.gather(w, -2, p[..., :, None].expand_as(w))
    return updated(params, changes)


# ----------------------------------------------------------------------------- scalings
def _scale_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    s = kappa ** (torch.rand(_hidden_shape(cfg), generator=g, dtype=torch.float64) - 0.5)
    return Element({"s": s}, float(s.max() / s.min()))


def _scale_hidden(cfg: Config, params: Params, el: Element, scaled_in: tuple[str, ...], positive: bool) -> Params:
    s = el.parts["s"]
    require_shape("s", s, _hidden_shape(cfg))
    if positive and (s <= 0).any():
        raise GaugeAuditError("the scaling must be positive (ReLU commutes only with c ≥ 0)")
    if (s == 0).any():
        raise GaugeAuditError("the scaling has a zero entry (not invertible)")
    changes = {}
    for l, pre in enumerate(_ffn_prefixes(cfg)):
        sl = as64(s[l])
        for name in scaled_in:
            key = f"{pre}.{name}"
            if key in params:
                t = as64(params[key])
                changes[key] = put(t * (sl[..., None, :] if t.dim() > sl.dim() else sl), params[key])
        w = params[f"{pre}.W_out"]
        changes[f"{pre}.W_out"] = put(as64(w) / sl[..., :, None], w)
    return updated(params, changes)


def relu_scaling(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ_{>0})^{d_ff} per FFN (ReLU only).

    Acts: W_in[:, i] ↦ s_i·W_in[:, i], b_in[i] ↦ s_i·b_in[i], W_out[i, :] ↦ W_out[i, :]/s_i.

    Why: ReLU is positively homogeneous, relu(s·z) = s·relu(z) for s ≥ 0 — which is why
    van Nierop's "the nonlinearity forces f(0) = f(1) = 1" is false for ReLU.
    """
    return _scale_hidden(cfg, params, el, ("W_in", "b_in"), positive=True)


def gelu_scaling(cfg: Config, params: Params, el: Element) -> Params:
    """FALSE CONTRAST: the ReLU scaling rule applied to a GELU FFN.  gelu(s·z) ≠ s·gelu(z)
    (GELU is not homogeneous), so the function changes unless s = 1."""
    return _scale_hidden(cfg, params, el, ("W_in", "b_in"), positive=True)


def swiglu_scaling(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ_{≠0})^{d_ff} per SwiGLU FFN (per expert).

    Acts: the up projection W_in[:, i] ↦ s_i·W_in[:, i] (and b_in), W_out[i, :] ↦ W_out[i, :]/s_i;
    the gate W_gate is untouched.

    Why: the hidden unit is silu(x·w_gate)·(x·w_up), linear in w_up, so the scale passes
    through the product and is undone by W_out.
    """
    return _scale_hidden(cfg, params, el, ("W_in", "b_in"), positive=False)


def _gelu_special(cfg: Config, params: Params, n: int, eps: float) -> Special | None:
    """Where ReLU's scaling rule holds on a GELU FFN: it fails generically because unit i then
    contributes gelu(s_i·z_i)/s_i·W_out[i] instead of gelu(z_i)·W_out[i]; the two agree for every
    s exactly when the unit contributes nothing either way — W_out[i] = 0, or z_i ≡ 0 (a zero
    column of W_in and b_in = 0: gelu(0) = 0).  A unit with z_i ≡ b_i ≠ 0 still changes the output
    by the constant (gelu(s·b)/s − gelu(b))·W_out[i]."""
    for layer in range(cfg.n_layers):
        if not bool(strata.units_silent(cfg, params, layer).all()):
            return None
    return Special(
        "every hidden unit is silent (W_out row 0, or zero input weights and bias: gelu(0) = 0), "
        "so no unit's gelu(s·z)/s ≠ gelu(z) reaches the output"
    )


# ----------------------------------------------------------------------------- experts
def _moe_applies(cfg: Config) -> str | None:
    return None if cfg.experts else "the model has no mixture of experts"


def _expert_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element({"perm": torch.stack([torch.randperm(cfg.experts, generator=g) for _ in range(cfg.n_layers)])}, 1.0)


def expert_perm(cfg: Config, params: Params, el: Element) -> Params:
    """Group: S_E per MoE block.

    Acts: expert e ↦ π(e): the router's columns W_router[:, π] and every stacked expert
    tensor (W_in, W_gate, W_out and biases) along the expert axis.

    Why: the gate p = softmax(x·W_router) is permutation-equivariant and top-k selects
    the same experts under their new labels, so Σ_{e in top-k} g_e·E_e(x) is unchanged.
    """
    perm = el.parts["perm"]
    require_shape("perm", perm.double(), (cfg.n_layers, cfg.experts))
    if perm.dtype.is_floating_point or not torch.equal(perm.sort(-1).values, torch.arange(cfg.experts).expand_as(perm)):
        raise GaugeAuditError("perm is not a permutation of the experts")
    changes = {}
    for l, pre in enumerate(_ffn_prefixes(cfg)):
        p = perm[l].to(next(iter(params.values())).device)
        changes[f"{pre}.W_router"] = params[f"{pre}.W_router"][:, p].clone()
        for name in ("W_in", "b_in", "W_gate", "b_gate", "W_out", "b_out"):
            key = f"{pre}.{name}"
            if key in params:
                changes[key] = params[key][p].clone()
    return updated(params, changes)


ACTIONS = [
    Action("ffn-perm", "S_{d_ff} per FFN", True, _has_ffn, _perm_sample, ffn_perm, generic_kappa=False),
    Action(
        "relu-scaling",
        "(ℝ>0)^{d_ff} per ReLU FFN",
        True,
        _act_is("relu"),
        _scale_sample,
        relu_scaling,
        claim="relu-forces-identity",
    ),
    Action("swiglu-scaling", "(ℝ≠0)^{d_ff} per SwiGLU FFN", True, _act_is("swiglu"), _scale_sample, swiglu_scaling),
    Action(
        "gelu-scaling",
        "ReLU's scaling rule on GELU",
        False,
        _act_is("gelu", "gelu-tanh"),
        _scale_sample,
        gelu_scaling,
        claim="relu-forces-identity",
        special=_gelu_special,
    ),
    Action(
        "expert-perm",
        "S_E per MoE block",
        True,
        _moe_applies,
        _expert_sample,
        expert_perm,
        claim="moe-expert-perm",
        generic_kappa=False,
        expert_relabel=lambda el, layer, idx: el.parts["perm"][layer][idx],
    ),
]
