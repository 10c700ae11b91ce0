"""Data families: flat directions created by the sampled inputs, not by the architecture
(dead or always-active ReLU units, experts never routed or routed a degenerate input set).
They are reported, never hidden.
"""

from __future__ import annotations

import torch

from ..measure import Genericity, Problem
from .base import Family, Rows, make_family
from .ffn import ffn_units, select_expert, unit_key


def data_families(problem: Problem, gen: Genericity) -> list[Family]:
    """Flat directions created by the sample, not by the architecture."""
    cfg, p = problem.cfg, problem.params()
    out = []
    R, count = Rows(problem.layout), 0
    for pre, e in ffn_units(cfg):
        key = unit_key(pre, e)
        if gen.unrouted.get(pre) and e in gen.unrouted[pre]:
            continue
        for i in gen.dead.get(key, []):
            for name in (f"{pre}.W_in", f"{pre}.W_out"):
                for r in range(cfg.d_model):
                    v = R.new()
                    sl = select_expert(R.at(v, name), e)
                    if name.endswith("W_in"):
                        sl[r, i] = 1.0
                    else:
                        sl[i, r] = 1.0
                    count += 1
            if f"{pre}.b_in" in p:
                select_expert(R.at(R.new(), f"{pre}.b_in"), e)[i] = 1.0
                count += 1
    if count:
        out.append(
            make_family(
                problem.layout,
                "dead-relu-units",
                "(2d + [b_in]) per dead unit",
                count,
                R,
                """A ReLU unit that is never positive on the sample contributes nothing and stays
                        dead under small changes of its input weights and bias: all of its weights are
                        flat for this data (not a symmetry of the architecture).""",
                kind="data",
            )
        )
    R, count = Rows(problem.layout), 0
    for pre, e in ffn_units(cfg):
        act = gen.always_active.get(unit_key(pre, e), [])
        if not act:
            continue
        s = torch.tensor(act)
        for a_i in range(len(act)):
            for a_j in range(len(act)):
                v = R.new()
                w_in, w_out = select_expert(p[f"{pre}.W_in"], e), select_expert(p[f"{pre}.W_out"], e)
                select_expert(R.at(v, f"{pre}.W_in"), e)[:, s[a_j]] = w_in[:, s[a_i]]
                if f"{pre}.b_in" in p:
                    select_expert(R.at(v, f"{pre}.b_in"), e)[s[a_j]] = select_expert(p[f"{pre}.b_in"], e)[s[a_i]]
                select_expert(R.at(v, f"{pre}.W_out"), e)[s[a_i]] -= w_out[s[a_j]]
                count += 1
        if f"{pre}.b_in" in p and f"{pre}.b_out" in p:
            for i in act:  # a linear unit's bias reaches the output as the constant b_in[i]·W_out[i]
                v = R.new()
                select_expert(R.at(v, f"{pre}.b_in"), e)[i] = 1.0
                select_expert(R.at(v, f"{pre}.b_out"), e)[...] = -select_expert(p[f"{pre}.W_out"], e)[i]
                count += 1
    if count:
        out.append(
            make_family(
                problem.layout,
                "always-active-relu-units",
                "|S|² (+|S| with b_in, b_out) per FFN (S: always-active units)",
                count,
                R,
                """ReLU units that are positive on the whole sample act linearly there, so any
                        GL(|S|) mixing of them (W_in·A, A⁻¹·W_out) is flat for this data, and their
                        biases reach the output as constants that b_out can carry.""",
                kind="data",
            )
        )
    R, count = Rows(problem.layout), 0
    for pre, experts in gen.unrouted.items():
        for e in experts:
            for name in (
                f"{pre}.W_in",
                f"{pre}.W_gate",
                f"{pre}.W_out",
                f"{pre}.b_in",
                f"{pre}.b_gate",
                f"{pre}.b_out",
            ):
                if name in p:
                    for flat in range(p[name][e].numel()):
                        v = R.new()
                        R.at(v, name)[e].view(-1)[flat] = 1.0
                        count += 1
            if cfg.top_k > 1:
                for r in range(cfg.d_model):
                    R.at(R.new(), f"{pre}.W_router")[r, e] = 1.0
                    count += 1
    if count:
        out.append(
            make_family(
                problem.layout,
                "unrouted-experts",
                "all parameters of experts never in a top-k",
                count,
                R,
                """An expert that the sample never routes to has no effect on it.""",
                kind="data",
            )
        )
    R, count = Rows(problem.layout), 0
    for pre, per in gen.unreached.items():
        for e, dirs in per.items():
            for a in dirs:
                for name in (f"{pre}.W_in", f"{pre}.W_gate"):
                    if name in p:
                        for col in range(p[name].shape[-1]):
                            v = R.new()
                            R.at(v, name)[e][:, col] = a
                            count += 1
    if count:
        out.append(
            make_family(
                problem.layout,
                "expert-unreached-readers",
                "(d − rank of its routed inputs)·(reader width)",
                count,
                R,
                """An expert whose routed inputs all lie in a proper subspace cannot see
                        its readers' (W_in, W_gate) components orthogonal to it.""",
                kind="data",
            )
        )
    return out
