"""Gauge fixing of the feed-forward networks: expert and neuron permutations and the ReLU / SwiGLU
rescalings (steps 10, 11, 14 of the pipeline).

Per hidden unit i (per expert in MoE blocks): a_i = ‖(W_in[:, i], b_in[i])‖ (the up projection
under SwiGLU) and b_i = ‖W_out[i, :]‖.  A rescaling s_i maps (a_i, b_i) ↦ (|s_i|·a_i, b_i/|s_i|), so
a_i·b_i is invariant — the neurons' sort key.
"""

from __future__ import annotations

import torch

from ..actions import ACTIONS, Element
from ..models.config import Config
from ..runtime import one_thread
from .base import SIGN_SENSITIVITY, Context, Params, descending, match, signs


def _prefixes(cfg: Config) -> list[str]:
    return [f"blocks.{i}.{'moe' if cfg.experts else 'mlp'}" for i in range(cfg.n_layers)]


def _up(p: Params, pre: str) -> torch.Tensor:
    """[W_in; b_in]: (…, d(+1), f) — the input weights of each unit with its bias as a row."""
    w = p[f"{pre}.W_in"]
    b = p.get(f"{pre}.b_in")
    return w if b is None else torch.cat([w, b.unsqueeze(-2)], -2)


def unit_norms(p: Params, pre: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b): (…, f) each."""
    return _up(p, pre).norm(dim=-2), p[f"{pre}.W_out"].norm(dim=-1)


# ----------------------------------------------------------------------------- 10 expert-perm
def fix_expert_perm(ctx: Context) -> None:
    """Condition: in every MoE block the experts are ordered by decreasing router-column norm
    ‖W_router[:, e]‖ (after the router offset and the stream are fixed; invariant under every
    later step).  Reachable: sort (expert-perm).  Unique unless two norms tie (reported).  With a
    reference, experts are matched to the reference's by their router columns.

    DeepSeek (deepseek-expert-perm: group-limited routing allows only permutations within the
    groups and of whole groups): within each group by that norm, and the groups by their sum; with
    a reference, each group's experts are matched to each reference group's and the groups by the
    summed cost of those matchings."""
    cfg, p = ctx.cfg, ctx.params
    action = next((a for a in ("expert-perm", "deepseek-expert-perm") if ACTIONS[a].applies(cfg) is None), None)
    if action is None or ctx.reuse(action):
        return
    perms, margins = [], []
    routed = [pre for pre in _prefixes(cfg) if f"{pre}.W_router" in p]  # DeepSeek: not in its dense blocks
    groups = cfg.expert_groups
    for pre in routed:
        cols = p[f"{pre}.W_router"].T
        ref = ctx.reference[f"{pre}.W_router"].T if ctx.reference is not None else None
        order, m = _grouped_order(cols, ref, groups)
        perms.append(order)
        margins.append(m)
    parts = dict(zip(routed, perms)) if action == "deepseek-expert-perm" else {"perm": torch.stack(perms)}
    ctx.apply(
        action,
        action,
        Element(parts, 1.0),
        "experts in decreasing order of their router-column norm"
        + (" within their groups, the groups by their sum" if groups > 1 else ""),
        decisions=[
            ctx.decision(
                "order" if ctx.reference is None else "match",
                "experts",
                torch.cat(margins) if margins else torch.zeros(0),  # a run of dense blocks: none
                2.0,
            )
        ],
    )


def _grouped_order(cols: torch.Tensor, ref: torch.Tensor | None, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The expert order (new[j] = old[order[j]]) for router columns ``cols`` (E × d) in ``groups``
    consecutive groups, and its margins: sorted by decreasing norm (groups by their summed norm),
    or matched to the reference's columns (groups by the summed cost of their best matching)."""
    per = cols.shape[0] // groups
    block = cols.reshape(groups, per, -1)
    if ref is None:
        keys = cols.norm(dim=1).reshape(groups, per)
        gorder, ggaps = descending(keys.sum(1))
        inner = [descending(keys[g]) for g in range(groups)]
        order = torch.cat([int(g) * per + inner[int(g)][0] for g in gorder])
        return order, torch.cat([ggaps, *(gaps for _, gaps in inner)])
    rblock = ref.reshape(groups, per, -1)
    cost = torch.zeros(groups, groups, dtype=torch.float64)
    inner_perm, inner_margin = {}, {}
    for a in range(groups):
        for b in range(groups):
            c = torch.cdist(block[a], rblock[b])
            inner_perm[a, b], inner_margin[a, b] = match(c)
            cost[a, b] = c[inner_perm[a, b], torch.arange(per)].sum()
    gperm, gm = match(cost)
    order = torch.cat([int(gperm[b]) * per + inner_perm[int(gperm[b]), b] for b in range(groups)])
    within = [inner_margin[int(gperm[b]), b] for b in range(groups)]
    return order, torch.tensor(within if groups == 1 else [gm, *within], dtype=torch.float64)


