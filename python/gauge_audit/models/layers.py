"""Building blocks shared by the reference families, written to read like the equations.

Conventions (TransformerLens-style, so every head is readable on its own):
row vectors, ``x @ W``; per-head weights carry a leading head axis.

    attn.W_Q (n_heads, d_model, d_head)   attn.b_Q (n_heads, d_head)
    attn.W_K (n_kv,    d_model, d_head)   attn.b_K (n_kv, d_head)
    attn.W_V (n_kv,    d_model, d_head)   attn.b_V (n_kv, d_head)
    attn.W_O (n_heads, d_head, d_model)   attn.b_O (d_model,)

Query head ``h`` reads KV head ``h // group_size`` (MHA: group_size 1; MQA: n_kv 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from .config import Config
from .rope import inverse_frequencies

# Read-only: a plain dict or parameters read lazily from a checkpoint.
Params = Mapping[str, torch.Tensor]


# ----------------------------------------------------------------------------- shapes
# Each parameter has a role that fixes how it is initialised (see params.init_params).
def norm_shapes(cfg: Config, prefix: str) -> dict:
    if cfg.norm in ("layernorm",):
        return {f"{prefix}.w": ((cfg.d_model,), "norm_w"), f"{prefix}.b": ((cfg.d_model,), "norm_b")}
    if cfg.norm == "rmsnorm":
        return {f"{prefix}.w": ((cfg.d_model,), "norm_w")}
    return {}


def attention_shapes(cfg: Config, prefix: str) -> dict:
    d, h, g, e = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_head
    out: dict[str, tuple[tuple[int, ...], str]] = {
        f"{prefix}.W_Q": ((h, d, e), "weight"),
        f"{prefix}.W_K": ((g, d, e), "weight"),
        f"{prefix}.W_V": ((g, d, e), "weight"),
        f"{prefix}.W_O": ((h, e, d), "weight"),
    }
    if cfg.attn_bias:
        out.update(
            {f"{prefix}.b_Q": ((h, e), "bias"), f"{prefix}.b_K": ((g, e), "bias"), f"{prefix}.b_V": ((g, e), "bias")}
        )
    if cfg.out_bias:
        out[f"{prefix}.b_O"] = ((d,), "bias")
    if cfg.qk_norm == "head":
        out.update({f"{prefix}.q_norm": ((e,), "norm_w"), f"{prefix}.k_norm": ((e,), "norm_w")})
    if cfg.qk_norm == "full":
        out.update({f"{prefix}.q_norm": ((h * e,), "norm_w"), f"{prefix}.k_norm": ((g * e,), "norm_w")})
    return out


def mlp_shapes(cfg: Config, prefix: str, lead: tuple = ()) -> dict:
    d, f = cfg.d_model, cfg.d_ff
    out = {f"{prefix}.W_in": ((*lead, d, f), "weight"), f"{prefix}.W_out": ((*lead, f, d), "weight")}
    if cfg.act == "swiglu":
        out[f"{prefix}.W_gate"] = ((*lead, d, f), "weight")
    if cfg.mlp_bias:
        out[f"{prefix}.b_in"] = ((*lead, f), "bias")
        out[f"{prefix}.b_out"] = ((*lead, d), "bias")
        if cfg.act == "swiglu":
            out[f"{prefix}.b_gate"] = ((*lead, f), "bias")
    return out


def ffn_shapes(cfg: Config, prefix: str) -> dict:
    """Dense MLP, or (experts > 0) a router plus E stacked expert MLPs."""
    if cfg.experts == 0:
        return mlp_shapes(cfg, f"{prefix}.mlp")
    return {
        f"{prefix}.moe.W_router": ((cfg.d_model, cfg.experts), "weight"),
        **mlp_shapes(cfg, f"{prefix}.moe", lead=(cfg.experts,)),
    }


def block_shapes(cfg: Config, i: int) -> dict:
    p = f"blocks.{i}"
    return {
        **norm_shapes(cfg, f"{p}.ln1"),
        **attention_shapes(cfg, f"{p}.attn"),
        **norm_shapes(cfg, f"{p}.ln2"),
        **ffn_shapes(cfg, p),
    }


# ----------------------------------------------------------------------------- layers
def normalize(params: Params, prefix: str, cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm γ⊙(x−μ)/σ + β, RMSNorm γ⊙x/rms(x), with or without the affine part."""
    if cfg.norm == "none":
        return x
    if cfg.norm.startswith("layernorm"):
        x = x - x.mean(-1, keepdim=True)
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.norm_eps)
    if f"{prefix}.w" in params:
        y = y * params[f"{prefix}.w"]
    if f"{prefix}.b" in params:
        y = y + params[f"{prefix}.b"]
    return y


