"""Qwen3: LLaMA with a QK-norm — every query and key head is RMS-normalised over its d_head
coordinates before RoPE, with one weight vector per layer shared by all query heads (q_norm)
and one shared by all key heads (k_norm):

    q_h = RoPE(γ_q ⊙ (x W_Q[h]) / rms(x W_Q[h])),   k_j = RoPE(γ_k ⊙ (x W_K[j]) / rms(x W_K[j])).

No biases (Qwen2's Q/K/V biases are gone).  Qwen3-MoE: the same blocks with a top-k softmax
mixture of SwiGLU experts (``experts > 0``; gates renormalised only with ``norm_topk_prob``).

The norm changes the gauge group: a per-head GL(d_k) element M on the query side changes
rms(x W_Q M), so only M that commute with the norm *and* with RoPE survive — per rotary plane a
common rescaling of (γ_q[i], γ_q[j]) against (γ_k[i], γ_k[j]) (the action ``qk-norm-scale``), and
discrete signs.  Value/output, FFN and stream actions are untouched."""

from __future__ import annotations

from . import llama
from .config import Config, validate

param_shapes = llama.param_shapes
forward = llama.forward
sample_inputs = llama.sample_inputs


def config(**overrides) -> Config:
    base = llama.config().with_(family="qwen3", qk_norm="head")
    return validate(base).with_(**overrides) if overrides else base
