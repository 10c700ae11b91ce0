"""DeepSeek-V3 (and V2): multi-head latent attention (MLA) and a mixture of experts with shared
experts, in a pre-norm RMSNorm decoder.

Attention of one layer (n(y) = y/√(mean y² + ε), per head h; x the normed stream):

    c_Q  = n(x W_DQ + b_DQ)⊙γ_Q                q_h = c_Q W_UQ[h] = [q_h^nope | q_h^rope]
         (q_lora_rank = 0: q_h = x W_Q[h], no latent)
    c_KV = n(x W_DKV + b_DKV)⊙γ_KV             k_h^nope = c_KV W_UK[h],   v_h = c_KV W_UV[h]
    k^rope = x W_KR + b_KR                       one RoPE key, shared by every head
    s_h  = (q_h^nope·k_h^nopeᵀ + RoPE(q_h^rope)·RoPE(k^rope)ᵀ) · σ,  σ = (d_nope + d_rope)^-1/2 · m²
    out  = Σ_h softmax(s_h + causal mask) v_h W_O[h] + b_O

(``kv_a_proj_with_mqa`` stores [W_DKV | W_KR], ``kv_b_proj`` per head [W_UK | W_UV]; m is yarn's
mscale(factor, mscale_all_dim), 1 without it; the latent norms' ε is transformers' fixed 1e-6.)
RoPE acts on the d_rope coordinates only, which is why ``d_head`` holds d_rope here — as
transformers' config does (head_dim = qk_rope_head_dim); interleaved pairs (2i, 2i+1) with
``rope_interleave`` (its de-interleaved output order permutes q and k alike: same scores).

Mixture of experts (layers ≥ first_dense; the first ones are dense SwiGLU FFNs of width d_ff):

    s = sigmoid(x W_router)                      per-expert scores in (0, 1)
    choice = s + b                               b: e_score_correction_bias, selection only
    groups: rank the n_group expert groups by the sum of their two best choices, keep topk_group
    top-k experts by choice inside the kept groups; gates g_e = s_e (/ Σ_top s, norm_topk_prob)·ρ
    FFN(x) = Σ_top g_e·Expert_e(x) + Shared(x)   ρ = routed_scaling_factor; Shared: one SwiGLU of
                                                 width moe_d_ff·n_shared (0: none)

DeepSeek-V2 (``router="softmax"``): s = softmax(x W_router), no bias, groups ranked by their best
score, gates g_e = s_e·ρ never renormalised (transformers' V2 router ignores norm_topk_prob).

Everything else is LLaMA's: pre-RMSNorms with weights, SwiGLU, an untied unembedding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, cast

import torch

from ..errors import GaugeAuditError
from . import layers
from .config import Config, validate
from .layers import Params, mlp_shapes, normalize, rope, unembed


@dataclass(frozen=True)
class DeepseekConfig(Config):
    latent_attention: ClassVar[bool] = True
    q_lora_rank: int = 0  # r_Q: rank of the query latent (0: a plain per-head W_Q)
    kv_lora_rank: int = 8  # r_KV: rank of the key/value latent
    nope_dim: int = 4  # d_nope = qk_nope_head_dim: the unrotated query/key coordinates per head
    v_dim: int = 4  # v_head_dim
    latent_eps: float = 1e-6  # ε of the two latent norms (transformers: the RMSNorm default, not rms_norm_eps)
    moe_d_ff: int = 8  # width of each routed expert (moe_intermediate_size)
    n_shared: int = 1  # shared experts: one SwiGLU of width moe_d_ff·n_shared beside the routed ones
    first_dense: int = 1  # first_k_dense_replace: layers below it have a dense FFN of width d_ff
    n_group: int = 1  # expert groups (n_group)
    topk_group: int = 1  # groups kept per token
    routed_scale: float = 1.0  # routed_scaling_factor ρ
    router: str = "sigmoid"  # sigmoid (V3: bias-corrected choice, groups by top-2 sum) | softmax (V2)

    @property
    def expert_groups(self) -> int:
        return self.n_group

    def moe_layer(self, i: int) -> bool:
        return self.experts > 0 and i >= self.first_dense

    def softmax_scale(self) -> float:
        """(d_nope + d_rope)^-1/2, times yarn's mscale(factor, mscale_all_dim)² when the table sets it."""
        scale = (self.nope_dim + self.d_head) ** -0.5
        opts = dict(self.rope_params)
        factor, m_all = opts.get("factor", 1.0), opts.get("mscale_all_dim", 0.0)
        if self.rope_type == "yarn" and m_all and factor > 1:
            m = 0.1 * m_all * math.log(factor) + 1.0
            scale *= m * m
        return scale

    def path_terms(self) -> list[tuple[str, int]]:
        """Inner products a forward adds beyond the generic path (numeric.path_length)."""
        return [
            ("d_nope", self.nope_dim),
            ("r_Q", self.q_lora_rank),
            ("r_KV (and its norm)", 2 * self.kv_lora_rank),
            ("r_Q (its norm)", self.q_lora_rank),
            ("moe_d_ff·(1 + n_shared)", self.moe_d_ff * (1 + self.n_shared) if self.experts else 0),
        ]

    def with_(self, **changes) -> DeepseekConfig:
        return check(cast(DeepseekConfig, super().with_(**changes)))


