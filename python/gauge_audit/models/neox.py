"""GPT-NeoX / Pythia: GPT-2's LayerNorm blocks with biases and a GELU MLP, but RoPE instead of
learned positions — on the first ``rotary_dim`` coordinates of each head only (rotary_pct, 0.25 by
default; half-split pairing within them) — and a parallel residual,

    x ↦ x + Attn(n₁(x)) + FFN(n₂(x)),

both sublayers reading the same stream.  Untied unembedding.

Gauge consequences: the parallel residual keeps the pre-norm stream actions (each sublayer still
reads the stream through its own norm and writes into it); the partial rotary gives the RoPE
commutant a GL block on the unrotated coordinates (qk-gl samples it)."""

from __future__ import annotations

from . import gpt2
from .config import Config, validate

param_shapes = gpt2.param_shapes
forward = gpt2.forward
sample_inputs = gpt2.sample_inputs


def config(**overrides) -> Config:
    base = gpt2.config().with_(
        family="neox",
        pos="rope",
        rope_style="half",
        d_head=8,
        d_model=32,
        rotary_dim=2,
        parallel_residual=True,
        act="gelu",
    )
    return validate(base).with_(**overrides) if overrides else base
