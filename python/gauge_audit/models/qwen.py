"""Qwen(2): LLaMA plus biases on the Q, K and V projections (none on O or the MLP).

With RoPE, the key bias is rotated with the key, so the softmax shift symmetry
b_K ↦ b_K + c of bias-carrying, position-free attention is *not* available here."""

from __future__ import annotations

from . import llama
from .config import Config, validate

param_shapes = llama.param_shapes
forward = llama.forward
sample_inputs = llama.sample_inputs


def config(**overrides) -> Config:
    base = llama.config().with_(family="qwen", attn_bias=True)
    return validate(base).with_(**overrides) if overrides else base