def as_latent(cfg: Config) -> DeepseekConfig:
    """``cfg`` as the latent-attention config it is (a room's MLA code asks only after
    ``cfg.latent_attention``)."""
    if not isinstance(cfg, DeepseekConfig):
        raise TypeError(f"{cfg.family} has no latent attention")
    return cfg


def check(cfg: DeepseekConfig) -> DeepseekConfig:
    def need(cond: bool, msg: str):
        if not cond:
            raise GaugeAuditError(f"invalid deepseek config: {msg}")

    validate(cfg)
    need(cfg.norm == "rmsnorm" and cfg.norm_placement == "pre", "DeepSeek has weighted pre-RMSNorms")
    need(cfg.act == "swiglu" and cfg.pos == "rope", "DeepSeek has SwiGLU FFNs and RoPE")
    need(cfg.n_kv_heads == cfg.n_heads, "MLA gives every head its own key and value (n_kv_heads = n_heads)")
    need(not (cfg.mlp_bias or cfg.unembed_bias) and cfg.attn_bias == cfg.out_bias, "biases: attention only")
    need(cfg.rotary_dim == 0 and cfg.window == 0 and cfg.qk_norm == "none", "no partial rotary/window/QK-norm")
    for name in ("q_lora_rank", "nope_dim", "n_shared", "first_dense"):
        need(isinstance(getattr(cfg, name), int) and getattr(cfg, name) >= 0, f"{name} must be an integer >= 0")
    for name in ("kv_lora_rank", "v_dim", "moe_d_ff", "n_group", "topk_group"):
        need(isinstance(getattr(cfg, name), int) and getattr(cfg, name) >= 1, f"{name} must be a positive integer")
    need(cfg.latent_eps >= 0 and math.isfinite(cfg.latent_eps), "latent_eps must be a finite number >= 0")
    need(cfg.routed_scale > 0 and math.isfinite(cfg.routed_scale), "routed_scale must be a finite number > 0")
    need(cfg.router in ("sigmoid", "softmax"), "router must be sigmoid (V3) or softmax (V2)")
    need(cfg.router == "sigmoid" or not cfg.router_renorm, "the softmax (V2) router does not renormalise its gates")
    if cfg.experts:
        need(cfg.experts % cfg.n_group == 0, f"n_group ({cfg.n_group}) must divide the experts ({cfg.experts})")
        need(
            cfg.router == "softmax" or cfg.experts // cfg.n_group >= 2,
            "each expert group needs >= 2 experts (V3 ranks groups by their top-2 sum)",
        )
        need(cfg.topk_group <= cfg.n_group, "topk_group must be <= n_group")
        need(cfg.top_k <= cfg.topk_group * cfg.experts // cfg.n_group, "top_k exceeds the experts of the kept groups")
    return cfg


def config(**overrides) -> DeepseekConfig:
    """DeepSeek-V3's structure at a tiny size: query latent, MoE after one dense layer, interleaved RoPE."""
    base = DeepseekConfig(
        family="deepseek",
        n_heads=4,
        n_kv_heads=4,
        d_head=2,
        norm="rmsnorm",
        norm_eps=1e-6,
        act="swiglu",
        attn_bias=False,
        out_bias=False,
        mlp_bias=False,
        pos="rope",
        rope_style="interleaved",
        tied=False,
        q_lora_rank=6,
        kv_lora_rank=5,
        nope_dim=3,
        v_dim=3,
        experts=4,
        top_k=2,
        n_group=2,
        topk_group=1,
        routed_scale=2.5,
    )
    if "n_heads" in overrides:
        overrides.setdefault("n_kv_heads", overrides["n_heads"])
    return base.with_(**overrides) if overrides else check(base)


# ----------------------------------------------------------------------------- shapes
def attention_shapes(cfg: DeepseekConfig, p: str) -> dict:
    d, h, e, nope, v = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.nope_dim, cfg.v_dim
    rq, rkv = cfg.q_lora_rank, cfg.kv_lora_rank
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if rq:
        out.update({f"{p}.W_DQ": ((d, rq), "weight"), f"{p}.q_norm": ((rq,), "norm_w")})
        out[f"{p}.W_UQ"] = ((h, rq, nope + e), "weight")
    else:
        out[f"{p}.W_Q"] = ((h, d, nope + e), "weight")
    out.update(
        {
            f"{p}.W_DKV": ((d, rkv), "weight"),
            f"{p}.W_KR": ((d, e), "weight"),
            f"{p}.kv_norm": ((rkv,), "norm_w"),
            f"{p}.W_UK": ((h, rkv, nope), "weight"),
            f"{p}.W_UV": ((h, rkv, v), "weight"),
            f"{p}.W_O": ((h, v, d), "weight"),
        }
    )
    if cfg.attn_bias:  # q_a_proj (with a query latent), kv_a_proj_with_mqa and o_proj carry biases
        out.update({f"{p}.b_DKV": ((rkv,), "bias"), f"{p}.b_KR": ((e,), "bias"), f"{p}.b_O": ((d,), "bias")})
        if rq:
            out[f"{p}.b_DQ"] = ((rq,), "bias")
    return out


def ffn_shapes(cfg: DeepseekConfig, i: int) -> dict:
    b = f"blocks.{i}"
    if not cfg.moe_layer(i):
        return mlp_shapes(cfg, f"{b}.mlp")
    out: dict[str, tuple[tuple[int, ...], str]] = {f"{b}.moe.W_router": ((cfg.d_model, cfg.experts), "weight")}
    if cfg.router == "sigmoid":  # the score-correction bias
        out[f"{b}.moe.b_router"] = ((cfg.experts,), "bias")
    out.update(mlp_shapes(cfg.with_(d_ff=cfg.moe_d_ff), f"{b}.moe", lead=(cfg.experts,)))
    if cfg.n_shared:
        out.update(mlp_shapes(cfg.with_(d_ff=cfg.moe_d_ff * cfg.n_shared), f"{b}.shared"))
    return out


def param_shapes(cfg: DeepseekConfig) -> dict:
    d = cfg.d_model
    shapes: dict[str, tuple[tuple[int, ...], str]] = {"embed.W_E": ((cfg.vocab, d), "embed")}
    for i in range(cfg.n_layers):
        shapes[f"blocks.{i}.ln1.w"] = ((d,), "norm_w")
        shapes.update(attention_shapes(cfg, f"blocks.{i}.attn"))
        shapes[f"blocks.{i}.ln2.w"] = ((d,), "norm_w")
        shapes.update(ffn_shapes(cfg, i))
    shapes["ln_final.w"] = ((d,), "norm_w")
    if not cfg.tied:
        shapes["unembed.W_U"] = ((d, cfg.vocab), "weight")
    return shapes


# ----------------------------------------------------------------------------- layers
def latent(params: Params, p: str, name: str, cfg: DeepseekConfig, x: torch.Tensor) -> torch.Tensor:
    """c = n(x W_D + b_D)⊙γ: a down-projection, RMS-normalised over the latent's r coordinates."""
    y = x @ params[f"{p}.W_D{name}"]
    if f"{p}.b_D{name}" in params:
        y = y + params[f"{p}.b_D{name}"]
    norm = "q_norm" if name == "Q" else "kv_norm"
    return y * torch.rsqrt((y * y).mean(-1, keepdim=True) + cfg.latent_eps) * params[f"{p}.{norm}"]


def attention(params: Params, cfg: DeepseekConfig, i: int, x: torch.Tensor) -> torch.Tensor:
    p = f"blocks.{i}.attn"
    if cfg.q_lora_rank:
        q = torch.einsum("bnr,hre->bhne", latent(params, p, "Q", cfg, x), params[f"{p}.W_UQ"])
    else:
        q = torch.einsum("bnd,hde->bhne", x, params[f"{p}.W_Q"])
    q_nope, q_rope = q[..., : cfg.nope_dim], q[..., cfg.nope_dim :]
    c_kv = latent(params, p, "KV", cfg, x)
    k_nope = torch.einsum("bnr,hre->bhne", c_kv, params[f"{p}.W_UK"])
    v = torch.einsum("bnr,hre->bhne", c_kv, params[f"{p}.W_UV"])
    k_rope = x @ params[f"{p}.W_KR"]
    if f"{p}.b_KR" in params:
        k_rope = k_rope + params[f"{p}.b_KR"]
    q_rope, k_rope = rope(cfg, q_rope), rope(cfg, k_rope[:, None])  # (B, 1, n, d_rope): one key for all heads
    scores = (q_nope @ k_nope.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)) * cfg.softmax_scale()
    n = x.shape[1]
    future = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
    z = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
    out = torch.einsum("bhne,hed->bnd", z, params[f"{p}.W_O"])
    return out + params[f"{p}.b_O"] if f"{p}.b_O" in params else out


