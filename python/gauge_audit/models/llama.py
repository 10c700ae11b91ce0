"""LLaMA: pre-norm RMSNorm with weight, RoPE on q and k (no learned positions),
grouped-query attention (n_kv_heads: MHA / GQA / MQA), SwiGLU MLP, no biases,
untied unembedding.  The decoder stack is GPT-2's; only the config differs,
which is the point: the families differ in switches, not in the stack."""

from __future__ import annotations

from . import gpt2
from .config import Config, validate

param_shapes = gpt2.param_shapes
forward = gpt2.forward
sample_inputs = gpt2.sample_inputs


def config(**overrides) -> Config:
    base = Config(
        family="llama",
        norm="rmsnorm",
        norm_placement="pre",
        norm_eps=1e-6,
        act="swiglu",
        attn_bias=False,
        out_bias=False,
        mlp_bias=False,
        pos="rope",
        rope_style="half",
        causal=True,
        tied=False,
    )
    return validate(base).with_(**overrides) if overrides else validate(base)