def activation(name: str, x: torch.Tensor) -> torch.Tensor:
    if name == "relu":
        return torch.relu(x)
    if name == "gelu":
        return F.gelu(x)  # exact erf form, as in BERT and the MiniLM checkpoint
    if name == "gelu-tanh":
        return F.gelu(x, approximate="tanh")  # GPT-2's 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³)))
    if name == "silu":
        return F.silu(x)
    raise ValueError(name)


def rope_angles(cfg: Config, n: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """a·cos(p·θ_i), a·sin(p·θ_i) for positions p < n: θ_i and the factor a from the scaling type."""
    inv_freq, factor = inverse_frequencies(cfg, n)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (n, R/2)
    return (factor * ang.cos()).to(device, dtype), (factor * ang.sin()).to(device, dtype)


def rope_planes(cfg: Config) -> list[tuple[int, int]]:
    """The coordinate pairs (i, j) that RoPE rotates together, by frequency index."""
    half = (cfg.rotary_dim or cfg.d_head) // 2
    if cfg.rope_style == "half":
        return [(i, i + half) for i in range(half)]
    return [(2 * i, 2 * i + 1) for i in range(half)]


def rope(cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """Rotate each frequency plane (x1, x2) of position p by the angle p·θ_i (the first
    ``rotary_dim`` coordinates of each head; the rest pass unrotated).

    Because R(pθ)ᵀR(sθ) = R((s−p)θ), scores then depend only on relative position.
    """
    n = x.shape[-2]
    cos, sin = rope_angles(cfg, n, x.device, x.dtype)
    R = cfg.rotary_dim or cfg.d_head
    x, rest = x[..., :R], x[..., R:]
    if cfg.rope_style == "half":
        x1, x2 = x.chunk(2, dim=-1)
    else:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    y1, y2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    if cfg.rope_style == "half":
        y = torch.cat([y1, y2], dim=-1)
    else:
        y = torch.stack([y1, y2], dim=-1).flatten(-2)
    return torch.cat([y, rest], dim=-1)


def head_norm(params: Params, key: str, cfg: Config, y: torch.Tensor) -> torch.Tensor:
    """QK-norm (Qwen3): y/rms(y)·γ over each head's d_head coordinates, one γ for every head."""
    return y * torch.rsqrt((y * y).mean(-1, keepdim=True) + cfg.norm_eps) * params[key]


def full_norm(params: Params, key: str, cfg: Config, y: torch.Tensor) -> torch.Tensor:
    """QK-norm (OLMo 2): one RMSNorm over the concatenation of all heads, y/rms(y)·γ, γ of length heads·d_head."""
    b, h, n, e = y.shape
    flat = y.transpose(1, 2).reshape(b, n, h * e)  # (B, n, heads·d_head), head-major as in the projection
    flat = flat * torch.rsqrt((flat * flat).mean(-1, keepdim=True) + cfg.norm_eps) * params[key]
    return flat.reshape(b, n, h, e).transpose(1, 2)


def attention(params: Params, prefix: str, cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ/√d_head + mask) v per head, then Σ_h z_h W_O[h] + b_O."""

    def proj(name: str) -> torch.Tensor:  # (B, heads, n, d_head)
        y = torch.einsum("bnd,hde->bhne", x, params[f"{prefix}.W_{name}"])
        if f"{prefix}.b_{name}" in params:
            y = y + params[f"{prefix}.b_{name}"][None, :, None, :]
        return y

    q, k, v = proj("Q"), proj("K"), proj("V")
    if cfg.qk_norm != "none":
        qk_norm = head_norm if cfg.qk_norm == "head" else full_norm
        q, k = qk_norm(params, f"{prefix}.q_norm", cfg, q), qk_norm(params, f"{prefix}.k_norm", cfg, k)
    if cfg.pos == "rope":
        q, k = rope(cfg, q), rope(cfg, k)
    # Each KV head serves group_size consecutive query heads (GQA/MQA).
    k = k.repeat_interleave(cfg.group_size, dim=1)
    v = v.repeat_interleave(cfg.group_size, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(cfg.d_head)
    if cfg.causal:
        n = x.shape[1]
        future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
        if cfg.window:  # sliding window: key s is visible from query p only if p − s < window
            future = future | torch.ones(n, n, dtype=torch.bool, device=x.device).tril(-cfg.window)
        scores = scores.masked_fill(future, float("-inf"))
    z = torch.softmax(scores, dim=-1) @ v
    out = torch.einsum("bhne,hed->bnd", z, params[f"{prefix}.W_O"])
    if f"{prefix}.b_O" in params:
        out = out + params[f"{prefix}.b_O"]
    return out


def mlp(params: Params, prefix: str, cfg: Config, x: torch.Tensor, e: int | None = None) -> torch.Tensor:
    """act(x W_in + b_in) W_out + b_out, or SwiGLU: (silu(x W_gate) ⊙ x W_in) W_out.

    ``e`` selects one expert of a stacked MoE parameter set.
    """

    def get(name):
        t = params.get(f"{prefix}.{name}")
        return t if t is None or e is None else t[e]

    def linear(w, b):
        y = x @ get(w)
        return y if get(b) is None else y + get(b)

    if cfg.act == "swiglu":
        hidden = F.silu(linear("W_gate", "b_gate")) * linear("W_in", "b_in")
    else:
        hidden = activation(cfg.act, linear("W_in", "b_in"))
    y = hidden @ get("W_out")
    return y if get("b_out") is None else y + get("b_out")


def moe(params: Params, prefix: str, cfg: Config, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
    """Top-k softmax gating: p = softmax(x W_router); keep the k largest, renormalise (unless
    ``router_renorm`` is off), and mix those experts' outputs.  (Experts are evaluated densely: the reference
    models are tiny and this keeps the code equal to the equation.)"""
    W = params[f"{prefix}.W_router"]
    logits = x @ W
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = probs.topk(cfg.top_k, dim=-1)
    gates = top_p / top_p.sum(-1, keepdim=True) if cfg.router_renorm else top_p
    if trace is not None:
        trace.setdefault("routing", []).append(top_i.detach().cpu())
        trace.setdefault("router_logits", []).append(logits.detach().cpu())  # auxiliary router losses
        # How far each token's top-k choice is from a tie: the gap between the k-th and (k+1)-th
        # router logits, relative to the scale |x|·|W_router| that bounds their rounding errors.
        if cfg.top_k < cfg.experts:
            s = logits.topk(cfg.top_k + 1, dim=-1).values
            gap = (s[..., cfg.top_k - 1] - s[..., cfg.top_k]) / (x.abs() @ W.abs()).amax(-1).clamp_min(1e-300)
        else:
            gap = torch.full(top_i.shape[:-1], float("inf"))
        trace.setdefault("router_margin", []).append(gap.detach().to("cpu", torch.float64))
    out = torch.zeros_like(x)
    for e in range(cfg.experts):
        weight = (gates * (top_i == e)).sum(-1, keepdim=True)
        out = out + weight * mlp(params, prefix, cfg, x, e=e)
    return out


def ffn(params: Params, block: str, cfg: Config, x: torch.Tensor, trace: dict | None) -> torch.Tensor:
    if cfg.experts:
        return moe(params, f"{block}.moe", cfg, x, trace)
    return mlp(params, f"{block}.mlp", cfg, x)


def block(params: Params, cfg: Config, i: int, x: torch.Tensor, trace: dict | None = None) -> torch.Tensor:
    """One transformer block; the norm placement decides pre-LN, post-LN or normed sublayer outputs."""
    p = f"blocks.{i}"
    if cfg.norm_placement == "pre" and cfg.parallel_residual:  # both sublayers read the same stream
        return (
            x
            + attention(params, f"{p}.attn", cfg, normalize(params, f"{p}.ln1", cfg, x))
            + ffn(params, p, cfg, normalize(params, f"{p}.ln2", cfg, x), trace)
        )
    if cfg.norm_placement == "pre":
        x = x + attention(params, f"{p}.attn", cfg, normalize(params, f"{p}.ln1", cfg, x))
        return x + ffn(params, p, cfg, normalize(params, f"{p}.ln2", cfg, x), trace)
    if cfg.norm_placement == "output":  # the sublayers read the raw stream; their outputs are normed
        x = x + normalize(params, f"{p}.ln1", cfg, attention(params, f"{p}.attn", cfg, x))
        return x + normalize(params, f"{p}.ln2", cfg, ffn(params, p, cfg, x, trace))
    x = normalize(params, f"{p}.ln1", cfg, x + attention(params, f"{p}.attn", cfg, x))
    return normalize(params, f"{p}.ln2", cfg, x + ffn(params, p, cfg, x, trace))


def unembed(params: Params, cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """Logits: x W_U (+ b_U); tied models use W_U = W_Eᵀ."""
    W_U = params["embed.W_E"].T if cfg.tied else params["unembed.W_U"]
    y = x @ W_U
    return y + params["unembed.b_U"] if "unembed.b_U" in params else y
