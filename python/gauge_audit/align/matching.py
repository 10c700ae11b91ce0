"""The discrete part of alignment: which head, KV group, FFN unit (expert) of B plays the role of
which in A — elements of head-perm (S_{n_kv} ≀ S_g per layer), ffn-perm and expert-perm, found by
linear assignment (:mod:`.assignment`) on a cost between B's items and A's.

Costs, by what the rest of the group can still do to an item:

* ``weights`` — nothing (the permutation group alone, Git Re-Basin's weight matching): the squared
  distance of the item's own tensors (a head: its W_Q, b_Q, W_O rows, its QK-norm chunk; a KV
  group: W_K, b_K, W_V, b_V; a unit: its W_in / W_gate columns, biases, W_out row);
* ``products`` — heads whose query/key and value/output factors can still move by qk-gl and vo-gl
  (or their orthogonal subgroups): the distance of the invariant maps X_h·Yᵀ (scores) and
  V·W_O[h] (outputs), each relative to A's total in that layer, computed from e × e Gram products
  (never the (d+1)² maps themselves);
* ``rank-one`` — units that can still be rescaled (relu-/swiglu-scaling): ‖a⊗b − a'⊗b'‖² of the
  scaled input column a and output row b (invariant under a ↦ s·a, b ↦ b/s), plus the gate's
  squared distance (SwiGLU's gate is not scaled).

With activations (``acts``), the cost is instead 1 − correlation of the items' activations on the
data (:mod:`.activations`), Git Re-Basin's activation matching.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..actions import Element
from ..gauge_fix.heads import qk_pair, vo_pair
from ..models.config import Config
from .assignment import assign

Params = dict


@dataclass
class MatchLog:
    """What the matchings of one stage found: items matched and how many assignment problems
    ran out of their time budget (completed greedily)."""

    problems: int = 0
    greedy: int = 0
    moved: int = 0  # items whose match is not themselves
    notes: list[str] = field(default_factory=list)

    def add(self, res, moved: int) -> None:
        self.problems += 1
        self.greedy += 0 if res.exact else 1
        self.moved += moved


# ----------------------------------------------------------------------------- heads
def _split(cfg: Config, x: torch.Tensor) -> torch.Tensor:
    """A KV group's stacked query (or output) rows → (group_size, rows, e)."""
    return x.reshape(cfg.group_size, -1, x.shape[-1])


def _per_head(cfg: Config, p: Params, layer: int, pair) -> tuple[torch.Tensor, torch.Tensor]:
    """(X per query head (h, r, e), Y per query head (h, r', e)) for qk_pair (X: queries, Y: keys)
    or vo_pair (X: values, Y: output rows W_O[h]ᵀ), the group's shared side repeated."""
    xs, ys = [], []
    for j in range(cfg.n_kv_heads):
        a, b = pair(cfg, p, layer, j)
        if pair is qk_pair:
            xs.append(_split(cfg, a))
            ys.append(b[None].expand(cfg.group_size, *b.shape))
        else:
            xs.append(a[None].expand(cfg.group_size, *a.shape))
            ys.append(_split(cfg, b))
    return torch.cat(xs), torch.cat(ys)


def _product_cost(xb, yb, xa, ya) -> tuple[torch.Tensor, torch.Tensor]:
    """‖X_b·Y_bᵀ − X_a·Y_aᵀ‖² for every (b, a) pair of heads, from e × e Grams: tr(G_x G_y) of
    each side minus twice tr((X_bᵀX_a)(Y_aᵀY_b)); and A's total Σ‖X_a·Y_aᵀ‖² (the scale)."""
    nb = ((xb.transpose(1, 2) @ xb) * (yb.transpose(1, 2) @ yb)).sum((1, 2))
    na = ((xa.transpose(1, 2) @ xa) * (ya.transpose(1, 2) @ ya)).sum((1, 2))
    p = torch.einsum("bre,arf->baef", xb, xa)
    q = torch.einsum("asf,bse->baef", ya, yb)
    cross = (p * q).sum((2, 3))
    return (nb[:, None] + na[None, :] - 2 * cross).clamp_min(0.0), na.sum()


def _flat(p: Params, names: list[str], idx: int, cfg: Config) -> torch.Tensor:
    out = []
    for n in names:
        if n in p:
            t = p[n]
            if n.endswith("_norm"):  # a full-width QK-norm's weights: one chunk per head
                if cfg.qk_norm != "full":
                    continue
                t = t.reshape(-1, cfg.d_head)
            out.append(t[idx].reshape(-1))
    return torch.cat(out) if out else torch.zeros(1, dtype=torch.float64)


