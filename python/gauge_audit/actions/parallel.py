"""The parallel residual's bias trade (GPT-NeoX/Pythia): x ↦ x + Attn(n₁(x)) + FFN(n₂(x)).

Both sublayers of a parallel block write into the stream in the same step, and nothing reads
either output before the two are added, so a constant may move from the attention's output bias to
the FFN's (nullity family parallel-bias-trade).
"""

from __future__ import annotations

import torch

from ..models.config import Config
from .base import Action, Element, Params, as64, put, require_shape, updated


def _biases(i: int) -> tuple[str, str]:
    return f"blocks.{i}.attn.b_O", f"blocks.{i}.mlp.b_out"


def _trade_applies(cfg: Config) -> str | None:
    if not cfg.parallel_residual:
        return "sequential residual: the FFN reads the attention's output, so its bias cannot take b_O's constant"
    if not (cfg.out_bias and cfg.mlp_bias) or cfg.experts:
        return "the parallel blocks lack an attention output bias or a dense FFN output bias"
    return None


def _trade_sample(cfg: Config, params: Params, g: torch.Generator, kappa: float) -> Element:
    return Element({"c": 0.1 * torch.randn(cfg.n_layers, cfg.d_model, generator=g, dtype=torch.float64)}, 1.0)


def parallel_bias_trade(cfg: Config, params: Params, el: Element) -> Params:
    """Group: (ℝ^{d_model}, +) per parallel block.

    Acts: b_O ↦ b_O − c, b_out ↦ b_out + c in block i (c = c[i]).

    Why: the block adds Attn(n₁(x)) + FFN(n₂(x)) to the stream at once; b_O and b_out enter only
    that sum, where (b_O − c) + (b_out + c) = b_O + b_out.  (Along 1 under a LayerNorm stream the
    trade coincides with writer-ones on the two biases; the nullity family counts c ⊥ 1 only.)
    """
    c = el.parts["c"]
    require_shape("c", c, (cfg.n_layers, cfg.d_model))
    changes = {}
    for i in range(cfg.n_layers):
        b_o, b_out = _biases(i)
        changes[b_o] = put(as64(params[b_o]) - as64(c[i]), params[b_o])
        changes[b_out] = put(as64(params[b_out]) + as64(c[i]), params[b_out])
    return updated(params, changes)


ACTIONS = [
    Action(
        "parallel-bias-trade",
        "(ℝ^d,+) per parallel block",
        True,
        _trade_applies,
        _trade_sample,
        parallel_bias_trade,
        generic_kappa=False,
    ),
]
