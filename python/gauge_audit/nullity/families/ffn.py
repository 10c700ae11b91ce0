"""FFN families: the positive rescaling of ReLU / SwiGLU units (per expert in MoE blocks)
and the router-offset family of a mixture of experts.
"""

from __future__ import annotations

import torch

from ...models.config import Config
from ..measure import Genericity, Problem
from .base import Family, Rows, complement_of_ones, make_family


def ffn_units(cfg: Config) -> list[tuple[str, int | None]]:
    """(prefix, expert index or None) for every FFN / expert."""
    out: list[tuple[str, int | None]] = []
    for i in range(cfg.n_layers):
        if cfg.experts:
            out += [(f"blocks.{i}.moe", e) for e in range(cfg.experts)]
        else:
            out.append((f"blocks.{i}.mlp", None))
    return out


def select_expert(t: torch.Tensor, e: int | None) -> torch.Tensor:
    return t if e is None else t[e]


def unit_key(pre: str, e: int | None) -> str:
    return pre if e is None else f"{pre}[expert {e}]"


def ffn_scaling_family(problem: Problem, gen: Genericity) -> Family | None:
    cfg, p = problem.cfg, problem.params()
    if cfg.attention_only or cfg.act not in ("relu", "swiglu"):
        return None
    R = Rows(problem.layout)
    skipped = 0
    for pre, e in ffn_units(cfg):
        bad = set(gen.dead.get(unit_key(pre, e), [])) | set(gen.always_active.get(unit_key(pre, e), []))
        if gen.unrouted.get(pre) and e in gen.unrouted[pre]:
            bad = set(range(cfg.d_ff))
        for i in range(cfg.d_ff):
            if i in bad:
                skipped += 1
                continue
            v = R.new()
            select_expert(R.at(v, f"{pre}.W_in"), e)[:, i] = select_expert(p[f"{pre}.W_in"], e)[:, i]
            if f"{pre}.b_in" in p:
                select_expert(R.at(v, f"{pre}.b_in"), e)[i] = select_expert(p[f"{pre}.b_in"], e)[i]
            select_expert(R.at(v, f"{pre}.W_out"), e)[i] = -select_expert(p[f"{pre}.W_out"], e)[i]
    n_units = cfg.n_layers * max(cfg.experts, 1)
    formula = "L·E·d_ff" if cfg.experts else "L·d_ff"
    if cfg.act == "relu":
        doc = """ReLU is positively homogeneous: relu(s·z) = s·relu(z) for s > 0, so per hidden unit
              W_in[:, i]·s, b_in[i]·s, W_out[i]/s.  (GELU and SiLU are not homogeneous: no such family.)"""
    else:
        doc = """SwiGLU's hidden unit silu(x·w_gate)·(x·w_up) is linear in the up projection, so per unit
              W_in[:, i]·s (and b_in[i]), W_out[i]/s, with W_gate untouched."""
    fam = make_family(
        problem.layout,
        f"{cfg.act}-scaling",
        formula + (" − excluded units" if skipped else ""),
        n_units * cfg.d_ff - skipped,
        R,
        doc,
    )
    return fam


def router_family(problem: Problem) -> Family | None:
    cfg = problem.cfg
    if not cfg.experts:
        return None
    R = Rows(problem.layout)
    d, E = cfg.d_model, cfg.experts
    if cfg.top_k == 1:
        for i in range(cfg.n_layers):
            for r in range(d):
                for e in range(E):
                    R.at(R.new(), f"blocks.{i}.moe.W_router")[r, e] = 1.0
        return make_family(
            problem.layout,
            "router-top1",
            "L·d·E",
            cfg.n_layers * d * E,
            R,
            """With top_k = 1 the renormalised gate is identically 1: the router only selects,
                    and selection is locally constant, so every router weight is flat.""",
        )
    # LayerNorm-noaffine readers also get the all-ones direction per column (reader-ones); the
    # offset along 1 is then already there, so the offset is restricted to 1^⊥.
    basis = (
        complement_of_ones(d)
        if cfg.norm == "layernorm-noaffine" and cfg.pre_norm
        else torch.eye(d, dtype=torch.float64)
    )
    for i in range(cfg.n_layers):
        for c in basis:
            R.at(R.new(), f"blocks.{i}.moe.W_router")[:, :] = c[:, None].expand(d, E)
    noaff = cfg.norm == "layernorm-noaffine" and cfg.pre_norm
    return make_family(
        problem.layout,
        "router-offset",
        "L·(d−1)" if noaff else "L·d",
        cfg.n_layers * basis.shape[0],
        R,
        """Adding the same vector c to every expert's router column adds x·c to every router
                logit: softmax, top-k and the renormalised gates are unchanged.""",
    )
