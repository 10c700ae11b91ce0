"""Gemma 2 and Gemma 3: the LLaMA stack with a norm after every sublayer as well as before it.

    x₀ = √d · W_E[t]                                           (embedding scaled by √d_model)
    a  = Attn_l(n(x)⊙γ₁)          x ← x + n(a)⊙γ₁'             (pre-norm and post-norm: "sandwich")
    f  = FFN(n(x)⊙γ₂)             x ← x + n(f)⊙γ₂'
    logits = c_f·tanh((n(x)⊙γ_f · W_Eᵀ)/c_f)                    (final-logit soft-capping, c_f > 0)

with n(x) = x/√(mean(x²) + ε).  Attention per head, with s = query_pre_attn_scalar:

    q = RoPE_l(n(x W_Q)⊙γ_q),  k = RoPE_l(n(x W_K)⊙γ_k)       (Gemma 3: qk_norm="head"; one γ_q, γ_k
                                                                 over d_head, shared by the heads)
    scores = c_a·tanh(q·kᵀ/(√s·c_a))                            (attention soft-capping, Gemma 2)
    masked to j ≤ i (full layers) or i − W < j ≤ i (sliding-window layers)

RoPE_l uses the base of its layer's type: ``rope_base`` on full layers (with the linear scaling
factor ``rope_scale``: angles p·θ_i / factor), ``rope_local_base`` on sliding ones (Gemma 3).  The
FFN is GeGLU: (gelu_tanh(x W_gate) ⊙ x W_in) W_out.

Norm weights.  Every Gemma norm multiplies by (1 + w) with w the stored parameter (Hugging Face
initialises w = 0); llama.cpp's converter stores 1 + w.  The project holds the effective weight
γ = 1 + w, so the forward is the plain weighted RMSNorm and the gauge actions act on γ as on any
norm weight; the Hugging Face links add / subtract the 1 (exact in float64).  The special point
w = 0 of a (1 + w) norm is γ = 1 here, i.e. γ ∝ 1 — where the norm commutes with every rotation.

``act="swiglu"`` marks the gated FFN (the gated-FFN symmetries read it); the gate's activation is
``gate_act`` ("gelu-tanh": GeGLU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch

from ..errors import GaugeAuditError
from .config import Config, validate
from .layers import Params, activation, attention_shapes, head_norm, normalize, unembed

SLIDING, FULL = "sliding", "full"


@dataclass(frozen=True)
class GemmaConfig(Config):
    qk_norm: str = "none"  # none | head (RMSNorm over d_head, weights shared by the heads)
    gate_act: str = "gelu-tanh"  # activation of the FFN gate (GeGLU)
    query_pre_attn_scalar: float = 0.0  # scores scaled by s^-1/2; 0: s = d_head
    attn_softcap: float = 0.0  # c_a > 0: scores ↦ c_a·tanh(scores/c_a); 0: none
    final_softcap: float = 0.0  # c_f > 0: logits ↦ c_f·tanh(logits/c_f); 0: none
    window: int = 0  # sliding-window length W of the sliding layers (0: none)
    sliding_pattern: int = 0  # every p-th layer (p, 2p, ...) is full, the others sliding; 0: all full
    layer_types: tuple = ()  # explicit per-layer "sliding" / "full" (overrides sliding_pattern)
    rope_local_base: float = 0.0  # RoPE base of the sliding layers (0: rope_base)
    rope_scale: float = 1.0  # linear RoPE scaling factor of the full layers

    @property
    def whole_head_rotary(self) -> bool:
        return True

    def layer_type(self, i: int) -> str:
        if self.layer_types:
            return self.layer_types[i]
        if self.sliding_pattern and (i + 1) % self.sliding_pattern:
            return SLIDING
        return FULL

    def with_(self, **changes) -> GemmaConfig:
        # fewer layers (a one-block view, a shallower copy) keep the first layers' types
        n = changes.get("n_layers", self.n_layers)
        types = changes.get("layer_types", self.layer_types)
        if types and n < len(types):
            changes["layer_types"] = tuple(types[:n])
        return check(cast(GemmaConfig, super().with_(**changes)))  # replace() keeps the class


def check(cfg: GemmaConfig) -> GemmaConfig:
    def need(cond: bool, msg: str):
        if not cond:
            raise GaugeAuditError(f"invalid gemma config: {msg}")

    validate(cfg)
    need(
        cfg.norm == "rmsnorm" and cfg.norm_placement == "sandwich", "Gemma has weighted RMSNorms in sandwich placement"
    )
    need(cfg.act == "swiglu" and cfg.gate_act in ("gelu-tanh", "gelu"), "the FFN is GeGLU (gate_act gelu-tanh or gelu)")
    need(cfg.pos == "rope" and cfg.rope_style == "half", "Gemma uses half-split RoPE")
    need(not (cfg.attn_bias or cfg.out_bias or cfg.mlp_bias or cfg.unembed_bias), "Gemma has no biases")
    need(cfg.qk_norm in ("none", "head"), "qk_norm must be none or head")
    need(cfg.experts == 0, "the FFN is a dense GeGLU (no experts)")
    for name in ("query_pre_attn_scalar", "attn_softcap", "final_softcap", "rope_local_base"):
        v = getattr(cfg, name)
        need(isinstance(v, (int, float)) and v == v and 0 <= v < math.inf, f"{name} must be a finite number >= 0")
    need(cfg.rope_scale >= 1, "rope_scale must be >= 1")
    need(isinstance(cfg.window, int) and cfg.window >= 0, "window must be an integer >= 0")
    need(isinstance(cfg.sliding_pattern, int) and cfg.sliding_pattern >= 0, "sliding_pattern must be >= 0")
    need(
        not cfg.layer_types or (len(cfg.layer_types) == cfg.n_layers and set(cfg.layer_types) <= {SLIDING, FULL}),
        f"layer_types must name {cfg.n_layers} layers, each sliding or full",
    )
    need(
        cfg.window > 0 or all(cfg.layer_type(i) == FULL for i in range(cfg.n_layers)),
        "sliding layers need a window > 0",
    )
    return cfg


def config(**overrides) -> GemmaConfig:
    """Gemma 3 defaults (qk_norm head, no soft-capping, sliding pattern 6, local base 10 000);
    Gemma 2: qk_norm="none", attn_softcap=50, final_softcap=30, sliding_pattern=2."""
    base = GemmaConfig(
        family="gemma",
        norm="rmsnorm",
        norm_placement="sandwich",
        norm_eps=1e-6,
        act="swiglu",
        attn_bias=False,
        out_bias=False,
        mlp_bias=False,
        pos="rope",
        rope_style="half",
        rope_base=1e6,
        causal=True,
        tied=True,
        qk_norm="head",
        window=8,
        sliding_pattern=6,
        rope_local_base=1e4,
    )
    return base.with_(**overrides) if overrides else check(base)


def gemma2_config(**overrides) -> GemmaConfig:
    return config(
        **{
            "qk_norm": "none",
            "attn_softcap": 50.0,
            "final_softcap": 30.0,
            "sliding_pattern": 2,
            "rope_base": 1e4,
            "rope_local_base": 0.0,
            **overrides,
        }
    )


# ----------------------------------------------------------------------------- shapes
def param_shapes(cfg: GemmaConfig) -> dict:
    d, f = cfg.d_model, cfg.d_ff
    shapes: dict[str, tuple[tuple[int, ...], str]] = {"embed.W_E": ((cfg.vocab, d), "embed")}
    for i in range(cfg.n_layers):
        p = f"blocks.{i}"
        shapes[f"{p}.ln1.w"] = ((d,), "norm_w")
        shapes.update(attention_shapes(cfg, f"{p}.attn"))
        # (attention_shapes includes the QK-norm weights attn.q_norm, attn.k_norm when qk_norm == "head")
        shapes[f"{p}.ln1_post.w"] = ((d,), "norm_w")
        shapes[f"{p}.ln2.w"] = ((d,), "norm_w")
        shapes.update(
            {
                f"{p}.mlp.W_gate": ((d, f), "weight"),
                f"{p}.mlp.W_in": ((d, f), "weight"),
                f"{p}.mlp.W_out": ((f, d), "weight"),
            }
        )
        shapes[f"{p}.ln2_post.w"] = ((d,), "norm_w")
    shapes["ln_final.w"] = ((d,), "norm_w")
    if not cfg.tied:
        shapes["unembed.W_U"] = ((d, cfg.vocab), "weight")
    return shapes


# ----------------------------------------------------------------------------- layers
def softcap(x: torch.Tensor, c: float) -> torch.Tensor:
    """c·tanh(x/c): smooth, odd, slope 1 at 0, |·| < c.  c = 0: the identity."""
    return c * torch.tanh(x / c) if c else x


def rope_inv_freq(cfg: GemmaConfig, layer: int) -> torch.Tensor:
    """θ_i = base^(−2i/d_head) of the layer's type (full layers: divided by the linear factor)."""
    sliding = cfg.layer_type(layer) == SLIDING
    base = (cfg.rope_local_base or cfg.rope_base) if sliding else cfg.rope_base
    inv = base ** (-torch.arange(cfg.d_head // 2, dtype=torch.float64) * 2.0 / cfg.d_head)
    return inv if sliding else inv / cfg.rope_scale


def rope(cfg: GemmaConfig, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Rotate the planes (i, i + d_head/2) of position p by p·θ_i."""
    ang = torch.arange(x.shape[-2], dtype=torch.float64)[:, None] * rope_inv_freq(cfg, layer)[None, :]
    cos, sin = ang.cos().to(x.device, x.dtype), ang.sin().to(x.device, x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def mask(cfg: GemmaConfig, layer: int, n: int, device) -> torch.Tensor:
    """True where key j is hidden from query i: the future, and on sliding layers j ≤ i − W."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    hidden = j > i
    if cfg.layer_type(layer) == SLIDING:
        hidden = hidden | (j <= i - cfg.window)
    return hidden


def attention(params: Params, cfg: GemmaConfig, layer: int, x: torch.Tensor) -> torch.Tensor:
    prefix = f"blocks.{layer}.attn"

    def proj(name: str) -> torch.Tensor:  # (B, heads, n, d_head)
        return torch.einsum("bnd,hde->bhne", x, params[f"{prefix}.W_{name}"])

    q, k, v = proj("Q"), proj("K"), proj("V")
    if cfg.qk_norm == "head":
        q = head_norm(params, f"{prefix}.q_norm", cfg, q)
        k = head_norm(params, f"{prefix}.k_norm", cfg, k)
    q, k = rope(cfg, layer, q), rope(cfg, layer, k)
    k = k.repeat_interleave(cfg.group_size, dim=1)
    v = v.repeat_interleave(cfg.group_size, dim=1)
    scores = softcap(q @ k.transpose(-1, -2) / math.sqrt(cfg.query_pre_attn_scalar or cfg.d_head), cfg.attn_softcap)
    scores = scores.masked_fill(mask(cfg, layer, x.shape[1], x.device), float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v
    return torch.einsum("bhne,hed->bnd", z, params[f"{prefix}.W_O"])


def geglu(params: Params, prefix: str, cfg: GemmaConfig, x: torch.Tensor) -> torch.Tensor:
    return (activation(cfg.gate_act, x @ params[f"{prefix}.W_gate"]) * (x @ params[f"{prefix}.W_in"])) @ params[
        f"{prefix}.W_out"
    ]


def block(params: Params, cfg: GemmaConfig, i: int, x: torch.Tensor) -> torch.Tensor:
    p = f"blocks.{i}"
    a = attention(params, cfg, i, normalize(params, f"{p}.ln1", cfg, x))
    x = x + normalize(params, f"{p}.ln1_post", cfg, a)
    f = geglu(params, f"{p}.mlp", cfg, normalize(params, f"{p}.ln2", cfg, x))
    return x + normalize(params, f"{p}.ln2_post", cfg, f)


def forward(params: Params, cfg: GemmaConfig, inputs: dict, trace: dict | None = None) -> torch.Tensor:
    tokens = inputs["tokens"]
    x = params["embed.W_E"][tokens] * math.sqrt(cfg.d_model)
    for i in range(cfg.n_layers):
        x = block(params, cfg, i, x)
    return softcap(unembed(params, cfg, normalize(params, "ln_final", cfg, x)), cfg.final_softcap)


def sample_inputs(cfg: GemmaConfig, g: torch.Generator, batch: int, n: int) -> dict:
    return {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}
