"""The parallel residual (GPT-NeoX/Pythia): x ↦ x + Attn(n₁(x)) + FFN(n₂(x)).

Both sublayers write into the stream in the same step, so a constant c moved from the attention's
output bias to the FFN's is invisible: b_O ↦ b_O − c, b_out ↦ b_out + c.  Per parallel layer d
directions, d − 1 under a LayerNorm stream (along 1 each writer bias is already ln-writer-ones).
"""

from __future__ import annotations

import torch

from ..measure import Problem
from .base import LN, Family, Rows, complement_of_ones, make_family


def parallel_bias_family(problem: Problem) -> Family | None:
    cfg, p = problem.cfg, problem.params()
    if not (cfg.parallel_residual and cfg.pre_norm):
        return None
    d = cfg.d_model
    ws = complement_of_ones(d) if cfg.norm in LN else torch.eye(d, dtype=torch.float64)
    R, count = Rows(problem.layout), 0
    for i in range(cfg.n_layers):
        b_o, b_out = f"blocks.{i}.attn.b_O", f"blocks.{i}.mlp.b_out"
        if b_o not in p or b_out not in p:
            continue
        for w in ws:
            v = R.new()
            R.at(v, b_o)[...] = -w
            R.at(v, b_out)[...] = w
            count += 1
    if not count:
        return None
    return make_family(
        problem.layout,
        "parallel-bias-trade",
        "L·(d − 1)" if cfg.norm in LN else "L·d",
        count,
        R,
        """A parallel block adds Attn(n₁(x)) + FFN(n₂(x)) in one step: a constant moved from b_O
                to b_out (db_O = −c, db_out = c) leaves every stream value unchanged (c ⊥ 1 under a
                LayerNorm, whose ones direction each bias already has as ln-writer-ones).""",
    )