def route(params: Params, p: str, cfg: DeepseekConfig, x: torch.Tensor, trace: dict | None):
    """(gates, chosen experts): V3's sigmoid scores with a bias-corrected group-limited top-k, or V2's
    softmax scores with a group-limited top-k (see the module doc)."""
    W = params[f"{p}.W_router"]
    sigmoid = cfg.router == "sigmoid"
    s = torch.sigmoid(x @ W) if sigmoid else torch.softmax(x @ W, dim=-1)
    choice = s + params[f"{p}.b_router"] if sigmoid else s
    G, per = cfg.n_group, cfg.experts // cfg.n_group
    grouped = choice.reshape(*choice.shape[:-1], G, per)
    group_score = grouped.topk(2, dim=-1).values.sum(-1) if sigmoid else grouped.amax(-1)  # (…, G)
    kept = torch.zeros_like(group_score, dtype=torch.bool).scatter(
        -1, group_score.topk(cfg.topk_group, -1).indices, True
    )
    # V3 hides the other groups' experts at −∞, V2 at 0 (below every softmax score: the same choice)
    masked = grouped.masked_fill(~kept[..., None], float("-inf") if sigmoid else 0.0).reshape(choice.shape)
    top_i = masked.topk(cfg.top_k, dim=-1).indices
    gates = s.gather(-1, top_i)
    if cfg.router_renorm:
        gates = gates / (gates.sum(-1, keepdim=True) + 1e-20)
    if trace is not None:
        trace.setdefault("routing", []).append(top_i.detach().cpu())
        trace.setdefault("routing_layers", []).append(int(p.split(".")[1]))
        # the gap between the k-th and (k+1)-th choice, relative to the scale that bounds their
        # rounding errors (σ' ≤ 1/4 times |x|·|W_router|, plus the bias)
        if cfg.top_k < cfg.experts:
            v = masked.topk(cfg.top_k + 1, dim=-1).values
            bias = params[f"{p}.b_router"].abs().max() if sigmoid else 0.0
            scale = (x.abs() @ W.abs()).amax(-1) / 4 + bias + 1.0
            gap = (v[..., cfg.top_k - 1] - v[..., cfg.top_k]) / scale
        else:
            gap = torch.full(top_i.shape[:-1], float("inf"))
        trace.setdefault("router_margin", []).append(gap.detach().to("cpu", torch.float64))
    return gates * cfg.routed_scale, top_i


