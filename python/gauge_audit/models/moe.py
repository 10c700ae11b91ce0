"""Mixture-of-experts decoder (Mixtral-style): LLaMA blocks whose FFN is a
top-k softmax-gated mixture of E SwiGLU experts; the router reads the normed stream."""

from __future__ import annotations

from . import llama
from .config import Config, validate

param_shapes = llama.param_shapes
forward = llama.forward
sample_inputs = llama.sample_inputs


def config(**overrides) -> Config:
    base = llama.config().with_(family="moe", experts=4, top_k=2)
    return validate(base).with_(**overrides) if overrides else base
