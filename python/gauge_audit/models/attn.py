"""A single attention layer on continuous inputs: X ↦ X + Attn(X), non-causal,
no norms.  The smallest object the attention gauge claims are about."""

from __future__ import annotations

import torch

from .config import Config, validate
from .layers import Params, attention, attention_shapes


def config(**overrides) -> Config:
    base = Config(
        family="attn",
        n_layers=1,
        norm="none",
        attn_bias=True,
        out_bias=True,
        mlp_bias=False,
        pos="none",
        causal=False,
        vocab=0,
        d_ff=0,
        unembed=False,
    )
    return validate(base).with_(**overrides) if overrides else validate(base)


def param_shapes(cfg: Config) -> dict:
    shapes = {}
    for i in range(cfg.n_layers):
        shapes.update(attention_shapes(cfg, f"blocks.{i}.attn"))
    return shapes


def forward(params: Params, cfg: Config, inputs: dict, trace: dict | None = None) -> torch.Tensor:
    x = inputs["x"]
    for i in range(cfg.n_layers):
        x = x + attention(params, f"blocks.{i}.attn", cfg, x)
    return x


def sample_inputs(cfg: Config, g: torch.Generator, batch: int, n: int) -> dict:
    return {"x": torch.randn(batch, n, cfg.d_model, generator=g, dtype=torch.float64)}