def _weight_costs(cfg: Config, b: Params, a: Params, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    pre = f"blocks.{layer}.attn"
    q = [f"{pre}.{n}" for n in ("W_Q", "b_Q", "W_O", "q_norm")]
    kv = [f"{pre}.{n}" for n in ("W_K", "b_K", "W_V", "b_V", "k_norm")]
    fq = [torch.stack([_flat(p, q, h, cfg) for h in range(cfg.n_heads)]) for p in (b, a)]
    fk = [torch.stack([_flat(p, kv, j, cfg) for j in range(cfg.n_kv_heads)]) for p in (b, a)]
    return torch.cdist(fq[0], fq[1]) ** 2, torch.cdist(fk[0], fk[1]) ** 2


def head_costs(cfg: Config, b: Params, a: Params, layer: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(query-head cost (h × h), KV-group cost (n_kv × n_kv)), rows B, columns A."""
    if mode == "weights":
        return _weight_costs(cfg, b, a, layer)
    cost = torch.zeros(cfg.n_heads, cfg.n_heads, dtype=torch.float64)
    for pair in (qk_pair, vo_pair):
        xb, yb = _per_head(cfg, b, layer, pair)
        xa, ya = _per_head(cfg, a, layer, pair)
        c, scale = _product_cost(xb, yb, xa, ya)
        cost = cost + c / (float(scale) if float(scale) > 0 else 1.0)
    return cost, torch.zeros(cfg.n_kv_heads, cfg.n_kv_heads, dtype=torch.float64)


def match_heads(cfg: Config, costs: list[tuple[torch.Tensor, torch.Tensor]], log: MatchLog, deadline) -> Element:
    """head-perm from per-layer (query-head cost, KV cost): a KV group of B is matched to one of
    A at the cost of its KV tensors plus the best assignment of their query heads; then the query
    heads within each matched pair of groups."""
    g, nkv = cfg.group_size, cfg.n_kv_heads
    kv = torch.zeros(cfg.n_layers, nkv, dtype=torch.long)
    qp = torch.zeros(cfg.n_layers, nkv, g, dtype=torch.long)
    for layer, (cq, ckv) in enumerate(costs):
        inner = {}
        group_cost = ckv.clone()
        for jb in range(nkv):
            for ja in range(nkv):
                res = assign(cq[jb * g : (jb + 1) * g, ja * g : (ja + 1) * g], deadline)
                inner[jb, ja] = res
                group_cost[jb, ja] += res.cost
        outer = assign(group_cost, deadline)
        kv[layer] = outer.perm
        log.add(outer, int((outer.perm != torch.arange(nkv)).sum()))
        for ja in range(nkv):
            res = inner[int(outer.perm[ja]), ja]
            qp[layer, ja] = res.perm
            log.add(res, int((res.perm != torch.arange(g)).sum()))
    return Element({"kv_perm": kv, "q_perm": qp}, 1.0)


# ----------------------------------------------------------------------------- FFN units, experts
def ffn_prefix(cfg: Config, layer: int) -> str:
    return f"blocks.{layer}.{'moe' if cfg.experts else 'mlp'}"


def _unit_parts(cfg: Config, p: Params, pre: str, e: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per hidden unit (rows): the scaled input side [W_in[:, i]; b_in[i]], the output row
    W_out[i], and the unscaled gate [W_gate[:, i]; b_gate[i]] (empty without a gate)."""

    def get(name):
        t = p.get(f"{pre}.{name}")
        return t if t is None or e is None else t[e]

    def cols(w, b):
        w = get(w)
        if w is None:
            return torch.zeros(cfg.d_ff, 0, dtype=torch.float64)
        bias = get(b)
        return (w if bias is None else torch.cat([w, bias[None]], 0)).T

    return cols("W_in", "b_in"), get("W_out"), cols("W_gate", "b_gate")


def unit_cost(cfg: Config, b: Params, a: Params, pre: str, e: int | None, mode: str) -> torch.Tensor:
    """(d_ff × d_ff) cost of matching B's unit (row) to A's (column)."""
    ub, ob, gb = _unit_parts(cfg, b, pre, e)
    ua, oa, ga = _unit_parts(cfg, a, pre, e)
    if mode == "weights":
        return torch.cdist(torch.cat([ub, ob, gb], 1), torch.cat([ua, oa, ga], 1)) ** 2
    nb = (ub * ub).sum(1) * (ob * ob).sum(1)
    na = (ua * ua).sum(1) * (oa * oa).sum(1)
    cost = nb[:, None] + na[None, :] - 2 * (ub @ ua.T) * (ob @ oa.T)
    if gb.shape[1]:
        cost = cost + torch.cdist(gb, ga) ** 2
    return cost.clamp_min(0.0)


def match_units(cfg: Config, costs: list[list[torch.Tensor]], log: MatchLog, deadline) -> Element:
    """ffn-perm from per-layer (per-expert) unit costs."""
    perms = []
    for layer_costs in costs:
        per = []
        for c in layer_costs:
            res = assign(c, deadline)
            per.append(res.perm)
            log.add(res, int((res.perm != torch.arange(cfg.d_ff)).sum()))
        perms.append(torch.stack(per) if cfg.experts else per[0])
    return Element({"perm": torch.stack(perms)}, 1.0)


def expert_cost(cfg: Config, b: Params, a: Params, layer: int) -> torch.Tensor:
    """(E × E): the squared distance of the experts' router columns (the stream aligned first)."""
    pre = ffn_prefix(cfg, layer)
    return torch.cdist(b[f"{pre}.W_router"].T, a[f"{pre}.W_router"].T) ** 2


def match_experts(cfg: Config, costs: list[torch.Tensor], log: MatchLog, deadline) -> Element:
    perms = []
    for c in costs:
        res = assign(c, deadline)
        perms.append(res.perm)
        log.add(res, int((res.perm != torch.arange(cfg.experts)).sum()))
    return Element({"perm": torch.stack(perms)}, 1.0)
