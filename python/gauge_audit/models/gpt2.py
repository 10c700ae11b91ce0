"""GPT-2: pre-LN, affine LayerNorm, learned absolute positions, causal MHA with
biases, GELU MLP, final LayerNorm, unembedding tied (W_U = W_Eᵀ) or untied
(``unembed=False``: the bare decoder, whose output is the final norm's output)."""

from __future__ import annotations

import torch

from .config import Config, validate
from .layers import Params, block, block_shapes, norm_shapes, normalize, unembed


def config(**overrides) -> Config:
    base = Config(
        family="gpt2",
        norm="layernorm",
        norm_placement="pre",
        act="gelu",
        attn_bias=True,
        out_bias=True,
        mlp_bias=True,
        pos="learned",
        causal=True,
    )
    return validate(base).with_(**overrides) if overrides else validate(base)


def param_shapes(cfg: Config) -> dict:
    shapes: dict[str, tuple[tuple[int, ...], str]] = {"embed.W_E": ((cfg.vocab, cfg.d_model), "embed")}
    if cfg.pos == "learned":
        shapes["embed.W_pos"] = ((cfg.n_ctx, cfg.d_model), "pos")
    for i in range(cfg.n_layers):
        shapes.update(block_shapes(cfg, i))
    shapes.update(norm_shapes(cfg, "ln_final"))
    if cfg.unembed and not cfg.tied:
        shapes["unembed.W_U"] = ((cfg.d_model, cfg.vocab), "weight")
    if cfg.unembed_bias:
        shapes["unembed.b_U"] = ((cfg.vocab,), "bias")
    return shapes


def forward(params: Params, cfg: Config, inputs: dict, trace: dict | None = None) -> torch.Tensor:
    tokens = inputs["tokens"]
    x = params["embed.W_E"][tokens]
    if cfg.pos == "learned":
        x = x + params["embed.W_pos"][: tokens.shape[1]]
    for i in range(cfg.n_layers):
        x = block(params, cfg, i, x, trace)
    x = normalize(params, "ln_final", cfg, x)
    return unembed(params, cfg, x) if cfg.unembed else x


def sample_inputs(cfg: Config, g: torch.Generator, batch: int, n: int) -> dict:
    return {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}
