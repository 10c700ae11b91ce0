"""BERT: post-LN encoder.  Embeddings (token + learned position + token type) go
through a LayerNorm; each block is x ↦ LN(x + Attn(x)), x ↦ LN(x + MLP(x)) with
biases everywhere, GELU, non-causal attention.  Output: the last hidden state."""

from __future__ import annotations

import torch

from .config import Config, validate
from .layers import Params, block, block_shapes, norm_shapes, normalize


def config(**overrides) -> Config:
    base = Config(
        family="bert",
        norm="layernorm",
        norm_placement="post",
        norm_eps=1e-12,
        act="gelu",
        attn_bias=True,
        out_bias=True,
        mlp_bias=True,
        pos="learned",
        causal=False,
        n_types=2,
        embed_norm=True,
        unembed=False,
    )
    return validate(base).with_(**overrides) if overrides else validate(base)


def param_shapes(cfg: Config) -> dict:
    shapes = {"embed.W_E": ((cfg.vocab, cfg.d_model), "embed"), "embed.W_pos": ((cfg.n_ctx, cfg.d_model), "pos")}
    if cfg.n_types:
        shapes["embed.W_tt"] = ((cfg.n_types, cfg.d_model), "pos")
    if cfg.embed_norm:
        shapes.update(norm_shapes(cfg, "embed.ln"))
    for i in range(cfg.n_layers):
        shapes.update(block_shapes(cfg, i))
    return shapes


def forward(params: Params, cfg: Config, inputs: dict, trace: dict | None = None) -> torch.Tensor:
    tokens = inputs["tokens"]
    x = params["embed.W_E"][tokens] + params["embed.W_pos"][: tokens.shape[1]]
    if cfg.n_types:
        x = x + params["embed.W_tt"][inputs["token_types"]]
    if cfg.embed_norm:
        x = normalize(params, "embed.ln", cfg, x)
    for i in range(cfg.n_layers):
        x = block(params, cfg, i, x, trace)
    return x


def sample_inputs(cfg: Config, g: torch.Generator, batch: int, n: int) -> dict:
    out = {"tokens": torch.randint(0, cfg.vocab, (batch, n), generator=g)}
    if cfg.n_types:
        out["token_types"] = torch.randint(0, cfg.n_types, (batch, n), generator=g)
    return out
