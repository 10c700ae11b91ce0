"""Phi-3: LLaMA with fused projections in its files (``qkv_proj`` = [Q | K | V], ``gate_up_proj`` =
[gate | up]) and, if configured, a partial rotary — RoPE on the first ``rotary_dim`` coordinates of
each head (half-split pairing within them), the rest unrotated.  The function is LLaMA's; the
fusion is only a storage layout (see checkpoint/hf_fused.py).

Partial rotary changes the gauge group: the RoPE commutant becomes the per-plane a·I + b·J on the
rotated coordinates ⊕ the whole GL(d_head − R) on the unrotated ones (qk-gl samples it)."""

from __future__ import annotations

from . import llama
from .config import Config, validate

param_shapes = llama.param_shapes
forward = llama.forward
sample_inputs = llama.sample_inputs


def config(**overrides) -> Config:
    base = llama.config().with_(family="phi3")
    return validate(base).with_(**overrides) if overrides else base