# ----------------------------------------------------------------------------- 11 ffn-perm
def _unit_columns(a: torch.Tensor) -> torch.Tensor:
    return a / a.norm(dim=0).clamp_min(torch.finfo(torch.float64).tiny)


CONTENDERS_PER_UNIT = 64  # beyond this many contenders per reference unit on average: the whole float64 matrix
CONTENDER_CHUNK = 256
SCREEN_ROWS = 2048  # reference units screened at a time
_U32 = 2.0**-24


def _column_norms(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.norm(dim=0), y.norm(dim=0)) for x, y in pairs]


def _screen_bound(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], norms: list[tuple[torch.Tensor, torch.Tensor]]
) -> float | None:
    """The bound E of :func:`similarity_screen` (None where it does not hold)."""
    bound = 0.0
    for (x, _), pair_norms in zip(pairs, norms):
        n = x.shape[0]
        if n * _U32 >= 0.01:
            return None
        for norm in pair_norms:
            live = norm > 0
            if bool(((norm[live] < 1e-30) | (norm[live] > 1e30)).any()):
                return None
        bound += n * _U32 / (1 - n * _U32) + 7 * _U32
    return 1.01 * bound + 1e-12  # and the float64 recomputation's own rounding


def _scaled(t: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """Columns rounded to float32 and scaled by their rounded inverse norms (zero columns stay zero)."""
    inv = torch.where(norm > 0, 1.0 / norm.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
    return t.to(torch.float32).mul_(inv.to(torch.float32))


def _screen_rows(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], norms: list[tuple[torch.Tensor, torch.Tensor]], lo: int, hi: int
) -> torch.Tensor:
    """Rows lo … hi − 1 (reference units) of the float32 similarities, one pair's scaled columns
    at a time (at Llama-3-8B's FFN a pair's are 235 MB each in float32)."""
    sim = None
    for (x, y), (nx, ny) in zip(pairs, norms):
        term = (_scaled(y[:, lo:hi], ny[lo:hi]).T @ _scaled(x, nx)).abs_()
        sim = term if sim is None else sim.add_(term)
    assert sim is not None
    return sim


def similarity_screen(
    pairs: list[tuple[torch.Tensor, torch.Tensor]], norms: list[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> tuple[torch.Tensor, float] | None:
    """The float32 similarities Σ over ``pairs`` of |cos| between the reference's columns (rows of
    the result) and this model's (its columns), and E: every entry lies within E of the float64
    value from :func:`_unit_columns`, whatever the products' summation order.  Each column is
    rounded to float32 and scaled by its rounded inverse norm (relative error ≤ 3.01u per entry,
    u = 2⁻²⁴), so a dot product of two such columns is within γ_n·(1 + 3.01u)² + 6.03u ≤ γ_n + 7u
    of the cosine, γ_n = n·u/(1 − n·u).  None where that does not hold: a column norm outside
    [10⁻³⁰, 10³⁰] (its inverse or its entries leave float32's normal range; exact zero columns —
    dead units — are fine: they stay zero) or n·u ≥ 0.01."""
    norms = norms or _column_norms(pairs)
    bound = _screen_bound(pairs, norms)
    if bound is None:
        return None
    return _screen_rows(pairs, norms, 0, pairs[0][1].shape[1]), bound


def match_directions(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, float]:
    """``match(-sim)`` for sim = Σ over ``pairs`` (x: n × f of this model, y: n × f of the
    reference) of |cos| between x's and y's columns: the same assignment, and the same margin to
    the rounding of a dot product, from the float64 similarities of the entries that can decide
    them.

    The matrix products are the step's cost (SmolLM2: three 1536 × 577 × 1536 products per layer,
    most of a canonicalisation against a reference), so they are formed in float32
    (:func:`similarity_screen`: every entry within E of the float64 one).  An entry can be the
    largest or the second largest of its reference unit's only if its float32 value is within 2E
    of that unit's second largest, so those entries are recomputed in float64 (each a dot product
    of :func:`_unit_columns` columns) and :func:`match`'s argmin, top-two gap and scale are taken
    from them.  Where the choice is not one-to-one (match's greedy fallback reads every entry),
    where the contenders are many (near-equal directions), where the screen's bound does not hold,
    or where torch's float32 products are set to a lower precision, the whole float64 matrix is
    formed as before."""
    f = pairs[0][0].shape[1]

    def whole() -> tuple[torch.Tensor, float]:
        sim = torch.zeros(f, f, dtype=torch.float64)
        for x, y in pairs:
            sim += (_unit_columns(x).T @ _unit_columns(y)).abs()
        return match(-sim)

    if f < 2 or torch.get_float32_matmul_precision() != "highest":
        return whole()
    tiny = torch.finfo(torch.float64).tiny
    norms = _column_norms(pairs)  # what _unit_columns divides by, bit for bit
    bound = _screen_bound(pairs, norms)
    if bound is None:
        return whole()
    # the similarities a block of reference units at a time (each unit's contenders are decided
    # from its own row): at Llama-3-8B's 14 336 units the whole float32 matrix is 822 MB
    found = []
    for lo in range(0, f, SCREEN_ROWS):
        sim32 = _screen_rows(pairs, norms, lo, min(f, lo + SCREEN_ROWS))  # (reference unit, unit)
        second = torch.topk(sim32, 2, dim=1).values[:, 1]
        c, r = torch.nonzero(sim32 >= (second - 2 * bound).unsqueeze(1), as_tuple=True)  # by (col, row)
        found.append((c + lo, r))
        del sim32
    cols, rows = torch.cat([c for c, _ in found]), torch.cat([r for _, r in found])
    if rows.numel() > CONTENDERS_PER_UNIT * f:
        return whole()
    # each contender's float64 similarity from rows of the transposed columns (contiguous, where
    # the columns are a strided gather: 109 → 39 ms per SmolLM2 layer), on one thread (each dot
    # product summed in one order whatever the thread count)
    exact = torch.zeros(rows.numel(), dtype=torch.float64)
    with one_thread():
        for (x, y), (nx, ny) in zip(pairs, norms):
            xt, yt, nx, ny = x.T.contiguous(), y.T.contiguous(), nx.clamp_min(tiny), ny.clamp_min(tiny)
            for lo in range(0, rows.numel(), CONTENDER_CHUNK):  # chunk × n temporaries
                r, c = rows[lo : lo + CONTENDER_CHUNK], cols[lo : lo + CONTENDER_CHUNK]
                exact[lo : lo + CONTENDER_CHUNK] += ((xt[r] / nx[r, None]) * (yt[c] / ny[c, None])).sum(1).abs_()
            del xt, yt
    # per reference unit, the largest exact value (the first row among equals, as argmin picks it)
    # and the second largest: the contenders come by (col, row); sort by −value, then by col, stably
    order = torch.argsort(-exact, stable=True)
    order = order[torch.argsort(cols[order], stable=True)]
    starts = torch.searchsorted(cols[order], torch.arange(f))
    best, v1, v2 = rows[order[starts]], exact[order[starts]], exact[order[starts + 1]]
    if not torch.equal(torch.sort(best).values, torch.arange(f)):
        return whole()
    scale = v1.max().clamp_min(tiny)
    return best, float(((v1 - v2) / scale).min())


def fix_ffn_perm(ctx: Context) -> None:
    """Condition: in every FFN (every expert) the hidden units are ordered by decreasing
    a_i·b_i = ‖(W_in[:, i], b_in[i])‖·‖W_out[i]‖, which every rescaling of a unit leaves unchanged.
    Reachable: sort (ffn-perm).  Unique unless two keys tie — dead units (a_i·b_i = 0) always do;
    ties are reported.  With a reference, units are matched to the reference's by the directions
    of their input and output weights (and gate)."""
    cfg, p = ctx.cfg, ctx.params
    action = next((a for a in ("ffn-perm", "deepseek-ffn-perm") if ACTIONS[a].applies(cfg) is None), None)
    if action is None or ctx.reuse(action):
        return
    perms, margins = [], []
    ffns = _ffns(cfg, p, keyed=action == "deepseek-ffn-perm")
    for pre in ffns:
        a, b = unit_norms(p, pre)
        if ctx.reference is None:
            order, gaps = descending(a * b)
            perms.append(order)
            margins.append(gaps.reshape(-1))
            continue
        experts = p[f"{pre}.W_in"].shape[0] if p[f"{pre}.W_in"].dim() == 3 else 0
        per = []
        for e in range(experts or 1):

            def sel(q, name, pre=pre, e=e, experts=experts):
                t = q[f"{pre}.{name}"]
                return t[e] if experts else t

            pairs = [
                (
                    _up(p, pre)[e] if experts else _up(p, pre),
                    _up(ctx.reference, pre)[e] if experts else _up(ctx.reference, pre),
                ),
                (sel(p, "W_out").T, sel(ctx.reference, "W_out").T),
            ]
            if f"{pre}.W_gate" in p:
                pairs.append((sel(p, "W_gate"), sel(ctx.reference, "W_gate")))
            order, m = match_directions(pairs)
            per.append(order)
            margins.append(torch.tensor([m]))
        perms.append(torch.stack(per) if experts else per[0])
    parts = dict(zip(ffns, perms)) if action == "deepseek-ffn-perm" else {"perm": torch.stack(perms)}
    ctx.apply(
        action,
        action,
        Element(parts, 1.0),
        "hidden units in decreasing order of ‖W_in[:, i]‖·‖W_out[i]‖",
        decisions=[
            ctx.decision("order" if ctx.reference is None else "match", "hidden units", torch.cat(margins), 2.0)
        ],
    )


# ----------------------------------------------------------------------------- 14 scaling
def scaling_action(cfg: Config) -> str | None:
    for name in ("relu-scaling", "swiglu-scaling", "deepseek-swiglu-scaling"):
        if ACTIONS[name].applies(cfg) is None:
            return name
    return None


def scaling_family(cfg: Config) -> str | None:
    """The nullity family the scaling step fixes (DeepSeek's per-FFN element is swiglu-scaling's)."""
    action = scaling_action(cfg)
    return "swiglu-scaling" if action == "deepseek-swiglu-scaling" else action


def _ffns(cfg: Config, p: Params, keyed: bool) -> list[str]:
    """The FFN prefixes a step acts on: one per layer, or (``keyed``, DeepSeek: dense FFNs, routed
    and shared experts differ by layer) every SwiGLU the parameters hold."""
    if not keyed:
        return _prefixes(cfg)
    kinds = ("mlp", "moe", "shared")
    return [f"blocks.{i}.{k}" for i in range(cfg.n_layers) for k in kinds if f"blocks.{i}.{k}.W_in" in p]


def scaling_kappa(s) -> float:
    """κ of the unit scalings ``s`` (a tensor or a list of them, every unit): the ratio of the extreme |s_i|."""
    s = [s] if isinstance(s, torch.Tensor) else s
    return max(float(t.abs().max()) for t in s) / min(float(t.abs().min()) for t in s)


def fix_scaling(ctx: Context) -> None:
    """Condition: every ReLU / SwiGLU unit balanced, a_i = b_i (its input and output weights of
    equal norm); SwiGLU also allows s_i < 0: its output row W_out[i] has a positive third moment.

    Reachable: s_i = (b_i/a_i)^{1/2} (times the sign).  Unique for a_i, b_i > 0; a dead unit
    (a_i·b_i = 0) is left unchanged and reported.  With a reference the SwiGLU sign is that of
    ⟨W_out[i], W_out^ref[i]⟩."""
    cfg, p = ctx.cfg, ctx.params
    action = scaling_action(cfg)
    if action is None:
        return
    ss, margins, notes = [], [], []
    ffns = _ffns(cfg, p, action == "deepseek-swiglu-scaling")
    for pre in ffns:
        a, b = unit_norms(p, pre)
        dead = (a == 0) | (b == 0)
        if dead.any():
            notes.append(f"{pre}: {int(dead.sum())} dead units keep their scale (not unique)")
        s = torch.where(dead, torch.ones_like(a), (b / torch.where(dead, torch.ones_like(a), a)).sqrt())
        if action != "relu-scaling":
            out = p[f"{pre}.W_out"] / s.unsqueeze(-1)
            if ctx.reference is None:
                sign, margin = signs(out, dim=-1)
                margins.append(margin.reshape(-1))
            else:
                sign = torch.where((out * ctx.reference[f"{pre}.W_out"]).sum(-1) < 0, -1.0, 1.0).double()
            s = s * sign
        ss.append(s)
    parts = dict(zip(ffns, ss)) if action == "deepseek-swiglu-scaling" else {"s": torch.stack(ss)}
    decisions = [ctx.decision("sign", "unit signs", torch.cat(margins), SIGN_SENSITIVITY)] if margins else []
    ctx.apply(
        scaling_family(cfg) or action,
        action,
        Element(parts, scaling_kappa(ss)),
        "every unit balanced: ‖W_in[:, i]‖ = ‖W_out[i]‖"
        + (", W_out[i] signed by its third moment" if action != "relu-scaling" else ""),
        decisions=decisions,
        notes=notes,
    )


def cond_scaling(cfg: Config, p: Params) -> torch.Tensor | None:
    action = scaling_action(cfg)
    if action is None:
        return None
    out = []
    for pre in _ffns(cfg, p, action == "deepseek-swiglu-scaling"):
        up, w_out = _up(p, pre), p[f"{pre}.W_out"]
        out.append(((up * up).sum(-2) - (w_out * w_out).sum(-1)).reshape(-1))
    return torch.cat(out)
