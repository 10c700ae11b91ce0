"""OLMo 2: LLaMA without pre-norms — each sublayer reads the raw stream and its output is
RMS-normalised before it is added (``norm_placement="output"``),

    x ↦ x + n₁(Attn(x)),   x ↦ x + n₂(FFN(x)),

and a QK-norm over the full width (``qk_norm="full"``): one RMSNorm over all query heads jointly
(weights of length n_heads·d_head) and one over all key heads, before RoPE.

Gauge consequences: the stream rotation is blocked (a norm's output γ⊙n(y) enters the stream, so a
rotation R would need diag(γ)·R = R·diag(γ')); per-head qk-gl is blocked by the QK-norm; what survives
on the query–key side is the rescaling of the norm weights per KV head and RoPE plane
(``qk-norm-scale``).  Value/output and FFN actions act inside the sublayers and survive."""

from __future__ import annotations

from . import llama
from .config import Config, validate

param_shapes = llama.param_shapes
forward = llama.forward
sample_inputs = llama.sample_inputs


def config(**overrides) -> Config:
    base = llama.config().with_(family="olmo2", norm_placement="output", qk_norm="full")
    return validate(base).with_(**overrides) if overrides else base