def ffn(params: Params, cfg: DeepseekConfig, i: int, x: torch.Tensor, trace: dict | None) -> torch.Tensor:
    b = f"blocks.{i}"
    if not cfg.moe_layer(i):
        return layers.mlp(params, f"{b}.mlp", cfg, x)
    gates, top_i = route(params, f"{b}.moe", cfg, x, trace)
    out = layers.mlp(params, f"{b}.shared", cfg, x) if cfg.n_shared else torch.zeros_like(x)
    # experts evaluated densely (the reference models are tiny); through the module attribute, so
    # that the nullity's genericity record sees each expert's inputs as for the other MoE families
    for e in range(cfg.experts):
        weight = (gates * (top_i == e)).sum(-1, keepdim=True)
        out = out + weight * layers.mlp(params, f"{b}.moe", cfg, x, e=e)
    return out


def forward(params: Params, cfg: DeepseekConfig, inputs: dict, trace: dict | None = None) -> torch.Tensor:
    x = params["embed.W_E"][inputs["tokens"]]
    for i in range(cfg.n_layers):
        x = x + attention(params, cfg, i, normalize(params, f"blocks.{i}.ln1", cfg, x))
        x = x + ffn(params, cfg, i, normalize(params, f"blocks.{i}.ln2", cfg, x), trace)
    return unembed(params, cfg, normalize(params, "ln_final", cfg, x))


def sample_inputs(cfg: DeepseekConfig, g: torch.Generator, batch: int, n: int) -> dict:
    return {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}


# ----------------------------------------------------------------------------- the stream
def norm_readers(cfg: DeepseekConfig) -> dict[str, list[tuple[str, str | None]]]:
    """pre-norm → [(reader, its bias)]: who may read each norm's output (the stream actions use it,
    keeping those present)."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for i in range(cfg.n_layers):
        b, a = f"blocks.{i}", f"blocks.{i}.attn"
        q = [(f"{a}.W_DQ", f"{a}.b_DQ")] if cfg.q_lora_rank else [(f"{a}.W_Q", None)]
        out[f"{b}.ln1"] = [*q, (f"{a}.W_DKV", f"{a}.b_DKV"), (f"{a}.W_KR", f"{a}.b_KR")]
        # both FFN kinds are listed: a one-block view (cfg with n_layers 1) cannot tell which this
        # block is, and the callers keep the readers the parameters hold
        out[f"{b}.ln2"] = [(f"{b}.{m}.{w}", None) for m in ("mlp", "moe", "shared") for w in ("W_gate", "W_in")]
        out[f"{b}.ln2"].insert(2, (f"{b}.moe.W_router", None))
    if not cfg.tied:
        out["ln_final"] = [("unembed.W_U", None)]
    return out


def stream_writers(cfg: DeepseekConfig) -> list[str]:
    names = ["embed.W_E"]
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        names += [f"{b}.attn.W_O", f"{b}.attn.b_O"]
        names += [f"{b}.mlp.W_out", f"{b}.moe.W_out", f"{b}.shared.W_out"]  # those present (see norm_readers)
    return names


def ffn_units(cfg: DeepseekConfig) -> list[tuple[str, int | None, int]]:
    """(prefix, expert or None, hidden width) of every SwiGLU: dense FFNs, routed and shared experts."""
    out: list[tuple[str, int | None, int]] = []
    for i in range(cfg.n_layers):
        b = f"blocks.{i}"
        if not cfg.moe_layer(i):
            out.append((f"{b}.mlp", None, cfg.d_ff))
            continue
        out += [(f"{b}.moe", e, cfg.moe_d_ff) for e in range(cfg.experts)]
        if cfg.n_shared:
            out.append((f"{b}.shared", None, cfg.moe_d_ff * cfg.n_shared))
    return out
